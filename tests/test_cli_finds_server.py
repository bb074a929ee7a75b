"""The CLI in a second terminal finds the running server's data, and `serve` refuses a busy port up front.

A real `threadloom serve` on its embedded PostgreSQL; the CLI a subprocess with its own HOME and
XDG_STATE_HOME, run from another folder, with no THREADLOOM_DATA_DIR: all it has is the state file.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
from pathlib import Path

import httpx

from tests.support import zygote
from tests.support.server import ServerProcess, free_port
from threadloom.api import ids


def cli(*args: str, env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return zygote.run(list(args), env, cwd=str(cwd), timeout=90)  # the CLI's main, forked (tests/support/cli.py)


def user_env(tmp_path: Path) -> dict[str, str]:
    """A user's second terminal: no data dir, no database URL; HOME and XDG_STATE_HOME are the test's."""
    env = {k: v for k, v in os.environ.items() if k not in {"DATABASE_URL", "THREADLOOM_DATA_DIR"}}
    env.update({"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")})
    return env


def test_the_cli_uses_the_data_dir_the_running_server_announced(tmp_path: Path) -> None:
    env = user_env(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    data = tmp_path / "data"
    server = ServerProcess(None, data, env={"XDG_STATE_HOME": env["XDG_STATE_HOME"]}).wait_ready(timeout=90)
    try:
        announced = json.loads((tmp_path / "state" / "threadloom" / "server.json").read_text())
        assert announced == {"url": server.url, "data_dir": str(data), "embedded": True, "pid": announced["pid"]}

        # The first admin token: printed, and in <data dir>/admin-token, which only its owner can read.
        assert server.admin_token is not None
        saved = data / "admin-token"
        assert saved.read_text().strip() == server.admin_token
        assert stat.S_IMODE(saved.stat().st_mode) == 0o600

        listed = cli("token", "list", env=env, cwd=elsewhere)
        assert listed.returncode == 0, listed.stderr
        (line,) = listed.stdout.splitlines()  # the server's first admin token, with its global id
        found = ids.decode(line.split()[0])
        assert found is not None and found[0] == "ApiToken"
        assert line.endswith("first admin")

        made = cli("token", "create", "--scope", "read", "--name", "second", env=env, cwd=elsewhere)
        assert made.returncode == 0, made.stderr
        secret = made.stdout.strip().splitlines()[-1]
        seen = httpx.post(
            server.url + "/graphql",
            json={"query": "{ viewer { scope } }"},
            headers={"authorization": f"Bearer {secret}"},
            timeout=30,
        )
        assert seen.json() == {"data": {"viewer": {"scope": "READ"}}}  # made in the server's own database
        assert not (elsewhere / ".threadloom").exists()  # no second database where the CLI was run
    finally:
        server.stop()
    assert server.proc.returncode == 0
    assert not (tmp_path / "state" / "threadloom" / "server.json").exists()  # a clean stop withdraws it

    gone = cli("token", "list", env=env, cwd=elsewhere)
    assert gone.returncode == 2 and gone.stderr.startswith("threadloom: NO_DATABASE: "), gone.stderr
    assert not (elsewhere / ".threadloom").exists()


def test_serve_refuses_a_busy_port_before_announcing_a_url(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        env = {**user_env(tmp_path), "THREADLOOM_DATA_DIR": str(tmp_path / "data")}
        done = cli("serve", "--port", str(port), env=env, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stdout == ""  # no URL, no admin token
    assert done.stderr.startswith("threadloom: PORT_IN_USE: cannot listen on 127.0.0.1:"), done.stderr
    assert len(done.stderr.splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "data" / "pg").exists()  # refused before the database was started
    assert not (tmp_path / "state").exists()  # and nothing announced

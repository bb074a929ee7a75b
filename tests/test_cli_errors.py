"""Every failure of the `threadloom` command is one line `threadloom: CODE: message`, exit status 2, no traceback.

A table of bad invocations, each run as the real command in a subprocess: on the test database (DATABASE_URL)
when the failure is about what is asked of it, without one when it is about finding it.
"""

from __future__ import annotations

import concurrent.futures
import os
import subprocess
import uuid
from pathlib import Path

from tests.support import zygote
from tests.support.server import free_port
from threadloom.api import ids

SOME = uuid.UUID("00000000-0000-4000-8000-000000000001")  # fixed: xdist workers must collect the same ids
ON_DATABASE = [
    (["token", "revoke", "not-a-uuid"], "INVALID_ID"),
    (["token", "revoke", ids.encode("Project", SOME)], "INVALID_ID"),  # a global id of another type
    (["token", "revoke", str(SOME)], "NOT_FOUND"),
    (["token", "revoke", ids.encode("ApiToken", SOME)], "NOT_FOUND"),
    (["token", "create", "--scope", "read", "--project", "nope"], "INVALID_ID"),
    (["token", "create", "--scope", "read", "--project", ids.encode("Project", SOME)], "NOT_FOUND"),
]

WITHOUT_DATABASE = [
    (["token", "list"], "NO_DATABASE"),
    (["token", "revoke", "not-a-uuid"], "NO_DATABASE"),  # where the database is comes first
    (["migrate"], "NO_DATABASE"),
    (["acp"], "TOKEN_MISSING"),
    (["token", "create", "--scope", "root"], "USAGE"),
    (["token", "create", "--scope", "read", "--expires-in", "soon"], "USAGE"),
    (["token"], "USAGE"),
    (["frobnicate"], "USAGE"),
    ([], "USAGE"),
    (["serve", "--port", "eighty"], "USAGE"),
]


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return zygote.run(args, env, cwd=str(cwd), timeout=60)  # the CLI's main, forked (tests/support/cli.py)


def run_all(table: list[tuple[list[str], str]], env: dict[str, str], cwd: Path) -> dict[str, str]:
    """Each invocation of the table at once (they are independent): its args → what went wrong with it, or
    "" when it failed as the table says. One dict for the table, so a failure shows every bad row."""
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        done = list(pool.map(lambda row: run(row[0], env, cwd), table))
    return {" ".join(args): problem(result, code) for (args, code), result in zip(table, done, strict=True)}


def base_env(tmp_path: Path) -> dict[str, str]:
    """No data dir, no token, no announced server: HOME and XDG_STATE_HOME are the test's own."""
    drop = {"DATABASE_URL", "THREADLOOM_DATA_DIR", "THREADLOOM_TOKEN", "XDG_STATE_HOME"}
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env.update({"HOME": str(tmp_path / "home"), "XDG_STATE_HOME": str(tmp_path / "state")})
    return env


def problem(done: subprocess.CompletedProcess[str], code: str) -> str:
    """ "" when `done` failed with one line `threadloom: CODE: …` and status 2, else what differs."""
    if "Traceback" in done.stderr + done.stdout:
        return "a traceback: " + done.stderr[-300:]
    if done.returncode != 2:
        return f"exit status {done.returncode}: {done.stderr[-300:]}"
    if done.stderr.splitlines() != [done.stderr.strip()]:
        return "not one line: " + done.stderr[-300:]
    if not done.stderr.startswith(f"threadloom: {code}: "):
        return f"not {code}: {done.stderr}"
    return ""


def test_each_bad_invocation_is_one_coded_line(database_url: str, tmp_path: Path) -> None:
    env = {**base_env(tmp_path), "DATABASE_URL": database_url}
    assert run_all(ON_DATABASE, env, tmp_path) == {" ".join(args): "" for args, _ in ON_DATABASE}


def test_without_a_database_each_command_says_so_and_makes_none(tmp_path: Path) -> None:
    assert run_all(WITHOUT_DATABASE, base_env(tmp_path), tmp_path) == {" ".join(a): "" for a, _ in WITHOUT_DATABASE}
    done = run(["token", "list"], base_env(tmp_path), tmp_path)
    assert "--data-dir" in done.stderr and "THREADLOOM_DATA_DIR" in done.stderr  # how to fix it
    assert not (tmp_path / ".threadloom").exists()  # never a silent new database


def test_an_unreachable_database_is_one_coded_line(tmp_path: Path) -> None:
    env = {**base_env(tmp_path), "DATABASE_URL": f"postgresql://nobody@127.0.0.1:{free_port()}/none"}
    assert problem(run(["token", "list"], env, tmp_path), "DATABASE_UNREACHABLE") == ""


def test_a_server_announcing_an_external_database_needs_database_url(tmp_path: Path) -> None:
    state = tmp_path / "state" / "threadloom"
    state.mkdir(parents=True)
    (state / "server.json").write_text(
        '{"url": "http://127.0.0.1:1", "data_dir": "/nonexistent", "embedded": false, "pid": 1}'
    )
    done = run(["token", "list"], base_env(tmp_path), tmp_path)
    assert problem(done, "NO_DATABASE") == ""
    assert "DATABASE_URL" in done.stderr

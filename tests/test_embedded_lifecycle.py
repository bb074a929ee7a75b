"""The embedded PostgreSQL follows `threadloom serve`: a clean stop stops it, a crash leaves it for reuse."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.graphql import make_project, make_thread
from tests.support.pg import postgres_pids, postmaster_pid
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient

EVENTS = "subscription($t: ID!) { threadEvents(threadId: $t) { sequence } }"


async def gone(pgdata: Path) -> bool:
    """True once no PostgreSQL server runs on `pgdata` any more."""
    return not postgres_pids(pgdata)


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
async def test_a_clean_stop_stops_the_embedded_server(tmp_path: Path, sig: signal.Signals) -> None:
    data = tmp_path / "data"
    server = ServerProcess(None, data).wait_ready(timeout=90)
    pgdata = data / "pg"
    try:
        assert postgres_pids(pgdata) == [postmaster_pid(pgdata)]
        server.proc.send_signal(sig)
        assert server.proc.wait(30) == 0, "\n".join(server.log[-30:])
    finally:
        server.kill()
    # `pg_ctl -w stop` returned before serve exited; the postmaster may take a moment to be reaped
    await until(lambda: gone(pgdata), within=10)
    assert not (pgdata / "postmaster.pid").exists()
    assert (pgdata / ".handle_pids.json").read_text() == "[]"


async def test_a_second_ctrl_c_during_the_shutdown_stops_cleanly(tmp_path: Path) -> None:
    """Ctrl-C twice: the second one, sent once the shutdown has begun (the open subscription was told
    SERVER_GOING_AWAY), stops the server at once; still exit 0, no error in the log (uvicorn skipped the app's
    shutdown, and the loop's teardown cancelled it midway: an error-level traceback), and the embedded
    PostgreSQL stopped."""
    data = tmp_path / "data"
    server = ServerProcess(None, data).wait_ready(timeout=90)
    pgdata = data / "pg"
    client = Client(server.url, server.admin_token)
    try:
        thread = (await make_thread(client, await make_project(client, "stop")))["id"]
        ws = await WsClient.connect(server.url, server.admin_token)
        await ws.subscribe(EVENTS, {"t": thread})
        said = await ws.receive(30)  # its first item: the subscription is open (one still being set up gets 1012)
        server.proc.send_signal(signal.SIGINT)
        while said["type"] == "next" and "errors" not in said["payload"]:  # the thread's history first
            said = await ws.receive(30)
        assert [e["extensions"]["code"] for e in said["payload"]["errors"]] == ["SERVER_GOING_AWAY"], said
        server.proc.send_signal(signal.SIGINT)
        assert server.proc.wait(30) == 0, "\n".join(server.log[-30:])
    finally:
        await client.aclose()
        server.kill()
    await until(lambda: gone(pgdata), within=10)
    errors = [line for line in server.log if '"level":"error"' in line or "Traceback" in line]
    assert errors == [], errors
    assert any("Application shutdown complete" in line for line in server.log)


async def test_a_crash_leaves_the_server_for_the_next_start(tmp_path: Path) -> None:
    data = tmp_path / "data"
    pgdata = data / "pg"
    first = ServerProcess(None, data).wait_ready(timeout=90)
    postmaster = postmaster_pid(pgdata)
    try:
        first.kill()  # kill -9: no exit hook runs
        assert postgres_pids(pgdata) == [postmaster]
        again = ServerProcess(None, data).wait_ready(timeout=90)
        try:
            assert again.admin_token is None  # same database: the first start's token exists
            assert postgres_pids(pgdata) == [postmaster]  # reused, not restarted
        finally:
            again.stop()  # SIGTERM; the dead first process is still listed as a user
        assert again.proc.returncode == 0
        await until(lambda: gone(pgdata), within=10)
    finally:
        for pid in postgres_pids(pgdata):  # the test failed: do not leave the server behind
            os.kill(pid, signal.SIGTERM)


async def test_a_half_made_database_folder_is_made_again(tmp_path: Path) -> None:
    """A first start interrupted while creating the database leaves a folder initdb refuses; the next start
    clears it and creates the database (a folder that holds a database is never touched)."""
    pgdata = tmp_path / "data" / "pg"
    pgdata.mkdir(parents=True)
    (pgdata / "base").mkdir()
    (pgdata / "global").write_text("left by an interrupted initdb")
    server = ServerProcess(None, tmp_path / "data").wait_ready(timeout=90)
    try:
        assert (pgdata / "PG_VERSION").exists() and (pgdata / "global").is_dir()
        assert postgres_pids(pgdata) == [postmaster_pid(pgdata)]
        assert any("trying once more" in line for line in server.log)
    finally:
        server.stop()


def test_a_child_the_server_has_just_forked_is_not_counted_as_a_second_server(tmp_path: Path) -> None:
    """A backend carries the server's command line until it sets its title: seen once as a second server right
    after a start ([31197, 31266]). Stand-ins with PostgreSQL's command line: a process and the child it forked.
    Only the parent counts; the twin, the parent alone with its own data dir, does."""
    data = (tmp_path / "pg").resolve()  # as pgserver passes it
    code = "import os, sys, time\nif os.fork() == 0: print(os.getpid(), flush=True)\ntime.sleep(60)"
    shell = 'exec -a "$0" "$3" -c "$1" -D "$2"'  # argv[0] as PostgreSQL's, the interpreter itself (no shim)
    argv = ["bash", "-c", shell, str(tmp_path / "bin" / "postgres"), code, str(data), sys.executable]
    parent = subprocess.Popen(argv, stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert child != parent.pid and child in processes.children(parent.pid)
        assert postgres_pids(data) == [parent.pid]  # the old count: [parent, child]
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.wait()

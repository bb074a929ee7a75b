"""A server whose worker lock goes while it lives stops itself.

Other replicas take a worker for dead the moment its advisory lock goes, and recover its runs.
If the process kept running (its lock's connection cut by the network or a database failover),
its agent processes would keep working on provider threads others now own. So it stops as on
SIGTERM — subscribers told where to resume — and exits with 75 for its supervisor to restart it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import sqlalchemy as sa

from tests.support.graphql import make_project, make_thread
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient
from threadloom.app import WORKER_LOST_EXIT
from threadloom.store import tables as t
from threadloom.store.db import Database

EVENTS = "subscription($t: ID!) { threadEvents(threadId: $t) { sequence type } }"
STATE = "query($t: ID!) { thread(id: $t) { status latestSequence } }"
LOCK_BACKEND = sa.text(
    "SELECT l.pid FROM pg_locks l JOIN workers w ON l.objid = w.lock_no::oid "
    "WHERE l.locktype = 'advisory' AND l.granted AND l.classid = :space AND l.objsubid = 2 "
    # Advisory locks are per database, and every test database numbers its workers from 1: without this the
    # lock of another test's server (a spare started ahead) could be the one cut.
    "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
    "AND w.pid = :server AND w.stopped_at IS NULL"
)


async def test_a_server_that_loses_its_worker_lock_stops_itself(database_url: str, tmp_path: Path) -> None:
    server = ServerProcess(database_url, tmp_path / "first").wait_ready()
    token = str(server.admin_token)
    client = Client(server.url, token)
    db = Database.from_url(database_url, pool_size=1)
    ws: WsClient | None = None
    try:
        thread = (await make_thread(client, await make_project(client, "lock"), "t"))["id"]
        ws = await WsClient.connect(server.url, token)
        op = await ws.subscribe(EVENTS, {"t": thread})
        active = await send(client, thread, "@delay 60000\n@reply never")

        async def running() -> bool:
            return bool((await client.gql(STATE, {"t": thread}))["thread"]["status"] == "RUNNING")

        await until(running)
        async with db.transaction() as tx:
            backend = await tx.scalar(LOCK_BACKEND, {"space": t.WORKER_LOCK_SPACE, "server": server.proc.pid})
            assert backend is not None, "the server holds its worker lock"
            assert await tx.scalar(sa.select(sa.func.pg_terminate_backend(backend)))
        ending = None
        async for message in ws.items():
            if message.get("id") == op and message["type"] == "next" and message["payload"].get("errors"):
                ending = message["payload"]["errors"][0]["extensions"]
                break
        assert ending is not None and ending["code"] == "SERVER_GOING_AWAY"
        assert await asyncio.to_thread(server.proc.wait, 30) == WORKER_LOST_EXIT
    finally:
        if ws is not None:
            await ws.close()
        server.stop()
        await client.aclose()
        print(server.report(60))  # shown when the test failed
    assert any("lost its lock connection" in line for line in server.log), server.log[-20:]

    # Started again (as a supervisor would), it is a new worker: the cut-off turn ended, the thread goes on.
    again = ServerProcess(database_url, tmp_path / "again").wait_ready()
    client = Client(again.url, token)
    try:
        assert (await finished(client, active["run"]["id"]))["status"] == "FAILED"
        done = await send(client, thread, "@reply back")
        assert (await finished(client, done["run"]["id"]))["status"] == "COMPLETED"
    finally:
        await client.aclose()
        again.stop()
        await db.dispose()

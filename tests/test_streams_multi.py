"""Streams across processes and under concurrent writers: postgres:// wake-ups, listener loss, dashboards."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.pg import PgServer
from tests.support.server import Client, ServerProcess, pg_broadcast_url
from tests.support.ws import WsClient
from threadloom.api.ids import decode
from threadloom.store import tables as t
from threadloom.store.db import Database

EVENTS = "subscription($t: ID!) { threadEvents(threadId: $t) { sequence type } }"
RENAME = "mutation($t: ID!, $n: String!) { renameThread(input: {threadId: $t, title: $n}) { userErrors { code } } }"
FEED = """subscription($p: ID!, $after: String) {
  projectThreads(projectId: $p, after: $after) { cursor sequence type thread { id title latestSequence } }
}"""


@pytest.fixture
def pair(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    env = {"BROADCAST_URL": pg_broadcast_url(database_url)}
    a = ServerProcess(database_url, tmp_path / "a", env=env).wait_ready()
    b = ServerProcess(database_url, tmp_path / "b", env=env).wait_ready()
    yield a, b
    a.stop()
    b.stop()
    print("\n".join(a.log[-30:] + b.log[-30:]))


async def _subscribers(url: str, token: str, thread: str, n: int) -> list[tuple[WsClient, str]]:
    subs = []
    for _ in range(n):
        ws = await WsClient.connect(url, token)
        subs.append((ws, await ws.subscribe(EVENTS, {"t": thread})))
    return subs


async def _receive_until(ws: WsClient, end: int) -> list[int]:
    got: list[int] = []
    while not got or got[-1] < end:
        item = (await ws.receive())["payload"]["data"]["threadEvents"]
        if item["type"] != "synchronized":
            got.append(item["sequence"])
    return got


async def test_subscribers_on_one_server_see_mutations_made_on_another(
    pair: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    a, b = pair
    token = a.admin_token
    assert token is not None
    writer = Client(a.url, token)
    try:
        data = await writer.gql(CREATE_PROJECT, {"name": "p", "root": workspace(tmp_path)})
        thread = (await make_thread(writer, data["createProject"]["project"]["id"], "x"))["id"]
        subs = await _subscribers(b.url, token, thread, 20)
        for i in range(30):  # mutations on A, subscribers on B
            await writer.gql(RENAME, {"t": thread, "n": f"n{i}"})
        results = await asyncio.gather(*(_receive_until(ws, 31) for ws, _ in subs))
    finally:
        await writer.aclose()
    for ws, _ in subs:
        await ws.close()
    assert all(seqs == list(range(1, 32)) for seqs in results)


async def test_subscribers_lose_nothing_when_the_listeners_are_killed(
    pair: tuple[ServerProcess, ServerProcess], pg: PgServer, database_url: str, tmp_path: Path
) -> None:
    a, b = pair
    token = a.admin_token
    assert token is not None
    writer = Client(a.url, token)
    conn = await pg.connect(database_url)
    try:
        data = await writer.gql(CREATE_PROJECT, {"name": "p", "root": workspace(tmp_path)})
        thread = (await make_thread(writer, data["createProject"]["project"]["id"], "x"))["id"]
        [(ws, _)] = await _subscribers(b.url, token, thread, 1)
        for i in range(5):
            await writer.gql(RENAME, {"t": thread, "n": f"before{i}"})
        assert await _receive_until(ws, 6) == list(range(1, 7))
        listen = (  # broadcaster listens and publishes on one connection per process
            "SELECT pid FROM pg_stat_activity WHERE datname = current_database() "
            "AND (query LIKE 'LISTEN%' OR query LIKE 'SELECT pg_notify%')"
        )
        killed = [r["pid"] for r in await conn.fetch(listen)]
        assert len(killed) == 2  # one listener per server process
        for pid in killed:
            await conn.execute("SELECT pg_terminate_backend($1)", pid)
        for i in range(10):
            await writer.gql(RENAME, {"t": thread, "n": f"after{i}"})
        assert await _receive_until(ws, 16) == list(range(7, 17))  # nothing lost while degraded

        async def relistening() -> bool:
            pids = {r["pid"] for r in await conn.fetch(listen)}
            return len(pids - set(killed)) == 2

        from tests.support.waiting import until

        await until(relistening, within=30)
        for i in range(3):
            await writer.gql(RENAME, {"t": thread, "n": f"again{i}"})
        assert await _receive_until(ws, 19) == [17, 18, 19]
        await ws.close()
    finally:
        await conn.close()
        await writer.aclose()
    assert any("reconnecting" in line for line in b.log)


async def test_dashboard_feed_misses_nothing(
    client: Client, server: ServerProcess, database_url: str, tmp_path: Path
) -> None:
    data = await client.gql(CREATE_PROJECT, {"name": "dash", "root": workspace(tmp_path)})
    project = data["createProject"]["project"]["id"]
    threads = [(await make_thread(client, project, f"t{i}"))["id"] for i in range(40)]
    cursor = (await client.gql("query($p: ID!) { project(id: $p) { feedCursor } }", {"p": project}))["project"][
        "feedCursor"
    ]
    ws = await WsClient.connect(server.url, client.token)
    op = await ws.subscribe(FEED, {"p": project, "after": cursor})
    rng = random.Random(7)

    async def writer(n: int) -> None:
        for i in range(25):
            await client.gql(RENAME, {"t": rng.choice(threads), "n": f"w{n}-{i}"})

    await asyncio.gather(*(writer(n) for n in range(8)))  # 8 concurrent writers, 200 changes
    got: list[tuple[str, int]] = []
    cursors: list[str] = []
    while len(got) < 200:
        message = await ws.receive()
        assert message["id"] == op, message
        item = message["payload"]["data"]["projectThreads"]
        got.append((item["thread"]["id"], item["sequence"]))
        cursors.append(item["cursor"])
        assert item["thread"]["latestSequence"] == item["sequence"]
    await ws.close()
    project_uuid = decode(project)[1]  # type: ignore[index]
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            rows = await r.rows(
                sa.select(t.events.c.thread_id, t.events.c.sequence).where(
                    t.events.c.project_id == project_uuid, t.events.c.event_type == "thread.renamed"
                )
            )
    finally:
        await db.dispose()
    expected = {(f"{r['thread_id']}", r["sequence"]) for r in rows}
    assert len(expected) == 200
    assert {(str(decode(tid)[1]), seq) for tid, seq in got} == expected  # type: ignore[index]
    assert len(set(cursors)) == 200
    per_thread: dict[str, list[int]] = {}
    for tid, seq in got:
        per_thread.setdefault(tid, []).append(seq)
    assert all(seqs == sorted(seqs) for seqs in per_thread.values())
    # Resuming from any cursor gives exactly the rest.
    again = await WsClient.connect(server.url, client.token)
    op2 = await again.subscribe(FEED, {"p": project, "after": cursors[149]})
    rest = [(await again.receive())["payload"]["data"]["projectThreads"]["cursor"] for _ in range(50)]
    await again.close()
    assert rest == cursors[150:]
    assert op2 == "1"

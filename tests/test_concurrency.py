"""Two real server processes on one database: commands stay serialized per thread."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.db import sequences
from tests.support.graphql import CREATE_PROJECT, CREATE_THREAD, make_project, make_thread, workspace
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, pg_broadcast_url, serving
from threadloom.store import tables as t
from threadloom.store.db import Database


@pytest.fixture
def server(database_url: str, data_dir: Path) -> Iterator[ServerProcess]:
    """The first of the two, on a wake-up channel they share as replicas do (`BROADCAST_URL`): a run one ends is
    seen at once by a `runStatus` subscriber of the other, not at its 5 s poll."""
    with serving(database_url, data_dir, {"BROADCAST_URL": pg_broadcast_url(database_url)}) as proc:
        yield proc


@pytest.fixture
def second_server(server: ServerProcess, database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    env = {"BROADCAST_URL": pg_broadcast_url(database_url)}
    proc = ServerProcess(database_url, tmp_path / "second", env=env).wait_ready()
    assert proc.admin_token is None  # only the first start on an empty database makes one
    yield proc
    proc.stop()


async def test_fifty_creates_over_two_processes(
    server: ServerProcess, second_server: ServerProcess, client: Client, database_url: str
) -> None:
    other = Client(second_server.url, client.token)
    try:
        project = await make_project(client)
        clients = [client, other]
        results = await asyncio.gather(
            *(clients[i % 2].gql(CREATE_THREAD, {"projectId": project, "title": f"t{i}"}) for i in range(50))
        )
        assert all(r["createThread"]["userErrors"] == [] for r in results)
        ids = {r["createThread"]["thread"]["id"] for r in results}
        assert len(ids) == 50
        # Renames of one thread racing through both processes: its log stays gapless.
        target = await make_thread(client, project, "contended")
        rename = (
            "mutation($t: ID!, $n: String!) { renameThread(input: {threadId: $t, title: $n}) { userErrors { code } } }"
        )
        renamed = await asyncio.gather(
            *(clients[i % 2].gql(rename, {"t": target["id"], "n": f"r{i}"}) for i in range(30))
        )
        assert all(r["renameThread"]["userErrors"] == [] for r in renamed)
        seen = await client.gql("query($t: ID!) { thread(id: $t) { latestSequence } }", {"t": target["id"]})
        assert seen["thread"]["latestSequence"] == 31
    finally:
        await other.aclose()
    db = Database.from_url(database_url, pool_size=1)
    try:
        per_thread = await sequences(db)
        assert len(per_thread) == 51
        assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in per_thread.values())
        async with db.read() as r:
            positions = [row["position"] for row in await r.rows(sa.select(t.events.c.position))]
        assert len(positions) == len(set(positions)) == 50 + 1 + 30 + 1  # threads, contended thread, renames, project
    finally:
        await db.dispose()


async def test_concurrent_sends_over_two_processes(
    server: ServerProcess, second_server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    other = Client(second_server.url, client.token)
    try:
        data = await client.gql(CREATE_PROJECT, {"name": "busy", "root": workspace(tmp_path)})
        thread = await make_thread(client, data["createProject"]["project"]["id"], "busy")
        clients = [client, other]
        sent = await asyncio.gather(
            *(send(clients[i % 2], thread["id"], f"message {i}", d={"queueAfterActive": True}) for i in range(50))
        )
        assert all(s["userErrors"] == [] for s in sent)
        assert sorted(s["run"]["ordinal"] for s in sent) == list(range(1, 51))
        runs = [await finished(clients[i % 2], s["run"]["id"], within=120) for i, s in enumerate(sent)]
    finally:
        await other.aclose()
    runs.sort(key=lambda r: r["ordinal"])
    assert all(r["status"] == "COMPLETED" for r in runs)
    # Never two active at once, and the queue drained in ordinal order.
    for before, after in itertools.pairwise(runs):
        assert after["startedAt"] >= before["completedAt"]
    db = Database.from_url(database_url, pool_size=1)
    try:
        per_thread = await sequences(db)
        assert all(seqs == list(range(1, len(seqs) + 1)) for seqs in per_thread.values())
    finally:
        await db.dispose()

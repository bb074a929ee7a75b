"""A live view costs the same statements whatever the size of the graph it filters: a subtree's membership is
learnt from the rows it streams after one read of the run's parents, and each row's project is checked from
the row (asked once per project). Runs of 2 and 20 tool calls are made through a real server; their subtree
views are replayed in this process on the same database, counting every statement the engine sends.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import sqlalchemy as sa

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from threadloom.api.ids import decode
from threadloom.store import graph_reads
from threadloom.store import tables as t
from threadloom.store.db import Database
from threadloom.store.events import LogEvent
from threadloom.streams.hub import Hub
from threadloom.streams.merge import Synchronized, thread_stream
from threadloom.streams.views import NodeTree, ViewMatch


def uid(gid: str) -> uuid.UUID:
    found = decode(gid)
    assert found is not None
    return found[1]


@contextmanager
def counted(db: Database) -> Iterator[list[str]]:
    """The statements this task sends: the view's own reads. The hub's feed polls the log on a timer in a task of
    its own (every 0.25 s without a wake-up channel), so on a slow machine a poll could land in either replay."""
    statements: list[str] = []
    mine = asyncio.current_task()

    def count(_conn: Any, _cursor: Any, statement: str, *_: Any) -> None:
        if asyncio.current_task() is mine:
            statements.append(statement)

    sa.event.listen(db.engine.sync_engine, "before_cursor_execute", count)
    try:
        yield statements
    finally:
        sa.event.remove(db.engine.sync_engine, "before_cursor_execute", count)


async def _subtree_replay(
    db: Database, thread: uuid.UUID, run: uuid.UUID
) -> tuple[int, list[LogEvent], list[uuid.UUID]]:
    """(statements, rows kept, projects asked about) of the run's root subtree, replayed to `synchronized`."""
    hub = Hub(db)
    asked: list[uuid.UUID] = []

    def sees(project: uuid.UUID) -> bool:
        asked.append(project)
        return True

    try:
        with counted(db) as statements:
            async with db.read() as r:
                root = await r.scalar(sa.select(t.runs.c.root_node_id).where(t.runs.c.id == run))
                tree = NodeTree(root, await graph_reads.run_node_parents(r, run))
                start = await graph_reads.run_start(r, thread, run)
            kept: list[LogEvent] = []
            stream = thread_stream(hub, db, thread, start, ViewMatch(sees, node=root, tree=tree), max_replay=10_000)
            async for item in stream:
                if isinstance(item, Synchronized):
                    break
                assert isinstance(item, LogEvent)
                kept.append(item)
            await stream.aclose()
        return len(statements), kept, asked
    finally:
        await hub.stop()


async def test_a_subtree_view_costs_the_same_statements_for_2_and_20_tool_calls(
    client: Client, server: ServerProcess, tmp_path: Path, database_url: str
) -> None:
    data = await client.gql(CREATE_PROJECT, {"name": "p", "root": workspace(tmp_path)})
    thread_id = (await make_thread(client, data["createProject"]["project"]["id"], "t"))["id"]
    runs = {}
    for size in (2, 20):
        sent = await send(client, thread_id, "\n".join([*(f"@tool echo {i}" for i in range(size)), "@reply done"]))
        assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
        runs[size] = uid(sent["run"]["id"])
    db = Database.from_url(database_url, pool_size=2)
    try:
        costs = {}
        for size, run in runs.items():
            statements, kept, asked = await _subtree_replay(db, uid(thread_id), run)
            costs[size] = statements
            async with db.read() as r:
                rows = await r.scalars_all(
                    sa.select(t.events.c.sequence)
                    .where(t.events.c.thread_id == uid(thread_id))
                    .where(
                        t.events.c.node_id.in_(
                            sa.select(t.execution_nodes.c.id).where(t.execution_nodes.c.run_id == run)
                        )
                    )
                    .order_by(t.events.c.sequence)
                )
            assert [row.sequence for row in kept] == rows  # every row naming a node of the run, each once
            assert len({row.node_id for row in kept}) > size  # the tool calls' nodes are all in it
            assert len(asked) == 1  # one project, asked about once for all its rows
    finally:
        await db.dispose()
    assert costs[2] == costs[20] >= 3, costs  # the parents, the start, and the replay's reads

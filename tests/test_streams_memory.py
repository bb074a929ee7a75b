"""Memory stays flat over long-lived subscriptions (graphql-core 3.3.2 per-event memo leak)."""

from __future__ import annotations

import asyncio
import tracemalloc
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path

import strawberry
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.pg import PgServer
from tests.support.server import Client, ServerProcess, pg_broadcast_url
from tests.support.ws import WsClient
from threadloom.api.ids import decode
from threadloom.api.schema import FreshMemoExecutionContext
from threadloom.domain.changes import Change
from threadloom.engine.clock import SystemClock
from threadloom.store import log
from threadloom.store import threads as thread_store
from threadloom.store.db import Database


@strawberry.type
class Item:
    n: int
    label: str


@strawberry.type
class Query:
    ok: bool = True


@strawberry.type
class Subscription:
    @strawberry.subscription
    async def items(self, count: int) -> AsyncGenerator[Item, None]:
        for n in range(count):
            yield Item(n=n, label=f"item {n}")


async def _growth(context_class: type[StrawberryGraphQLCoreExecutionContext], events: int) -> int:
    schema = strawberry.Schema(query=Query, subscription=Subscription, execution_context_class=context_class)
    stream = await schema.subscribe(
        "subscription($c: Int!) { items(count: $c) { n label } }", variable_values={"c": events}
    )
    assert not isinstance(stream, strawberry.types.ExecutionResult)
    tracemalloc.start()
    start = 0
    async for result in stream:
        if result.data and result.data["items"]["n"] == 100:
            start = tracemalloc.get_traced_memory()[0]
    end = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    return end - start


async def test_fresh_memo_keeps_a_subscription_flat() -> None:
    leaky = await _growth(StrawberryGraphQLCoreExecutionContext, 3000)
    fixed = await _growth(FreshMemoExecutionContext, 3000)
    assert leaky > 2_000_000  # the library's own context keeps ~1 KB+ per event
    assert fixed < 200_000


def _rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def test_server_memory_is_flat_over_long_subscriptions(pg: PgServer, database_url: str, tmp_path: Path) -> None:
    server = ServerProcess(
        database_url, tmp_path / "d", env={"BROADCAST_URL": pg_broadcast_url(database_url)}
    ).wait_ready()
    client = Client(server.url, server.admin_token)
    db = Database.from_url(database_url, pool_size=2)
    notify = await pg.connect(database_url)
    sockets: list[WsClient] = []
    try:
        data = await client.gql(CREATE_PROJECT, {"name": "mem", "root": workspace(tmp_path)})
        project = data["createProject"]["project"]["id"]
        thread = (await make_thread(client, project, "mem"))["id"]
        thread_uuid: uuid.UUID = decode(thread)[1]  # type: ignore[index]
        query = (
            "subscription($t: ID!) { threadEvents(threadId: $t) { sequence type entity { ... on Thread { title } } } }"
        )
        for _ in range(5):  # 50 subscribers on 5 connections
            ws = await WsClient.connect(server.url, server.admin_token)
            for _ in range(10):
                await ws.subscribe(query, {"t": thread})
            sockets.append(ws)

        async def write(batch: int, size: int = 100) -> int:
            """`size` renames in one transaction, then a wake-up, as the server itself would send."""
            async with db.transaction() as tx:
                current = await thread_store.lock(tx, thread_uuid)
                assert current is not None
                changes = [Change("thread.renamed", current.evolve(title=f"b{batch}-{i}")) for i in range(size)]
                appended = await log.append(
                    tx, changes, project_id=current.project_id, command_id=None, now=SystemClock().now()
                )
            seqs = appended.sequences
            await notify.execute(
                "SELECT pg_notify('threadloom_wakeups', $1)",
                f'{{"t": "{thread_uuid}", "p": "{current.project_id}", "s": {seqs[-1]}}}',
            )
            return seqs[-1]

        async def drain(ws: WsClient, until: int) -> None:
            done: dict[str, int] = {}
            async with asyncio.timeout(120):  # 10,000 deliveries a socket: one bound for all
                while len(done) < 10 or min(done.values()) < until:
                    message = await ws.receive(within=None)
                    item = message["payload"]["data"]["threadEvents"]
                    if item["type"] != "synchronized":
                        done[message["id"]] = item["sequence"]

        last = 0
        for batch in range(10):  # warm up: caches, pools, first allocations
            last = await write(batch)
        await asyncio.gather(*(drain(ws, last) for ws in sockets))
        before = _rss(server.proc.pid)
        for batch in range(10, 60):  # 5,000 events x 50 subscribers = 250,000 deliveries
            last = await write(batch)
            if batch % 10 == 9:
                await asyncio.gather(*(drain(ws, last) for ws in sockets))
        grown = _rss(server.proc.pid) - before
    finally:
        for ws in sockets:
            await ws.close()
        await notify.close()
        await db.dispose()
        await client.aclose()
        server.stop()
    assert last == 1 + 6000
    assert grown < 20 * 1024 * 1024, f"server RSS grew by {grown / 1e6:.1f} MB"

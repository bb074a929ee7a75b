"""Subscriptions that start all at once all start, however many more than the server's database pool.

Starting a `threadEvents` view on the general path (src/threadloom/api/stream_scopes.py `resolve_view`) reads
the thread through the request's loaders and the feed's start on a pooled connection. When the loader's read
ran while that connection was held, thirty sockets starting at once (more than the pool's 10 + 10 overflow)
each held one connection and waited for a second: every start waited out the pool's 30 s timeout and ended
with INTERNAL_SERVER_ERROR, and the server's other requests (its /metrics too) waited behind them.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.server import Client, ServerProcess
from tests.support.ws import WsClient

SHARED_SERVER = True
# A socket's operations share its loaders (one batched read), so the starts that each want a connection of
# their own are one a socket: 30 sockets, more than the server's database pool (10 + 10 overflow).
SOCKETS, PER_SOCKET = 30, 2
# `@include` below the root field: the general path (strawberry's resolver), where the view is started.
EVENTS = """subscription($t: ID!) { threadEvents(threadId: $t) {
  sequence type entity @include(if: true) { ... on ExecutionNode { status } } } }"""


async def _synchronized(ws: WsClient) -> set[str]:
    """The operations of `ws` that said `synchronized`; fails on the first error."""
    synced: set[str] = set()
    while len(synced) < PER_SOCKET:
        message = await ws.receive(within=60)
        assert message["type"] == "next" and not message["payload"].get("errors"), message
        if message["payload"]["data"]["threadEvents"]["type"] == "synchronized":
            synced.add(message["id"])
    return synced


async def _start(ws: WsClient, thread: str) -> list[str]:
    return [await ws.subscribe(EVENTS, {"t": thread}) for _ in range(PER_SOCKET)]


async def test_thread_subscriptions_of_thirty_sockets_started_at_once_all_synchronize(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    data = await client.gql(CREATE_PROJECT, {"name": "starts", "root": workspace(tmp_path)})
    thread = str((await make_thread(client, data["createProject"]["project"]["id"], "starts"))["id"])
    sockets = [await WsClient.connect(server.url, server.admin_token) for _ in range(SOCKETS)]
    try:
        opened = await asyncio.gather(*(_start(ws, thread) for ws in sockets))
        synced = await asyncio.gather(*(_synchronized(ws) for ws in sockets))
        assert synced == [set(ops) for ops in opened]
    finally:
        for ws in sockets:
            await ws.close()

"""Queued subscriber bytes are bounded per subscriber and per token (docs/security.md, "Limits").

One real server for the module, with small byte bounds. A read token opens 100 subscriptions of
`threadEvents` with the entity (half on the fast path, half on the general path) on sockets that never
read, while the scripted agent runs a command printing megabytes: every tool-call event carries up to
64 KiB of output. The server's queued bytes (the `threadloom_subscriber_queued_bytes` gauge) stay under
the token's bound and its RSS grows by far less than the streams would hold; every one of the 100 is ended
with SUBSCRIBER_TOO_SLOW, and resuming from its `resumeFrom` gets every later event exactly once. A twin
subscriber of another token that reads normally meanwhile receives every event and is not cut.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import websockets

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.queue_peaks import (
    MB,
    OPEN_FAST,
    OPEN_GENERAL,
    QueuePeaks,
    gauges,
    latest_sequence,
    thread_and_reader,
)
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient, slow_socket

SUBSCRIBER_BYTES = 1024 * 1024
TOKEN_BYTES = 16 * 1024 * 1024
SOCKETS, PER_SOCKET = 20, 5  # 100 subscriptions of one read token
SHARED_SERVER = True  # conftest's module server, with these small byte bounds
SERVER_ENV = {
    "THREADLOOM_SUBSCRIBER_QUEUE_BYTES": str(SUBSCRIBER_BYTES),
    "THREADLOOM_TOKEN_QUEUE_BYTES": str(TOKEN_BYTES),
}

# The entity, so each frame carries the node's output; `@include` below the root field takes the general path.
FAST = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
  sequence type truncated entity { ... on ExecutionNode { status detail } ... on ConversationMessage { text } } } }"""
GENERAL = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
  sequence type truncated entity @include(if: true) { ... on ExecutionNode { status detail } } } }"""
LIGHT = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) { sequence type } }"""
# ~5 MB of output over ~100 writes: about as many `node.updated` events, each with the last 64 KiB.
COMMAND = "for i in $(seq 100); do yes x | head -c 49152; sleep 0.03; done"


async def _silent_socket(url: str, token: str) -> websockets.ClientConnection:
    """A client that never reads, past its `connection_ack`."""
    ws = await slow_socket(url)
    await ws.send(orjson.dumps({"type": "connection_init", "payload": {"token": token}}).decode())
    assert orjson.loads(await ws.recv())["type"] == "connection_ack"
    return ws


def _item(message: dict[str, Any]) -> dict[str, Any] | None:
    """The threadEvents item of a `next` message (None for `synchronized`)."""
    item: dict[str, Any] = message["payload"]["data"]["threadEvents"]
    return None if item["type"] == "synchronized" else item


def _error(message: dict[str, Any]) -> dict[str, Any] | None:
    if message["type"] == "error":
        return message["payload"][0]  # type: ignore[no-any-return]
    if message["type"] == "next" and message["payload"].get("errors"):
        return message["payload"]["errors"][0]  # type: ignore[no-any-return]
    return None


async def test_non_reading_subscribers_are_cut_within_the_byte_bounds(
    server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    thread, reader = await thread_and_reader(client, database_url, "bytes", tmp_path)
    start = await latest_sequence(client, thread)

    # The twin: another token's subscriber that reads everything as it comes.
    twin = await WsClient.connect(server.url, server.admin_token)
    await twin.subscribe(FAST, {"t": thread, "after": start})
    twin_seen: list[int] = []
    twin_errors: list[dict[str, Any]] = []

    async def read_twin() -> None:
        while True:
            message = await twin.receive(within=120)
            if (error := _error(message)) is not None:
                twin_errors.append(error)
                return
            if (item := _item(message)) is not None:
                twin_seen.append(item["sequence"])

    # 100 subscriptions of the read token on 20 sockets that never read: ops 1-3 fast, 4-5 general.
    documents = {str(op): FAST if op <= 3 else GENERAL for op in range(1, PER_SOCKET + 1)}
    silent = [await _silent_socket(server.url, reader) for _ in range(SOCKETS)]
    for ws in silent:
        for op in range(1, PER_SOCKET + 1):
            payload = {"query": documents[str(op)], "variables": {"t": thread, "after": start}}
            await ws.send(orjson.dumps({"id": str(op), "type": "subscribe", "payload": payload}).decode())

    async def all_open() -> bool:
        found = await gauges(client, OPEN_FAST, OPEN_GENERAL)
        return found[OPEN_FAST] + found[OPEN_GENERAL] == SOCKETS * PER_SOCKET + 1

    await until(all_open, within=60)
    reading = asyncio.create_task(read_twin())
    async with QueuePeaks(client, server.proc.pid) as peaks:
        sent = await send(client, thread, f"@tool {COMMAND}")
        done = await finished(client, sent["run"]["id"], within=120)
        assert done["status"] == "COMPLETED"
        latest = await latest_sequence(client, thread)

        async def twin_caught_up() -> bool:
            return bool(twin_errors) or reading.done() or (bool(twin_seen) and twin_seen[-1] >= latest)

        await until(twin_caught_up, within=120)
        reading.cancel()

    # The twin of another token read everything, in order, and was never cut.
    assert twin_errors == []
    assert twin_seen == list(range(start + 1, latest + 1))
    # The read token's queues together never held more than its bound (the twin's at most its own).
    assert 0 < peaks.bytes <= TOKEN_BYTES + SUBSCRIBER_BYTES
    # ~5 MB a stream x 100 streams unbounded; bounded, the server grows by far less than that.
    assert peaks.grown < 150 * MB, f"server RSS grew by {peaks.grown / MB:.0f} MiB"

    # Now each silent socket reads (all at once: uvicorn's keepalive closes a socket that leaves its ping
    # unanswered for 40 s): what it was sent, then SUBSCRIBER_TOO_SLOW with where to resume.
    async def read_back(ws: websockets.ClientConnection) -> tuple[dict[str, list[int]], dict[str, dict[str, Any]]]:
        received: dict[str, list[int]] = {str(op): [] for op in range(1, PER_SOCKET + 1)}
        ended: dict[str, dict[str, Any]] = {}
        while len(ended) < PER_SOCKET:
            message = orjson.loads(await asyncio.wait_for(ws.recv(), 60))
            op = message.get("id")
            if op in ended or message["type"] == "complete":
                continue
            if (error := _error(message)) is not None:
                ended[op] = error
            elif (item := _item(message)) is not None:
                received[op].append(item["sequence"])
        # Dropped, not closed: a close with a frame left unread (a `complete`) waits out websockets' 10 s close
        # timeout, as this client stops reading while its queue of one frame is full.
        ws.transport.abort()
        return received, ended

    cut: list[tuple[str, int, list[int]]] = []
    for received, ended in await asyncio.gather(*(read_back(ws) for ws in silent)):
        for op, error in ended.items():
            assert error["extensions"]["code"] == "SUBSCRIBER_TOO_SLOW", error
            resume = error["extensions"]["resumeFrom"]
            assert received[op] == list(range(start + 1, resume + 1))  # nothing missed or repeated before the cut
            assert resume < latest  # it really was cut before the end
            cut.append((documents[op], resume, received[op]))
    assert len(cut) == SOCKETS * PER_SOCKET

    # Resuming from each cursor yields exactly the rest: the same document for a few, the light one for all.
    resumer = await WsClient.connect(server.url, reader)
    operations: dict[str, tuple[int, list[int]]] = {}
    for index, (query, resume, _) in enumerate(cut):
        op = await resumer.subscribe(query if index % 25 == 0 else LIGHT, {"t": thread, "after": resume})
        operations[op] = (resume, [])
    synced: set[str] = set()
    while len(synced) < len(operations):
        message = await resumer.receive(within=60)
        assert _error(message) is None, message
        item = message["payload"]["data"]["threadEvents"]
        if item["type"] == "synchronized":
            synced.add(message["id"])
        else:
            operations[message["id"]][1].append(item["sequence"])
    await resumer.close()
    await twin.close()
    for resume, rest in operations.values():
        assert rest == list(range(resume + 1, latest + 1))


async def test_a_long_text_is_cut_in_stream_frames_and_whole_by_query(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    data = await client.gql(CREATE_PROJECT, {"name": "long", "root": workspace(tmp_path)})
    thread = str((await make_thread(client, data["createProject"]["project"]["id"], "long"))["id"])
    start = await latest_sequence(client, thread)
    text = "".join(f"{n:07d}\n" for n in range(10_000))  # 80,000 characters: over the frame's 65,536
    query = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
      sequence type truncated entity { ... on ConversationMessage { id role text } } } }"""
    for document in (query, query.replace("entity {", "entity @include(if: true) {")):  # fast, then general
        ws = await WsClient.connect(server.url, server.admin_token)
        await ws.subscribe(document, {"t": thread, "after": start})
        if document is query:
            await send(client, thread, f"@reply ok\n{text}")
        while True:
            item = (await ws.receive())["payload"]["data"]["threadEvents"]
            entity = item["entity"] or {}
            if entity.get("role") == "USER":
                break
        await ws.close()
        assert item["truncated"] is True
        assert entity["text"] == f"@reply ok\n{text}"[:65_536]
        whole = await client.gql(
            "query($id: ID!) { node(id: $id) { ... on ConversationMessage { text } } }", {"id": entity["id"]}
        )
        assert whole["node"]["text"] == f"@reply ok\n{text}"

"""The subscription fast path (cohorts) sends exactly the bytes of the general path.

Two servers share one database: one with the fast paths on (the default), one with
`THREADLOOM_FAST_PATHS=0`. The same subscriptions — documents built directly and executed,
filtered by run and node, `activities`, replays from the start, from the middle and from the
head, a replay over the bound — are opened on both, a run produces events, and every raw text
frame each server sent is compared byte for byte.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, pg_broadcast_url, serving
from tests.support.ws import PROTOCOL
from tests.test_streams import log_rows
from threadloom.api.ids import decode

SCALARS = """subscription($t: ID!, $after: Int) {
  threadEvents(threadId: $t, afterSequence: $after) { sequence type runId nodeId occurredAt __typename }
}"""
ALIASED = """subscription S($t: ID!, $after: Int) {
  events: threadEvents(threadId: $t, afterSequence: $after) { s: sequence kind: type __typename at: occurredAt }
}"""
ENTITIES = """subscription($t: ID!, $after: Int, $run: ID, $node: ID) {
  threadEvents(threadId: $t, afterSequence: $after, runId: $run, nodeId: $node) {
    sequence type runId nodeId entity { __typename ... on Run { status queuePosition thread { title } }
      ... on ConversationMessage { role text } ... on ExecutionNode { kind nodeStatus: status parent { id } } }
  }
}"""
ACTIVITIES = """subscription($t: ID!, $after: Int) {
  activities(threadId: $t, afterSequence: $after) { __typename ... on Activity { kind summary sequence }
    ... on ReloadRequired { sequence } }
}"""


@pytest.fixture
def pair(database_url: str, tmp_path: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    # One wake-up channel: the run writes through `fast`, and `slow`'s subscribers are woken at once, not by
    # their feeds' 5 s poll.
    env = {"THREADLOOM_MAX_REPLAY": "50", "BROADCAST_URL": pg_broadcast_url(database_url)}
    with (
        serving(database_url, tmp_path / "fast", env) as fast,
        serving(database_url, tmp_path / "slow", {**env, "THREADLOOM_FAST_PATHS": "0"}) as slow,
    ):
        yield fast, slow


async def _socket(server: ServerProcess, token: str) -> websockets.ClientConnection:
    url = server.url.replace("http://", "ws://") + "/graphql"
    ws = await websockets.connect(url, subprotocols=[PROTOCOL], max_size=None)  # type: ignore[list-item]
    await ws.send(orjson.dumps({"type": "connection_init", "payload": {"token": token}}).decode())
    assert orjson.loads(await ws.recv())["type"] == "connection_ack"
    return ws


async def _frames(
    ws: websockets.ClientConnection, ends: dict[str, tuple[Any, bool]], early: list[str]
) -> dict[str, list[str]]:
    """Raw frames per operation (`early` ones first) until each has sent what it waits for: (the item at
    a sequence, or None; its `synchronized` marker), or ("complete", False)."""
    got: dict[str, list[str]] = {op: [] for op in ends}
    seen: dict[str, set[Any]] = {op: set() for op in ends}
    pending = list(early)

    def done(op: str) -> bool:
        last, sync = ends[op]
        return (last is None or last in seen[op]) and (not sync or "sync" in seen[op])

    while pending or not all(done(op) for op in ends):
        raw = pending.pop(0) if pending else await asyncio.wait_for(ws.recv(), 30)
        assert isinstance(raw, str)
        message = orjson.loads(raw)
        op = message.get("id")
        if op not in got:
            continue
        got[op].append(raw)
        if message["type"] != "next":
            seen[op].add("complete")
            continue
        item = next(iter((message["payload"].get("data") or {}).values()), None) or {}
        if item.get("type", item.get("kind")) == "synchronized":
            seen[op].add("sync")
        else:
            seen[op].add(item.get("sequence", item.get("s")))
    return got


def _last(rows: list[Any], after: int, keep: Any) -> int | None:
    """The last sequence after `after` of the rows a subscription keeps (None when none)."""
    return max([r["sequence"] for r in rows if r["sequence"] > after and keep(r)], default=None)


async def _synchronized(ws: websockets.ClientConnection, count: int) -> list[str]:
    frames: list[str] = []
    while sum(1 for f in frames if '"synchronized"' in f) < count:
        raw = await asyncio.wait_for(ws.recv(), 30)
        assert isinstance(raw, str)
        frames.append(raw)
    return frames


async def test_fast_and_general_paths_send_the_same_bytes(
    pair: tuple[ServerProcess, ServerProcess], tmp_path: Path, database_url: str
) -> None:
    fast, slow = pair
    client = Client(fast.url, fast.admin_token)
    project = await client.gql(CREATE_PROJECT, {"name": "bytes", "root": workspace(tmp_path)})
    thread = str((await make_thread(client, project["createProject"]["project"]["id"], "bytes"))["id"])
    first = await send(client, thread, "@reply one two three\n@plan step one")
    assert (await finished(client, first["run"]["id"]))["status"] == "COMPLETED"
    rows = await log_rows(database_url, thread)
    middle = rows[-1]["sequence"]
    run_uuid = decode(first["run"]["id"])[1]  # type: ignore[index]
    every, activity = (lambda r: True), (lambda r: r["entity_type"] == "activity")
    subscriptions: list[tuple[str, dict[str, Any], int, Any]] = [
        (SCALARS, {"t": thread}, 0, every),
        (SCALARS, {"t": thread, "after": middle - 3}, middle - 3, every),
        (ALIASED, {"t": thread, "after": middle}, middle, every),
        (ENTITIES, {"t": thread, "after": 0}, 0, every),
        (ENTITIES, {"t": thread, "run": first["run"]["id"]}, 0, lambda r: r["run_id"] == run_uuid),
        (ENTITIES, {"t": thread, "after": 2, "node": "not-a-node-id"}, 2, lambda r: False),
        (ACTIVITIES, {"t": thread}, 0, activity),
        (ACTIVITIES, {"t": thread, "after": middle}, middle, activity),
    ]
    sockets = {name: await _socket(server, client.token) for name, server in (("fast", fast), ("slow", slow))}
    early: dict[str, list[str]] = {}
    try:
        for name, ws in sockets.items():
            for n, (query, variables, _, _) in enumerate(subscriptions):
                message = {"id": f"op{n}", "type": "subscribe", "payload": {"query": query, "variables": variables}}
                await ws.send(orjson.dumps(message).decode())
            # Every replay ends before live events start: the `synchronized` markers then agree.
            early[name] = await _synchronized(ws, 6)
        second = await send(client, thread, "@reply " + " ".join(f"w{i}" for i in range(60)))
        assert (await finished(client, second["run"]["id"]))["status"] == "COMPLETED"
        rows = await log_rows(database_url, thread)
        ends: dict[str, tuple[Any, bool]] = {
            f"op{n}": (_last(rows, after, keep), query != ACTIVITIES)
            for n, (query, _, after, keep) in enumerate(subscriptions)
        }
        ends["reload"] = ("complete", False)  # the log is longer than the bound (50): reload_required, complete
        for ws in sockets.values():
            again = {"id": "reload", "type": "subscribe", "payload": {"query": SCALARS, "variables": {"t": thread}}}
            await ws.send(orjson.dumps(again).decode())
        results = {name: await _frames(ws, ends, early[name]) for name, ws in sockets.items()}
    finally:
        for ws in sockets.values():
            await ws.close()
    assert results["fast"] == results["slow"]
    assert len(rows) > 50 and len(results["fast"]["op0"]) > 50  # replay, synchronized and live really happened


async def test_a_completed_fast_subscription_stops_and_its_id_can_be_reused(
    pair: tuple[ServerProcess, ServerProcess], tmp_path: Path
) -> None:
    fast, _ = pair
    client = Client(fast.url, fast.admin_token)
    project = await client.gql(CREATE_PROJECT, {"name": "complete", "root": workspace(tmp_path)})
    thread = str((await make_thread(client, project["createProject"]["project"]["id"], "c"))["id"])
    rename = "mutation($t: ID!, $n: String!) { renameThread(input: {threadId: $t, title: $n}) { userErrors { code } } }"
    ws = await _socket(fast, client.token)

    async def subscribe(op: str) -> None:
        message = {"id": op, "type": "subscribe", "payload": {"query": SCALARS, "variables": {"t": thread}}}
        await ws.send(orjson.dumps(message).decode())
        while True:  # its replay, up to `synchronized`
            frame = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
            if frame["id"] == op and frame["payload"]["data"]["threadEvents"]["type"] == "synchronized":
                return

    try:
        await subscribe("a")
        await ws.send(orjson.dumps({"id": "a", "type": "complete"}).decode())
        await subscribe("b")  # sent after the complete: the server handled that first
        await client.gql(rename, {"t": thread, "n": "after"})
        frame = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
        assert frame["id"] == "b" and frame["payload"]["data"]["threadEvents"]["type"] == "thread.renamed"
        await subscribe("a")  # the completed id is free again, and replays the rename too
        await client.gql(rename, {"t": thread, "n": "again"})
        got = {orjson.loads(await asyncio.wait_for(ws.recv(), 30))["id"] for _ in range(2)}
        assert got == {"a", "b"}  # one live frame each, nothing for a stale "a"
    finally:
        await ws.close()

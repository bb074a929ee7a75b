"""Stream limits: slow consumers, filtered subscribers' queues, replay bound, subscriptions per connection, origins,
memory."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.runs import TERMINAL, send
from tests.support.server import Client, ServerProcess, serving
from tests.support.ws import PROTOCOL, WsClient, slow_socket
from threadloom.api.ids import decode_as
from threadloom.domain.changes import Change
from threadloom.engine.clock import SystemClock
from threadloom.store import log
from threadloom.store import threads as thread_store
from threadloom.store.db import Database

BIG = """subscription($t: ID!, $after: Int) {
  threadEvents(threadId: $t, afterSequence: $after) {
    sequence type entity { ... on ConversationMessage { text } }
  }
}"""


@pytest.fixture
def small_queue_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    with serving(database_url, tmp_path / "d", {"THREADLOOM_SUBSCRIBER_QUEUE": "20"}) as server:
        yield server


async def _thread(client: Client, tmp_path: Path) -> str:
    data = await client.gql(CREATE_PROJECT, {"name": "limits", "root": workspace(tmp_path)})
    return str((await make_thread(client, data["createProject"]["project"]["id"], "x"))["id"])


async def test_slow_consumer_is_completed_and_can_resume(small_queue_server: ServerProcess, tmp_path: Path) -> None:
    server = small_queue_server
    client = Client(server.url, server.admin_token)
    thread = await _thread(client, tmp_path)
    ws = await slow_socket(server.url)
    await ws.send(orjson.dumps({"type": "connection_init", "payload": {"token": server.admin_token}}).decode())
    assert orjson.loads(await ws.recv())["type"] == "connection_ack"
    start = (await client.gql("query($t: ID!) { thread(id: $t) { latestSequence } }", {"t": thread}))["thread"]
    payload = {"query": BIG, "variables": {"t": thread, "after": start["latestSequence"]}}
    await ws.send(orjson.dumps({"id": "slow", "type": "subscribe", "payload": payload}).decode())
    busy = await send(client, thread, "@await go\n@reply done")  # held: the next messages stay queued
    big = "x" * 150_000
    for _ in range(40):  # ~6 MB of queued messages: more than the socket buffers hold
        queued = await send(client, thread, big, d={"queueAfterActive": True})
        assert queued["appliedDispatch"] == "QUEUE_AFTER_ACTIVE"
    (tmp_path / "ws" / "go").touch()  # the queued runs now run one after another, and their events pile up
    received: list[int] = []
    error: dict[str, Any] | None = None
    while error is None:  # now read what the server managed to send, then its verdict
        message = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
        if message["type"] == "next" and message["payload"].get("errors"):
            error = message["payload"]["errors"][0]
        elif message["type"] == "next":
            item = message["payload"]["data"]["threadEvents"]
            if item["type"] != "synchronized":
                received.append(item["sequence"])
        elif message["type"] == "error":
            error = message["payload"][0]
    # Then the server completes the operation. Read so: a socket closed with a frame unread waits out
    # websockets' 10 s close timeout (it stops reading while its queue of one frame is full).
    assert orjson.loads(await asyncio.wait_for(ws.recv(), 30)) == {"id": "slow", "type": "complete"}
    await ws.close()
    assert error["extensions"]["code"] == "SUBSCRIBER_TOO_SLOW"
    resume = error["extensions"]["resumeFrom"]
    assert resume == (received[-1] if received else start["latestSequence"])
    assert received == list(range(start["latestSequence"] + 1, resume + 1))
    latest = (await client.gql("query($t: ID!) { thread(id: $t) { latestSequence } }", {"t": thread}))["thread"]
    assert latest["latestSequence"] - resume > 20  # it really fell behind
    # Resuming from the cursor yields exactly the rest.
    rest: list[int] = []
    cursor = resume
    while cursor < latest["latestSequence"]:
        again = await WsClient.connect(server.url, server.admin_token)
        op = await again.subscribe(BIG, {"t": thread, "after": cursor})
        synced = False
        while True:
            message = await again.receive()
            if message["type"] == "next" and message["payload"].get("errors"):
                # Too slow again (a loaded machine reads the replay slowly): resume from its cursor once more.
                again_error = message["payload"]["errors"][0]
                assert again_error["extensions"]["code"] == "SUBSCRIBER_TOO_SLOW", again_error
                assert again_error["extensions"]["resumeFrom"] == (rest[-1] if rest else cursor)
                assert (await again.receive()) == {"id": op, "type": "complete"}
                break
            item = message["payload"]["data"]["threadEvents"]
            if item["type"] == "reload_required":
                pytest.fail("the resume gap should stay under the replay bound here")
            if item["type"] == "synchronized":
                synced = True
                break
            rest.append(item["sequence"])
        assert op == "1"
        await again.close()
        cursor = rest[-1] if rest else (latest["latestSequence"] if synced else cursor)
    await client.aclose()
    assert busy["run"]["status"] in ("PREPARING", "QUEUED", "STARTING", "RUNNING")
    everything = received + rest  # gapless and exactly once, through the point it caught up to
    assert everything == list(range(start["latestSequence"] + 1, everything[-1] + 1))
    assert everything[-1] >= latest["latestSequence"]


async def test_replay_bound_and_subscription_limit(database_url: str, tmp_path: Path) -> None:
    env = {"THREADLOOM_MAX_REPLAY": "3", "THREADLOOM_MAX_SUBSCRIPTIONS": "3"}
    server = ServerProcess(database_url, tmp_path / "d", env=env).wait_ready()
    client = Client(server.url, server.admin_token)
    thread = await _thread(client, tmp_path)
    rename = "mutation($t: ID!, $n: String!) { renameThread(input: {threadId: $t, title: $n}) { userErrors { code } } }"
    for i in range(5):
        await client.gql(rename, {"t": thread, "n": f"n{i}"})
    await client.aclose()
    ws = await WsClient.connect(server.url, server.admin_token)
    try:
        # A cursor further back than THREADLOOM_MAX_REPLAY is told to reload and resume from latestSequence.
        op = await ws.subscribe(BIG, {"t": thread, "after": 1})
        item = (await ws.receive())["payload"]["data"]["threadEvents"]
        assert item == {"sequence": 6, "type": "reload_required", "entity": None}
        assert (await ws.receive()) == {"id": op, "type": "complete"}
        near = await ws.subscribe(BIG, {"t": thread, "after": 3})  # within the bound: replayed
        got = [(await ws.receive())["payload"]["data"]["threadEvents"]["sequence"] for _ in range(4)]
        assert got == [4, 5, 6, 6]  # three events, then synchronized at 6
        await ws.ws.send(orjson.dumps({"id": near, "type": "complete"}).decode())
        negative = await ws.subscribe(BIG, {"t": thread, "after": -1})
        refused = await ws.receive()
        assert refused["id"] == negative
        assert refused["payload"]["errors"][0]["extensions"]["code"] == "INVALID_INPUT"
        await ws.close()
        ws = await WsClient.connect(server.url, server.admin_token)  # a fresh connection for the limit
        # From the latest sequence, so they stay live (a full replay would end them with reload_required).
        live = [await ws.subscribe(BIG, {"t": thread, "after": 6}) for _ in range(3)]  # MAX_SUBSCRIPTIONS=3
        fourth = await ws.subscribe(BIG, {"t": thread, "after": 6})
        seen: dict[str, list[str]] = {}
        while fourth not in seen or len(seen) < 4:
            message = await ws.receive()
            seen.setdefault(message["id"], []).append(message["type"])
        assert seen[fourth] == ["error"]
        assert all("error" not in seen[o] for o in live)
    finally:
        await ws.close()
        server.stop()


async def test_cross_origin_websocket_needs_an_allowed_origin(database_url: str, tmp_path: Path) -> None:
    url = None
    allowed = ServerProcess(
        database_url, tmp_path / "o", env={"THREADLOOM_ALLOWED_ORIGINS": "https://dash.example"}
    ).wait_ready()
    try:
        url = allowed.url.replace("http://", "ws://") + "/graphql"
        with pytest.raises(websockets.InvalidStatus) as refused:
            await websockets.connect(url, subprotocols=[PROTOCOL], origin="https://evil.example")  # type: ignore[list-item,arg-type]
        assert refused.value.response.status_code == 403
        ok = await websockets.connect(url, subprotocols=[PROTOCOL], origin="https://dash.example")  # type: ignore[list-item,arg-type]
        await ok.close()
    finally:
        allowed.stop()


STATUSES = "subscription($t: ID!) { runStatus(threadId: $t) { status run { id } } }"


async def _renamed_at_once(database_url: str, thread: str, times: int) -> None:
    """`times` renames of the thread in one commit: events no `runStatus` subscriber receives, which its feed reads
    and hands out in one go (the server learns of them at its next poll)."""
    thread_uuid = decode_as(thread, "Thread", "t")
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.transaction() as tx:
            current = await thread_store.lock(tx, thread_uuid)
            assert current is not None
            changes = [Change("thread.renamed", current.evolve(title=f"r{i}")) for i in range(times)]
            await log.append(tx, changes, project_id=current.project_id, command_id=None, now=SystemClock().now())
    finally:
        await db.dispose()


async def _statuses_until_ended(ws: WsClient, run_id: str) -> list[str]:
    seen = []
    while not seen or seen[-1] not in TERMINAL:
        message = await ws.receive()
        assert message["type"] == "next" and not message["payload"].get("errors"), message
        item = message["payload"]["data"]["runStatus"]
        if item["run"]["id"] == run_id:
            seen.append(item["status"])
    return seen


async def test_a_filtered_subscriber_is_not_charged_for_the_events_it_never_receives(
    small_queue_server: ServerProcess, database_url: str, tmp_path: Path
) -> None:
    server = small_queue_server  # 20 rows per subscriber's queue
    client = Client(server.url, server.admin_token)
    thread = await _thread(client, tmp_path)
    ws = await WsClient.connect(server.url, server.admin_token)
    try:
        await ws.subscribe(STATUSES, {"t": thread})
        first = (await send(client, thread, "@reply one"))["run"]["id"]
        assert (await _statuses_until_ended(ws, first))[-1] == "COMPLETED"  # live now
        await _renamed_at_once(database_url, thread, 100)  # five times its queue, none of them for it
        second = (await send(client, thread, "@reply two"))["run"]["id"]  # behind the renames in the log
        assert (await _statuses_until_ended(ws, second))[-1] == "COMPLETED"  # not cut as SUBSCRIBER_TOO_SLOW
        titles = (await client.gql("query($t: ID!) { thread(id: $t) { title } }", {"t": thread}))["thread"]
        assert titles["title"] == "r99"
    finally:
        await ws.close()
        await client.aclose()

"""SIGTERM while clients stream: every subscription ends with SERVER_GOING_AWAY and the cursor to
resume from, the process exits within its deadline, and resuming on the next server from that
cursor gives exactly the rest of the log — including what the stop itself wrote.

Subscribers of every kind are open at once: the WebSocket fast path, the general path (a
directive keeps a document off the fast path), the project feed, and a multipart HTTP stream.
"""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path
from typing import Any

import orjson

from tests.support.graphql import make_project, make_thread
from tests.support.multipart import subscribe
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient
from threadloom.api.gate import Gate
from threadloom.engine.services import Services

FAST = "subscription($t: ID!, $a: Int) { threadEvents(threadId: $t, afterSequence: $a) { sequence type } }"
GENERAL = """subscription($t: ID!, $a: Int) {
  threadEvents(threadId: $t, afterSequence: $a) { sequence type runId @include(if: true) } }"""
FEED = """subscription($p: ID!, $after: String) { projectThreads(projectId: $p, after: $after) {
  cursor sequence type } }"""
STATE = "query($t: ID!) { thread(id: $t) { status latestSequence } }"
RENAME = 'mutation($t: ID!) { renameThread(input: {threadId: $t, title: "after"}) { userErrors { code } } }'
FEED_CURSOR = "query($p: ID!) { project(id: $p) { feedCursor } }"


class Seen:
    """What one thread subscriber got before the server went away, and how it ended."""

    def __init__(self) -> None:
        self.sequences: list[int] = []
        self.error: dict[str, Any] | None = None
        self.completed = False

    def take(self, payload: dict[str, Any]) -> bool:
        """One `next` payload; True once the subscription's last item (its error) came."""
        if payload.get("errors"):
            self.error = payload["errors"][0]
            return True
        item = payload["data"]["threadEvents"]
        if item["type"] != "synchronized":
            self.sequences.append(item["sequence"])
        return False


async def _ws(client: WsClient, op: str, seen: Seen) -> None:
    async for message in client.items():
        if message.get("id") != op:
            continue
        if message["type"] == "next" and seen.take(message["payload"]):
            continue
        if message["type"] == "complete":
            seen.completed = True
            return


async def _resumed(server: ServerProcess, token: str, query: str, thread: str, after: int) -> list[int]:
    """The sequences a subscription resumed after `after` replays, up to `synchronized`."""
    ws = await WsClient.connect(server.url, token)
    try:
        op = await ws.subscribe(query, {"t": thread, "a": after})
        found: list[int] = []
        async for message in ws.items():
            if message.get("id") == op and message["type"] == "next":
                item = message["payload"]["data"]["threadEvents"]
                if item["type"] == "synchronized":
                    return found
                found.append(item["sequence"])
        raise AssertionError("the resumed stream ended before `synchronized`")
    finally:
        await ws.close()


async def test_sigterm_ends_every_subscription_with_a_cursor_that_loses_nothing(
    database_url: str, tmp_path: Path
) -> None:
    first = ServerProcess(database_url, tmp_path / "first", env={"THREADLOOM_SHUTDOWN_SECONDS": "8"}).wait_ready()
    token = str(first.admin_token)
    client = Client(first.url, token)
    sockets: list[WsClient] = []
    try:
        project = await make_project(client, "going away")
        thread = (await make_thread(client, project, "t"))["id"]
        done = await send(client, thread, "@reply one")
        assert (await finished(client, done["run"]["id"]))["status"] == "COMPLETED"
        feed_cursor = (await client.gql(FEED_CURSOR, {"p": project}))["project"]["feedCursor"]

        fast, general, feed = [await WsClient.connect(first.url, token) for _ in range(3)]
        sockets += [fast, general, feed]
        fast_op = await fast.subscribe(FAST, {"t": thread, "a": 0})
        general_op = await general.subscribe(GENERAL, {"t": thread, "a": 0})
        feed_op = await feed.subscribe(FEED, {"p": project, "after": feed_cursor})
        seen = {"fast": Seen(), "general": Seen(), "http": Seen()}
        feed_items: list[dict[str, Any]] = []

        async def feed_reader() -> None:
            async for message in feed.items():
                if message.get("id") == feed_op and message["type"] == "next":
                    feed_items.append(message["payload"])
                elif message.get("id") == feed_op and message["type"] == "complete":
                    return

        async with subscribe(first, token, FAST, {"t": thread, "a": 0}) as parts:

            async def http_reader() -> None:
                async for part in parts.items():
                    seen["http"].take(part["payload"])

            readers = [
                asyncio.create_task(_ws(fast, fast_op, seen["fast"])),
                asyncio.create_task(_ws(general, general_op, seen["general"])),
                asyncio.create_task(http_reader()),
                asyncio.create_task(feed_reader()),
            ]
            # A run is active when the server stops: its end is written after the subscriptions ended.
            active = await send(client, thread, "@delay 60000\n@reply never")

            async def running() -> bool:
                state = (await client.gql(STATE, {"t": thread}))["thread"]
                return state["status"] == "RUNNING" and all(
                    s.sequences and s.sequences[-1] == state["latestSequence"] for s in seen.values()
                )

            await until(running)
            first.proc.send_signal(signal.SIGTERM)
            await asyncio.wait_for(asyncio.gather(*readers), 30)
            assert await asyncio.to_thread(first.proc.wait, 30) == 0
    finally:
        first.stop()
        await client.aclose()
        for socket in sockets:
            await socket.close()

    for name, got in seen.items():
        assert got.error is not None, name
        assert got.error["extensions"]["code"] == "SERVER_GOING_AWAY", (name, got.error)
        assert got.error["extensions"]["resumeFrom"] == got.sequences[-1], name  # nothing queued was lost
    assert seen["fast"].completed and seen["general"].completed
    feed_end = feed_items[-1]["errors"][0]["extensions"]
    assert feed_end["code"] == "SERVER_GOING_AWAY" and isinstance(feed_end["resumeFrom"], str)

    second = ServerProcess(database_url, tmp_path / "second").wait_ready()
    client = Client(second.url, token)
    try:
        stopped = await finished(client, active["run"]["id"])  # the stop failed the active turn
        assert stopped["status"] == "FAILED"
        latest = (await client.gql(STATE, {"t": thread}))["thread"]["latestSequence"]
        assert latest > seen["fast"].sequences[-1]  # the stop wrote after the subscriptions ended
        for name, got in seen.items():
            resume = got.error["extensions"]["resumeFrom"]  # type: ignore[index]
            rest = await _resumed(second, token, GENERAL if name == "general" else FAST, thread, resume)
            assert got.sequences + rest == list(range(1, latest + 1)), name  # no gap, no duplicate
        # The project feed resumes from its cursor too: nothing before it comes again, the next change comes.
        before = [item["data"]["projectThreads"]["sequence"] for item in feed_items[:-1]]
        ws = await WsClient.connect(second.url, token)
        try:
            op = await ws.subscribe(FEED, {"p": project, "after": feed_end["resumeFrom"]})
            assert (await client.gql(RENAME, {"t": thread}))["renameThread"]["userErrors"] == []
            renamed = (await client.gql(STATE, {"t": thread}))["thread"]["latestSequence"]
            resumed: list[int] = []
            while renamed not in resumed:
                message = await ws.receive()
                assert message["id"] == op and message["type"] == "next", message
                resumed.append(message["payload"]["data"]["projectThreads"]["sequence"])
            assert not set(resumed) & set(before)
        finally:
            await ws.close()
    finally:
        await client.aclose()
        second.stop()


async def test_a_draining_server_refuses_new_requests_and_sockets(services: Services) -> None:
    """Between SIGTERM and exit, a request on a kept-alive connection gets a typed 503 to retry
    elsewhere and a new WebSocket is refused; neither reaches the API."""
    reached: list[str] = []

    async def api(scope: Any, receive: Any, send: Any) -> None:
        reached.append(scope["type"])

    gate = Gate(api, services)
    gate.draining = True
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b'{"query": "{ viewer { scope } }"}', "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await gate({"type": "http", "method": "POST", "path": "/graphql", "headers": []}, receive, send)
    assert sent[0]["status"] == 503 and (b"retry-after", b"1") in sent[0]["headers"]
    assert orjson.loads(sent[1]["body"])["errors"][0]["extensions"]["code"] == "SERVER_GOING_AWAY"
    sent.clear()
    await gate({"type": "websocket", "path": "/graphql", "headers": []}, receive, send)
    assert sent == [{"type": "websocket.close", "code": 1013, "reason": "server going away"}]
    assert reached == []

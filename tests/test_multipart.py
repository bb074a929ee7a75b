"""Subscriptions over HTTP: `Accept: multipart/mixed;subscriptionSpec=1.0`, against a real server.

The same replay, `synchronized` marker, live items, cursor resume, auth, per-token cap and
NOT_FOUND as over a WebSocket; the items are compared with the WebSocket's.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.cli import create_token, threadloom
from tests.support.graphql import make_project, make_thread
from tests.support.multipart import MULTIPART, Parts, subscribe
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, serving
from tests.support.waiting import until
from tests.support.ws import WsClient

EVENTS = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
  sequence type runId entity { __typename ... on ConversationMessage { role text } ... on Run { status } } } }"""
CAP = 2


@pytest.fixture
def server(database_url: str, data_dir: Path) -> Iterator[ServerProcess]:
    with serving(database_url, data_dir, {"THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN": str(CAP)}) as proc:
        yield proc


async def until_synchronized(parts: Parts) -> list[dict[str, Any]]:
    """The replayed items, up to and without the `synchronized` marker."""
    replay = []
    async for part in parts.items():
        item = part["payload"]["data"]["threadEvents"]
        if item["type"] == "synchronized":
            return replay
        replay.append(item)
    raise AssertionError("the stream ended before `synchronized`")


async def ws_replay(server: ServerProcess, token: str, thread: str, after: int | None) -> list[dict[str, Any]]:
    ws = await WsClient.connect(server.url, token)
    try:
        op = await ws.subscribe(EVENTS, {"t": thread, "after": after})
        items = []
        async for message in ws.items():
            assert message["id"] == op and message["type"] == "next", message
            item = message["payload"]["data"]["threadEvents"]
            if item["type"] == "synchronized":
                return items
            items.append(item)
    finally:
        await ws.close()
    raise AssertionError("unreachable")


async def test_replay_live_and_resume_match_the_websocket(server: ServerProcess, client: Client) -> None:
    assert server.admin_token
    thread = (await make_thread(client, await make_project(client)))["id"]
    first = await send(client, thread, "@reply one")
    await finished(client, first["run"]["id"])

    async with subscribe(server, server.admin_token, EVENTS, {"t": thread, "after": 0}) as parts:
        assert parts.response.status_code == 200
        assert parts.response.headers["content-type"].startswith("multipart/mixed")
        replay = await until_synchronized(parts)
        # Byte for byte what a WebSocket replays (same orjson encoding, same items).
        assert replay == await ws_replay(server, server.admin_token, thread, 0)
        assert [i["sequence"] for i in replay] == list(range(1, len(replay) + 1))
        second = await send(client, thread, "@reply two")
        live = []
        async for part in parts.items():
            item = part["payload"]["data"]["threadEvents"]
            live.append(item)
            if item["runId"] == second["run"]["id"] and (item["entity"] or {}).get("status") == "COMPLETED":
                break
        assert [i["sequence"] for i in live] == list(range(len(replay) + 1, len(replay) + 1 + len(live)))
        assert {"__typename": "ConversationMessage", "role": "ASSISTANT", "text": "two"} in [i["entity"] for i in live]
    last = live[-1]["sequence"]

    # Disconnected: a third run happens unseen; resuming from the last cursor gets exactly it.
    third = await send(client, thread, "@reply three")
    await finished(client, third["run"]["id"])
    async with subscribe(server, server.admin_token, EVENTS, {"t": thread, "after": last}) as parts:
        missed = await until_synchronized(parts)
    everything = await ws_replay(server, server.admin_token, thread, 0)
    assert missed == [i for i in everything if i["sequence"] > last]
    assert {"__typename": "ConversationMessage", "role": "ASSISTANT", "text": "three"} in [i["entity"] for i in missed]


async def test_auth_and_another_projects_token(server: ServerProcess, client: Client, database_url: str) -> None:
    thread = (await make_thread(client, await make_project(client)))["id"]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        body = {"query": EVENTS, "variables": {"t": thread}}
        for headers in ({}, {"authorization": "Bearer tl_nope"}):
            refused = await http.post("/graphql", json=body, headers={"accept": MULTIPART, **headers})
            assert refused.status_code == 401
            assert refused.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"

    other = await make_project(client, "Other")
    _, stranger = create_token(database_url, "admin", other)
    async with subscribe(server, stranger, EVENTS, {"t": thread}) as parts:
        over_http = [part async for part in parts.items()]
    ws = await WsClient.connect(server.url, stranger)
    try:
        op = await ws.subscribe(EVENTS, {"t": thread})
        over_ws = await ws.receive()
    finally:
        await ws.close()
    assert over_ws["id"] == op
    errors = over_ws["payload"] if over_ws["type"] == "error" else over_ws["payload"]["errors"]
    assert over_http == [{"payload": {"errors": errors}}]  # nothing ran: no `data` entry, as over plain HTTP
    assert errors[0]["message"] == "not found" and errors[0]["extensions"]["code"] == "NOT_FOUND"
    assert parts.ended


async def test_cap_is_shared_with_websockets_and_released(server: ServerProcess, client: Client) -> None:
    token = server.admin_token
    assert token
    thread = (await make_thread(client, await make_project(client)))["id"]
    async with contextlib.AsyncExitStack() as stack:
        held = [await stack.enter_async_context(subscribe(server, token, EVENTS, {"t": thread})) for _ in range(CAP)]
        for parts in held:  # kept referenced: a collected reader would close its stream
            await until_synchronized(parts)
        async with subscribe(server, token, EVENTS, {"t": thread}) as refused:
            assert refused.response.status_code == 429
            body = orjson.loads(await refused.response.aread())
            assert body["errors"][0]["extensions"]["code"] == "TOO_MANY_SUBSCRIPTIONS"
        ws = await WsClient.connect(server.url, token)
        try:
            op = await ws.subscribe(EVENTS, {"t": thread})
            message = await ws.receive()
            assert message["id"] == op and message["type"] == "error"
            assert message["payload"][0]["extensions"]["code"] == "TOO_MANY_SUBSCRIPTIONS"
        finally:
            await ws.close()

    # The streams are closed: their slots are free again (the server counts them down on disconnect).
    async def opens() -> bool:
        async with subscribe(server, token, EVENTS, {"t": thread}) as parts:
            if parts.response.status_code == 429:
                return False
            await until_synchronized(parts)
            return True

    assert await until(opens)


async def test_revoked_token_ends_the_stream(server: ServerProcess, client: Client, database_url: str) -> None:
    project = await make_project(client)
    thread = (await make_thread(client, project))["id"]
    token_id, secret = create_token(database_url, "read", project)
    async with subscribe(server, secret, EVENTS, {"t": thread}) as parts:
        await until_synchronized(parts)
        done = threadloom(database_url, "token", "revoke", token_id)
        assert done.returncode == 0, done.stderr
        rest = [part async for part in parts.items()]
    assert rest == [
        {
            "payload": None,
            "errors": [{"message": "token revoked or expired", "extensions": {"code": "UNAUTHENTICATED"}}],
        }
    ]
    assert parts.ended


async def test_plain_http_subscription_is_still_refused(server: ServerProcess, client: Client) -> None:
    thread = (await make_thread(client, await make_project(client)))["id"]
    response = await client.post(EVENTS, {"t": thread}, headers={"accept": "application/json"})
    assert response.status_code == 400
    assert response.json()["errors"][0]["extensions"]["code"] == "SUBSCRIPTION_OVER_HTTP"

"""Subscriptions over server-sent events (graphql-sse, distinct connections mode) against a real server.

A client POSTs (or GETs) the subscription with `Accept: text/event-stream` and reads `next` events, each a
GraphQL result, until `complete`. The stream is the one a WebSocket or a multipart request gets: the same
replay and `synchronized` marker, live items, authorization (another project's thread is NOT_FOUND, its
owner's token reads it), the per-token cap shared with the other transports, and the end on revocation.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.cli import create_token, threadloom
from tests.support.graphql import make_project, make_thread
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, serving
from tests.support.ws import WsClient

EVENTS = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
  sequence type runId entity { __typename ... on ConversationMessage { role text } ... on Run { status } } } }"""
SSE = "text/event-stream"
CAP = 2


@pytest.fixture
def server(database_url: str, data_dir: Path) -> Iterator[ServerProcess]:
    with serving(database_url, data_dir, {"THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN": str(CAP)}) as proc:
        yield proc


class Events:
    """The events of one SSE response as a graphql-sse client reads them (comments, the heartbeats, skipped)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._lines = response.aiter_lines()
        self.completed = False

    async def next(self) -> tuple[str, Any] | None:
        """(event name, decoded data) of the next event; None when the response ended."""
        name, data = "message", list[str]()
        async for line in self._lines:
            if line == "":
                if data or name != "message":
                    text = "\n".join(data)
                    if name == "complete":
                        self.completed = True
                    return name, json.loads(text) if text else None
                continue
            if line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value.removeprefix(" ")
            if field == "event":
                name = value
            elif field == "data":
                data.append(value)
        return None

    async def results(self) -> AsyncIterator[dict[str, Any]]:
        """The `next` payloads up to `complete` (which must come before the response ends)."""
        while (event := await self.next()) is not None:
            name, data = event
            if name == "complete":
                return
            assert name == "next", event
            yield data
        raise AssertionError("the stream ended without a `complete` event")


@contextlib.asynccontextmanager
async def subscribe(
    server: ServerProcess, token: str | None, variables: dict[str, Any], method: str = "POST"
) -> AsyncIterator[Events]:
    headers = {"accept": SSE, **({"authorization": f"Bearer {token}"} if token else {})}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        if method == "GET":
            params = {"query": EVENTS, "variables": json.dumps(variables)}
            request = http.stream("GET", "/graphql", params=params, headers=headers)
        else:
            request = http.stream("POST", "/graphql", json={"query": EVENTS, "variables": variables}, headers=headers)
        async with request as response:
            yield Events(response)


async def until_synchronized(events: Events) -> list[dict[str, Any]]:
    replay: list[dict[str, Any]] = []
    async for result in events.results():
        item = result["data"]["threadEvents"]
        if item["type"] == "synchronized":
            return replay
        replay.append(item)
    raise AssertionError("completed before `synchronized`")


async def ws_replay(server: ServerProcess, token: str, thread: str) -> list[dict[str, Any]]:
    ws = await WsClient.connect(server.url, token)
    try:
        await ws.subscribe(EVENTS, {"t": thread, "after": 0})
        items: list[dict[str, Any]] = []
        async for message in ws.items():
            item = message["payload"]["data"]["threadEvents"]
            if item["type"] == "synchronized":
                return items
            items.append(item)
    finally:
        await ws.close()
    raise AssertionError("unreachable")


async def test_an_sse_subscription_replays_follows_live_and_completes_when_its_token_is_revoked(
    server: ServerProcess, client: Client, database_url: str
) -> None:
    project = await make_project(client)
    thread = (await make_thread(client, project))["id"]
    await finished(client, (await send(client, thread, "@reply one"))["run"]["id"])
    token_id, reader = create_token(database_url, "read", project)

    async with subscribe(server, reader, {"t": thread, "after": 0}) as events:
        assert events.response.status_code == 200
        assert events.response.headers["content-type"].startswith(SSE)
        replay = await until_synchronized(events)
        assert replay == await ws_replay(server, reader, thread)  # the WebSocket's replay, item for item
        assert {"__typename": "ConversationMessage", "role": "ASSISTANT", "text": "one"} in [
            i["entity"] for i in replay
        ]

        second = await send(client, thread, "@reply two")
        live = []
        async for result in events.results():
            item = result["data"]["threadEvents"]
            live.append(item)
            if item["runId"] == second["run"]["id"] and (item["entity"] or {}).get("status") == "COMPLETED":
                break
        assert [i["sequence"] for i in live] == list(range(len(replay) + 1, len(replay) + 1 + len(live)))
        assert {"__typename": "ConversationMessage", "role": "ASSISTANT", "text": "two"} in [i["entity"] for i in live]

        revoked = threadloom(database_url, "token", "revoke", token_id)
        assert revoked.returncode == 0, revoked.stderr
        rest = [result async for result in events.results()]
        # What the run still logged after COMPLETED (activity, thread update), then the revocation, then `complete`.
        assert [list(result) for result in rest[:-1]] == [["data"]] * (len(rest) - 1)
        assert rest[-1] == {
            "errors": [{"message": "token revoked or expired", "extensions": {"code": "UNAUTHENTICATED"}}]
        }
        assert events.completed
        assert await events.next() is None  # and the response ends there


async def test_another_projects_token_is_refused_and_the_owners_twin_reads_the_thread(
    server: ServerProcess, client: Client, database_url: str
) -> None:
    project = await make_project(client, "Mine")
    thread = (await make_thread(client, project))["id"]
    _, stranger = create_token(database_url, "admin", await make_project(client, "Other"))
    _, owner = create_token(database_url, "admin", project)

    async with subscribe(server, stranger, {"t": thread}) as events:
        refused = [result async for result in events.results()]
        assert events.completed
    # One `next` with the error and no `data` (nothing ran, as over a WebSocket), then `complete`.
    assert len(refused) == 1 and list(refused[0]) == ["errors"], refused
    assert [(e["message"], e["extensions"]["code"]) for e in refused[0]["errors"]] == [("not found", "NOT_FOUND")]

    async with subscribe(server, owner, {"t": thread}) as events:
        assert [item["type"] for item in await until_synchronized(events)] == ["thread.created"]

    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for headers in ({}, {"authorization": "Bearer tl_nope"}):
            body = {"query": EVENTS, "variables": {"t": thread}}
            response = await http.post("/graphql", json=body, headers={"accept": SSE, **headers})
            assert (
                response.status_code == 401 and response.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
            )


async def test_a_get_subscription_streams_and_a_mutation_over_get_is_still_refused(
    server: ServerProcess, client: Client
) -> None:
    thread = (await make_thread(client, await make_project(client)))["id"]
    async with subscribe(server, server.admin_token, {"t": thread}, method="GET") as events:
        assert events.response.status_code == 200
        assert [item["type"] for item in await until_synchronized(events)] == ["thread.created"]
    mutation = 'mutation($t: ID!) { sendMessage(input: {threadId: $t, text: "@reply no"}) { run { id } } }'
    response = await client.http.get(
        "/graphql",
        params={"query": mutation, "variables": json.dumps({"t": thread})},
        headers={**client.headers(), "accept": SSE},
    )
    assert response.status_code == 405 and response.headers["allow"] == "POST"
    assert response.json()["errors"][0]["extensions"]["code"] == "MUTATION_OVER_GET"
    runs = await client.gql("query($t: ID!) { node(id: $t) { ... on Thread { runs { totalCount } } } }", {"t": thread})
    assert runs["node"]["runs"]["totalCount"] == 0


async def test_sse_streams_count_against_the_token_cap_shared_with_websockets(
    server: ServerProcess, client: Client
) -> None:
    token = server.admin_token
    assert token
    thread = (await make_thread(client, await make_project(client)))["id"]
    async with contextlib.AsyncExitStack() as stack:
        held = [await stack.enter_async_context(subscribe(server, token, {"t": thread})) for _ in range(CAP)]
        for events in held:
            await until_synchronized(events)
        async with subscribe(server, token, {"t": thread}) as refused:
            assert refused.response.status_code == 429
            body = json.loads(await refused.response.aread())
            assert body["errors"][0]["extensions"]["code"] == "TOO_MANY_SUBSCRIPTIONS"
        ws = await WsClient.connect(server.url, token)
        try:
            op = await ws.subscribe(EVENTS, {"t": thread})
            message = await ws.receive()
            assert message["id"] == op and message["type"] == "error"
            assert message["payload"][0]["extensions"]["code"] == "TOO_MANY_SUBSCRIPTIONS"
        finally:
            await ws.close()

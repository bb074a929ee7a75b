"""Tokens against a real server: revocation and expiry on open sockets, per-token caps, rate limits,
WebSocket message sizes and subscriptions sent over plain HTTP.

Written from the client's side: what a holder of a token sees when it is revoked, expires, or is
used harder than its limits allow — and that a refused request changed nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import websockets

from tests.support.cli import create_token, threadloom
from tests.support.graphql import CREATE_PROJECT, CREATE_THREAD
from tests.support.server import Client, ServerProcess
from tests.support.ws import PROTOCOL, WsClient

EVENTS = "subscription($t: ID!) { threadEvents(threadId: $t) { sequence type } }"
RENAME = """mutation($t: ID!, $n: String!) { renameThread(input: {threadId: $t, title: $n}) {
  thread { title } userErrors { code } } }"""
SEND = """mutation($t: ID!, $text: String!) { sendMessage(input: {threadId: $t, text: $text}) {
  run { id } userErrors { code } } }"""
TITLE = "query($t: ID!) { thread(id: $t) { title runs { totalCount } } }"


async def _project_and_thread(client: Client, root: Path) -> tuple[str, str]:
    root.mkdir(parents=True, exist_ok=True)  # noqa: ASYNC240 (test setup, instant)
    made = await client.gql(CREATE_PROJECT, {"name": "sec", "root": str(root)})
    project = made["createProject"]["project"]["id"]
    thread = await client.gql(CREATE_THREAD, {"projectId": project, "title": "before"})
    return project, thread["createThread"]["thread"]["id"]


async def _synchronized(ws: WsClient, op: str) -> None:
    """Read this socket until subscription `op` says it has caught up."""
    while True:
        message = await ws.receive()
        if message.get("id") == op and message["type"] == "next":
            if message["payload"]["data"]["threadEvents"]["type"] == "synchronized":
                return
        elif message.get("id") == op:
            raise AssertionError(message)


async def _closed(ws: websockets.ClientConnection, within: float) -> int | None:
    """Wait (reading and dropping messages) until the server closes the socket; its close code."""

    async def drain() -> None:
        try:
            while True:
                await ws.recv()
        except websockets.ConnectionClosed:
            return

    await asyncio.wait_for(drain(), within)
    return ws.close_code


async def _title(client: Client, thread: str) -> dict[str, Any]:
    found: dict[str, Any] = (await client.gql(TITLE, {"t": thread}))["thread"]
    return found


@pytest.fixture
def limited_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    env = {
        "THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN": "3",
        "THREADLOOM_MAX_CONNECTIONS_PER_TOKEN": "2",
        "THREADLOOM_MUTATION_BURST": "3",
        "THREADLOOM_MUTATIONS_PER_MINUTE": "1",
        "THREADLOOM_RUN_START_BURST": "1",
        "THREADLOOM_RUN_STARTS_PER_MINUTE": "1",
    }
    server = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
    yield server
    server.stop()
    print(server.report(40))


async def test_revoked_token_socket_is_closed_and_its_mutation_refused(
    server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    project, thread = await _project_and_thread(client, tmp_path / "ws")
    watcher_id, watcher_token = create_token(database_url, "operate", project)
    writer_id, writer_token = create_token(database_url, "operate", project)
    watching = await WsClient.connect(server.url, watcher_token)
    writing = await WsClient.connect(server.url, writer_token)
    try:
        op = await watching.subscribe(EVENTS, {"t": thread})
        await _synchronized(watching, op)

        # A live subscription of a revoked token is ended and its socket closed with 4403 within 2 s.
        assert threadloom(database_url, "token", "revoke", watcher_id).returncode == 0
        assert await _closed(watching.ws, within=2.0) == 4403

        # A mutation sent on a socket whose token was just revoked is not run: the socket is closed.
        assert threadloom(database_url, "token", "revoke", writer_id).returncode == 0
        await writing.ws.send(
            orjson.dumps(
                {"id": "m", "type": "subscribe", "payload": {"query": RENAME, "variables": {"t": thread, "n": "evil"}}}
            ).decode()
        )
        assert await _closed(writing.ws, within=2.0) == 4403
    finally:
        await watching.close()
        await writing.close()
    assert (await _title(client, thread))["title"] == "before"
    # …and the revoked token cannot open a new socket.
    with pytest.raises(websockets.ConnectionClosed) as refused:
        await WsClient.connect(server.url, writer_token)
    assert refused.value.rcvd is not None and refused.value.rcvd.code == 4403


async def test_a_socket_opened_just_after_a_revocation_does_not_outlive_it(
    server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    """A socket's token verdict younger than a second serves the next socket of that token without a lookup;
    a socket let in on it after a revocation is closed with the others, and nothing it sends runs."""
    project, thread = await _project_and_thread(client, tmp_path / "ws")
    token_id, token = create_token(database_url, "operate", project)
    first = await WsClient.connect(server.url, token)
    try:
        op = await first.subscribe(EVENTS, {"t": thread})
        await _synchronized(first, op)
        second = await WsClient.connect(server.url, token)  # admitted on the first socket's verdict
        await second.close()

        assert threadloom(database_url, "token", "revoke", token_id).returncode == 0
        try:
            late = await WsClient.connect(server.url, token)
        except websockets.ConnectionClosed as refused:  # the watcher had already seen the revocation
            assert refused.rcvd is not None and refused.rcvd.code == 4403
        else:
            rename = {"query": RENAME, "variables": {"t": thread, "n": "evil"}}
            await late.ws.send(orjson.dumps({"id": "m", "type": "subscribe", "payload": rename}).decode())
            assert await _closed(late.ws, within=2.0) == 4403
        assert await _closed(first.ws, within=2.0) == 4403
    finally:
        await first.close()
    assert (await _title(client, thread))["title"] == "before"
    with pytest.raises(websockets.ConnectionClosed) as refused_after:
        await WsClient.connect(server.url, token)
    assert refused_after.value.rcvd is not None and refused_after.value.rcvd.code == 4403


async def test_expired_token_is_refused_on_http_and_websocket(
    server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    project, thread = await _project_and_thread(client, tmp_path / "ws")
    bad = threadloom(database_url, "token", "create", "--scope", "read", "--expires-in", "soon")
    assert bad.returncode == 2 and "not a duration" in bad.stderr
    later = threadloom(database_url, "token", "create", "--scope", "read", "--expires-in", "1h")
    assert later.returncode == 0, later.stderr
    later_id = later.stdout.split()[2]
    # Used at once after it is made (the command returns right after its commit).
    made = threadloom(database_url, "token", "create", "--scope", "read", "--project", project, "--expires-in", "5s")
    assert made.returncode == 0, made.stderr
    token_id, token = made.stdout.split()[2], made.stdout.strip().splitlines()[-1]
    assert "expires=" in made.stdout and "expires=never" not in made.stdout
    reader = Client(server.url, token)
    ws = await WsClient.connect(server.url, token)
    try:
        assert (await reader.post("{ viewer { scope } }")).status_code == 200
        op = await ws.subscribe(EVENTS, {"t": thread})
        await _synchronized(ws, op)
        # The open socket is closed when the token expires…
        assert await _closed(ws.ws, within=15.0) == 4403
        # …and from then on the token is refused everywhere.
        refused = await reader.post("{ viewer { scope } }")
        assert refused.status_code == 401
        assert refused.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await WsClient.connect(server.url, token)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    finally:
        await ws.close()
        await reader.aclose()
    listed = threadloom(database_url, "token", "list").stdout.splitlines()
    assert any(line.startswith(token_id) and " expired " in line for line in listed)
    assert any(line.startswith(later_id) and "active, expires " in line for line in listed)


async def test_connections_and_subscriptions_are_capped_per_token(
    limited_server: ServerProcess, database_url: str, tmp_path: Path
) -> None:
    server = limited_server
    admin = Client(server.url, server.admin_token)
    project, thread = await _project_and_thread(admin, tmp_path / "ws")
    await admin.aclose()
    _, token = create_token(database_url, "read", project)
    _, other = create_token(database_url, "read", project)
    first = await WsClient.connect(server.url, token)
    second = await WsClient.connect(server.url, token)
    sockets = [first, second]
    try:
        # THREADLOOM_MAX_CONNECTIONS_PER_TOKEN=2: a third socket of the same token is closed with 4429.
        url = server.url.replace("http://", "ws://") + "/graphql"
        third = await websockets.connect(url, subprotocols=[PROTOCOL])  # type: ignore[list-item]
        await third.send(
            orjson.dumps({"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}).decode()
        )
        assert await _closed(third, within=10.0) == 4429

        # THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN=3, counted over both sockets.
        for ws in (first, first, second):
            await _synchronized(ws, await ws.subscribe(EVENTS, {"t": thread}))
        over = await second.subscribe(EVENTS, {"t": thread})
        refused = await second.receive()
        assert refused["id"] == over and refused["type"] == "error"
        assert refused["payload"][0]["extensions"]["code"] == "TOO_MANY_SUBSCRIPTIONS"

        # Another token is not affected; closing a socket frees its share.
        theirs = await WsClient.connect(server.url, other)
        sockets.append(theirs)
        await _synchronized(theirs, await theirs.subscribe(EVENTS, {"t": thread}))
        await first.close()
        again = await WsClient.connect(server.url, token)
        sockets.append(again)
        await _synchronized(again, await again.subscribe(EVENTS, {"t": thread}))
    finally:
        for ws in sockets:
            await ws.close()


async def test_rate_limits_refuse_with_retry_after_and_change_nothing(
    limited_server: ServerProcess, database_url: str, tmp_path: Path
) -> None:
    server = limited_server
    admin = Client(server.url, server.admin_token)
    project, thread = await _project_and_thread(admin, tmp_path / "ws")
    _, renamer_token = create_token(database_url, "operate", project)
    _, sender_token = create_token(database_url, "operate", project)
    renamer = Client(server.url, renamer_token)
    sender = Client(server.url, sender_token)
    try:
        # THREADLOOM_MUTATION_BURST=3: three renames pass, the fourth is refused as a whole.
        for i in range(3):
            assert (await renamer.gql(RENAME, {"t": thread, "n": f"n{i}"}))["renameThread"]["userErrors"] == []
        response = await renamer.post(RENAME, {"t": thread, "n": "too many"})
        assert response.status_code == 429
        assert int(response.headers["retry-after"]) > 0
        body = response.json()
        error = body["errors"][0]
        assert error["extensions"]["code"] == "RATE_LIMITED"
        assert error["extensions"]["retryAfter"] == int(response.headers["retry-after"])
        assert body.get("data") is None
        assert (await _title(admin, thread))["title"] == "n2"
        # The same limit holds on a WebSocket, as an error of the operation.
        ws = await WsClient.connect(server.url, renamer_token)
        try:
            op = await ws.subscribe(RENAME, {"t": thread, "n": "over ws"})
            answer = await ws.receive()
            assert answer["id"] == op
            assert answer["payload"]["errors"][0]["extensions"]["code"] == "RATE_LIMITED"
        finally:
            await ws.close()
        assert (await _title(admin, thread))["title"] == "n2"

        # THREADLOOM_RUN_START_BURST=1: a second message that would start agent work is refused.
        first = await sender.gql(SEND, {"t": thread, "text": "hello"})
        assert first["sendMessage"]["userErrors"] == []
        again = await sender.post(SEND, {"t": thread, "text": "again"})
        assert again.status_code == 429
        assert again.json()["errors"][0]["extensions"]["code"] == "RATE_LIMITED"
        assert (await _title(admin, thread))["runs"]["totalCount"] == 1
        # A token's limits are its own: the sender may still rename (its mutation bucket is not empty).
        renamed = await sender.gql(RENAME, {"t": thread, "n": "sender"})
        assert renamed["renameThread"]["userErrors"] == []
    finally:
        await renamer.aclose()
        await sender.aclose()
        await admin.aclose()


async def test_oversized_websocket_messages_are_refused_before_parsing(server: ServerProcess, client: Client) -> None:
    url = server.url.replace("http://", "ws://") + "/graphql"
    # A 15 MiB connection_init with a bad token: refused for its size (1009), never parsed (that would be 4403).
    raw = await websockets.connect(url, subprotocols=[PROTOCOL], max_size=None)  # type: ignore[list-item]
    huge = orjson.dumps(
        {"type": "connection_init", "payload": {"authorization": "Bearer nope", "pad": "x" * (15 << 20)}}
    )
    with contextlib.suppress(websockets.ConnectionClosed):  # the server may close while we still send
        await raw.send(huge.decode())
    assert await _closed(raw, within=30.0) == 1009

    # An authenticated socket sending a message over 256 KiB is closed the same way…
    ws = await WsClient.connect(server.url, server.admin_token)
    big = "query { viewer { scope } } #" + "x" * (300 << 10)
    with contextlib.suppress(websockets.ConnectionClosed):
        await ws.ws.send(orjson.dumps({"id": "1", "type": "subscribe", "payload": {"query": big}}).decode())
    assert await _closed(ws.ws, within=30.0) == 1009

    # …while the server keeps serving everyone else, on both transports.
    fine = await WsClient.connect(server.url, server.admin_token)
    try:
        op = await fine.subscribe("query { viewer { scope } }")
        assert (await fine.receive()) == {"id": op, "type": "next", "payload": {"data": {"viewer": {"scope": "ADMIN"}}}}
    finally:
        await fine.close()
    assert (await client.gql("{ viewer { scope } }"))["viewer"]["scope"] == "ADMIN"


async def test_subscription_over_plain_http_is_a_coded_400(server: ServerProcess, client: Client) -> None:
    query = 'subscription { threadEvents(threadId: "VGhyZWFkOjA") { sequence } }'
    for accept in ("application/json", "application/graphql-response+json"):
        response = await client.post(query, headers={"accept": accept})
        assert response.status_code == 400
        assert response.json()["errors"][0]["extensions"]["code"] == "SUBSCRIPTION_OVER_HTTP"
    by_get = await client.http.get("/graphql", params={"query": query}, headers=client.headers())
    assert by_get.status_code == 400
    assert by_get.json()["errors"][0]["extensions"]["code"] == "SUBSCRIPTION_OVER_HTTP"
    # Queries and mutations are unaffected.
    assert (await client.gql("{ viewer { scope } }"))["viewer"]["scope"] == "ADMIN"
    server.stop()
    assert not any("Traceback" in line for line in server.log), "\n".join(server.log)


def test_token_buckets_take_all_or_nothing() -> None:
    """The arithmetic behind RATE_LIMITED: a refusal charges no bucket and names the wait."""
    from threadloom.domain.rate_limits import Bucket, Rate, take_all

    mutations, starts = Rate(per_minute=60, burst=2), Rate(per_minute=6, burst=1)
    m, s = Bucket.full(mutations, 0.0), Bucket.full(starts, 0.0)
    assert take_all([(m, mutations, 1), (s, starts, 1)], now=0.0) == 0
    # The run-start bucket is empty: refused, and the mutation bucket keeps its token.
    assert take_all([(m, mutations, 1), (s, starts, 1)], now=0.0) == 10
    assert m.level == 1.0
    assert take_all([(m, mutations, 1), (s, starts, 0)], now=0.0) == 0
    assert take_all([(m, mutations, 1), (s, starts, 0)], now=0.5) == 1  # half a token back: wait 1 s (rounded up)
    assert take_all([(m, mutations, 1), (s, starts, 1)], now=10.0) == 0  # both refilled
    assert take_all([(m, mutations, 1)], now=1000.0) == 0 and m.level == 1.0  # never above the burst

"""Subscriptions over HTTP (multipart and SSE) are bounded in bytes like WebSocket ones (docs/security.md).

A subscription over HTTP takes the general path: its rows wait in the hub's mailbox, counted in bytes against
the subscriber (`THREADLOOM_SUBSCRIBER_QUEUE_BYTES`) and its token (`THREADLOOM_TOKEN_QUEUE_BYTES`); past the
mailbox there is only strawberry's one-item hand-over to the response and uvicorn's transport, whose `send`
waits once the peer stops reading. So a client that never reads is ended with SUBSCRIBER_TOO_SLOW and its
cursor, and the server holds at most the bounds for it.

One real server for the module, with small byte bounds. A read token opens 5 multipart and 5 SSE streams of
`threadEvents` with the node's output on connections that never read (a 4 KiB receive buffer), while the
scripted agent prints ~10 MB (each `node.updated` frame up to 64 KiB). The queued bytes the server accounts
(`threadloom_subscriber_queued_bytes` on /metrics) never pass the token's bound and its RSS grows by far less
than the streams would hold; every stream ends with SUBSCRIBER_TOO_SLOW after a gapless prefix, and resuming
each from its `resumeFrom` over the same transport gets the rest exactly once. The twins: another token's
multipart and SSE streams that read as they go get every event and are never cut.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpcore
import httpx

from tests.support.multipart import MULTIPART, Parts
from tests.support.queue_peaks import MB, OPEN_GENERAL, QueuePeaks, gauges, latest_sequence, thread_and_reader
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until

SUBSCRIBER_BYTES = 1024 * 1024
TOKEN_BYTES = 4 * 1024 * 1024
SILENT = 5  # per transport, all of one read token
SHARED_SERVER = True  # conftest's module server, with these small byte bounds
SERVER_ENV = {
    "THREADLOOM_SUBSCRIBER_QUEUE_BYTES": str(SUBSCRIBER_BYTES),
    "THREADLOOM_TOKEN_QUEUE_BYTES": str(TOKEN_BYTES),
}
SSE = "text/event-stream"
TRANSPORTS = ("multipart", "sse")

HEAVY = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
  sequence type truncated entity { ... on ExecutionNode { status detail } } } }"""
LIGHT = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) { sequence type } }"""
# ~10 MB of output over ~200 writes: about as many `node.updated` events, each with the last 64 KiB. More than
# a connection's kernel buffers take (the server's send buffer grows to 4 MiB) with the queue's bound on top.
COMMAND = "for i in $(seq 200); do yes x | head -c 49152; sleep 0.02; done"


class _SlowStream(httpcore.AsyncNetworkStream):
    """A connection read only when the client asks (no read-ahead), through a 4 KiB receive buffer."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    # httpcore's interface passes the client's timeouts in.
    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:  # noqa: ASYNC109
        return await asyncio.wait_for(asyncio.get_running_loop().sock_recv(self.sock, min(max_bytes, 4096)), timeout)

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        await asyncio.wait_for(asyncio.get_running_loop().sock_sendall(self.sock, buffer), timeout)

    async def aclose(self) -> None:
        self.sock.close()


class _SlowBackend(httpcore.AsyncNetworkBackend):
    """Connections whose receive buffer is set before they connect (after, the window is already open)."""

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109
        local_address: str | None = None,
        socket_options: Any = None,
    ) -> httpcore.AsyncNetworkStream:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.setblocking(False)
        await asyncio.wait_for(asyncio.get_running_loop().sock_connect(sock, (host, port)), timeout)
        return _SlowStream(sock)

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


def _transport(silent: bool) -> httpx.AsyncHTTPTransport:
    transport = httpx.AsyncHTTPTransport()
    if silent:
        transport._pool = httpcore.AsyncConnectionPool(network_backend=_SlowBackend())
    return transport


class Results:
    """The results (`{"data", "errors"}`) of one multipart or SSE subscription response, in order."""

    def __init__(self, transport: str, response: httpx.Response) -> None:
        self.transport = transport
        self.parts = Parts(response) if transport == "multipart" else None
        self.lines = response.aiter_lines()

    async def next(self) -> dict[str, Any] | None:
        """The next result; None once the stream ended (closing boundary, or SSE `complete`)."""
        if self.parts is not None:
            part = await self.parts.next()
            if part is None:
                return None
            if part.get("payload") is None:  # a transport error: {"payload": null, "errors": [...]}
                return {"data": None, "errors": part["errors"]}
            return part["payload"]  # type: ignore[no-any-return]
        name, data = "message", list[str]()
        async for line in self.lines:
            if line == "":
                if name == "complete":
                    return None
                if data:
                    return json.loads("\n".join(data))  # type: ignore[no-any-return]
                continue
            field, _, value = line.partition(":")
            if field == "event":
                name = value.strip()
            elif field == "data":
                data.append(value.removeprefix(" "))
        return None


@contextlib.asynccontextmanager
async def subscribe(
    server: ServerProcess, transport: str, token: str, query: str, variables: dict[str, Any], *, silent: bool = False
) -> AsyncIterator[Results]:
    """One subscription over `transport`; `silent`: on a connection whose receive buffer is 4 KiB, so what the
    server sends and the client does not read piles up on the server's side."""
    accept = MULTIPART if transport == "multipart" else SSE
    headers = {"accept": accept, "authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=server.url, timeout=120, transport=_transport(silent)) as http:
        body = {"query": query, "variables": variables}
        async with http.stream("POST", "/graphql", json=body, headers=headers) as response:
            assert response.status_code == 200, await response.aread()
            yield Results(transport, response)


async def _read_all(results: Results, latest: int) -> tuple[list[int], dict[str, Any] | None]:
    """(the sequences of the items read, the error that ended the stream or None) up to the stream's end, or
    up to `latest` (a stream that was not cut)."""
    seen: list[int] = []
    while (not seen or seen[-1] < latest) and (result := await results.next()) is not None:
        if result.get("errors"):
            return seen, result["errors"][0]
        item = result["data"]["threadEvents"]
        if item["type"] != "synchronized":
            seen.append(item["sequence"])
    return seen, None


async def test_http_streams_that_never_read_are_cut_within_the_byte_bounds_and_resume(
    server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    thread, reader = await thread_and_reader(client, database_url, "bytes-http", tmp_path)
    start = await latest_sequence(client, thread)
    variables = {"t": thread, "after": start}
    latest = -1  # known once the run ended

    async with contextlib.AsyncExitStack() as stack:
        # The twins: another token's streams that read as they go, one per transport.
        twin_seen: dict[str, list[int]] = {t: [] for t in TRANSPORTS}
        twin_errors: list[dict[str, Any]] = []

        async def read_twin(transport: str, results: Results) -> None:
            while (result := await results.next()) is not None:
                if result.get("errors"):
                    twin_errors.append(result["errors"][0])
                    return
                item = result["data"]["threadEvents"]
                if item["type"] != "synchronized":
                    twin_seen[transport].append(item["sequence"])

        twins = []
        for transport in TRANSPORTS:
            results = await stack.enter_async_context(
                subscribe(server, transport, server.admin_token, HEAVY, variables)
            )
            twins.append(asyncio.create_task(read_twin(transport, results)))
        silent = [
            (
                transport,
                await stack.enter_async_context(subscribe(server, transport, reader, HEAVY, variables, silent=True)),
            )
            for transport in TRANSPORTS
            for _ in range(SILENT)
        ]

        async def all_open() -> bool:
            return (await gauges(client, OPEN_GENERAL))[OPEN_GENERAL] >= 2 * SILENT + len(TRANSPORTS)

        await until(all_open, within=60)
        async with QueuePeaks(client, server.proc.pid) as peaks:
            sent = await send(client, thread, f"@tool {COMMAND}")
            done = await finished(client, sent["run"]["id"], within=120)
            assert done["status"] == "COMPLETED", done
            latest = await latest_sequence(client, thread)

            async def twins_caught_up() -> bool:
                return bool(twin_errors) or all(s and s[-1] >= latest for s in twin_seen.values())

            await until(twins_caught_up, within=120)

        # The reading twins got every event, in order, and were never cut.
        assert twin_errors == []
        for transport in TRANSPORTS:
            assert twin_seen[transport] == list(range(start + 1, latest + 1)), transport
        # The read token's 10 queues together never held more than its bound (the twins' at most their own).
        assert 0 < peaks.bytes <= TOKEN_BYTES + 2 * SUBSCRIBER_BYTES
        # Unbounded, each stream would keep what its connection's buffers did not take (~6 MB) in the server.
        assert peaks.grown < 100 * MB, f"server RSS grew by {peaks.grown / MB:.0f} MiB"

        # Now the silent streams read: a gapless prefix, then SUBSCRIBER_TOO_SLOW with where to resume.
        cut: list[tuple[str, int]] = []
        for (transport, _), (seen, error) in zip(
            silent, await asyncio.gather(*(_read_all(results, latest) for _, results in silent)), strict=True
        ):
            assert error is not None and error["extensions"]["code"] == "SUBSCRIBER_TOO_SLOW", (transport, error)
            resume = error["extensions"]["resumeFrom"]
            assert seen == list(range(start + 1, resume + 1)), transport  # nothing missed or repeated before it
            assert resume < latest, transport  # it really was cut before the end
            cut.append((transport, resume))
        for twin in twins:
            twin.cancel()

    # Resuming each from its cursor over its own transport yields exactly the rest.
    async def resume(transport: str, after: int) -> None:
        async with subscribe(server, transport, reader, LIGHT, {"t": thread, "after": after}) as results:
            rest: list[int] = []
            while len(rest) < latest - after:
                result = await results.next()
                assert result is not None and not result.get("errors"), result
                item = result["data"]["threadEvents"]
                if item["type"] != "synchronized":
                    rest.append(item["sequence"])
            assert rest == list(range(after + 1, latest + 1)), transport

    await asyncio.gather(*(resume(transport, after) for transport, after in cut))

"""One graphql-transport-ws socket carrying the bridge's queries, mutations and subscriptions.

Queries and mutations go over the socket too (the protocol allows any operation), so the bridge needs no
HTTP client and authenticates once, in `connection_init`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import AsyncIterator
from typing import Any

import orjson
import websockets

PROTOCOL = "graphql-transport-ws"
REFUSED = frozenset({4401, 4403})  # the server's close codes for a missing or refused token
_END = object()


class GraphQLError(Exception):
    """The server refused an operation (top-level errors) or the socket ended under it."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


def websocket_url(url: str) -> str:
    """The WebSocket endpoint of a server given as its base URL (`THREADLOOM_URL`, what every client takes)
    or as its GraphQL endpoint (`…/graphql`, what a GraphQL tool is usually given): both mean the same server."""
    base = url.strip().rstrip("/")
    base = base.removesuffix("/graphql")
    for http, ws in (("http://", "ws://"), ("https://", "wss://")):
        if base.startswith(http):
            base = ws + base[len(http) :]
    return base + "/graphql"


class GraphQLSocket:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self._ws = ws
        self._ids = itertools.count(1)
        self._streams: dict[str, asyncio.Queue[Any]] = {}
        self.closed = False  # the server closed the socket (or it was closed): open a new one
        self._reader = asyncio.create_task(self._read(), name="acp-graphql-reader")

    @classmethod
    async def connect(cls, base_url: str, token: str, device: str | None = None) -> GraphQLSocket:
        """`device`: the device this socket's writes come from (the writer lease's holder, docs/leases.md)."""
        url = websocket_url(base_url)
        try:
            ws = await websockets.connect(url, subprotocols=[PROTOCOL], max_size=None)  # type: ignore[list-item]
        except (OSError, websockets.InvalidHandshake) as exc:
            raise GraphQLError(f"cannot reach Threadloom at {url}: {exc}", "UNREACHABLE") from exc
        init_payload = {"authorization": f"Bearer {token}", **({"deviceId": device} if device else {})}
        init = {"type": "connection_init", "payload": init_payload}
        try:
            await ws.send(orjson.dumps(init).decode())
            ack = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
        except websockets.ConnectionClosed as exc:
            if exc.rcvd is not None and exc.rcvd.code in REFUSED:
                raise GraphQLError(f"Threadloom refused the token ({exc.rcvd.reason})", "UNAUTHENTICATED") from exc
            raise GraphQLError(f"the connection to {url} closed before it was accepted", "UNREACHABLE") from exc
        except TimeoutError as exc:
            await ws.close()
            raise GraphQLError(f"{url} did not acknowledge the connection", "UNREACHABLE") from exc
        if ack.get("type") != "connection_ack":
            await ws.close()
            raise GraphQLError(f"unexpected answer to connection_init: {ack}", "UNAUTHENTICATED")
        return cls(ws)

    async def execute(self, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
        """The data of a query or mutation; top-level errors raise `GraphQLError`."""
        op, queue = await self._start(query, variables)
        try:
            item = await queue.get()
        finally:
            self._streams.pop(op, None)  # the server's `complete` that follows is ignored
        if isinstance(item, GraphQLError):
            raise item
        if item is _END:
            raise GraphQLError("the server completed the operation without a result")
        return item  # type: ignore[no-any-return]

    async def subscribe(self, query: str, variables: dict[str, Any] | None = None) -> AsyncIterator[dict[str, Any]]:
        """Each result's data until the server completes the operation; leaving the loop stops it."""
        op, queue = await self._start(query, variables)
        completed = False
        try:
            while (item := await queue.get()) is not _END:
                if isinstance(item, GraphQLError):
                    completed = True
                    raise item
                yield item
            completed = True
        finally:
            self._streams.pop(op, None)
            if not completed and not self.closed:
                with contextlib.suppress(GraphQLError):
                    await self._send({"id": op, "type": "complete"})

    async def _start(self, query: str, variables: dict[str, Any] | None) -> tuple[str, asyncio.Queue[Any]]:
        if self.closed:
            raise GraphQLError("the connection to Threadloom closed", "DISCONNECTED")
        op = str(next(self._ids))
        queue: asyncio.Queue[Any] = asyncio.Queue()
        self._streams[op] = queue
        try:
            await self._send({"id": op, "type": "subscribe", "payload": {"query": query, "variables": variables or {}}})
        except GraphQLError:
            self._streams.pop(op, None)
            raise
        return op, queue

    async def close(self) -> None:
        self.closed = True
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
        await self._ws.close()

    async def _send(self, message: dict[str, Any]) -> None:
        try:
            await self._ws.send(orjson.dumps(message).decode())
        except websockets.ConnectionClosed as exc:
            raise GraphQLError("the connection to Threadloom closed", "DISCONNECTED") from exc

    async def _read(self) -> None:
        try:
            async for raw in self._ws:
                message = orjson.loads(raw)
                kind, queue = message.get("type"), self._streams.get(message.get("id", ""))
                if kind == "ping":
                    await self._send({"type": "pong"})
                elif queue is None:
                    continue
                elif kind == "next":
                    payload = message["payload"]
                    if payload.get("errors"):
                        queue.put_nowait(_error(payload["errors"]))
                    else:
                        queue.put_nowait(payload["data"])
                elif kind == "error":
                    queue.put_nowait(_error(message["payload"]))
                elif kind == "complete":
                    queue.put_nowait(_END)
        except (websockets.ConnectionClosed, GraphQLError):
            pass
        self.closed = True
        for queue in self._streams.values():
            queue.put_nowait(GraphQLError("the connection to Threadloom closed", "DISCONNECTED"))


def _error(errors: list[dict[str, Any]]) -> GraphQLError:
    first = errors[0] if errors else {}
    code = (first.get("extensions") or {}).get("code")
    return GraphQLError("; ".join(str(e.get("message")) for e in errors), code)

"""A graphql-transport-ws client over real websockets, written to the protocol's letter."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator
from typing import Any

import orjson
import websockets

PROTOCOL = "graphql-transport-ws"


async def slow_socket(base_url: str) -> websockets.ClientConnection:
    """A client that reads as little as the kernel allows: a tiny receive buffer and one frame held by the
    library, so what the server sends piles up on the server's side (the slow-subscriber tests)."""
    host, port = base_url.removeprefix("http://").split(":")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    return await websockets.connect(
        base_url.replace("http://", "ws://") + "/graphql",
        sock=sock,
        subprotocols=[PROTOCOL],  # type: ignore[list-item]
        max_queue=1,
        max_size=None,
        ping_interval=None,
    )


class WsClient:
    def __init__(self, ws: websockets.ClientConnection) -> None:
        self.ws = ws
        self._ids = itertools.count(1)

    @classmethod
    async def connect(cls, base_url: str, token: str | None, *, payload: dict[str, Any] | None = None) -> WsClient:
        url = base_url.replace("http://", "ws://") + "/graphql"
        ws = await websockets.connect(url, subprotocols=[PROTOCOL], max_size=None)  # type: ignore[list-item]
        init = payload if payload is not None else ({"authorization": f"Bearer {token}"} if token else {})
        await ws.send(orjson.dumps({"type": "connection_init", "payload": init}).decode())
        client = cls(ws)
        message = await client.receive()
        if message.get("type") != "connection_ack":
            raise ConnectionError(message)
        return client

    async def receive(self, within: float | None = 30.0) -> dict[str, Any]:
        """The next message, answering pings on the way. `within=None`: no bound of its own, for a caller that
        bounds a whole stream of receives at once (a timer per message is most of a fast reader's CPU)."""
        while True:
            async with asyncio.timeout(within):  # not wait_for: that makes a task of every receive
                raw = await self.ws.recv()
            assert isinstance(raw, str), "graphql-transport-ws messages must be text frames"
            message: dict[str, Any] = orjson.loads(raw)
            if message.get("type") == "ping":
                await self.ws.send(orjson.dumps({"type": "pong"}).decode())
                continue
            return message

    async def subscribe(self, query: str, variables: dict[str, Any] | None = None) -> str:
        op = str(next(self._ids))
        await self.ws.send(
            orjson.dumps(
                {"id": op, "type": "subscribe", "payload": {"query": query, "variables": variables or {}}}
            ).decode()
        )
        return op

    async def items(self, within: float = 30.0) -> AsyncIterator[dict[str, Any]]:
        """Messages of any subscription on this socket until the socket closes."""
        while True:
            yield await self.receive(within)

    async def close(self) -> None:
        await self.ws.close()

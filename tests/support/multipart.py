"""Subscriptions over HTTP as a client reads them: one multipart response, part by part."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import orjson

from tests.support.server import ServerProcess

MULTIPART = "multipart/mixed;boundary=graphql;subscriptionSpec=1.0,application/json"


class Parts:
    """The JSON parts of one multipart subscription response (heartbeats `{}` skipped)."""

    def __init__(self, response: httpx.Response) -> None:
        self.response = response
        self._chunks = response.aiter_text()
        self._buffer = ""
        self.ended = False

    async def next(self) -> dict[str, Any] | None:
        """The next part, or None once the closing boundary came."""
        while True:
            head, sep, rest = self._buffer.partition("\r\n--graphql")
            if sep:
                self._buffer = rest
                if rest.startswith("--"):
                    self.ended = True
                _, _, body = head.partition("\r\n\r\n")
                if body.strip():
                    part: dict[str, Any] = orjson.loads(body)
                    if part:
                        return part
                continue
            if self.ended:
                return None
            chunk = await anext(self._chunks, None)
            if chunk is None:
                self.ended = True
                return None
            self._buffer += chunk

    async def items(self) -> AsyncIterator[dict[str, Any]]:
        while (part := await self.next()) is not None:
            yield part


@contextlib.asynccontextmanager
async def subscribe(
    server: ServerProcess, token: str | None, query: str, variables: dict[str, Any]
) -> AsyncIterator[Parts]:
    headers = {"accept": MULTIPART, **({"authorization": f"Bearer {token}"} if token else {})}
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        body = {"query": query, "variables": variables}
        async with http.stream("POST", "/graphql", json=body, headers=headers) as response:
            yield Parts(response)

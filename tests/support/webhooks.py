"""A real webhook receiver for tests, and the Standard Webhooks reference check it verifies deliveries with.

`Receiver` is an HTTP/1.1 server on 127.0.0.1 (asyncio streams, a free port) in the test's own event loop. It
records every request and answers as the test scripted it: `plan` is a list of answers taken one per request
(an HTTP status, or `HOLD`: no answer at all until the receiver closes, which the sender sees as a timeout or
as a request in flight), then `default`. Tests wait for what it received (`until`), never for a time.

`verify` is written from the Standard Webhooks 1.0 text, independently of `threadloom.domain.webhook_signing`:
the key is the base64 after `whsec_`, the signed content `{id}.{timestamp}.{body}`, each `v1,` entry of the
space-separated header a base64 HMAC-SHA256, compared in constant time; the timestamp within 5 minutes.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import dataclasses
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

import orjson

HOLD = "hold"
TOLERANCE_S = 300


def verify(secret: str, headers: dict[str, str], body: bytes, *, now: float | None = None) -> bool:
    """The reference check a receiver runs: does any signature in the header verify with `secret`?"""
    try:
        msg_id = headers["webhook-id"]
        timestamp = headers["webhook-timestamp"]
        header = headers["webhook-signature"]
    except KeyError:
        return False
    if not timestamp.isdigit() or abs((now or time.time()) - int(timestamp)) > TOLERANCE_S:
        return False
    key = base64.b64decode(secret.removeprefix("whsec_"))
    expected = hmac.new(key, f"{msg_id}.{timestamp}.".encode() + body, hashlib.sha256).digest()
    for entry in header.split(" "):
        version, _, signature = entry.partition(",")
        if version != "v1":
            continue
        try:
            given = base64.b64decode(signature, validate=True)
        except ValueError:
            continue
        if hmac.compare_digest(given, expected):
            return True
    return False


@dataclasses.dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    answer: int | str  # the status answered, or HOLD

    @property
    def webhook_id(self) -> str:
        return self.headers["webhook-id"]

    @property
    def json(self) -> Any:
        return orjson.loads(self.body)

    @property
    def signatures(self) -> list[str]:
        return self.headers["webhook-signature"].split(" ")


class Receiver:
    def __init__(self, plan: list[int | str] | None = None, default: int = 200) -> None:
        self.plan: list[int | str] = list(plan or [])
        self.default = default
        self.received: list[Received] = []
        self.redirect_to = "/elsewhere"
        self._changed = asyncio.Condition()
        self._closing = asyncio.Event()
        self._server: asyncio.Server | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/hooks"

    async def start(self) -> Receiver:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def close(self) -> None:
        self._closing.set()
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await reader.readline()
            method, path, _ = line.decode().split(" ", 2)
            headers: dict[str, str] = {}
            while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
                name, _, value = header.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            body = await reader.readexactly(int(headers.get("content-length", "0")))
            answer = self.plan.pop(0) if self.plan else self.default
            async with self._changed:
                self.received.append(Received(method, path, headers, body, answer))
                self._changed.notify_all()
            if answer == HOLD:
                await self._closing.wait()
                return
            extra = f"Location: {self.redirect_to}\r\n" if 300 <= int(answer) < 400 else ""
            writer.write(f"HTTP/1.1 {answer} X\r\n{extra}Content-Length: 0\r\nConnection: close\r\n\r\n".encode())
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()

    async def until(self, check: Callable[[list[Received]], bool], within: float = 45.0) -> list[Received]:
        """Wait until `check(received)` holds (woken by each request), at most `within` seconds."""
        async with self._changed:
            await asyncio.wait_for(self._changed.wait_for(lambda: check(self.received)), within)
            return list(self.received)

    def of(self, webhook_id: str) -> list[Received]:
        return [r for r in self.received if r.webhook_id == webhook_id]

    def answered(self, status: int = 200) -> list[Received]:
        """The requests answered `status`, in the order they arrived."""
        return [r for r in self.received if r.answer == status]

"""GraphQL POSTs over plain asyncio streams, answered as `httpx.Response`s.

The suite sends tens of thousands of GraphQL requests through `tests.support.server.Client`. httpx (httpcore on
anyio) spent ~1.7 ms of the test process's CPU on each of them, against ~0.35 ms for the same keep-alive
HTTP/1.1 exchange on asyncio streams: a tenth of a test worker's CPU. `Connections` does just that exchange — a
request with a body, an answer with a `Content-Length` or chunked body — and hands back a real
`httpx.Response`, so tests read status, headers, text and JSON as before; a transport failure raises httpx's
own exceptions (`ConnectError`, `RemoteProtocolError`, `ReadTimeout`: all `httpx.TransportError`s), as a test
that kills a server expects. Anything else (a stream read line by line, a GET) still goes through httpx.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx

_OURS = ("host", "content-length")  # headers this client writes itself
_DEFAULTS = {"accept": "*/*", "content-type": "application/json"}
_JSON = {"separators": (",", ":"), "ensure_ascii": False, "allow_nan": False}  # as httpx encodes `json=`


class _Gone(Exception):
    """The connection ended before any byte of the answer: a kept-alive one the server had closed."""


class Connections:
    """Kept-alive connections to one server (`http://host:port`), one per request in flight."""

    def __init__(self, base_url: str, timeout: float) -> None:
        host_port = base_url.removeprefix("http://").rstrip("/")
        host, _, port = host_port.rpartition(":")
        self.base_url, self.host, self.port, self.host_header = base_url.rstrip("/"), host, int(port), host_port
        self.timeout = timeout
        self._idle: list[tuple[asyncio.StreamReader, asyncio.StreamWriter]] = []

    async def post(self, path: str, body: Any, headers: dict[str, str]) -> httpx.Response:
        content = json.dumps(body, **_JSON).encode()  # type: ignore[arg-type]
        names = {name.lower() for name in headers}
        head = [f"POST {path} HTTP/1.1", f"host: {self.host_header}"]
        head += [f"{name}: {value}" for name, value in _DEFAULTS.items() if name not in names]  # given ones win
        head += [f"{name}: {value}" for name, value in headers.items() if name.lower() not in _OURS]
        head.append(f"content-length: {len(content)}")
        request = ("\r\n".join(head) + "\r\n\r\n").encode() + content
        try:
            async with asyncio.timeout(self.timeout):
                status, answer_headers, answer = await self._exchange(request)
        except TimeoutError as error:
            raise httpx.ReadTimeout(f"no answer within {self.timeout} s") from error
        sent = httpx.Request("POST", self.base_url + path, headers=headers, content=content)
        return httpx.Response(status, headers=answer_headers, content=answer, request=sent)

    async def _exchange(self, request: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        while self._idle:  # a kept-alive connection, unless the server closed it meanwhile
            reader, writer = self._idle.pop()
            if reader.at_eof() or writer.is_closing():
                writer.close()
                continue
            try:
                return await self._on(reader, writer, request)
            except _Gone:
                continue  # closed as we sent: nothing of it was read, so nothing was answered on it
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port)
        except OSError as error:
            raise httpx.ConnectError(str(error)) from error
        try:
            return await self._on(reader, writer, request)
        except _Gone as error:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.") from error

    async def _on(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, request: bytes
    ) -> tuple[int, list[tuple[str, str]], bytes]:
        done = False
        try:
            try:
                writer.write(request)
                await writer.drain()
                status_line = await reader.readline()
            except (ConnectionError, OSError) as error:
                raise _Gone from error
            if not status_line:
                raise _Gone
            try:
                status = int(status_line.split(b" ", 2)[1])
                headers: list[tuple[str, str]] = []
                while (line := await reader.readline()) not in (b"\r\n", b"\n", b""):
                    name, _, value = line.decode("latin-1").partition(":")
                    headers.append((name.strip(), value.strip()))
                fields = {name.lower(): value for name, value in headers}
                if fields.get("transfer-encoding", "").lower() == "chunked":
                    body = await _chunked(reader)
                elif "content-length" in fields:
                    body = await reader.readexactly(int(fields["content-length"]))
                else:
                    body = await reader.read()
            except (asyncio.IncompleteReadError, ConnectionError, OSError, ValueError, IndexError) as error:
                raise httpx.RemoteProtocolError(f"the answer broke off: {error!r}") from error
            done = True
            if fields.get("connection", "").lower() == "close" or reader.at_eof():
                writer.close()
            else:
                self._idle.append((reader, writer))  # the whole answer was read: the next request may follow
            return status, headers, body
        finally:
            if not done:
                writer.close()

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for _, writer in idle:
            writer.close()


async def _chunked(reader: asyncio.StreamReader) -> bytes:
    parts = []
    while True:
        size = int((await reader.readline()).split(b";", 1)[0].strip(), 16)
        if size == 0:
            while (await reader.readline()) not in (b"\r\n", b"\n", b""):
                pass  # trailers
            return b"".join(parts)
        parts.append(await reader.readexactly(size))
        await reader.readexactly(2)

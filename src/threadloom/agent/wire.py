"""JSON lines over stdio: one message per line, nothing else ever on stdout.

Reads and writes go through asyncio pipes so a slow client never blocks the turns of other threads, and all
writes share one lock so concurrent turns never interleave their lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import sys
from collections.abc import Awaitable, Callable
from typing import Any, BinaryIO, Protocol

log = logging.getLogger("threadloom.agent")

LINE_LIMIT = 16 * 1024 * 1024

Message = dict[str, Any]

PARSE_ERROR = -32700
INVALID_REQUEST = -32600
METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
INTERNAL_ERROR = -32603
NO_THREAD = -32001
NOT_RUNNING_TURN = -32002
CAPABILITY_OFF = -32003
TURN_RUNNING = -32004


class Sink(Protocol):
    """Where messages go: a LineWriter, or the ACP face's translation of what a turn sends."""

    async def send(self, message: Message) -> None: ...


class RpcError(Exception):
    """Raised by a method handler; becomes the `error` of the response."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class PeerError(Exception):
    """The client answered one of the agent's requests with an error."""


class LineReader:
    """Lines from stdin; `None` at end of input."""

    def __init__(self, read: Callable[[], Awaitable[bytes]]) -> None:
        self._read = read

    @classmethod
    async def stdin(cls) -> LineReader:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=LINE_LIMIT)
        try:
            await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        except ValueError:
            # A regular file on stdin (`< script.jsonl`) cannot be a pipe transport; read it in a thread.
            source = sys.stdin.buffer
            return cls(lambda: loop.run_in_executor(None, source.readline))
        return cls(reader.readline)

    async def readline(self) -> bytes | None:
        """The next line; raises `ValueError` for a line over the limit (the rest of it is skipped)."""
        line = await self._read()
        return line or None


class LineWriter:
    """Serialized JSON-line output that survives a client that stopped reading."""

    def __init__(
        self,
        write: Callable[[bytes], None],
        drain: Callable[[], Awaitable[None]],
        transport: asyncio.WriteTransport | None = None,
    ) -> None:
        self._write = write
        self._drain = drain
        self._transport = transport
        self._lock = asyncio.Lock()
        self._broken = False

    @classmethod
    async def stdout(cls) -> LineWriter:
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.connect_write_pipe(asyncio.streams.FlowControlMixin, sys.stdout)
        except ValueError:
            # A regular file on stdout cannot be a pipe transport; blocking writes to a file are fine.
            return cls(_blocking_write(sys.stdout.buffer), _no_drain)
        writer = asyncio.StreamWriter(transport, protocol, None, loop)
        return cls(writer.write, writer.drain, transport)

    async def send(self, message: Message) -> None:
        line = json.dumps(message, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
        async with self._lock:
            if self._broken:
                return
            try:
                self._write(line)
                await self._drain()
            except (BrokenPipeError, ConnectionResetError) as exc:
                self._broken = True
                log.warning("stdout closed (%s); dropping further output", exc)

    async def flush(self, within: float) -> None:
        """Waits (a bounded time) until everything sent is out of the process, so exiting loses no line."""
        if self._transport is None or self._broken:
            return
        self._transport.set_write_buffer_limits(high=0)  # drain() now waits for an empty buffer
        with contextlib.suppress(TimeoutError, BrokenPipeError, ConnectionResetError):
            await asyncio.wait_for(self._drain(), within)


def _blocking_write(stream: BinaryIO) -> Callable[[bytes], None]:
    def write(data: bytes) -> None:
        stream.write(data)
        stream.flush()

    return write


async def _no_drain() -> None:
    return None


class Peer:
    """The agent's own requests to the client (approvals, questions) and the futures awaiting their answers."""

    def __init__(self, writer: Sink) -> None:
        self._writer = writer
        self._ids = itertools.count(1)
        self._pending: dict[str, asyncio.Future[Message]] = {}

    async def request(self, method: str, params: Message) -> Message:
        """Sends a request with a string id and waits for the client's `result` (raises `PeerError` on `error`)."""
        request_id = f"srv-{next(self._ids)}"
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._writer.send({"id": request_id, "method": method, "params": params})
            return await future
        finally:
            self._pending.pop(request_id, None)

    def resolve(self, message: Message) -> None:
        """Hands a client response to the request waiting for it; stale or unknown ids are only logged."""
        future = self._pending.get(str(message.get("id")))
        if future is None or future.done():
            log.warning("response to unknown request id %r ignored", message.get("id"))
            return
        if "error" in message:
            error = message["error"]
            text = error.get("message") if isinstance(error, dict) else None
            future.set_exception(PeerError(str(text or error)))
            return
        result = message.get("result")
        future.set_result(result if isinstance(result, dict) else {})

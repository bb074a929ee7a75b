"""The agent end of an ACP connection: JSON-RPC 2.0 over JSON lines on the child's stdio.

Why not `jsonlines.JsonLinesProcess`: ACP frames carry `"jsonrpc": "2.0"`, the agent sends requests of its
own that wait for the user (permissions, elicitations), a `session/prompt` response must reach the event
stream in order with the updates around it (a trailing `usage_update` comes after it), and one oversized
line must not end the connection. So this reader splits lines itself: a line longer than `max_line` is
skipped (its bytes are counted, never buffered), the request it answered, if its head names one, fails
with `oversized`, and `oversized` notes it for the runtime to show as a warning.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import os
import re
import signal
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import orjson

from threadloom.providers.child_process import ChildProcess
from threadloom.providers.contract import ProviderError

log = logging.getLogger("threadloom.providers.acp")

METHOD_NOT_FOUND = -32601
INVALID_PARAMS = -32602
DEFAULT_MAX_LINE = 16 * 1024 * 1024
READ_CHUNK = 1 << 16
_HEAD = 256  # bytes of an oversized line kept to find the id it answers
_ID = re.compile(rb'"id"\s*:\s*(\d+)')


class RpcError(ProviderError):
    """An error response; `rpc_code` is the JSON-RPC code (-32601: the method does not exist)."""

    def __init__(self, rpc_code: int, message: str) -> None:
        code = "unsupported" if rpc_code == METHOD_NOT_FOUND else f"rpc_{rpc_code}"
        super().__init__(code, message)
        self.rpc_code = rpc_code


@dataclasses.dataclass(frozen=True, slots=True)
class PromptDone:
    """A `session/prompt` answered: placed on `incoming` where its response line was read."""

    request_id: int
    result: dict[str, Any] | None
    error: RpcError | None


@dataclasses.dataclass(frozen=True, slots=True)
class Oversized:
    """A line over the limit was skipped."""

    size: int
    limit: int


Incoming = dict[str, Any] | PromptDone | Oversized


class AcpProcess(ChildProcess):
    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        name: str,
        *,
        max_line: int = DEFAULT_MAX_LINE,
        scrub: Callable[[str], str] | None = None,
    ) -> None:
        super().__init__(proc, name, scrub)
        self.max_line = max_line
        self.incoming: asyncio.Queue[Any] = asyncio.Queue()  # Incoming, the runtime's own, None at the end
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._prompts: set[int] = set()
        self._ids = itertools.count(1)
        self.start()

    # ---- reading ---------------------------------------------------------------------

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        buf = bytearray()
        skipping = 0  # bytes of an oversized line skipped so far (0: not skipping)
        head = b""
        try:
            while chunk := await self.proc.stdout.read(READ_CHUNK):
                start = 0
                while (end := chunk.find(b"\n", start)) >= 0:
                    piece = chunk[start:end]
                    start = end + 1
                    if skipping:
                        await self._skipped(skipping + len(piece), head)
                        skipping = 0
                    elif len(buf) + len(piece) > self.max_line:
                        await self._skipped(len(buf) + len(piece), bytes(buf[:_HEAD]) or piece[:_HEAD])
                        buf.clear()
                    elif buf:
                        buf += piece
                        await self._line(bytes(buf))
                        buf.clear()
                    else:
                        await self._line(piece)
                rest = chunk[start:]
                if skipping:
                    skipping += len(rest)
                elif len(buf) + len(rest) > self.max_line:
                    head = bytes((buf + rest)[:_HEAD])
                    skipping = len(buf) + len(rest)
                    buf.clear()
                else:
                    buf += rest
        except Exception:
            log.exception("%s: unreadable output; stopping the process", self.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        except asyncio.CancelledError:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        finally:
            self.exit_code = await self.proc.wait()
            self.exited(self.exit_code)

    async def _line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = orjson.loads(line)
        except orjson.JSONDecodeError:
            log.warning("%s sent a non-JSON line: %r", self.name, self.scrub(line[:200].decode(errors="replace")))
            return
        if isinstance(message, dict):
            await self.handle(message)

    async def _skipped(self, size: int, head: bytes) -> None:
        log.warning("%s sent a line of %d bytes (limit %d); skipped", self.name, size, self.max_line)
        found = _ID.search(head)
        if found is not None and b'"method"' not in head:
            request_id = int(found[1])
            error = RpcError(-32603, f"the agent's answer was {size} bytes, over the {self.max_line}-byte line limit")
            error.code = "oversized"
            self._settle(request_id, None, error)
        await self.incoming.put(Oversized(size, self.max_line))

    async def handle(self, message: dict[str, Any]) -> None:
        if "method" not in message and "id" in message:
            request_id = message["id"]
            error = None
            if "error" in message:
                body = message["error"] if isinstance(message["error"], dict) else {"message": message["error"]}
                code = body.get("code")
                error = RpcError(code if isinstance(code, int) else -32603, self.scrub(str(body.get("message"))))
            if isinstance(request_id, int):
                self._settle(request_id, message.get("result"), error)
            return
        await self.incoming.put(message)

    def _settle(self, request_id: int, result: Any, error: RpcError | None) -> None:
        if request_id in self._prompts:
            self._prompts.discard(request_id)
            self.incoming.put_nowait(PromptDone(request_id, result if isinstance(result, dict) else {}, error))
        future = self._pending.pop(request_id, None)
        if future is not None and not future.done():
            if error is not None:
                future.set_exception(error)
            else:
                future.set_result(result)

    def exited(self, code: int) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ProviderError("exited", f"{self.name} exited ({code})"))
        self._pending.clear()
        self.incoming.put_nowait(None)

    async def messages(self) -> AsyncIterator[Any]:
        while (message := await self.incoming.get()) is not None:
            yield message

    # ---- writing ---------------------------------------------------------------------

    async def send(self, message: dict[str, Any]) -> None:
        await self.write({"jsonrpc": "2.0", **message})

    def _open(self) -> tuple[int, asyncio.Future[Any]]:
        if not self.alive:
            raise ProviderError("exited", f"{self.name} is not running")
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        return request_id, future

    async def request(self, method: str, params: Mapping[str, Any], wait_s: float | None = 60.0) -> Any:
        """Send a request and wait for its result (an error response raises `RpcError`)."""
        request_id, future = self._open()
        try:
            await self.send({"id": request_id, "method": method, "params": dict(params)})
            return await asyncio.wait_for(future, wait_s)
        except TimeoutError as error:
            raise ProviderError("timeout", f"{self.name} did not answer {method} in {wait_s}s") from error
        finally:
            self._pending.pop(request_id, None)

    async def prompt(self, params: Mapping[str, Any]) -> int:
        """Send `session/prompt` without waiting: its answer arrives on `incoming` as a `PromptDone`."""
        request_id, future = self._open()
        self._prompts.add(request_id)
        future.add_done_callback(lambda f: f.exception() if not f.cancelled() else None)  # read on incoming
        try:
            await self.send({"id": request_id, "method": "session/prompt", "params": dict(params)})
        except ProviderError:
            self._prompts.discard(request_id)
            self._pending.pop(request_id, None)
            raise
        return request_id

    async def notify(self, method: str, params: Mapping[str, Any]) -> None:
        await self.send({"method": method, "params": dict(params)})

    async def respond(self, request_id: Any, result: Any) -> None:
        await self.send({"id": request_id, "result": result})

    async def respond_error(self, request_id: Any, code: int, message: str) -> None:
        await self.send({"id": request_id, "error": {"code": code, "message": message}})

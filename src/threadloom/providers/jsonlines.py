"""A JSON-lines peer over a child process's stdio (Codex app-server framing: no "jsonrpc").

Requests get integer ids and await their response; notifications and the child's own
requests go to `incoming`. When the child exits, pending requests fail and `incoming`
ends with `None`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from threadloom.providers.contract import ProviderError

log = logging.getLogger("threadloom.providers")
LINE_LIMIT = 64 * 1024 * 1024


class JsonLinesProcess:
    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name
        self.incoming: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self._write_lock = asyncio.Lock()
        self._reader = asyncio.create_task(self._read(), name=f"{name}-reader")
        self._stderr = asyncio.create_task(self._drain_stderr(), name=f"{name}-stderr")
        self.exit_code: int | None = None

    @classmethod
    async def spawn(
        cls, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None, name: str = "provider"
    ) -> JsonLinesProcess:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=dict(env),
            cwd=cwd,
            limit=LINE_LIMIT,
            start_new_session=True,
        )
        return cls(proc, name)

    @property
    def alive(self) -> bool:
        return self.proc.returncode is None and not self._reader.done()

    def scrub(self, text: str) -> str:
        """Text about to be logged; subclasses redact their secrets."""
        return text

    async def _read(self) -> None:
        """Route responses to their requests, everything else to `incoming`.

        Any failure here (an over-long line, a malformed response) kills the child: a peer
        whose output is no longer read would otherwise look alive while nothing moves.
        """
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    log.warning(
                        "%s sent a non-JSON line: %r", self.name, self.scrub(line[:200].decode(errors="replace"))
                    )
                    continue
                if isinstance(message, dict):
                    await self._route(message)
        except Exception:
            log.exception("%s: unreadable output; stopping the process", self.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        finally:
            self.exit_code = await self.proc.wait()
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(ProviderError("exited", f"{self.name} exited ({self.exit_code})"))
            self._pending.clear()
            await self.incoming.put(None)

    async def _route(self, message: dict[str, Any]) -> None:
        if "method" not in message and "id" in message:
            request_id = message["id"]
            future = self._pending.pop(request_id, None) if isinstance(request_id, int) else None
            if future is not None and not future.done():
                if "error" in message:
                    err = message["error"] if isinstance(message["error"], dict) else {"message": message["error"]}
                    future.set_exception(ProviderError(str(err.get("code")), self.scrub(str(err.get("message")))))
                else:
                    future.set_result(message.get("result"))
            return
        await self.incoming.put(message)

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            log.debug("%s: %s", self.name, line.decode(errors="replace").rstrip())

    async def _write(self, message: dict[str, Any]) -> None:
        assert self.proc.stdin is not None
        async with self._write_lock:
            if self.proc.stdin.is_closing():
                raise ProviderError("exited", f"{self.name} is not running")
            self.proc.stdin.write(orjson.dumps(message) + b"\n")
            try:
                await self.proc.stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as error:
                raise ProviderError("exited", f"{self.name} is not running") from error

    async def request(self, method: str, params: dict[str, Any], wait_s: float = 60.0) -> Any:
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if not self.alive:
            self._pending.pop(request_id, None)
            raise ProviderError("exited", f"{self.name} is not running")
        try:
            await self._write({"id": request_id, "method": method, "params": params})
        except ProviderError:
            self._pending.pop(request_id, None)
            raise
        try:
            return await asyncio.wait_for(future, wait_s)
        except TimeoutError as error:
            self._pending.pop(request_id, None)
            raise ProviderError("timeout", f"{self.name} did not answer {method} in {wait_s}s") from error

    async def notify(self, method: str, params: dict[str, Any] | None = None) -> None:
        message: dict[str, Any] = {"method": method}
        if params is not None:
            message["params"] = params
        await self._write(message)

    async def respond(self, request_id: Any, result: dict[str, Any]) -> None:
        await self._write({"id": request_id, "result": result})

    async def close(self, grace: float = 5.0) -> None:
        """Close stdin (the polite stop), then terminate the process group if it lingers."""
        await stop_child(self.proc, grace)
        for task in (self._reader, self._stderr):
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def stop_child(proc: asyncio.subprocess.Process, grace: float = 5.0) -> None:
    """Close an agent's stdin (every CLI here ends on EOF), then kill its process group after `grace` s."""
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()

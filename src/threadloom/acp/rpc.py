"""JSON-RPC 2.0 over JSON lines on stdio, both ways: the editor's requests and the bridge's own.

Every request the editor sends runs as a task of its own, so `session/cancel` is read while a
`session/prompt` is still streaming, and a permission request to the editor can wait for the user.
`$/cancel_request` cancels one of them (a method may say how it is cancelled instead, as a prompt stops its
run); a request of the bridge's own that is no longer wanted is withdrawn with `$/cancel_request` too. A line
over the reader's limit is answered as unreadable and the next one is read: one bad line never ends the bridge.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from threadloom.agent.wire import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    LineReader,
    LineWriter,
)

log = logging.getLogger("threadloom.acp")

# ACP's own codes beside JSON-RPC's standard ones.
AUTH_REQUIRED = -32000
RESOURCE_NOT_FOUND = -32002
REQUEST_CANCELLED = -32800
CANCEL_REQUEST = "$/cancel_request"

Params = dict[str, Any]
Handler = Callable[[Params], Awaitable[Any]]


class AcpError(Exception):
    """A request's error response; `code` is Threadloom's stable error code when there is one."""

    def __init__(self, rpc_code: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.rpc_code = rpc_code
        self.message = message
        self.code = code

    def body(self) -> dict[str, Any]:
        error: dict[str, Any] = {"code": self.rpc_code, "message": self.message}
        if self.code is not None:
            error["data"] = {"code": self.code}
        return error


class PeerGone(Exception):
    """The editor closed its side before answering."""


class Connection:
    def __init__(
        self,
        reader: LineReader,
        writer: LineWriter,
        requests: Mapping[str, Handler],
        notifications: Mapping[str, Handler],
        cancellers: Mapping[str, Handler] | None = None,
    ) -> None:
        """`cancellers`: for a method whose request is cancelled its own way, what `$/cancel_request` does
        (given the request's params) instead of cancelling the handler."""
        self._reader = reader
        self._writer = writer
        self._requests = requests
        self._notifications = notifications
        self._cancellers = cancellers or {}
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._running: dict[str, tuple[asyncio.Task[None], str, Any]] = {}  # the editor's requests being answered
        self._withdrawn: set[str] = set()

    async def serve(self) -> None:
        """Reads until the editor closes stdin, then stops what its requests started."""
        try:
            while True:
                try:
                    line = await self._reader.readline()
                except ValueError as exc:  # over the line limit: its rest is skipped, the connection goes on
                    await self._send({"id": None, "error": {"code": PARSE_ERROR, "message": f"unreadable line: {exc}"}})
                    continue
                if line is None:
                    break
                if line.strip():
                    await self._dispatch(line)
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._tasks:
                await asyncio.wait(self._tasks)
            for future in self._pending.values():
                if not future.done():
                    future.set_exception(PeerGone("the editor closed the connection"))

    async def request(self, method: str, params: Params) -> Any:
        """Asks the editor and waits for its result (an error response raises `AcpError`)."""
        request_id = next(self._ids)
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self._send({"id": request_id, "method": method, "params": params})
            return await future
        except asyncio.CancelledError:
            if future.cancelled():  # not answered, no longer wanted (answered elsewhere, the prompt ended): withdrawn
                with contextlib.suppress(Exception):
                    await asyncio.shield(self.notify(CANCEL_REQUEST, {"requestId": request_id}))
            raise
        finally:
            self._pending.pop(request_id, None)

    async def notify(self, method: str, params: Params) -> None:
        await self._send({"method": method, "params": params})

    async def _send(self, message: dict[str, Any]) -> None:
        await self._writer.send({"jsonrpc": "2.0", **message})

    async def _dispatch(self, line: bytes) -> None:
        try:
            message = json.loads(line)
        except ValueError:
            await self._send({"id": None, "error": {"code": PARSE_ERROR, "message": "not JSON"}})
            return
        if not isinstance(message, dict):
            await self._send({"id": None, "error": {"code": INVALID_REQUEST, "message": "not a JSON-RPC message"}})
            return
        method, request_id = message.get("method"), message.get("id")
        if method is None:
            self._resolve(message)
        elif request_id is None:
            if method == CANCEL_REQUEST:
                await self._cancel(message.get("params"))
                return
            handler = self._notifications.get(str(method))
            if handler is not None:  # unknown notifications are ignored, as JSON-RPC asks
                self._spawn(self._notified(handler, message.get("params") or {}))
        else:
            params = message.get("params") or {}
            key = _key(request_id)
            task = self._spawn(self._answer(request_id, str(method), params))
            self._running[key] = (task, str(method), params)
            task.add_done_callback(lambda done: self._answered(request_id, done))

    def _spawn(self, work: Awaitable[None]) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _answered(self, request_id: Any, task: asyncio.Task[None]) -> None:
        key = _key(request_id)
        self._running.pop(key, None)
        if key in self._withdrawn:  # cancelled by `$/cancel_request`: its answer says so
            self._withdrawn.discard(key)
            error = {"code": REQUEST_CANCELLED, "message": "request cancelled"}
            self._spawn(self._send({"id": request_id, "error": error}))

    async def _cancel(self, params: Any) -> None:
        """`$/cancel_request`: the request is cancelled its method's way, else its handler stops and the request
        is answered with -32800. An unknown or finished request: nothing to do."""
        key = _key((params or {}).get("requestId") if isinstance(params, dict) else None)
        running = self._running.get(key)
        if running is None:
            return
        task, method, request_params = running
        canceller = self._cancellers.get(method)
        if canceller is not None and isinstance(request_params, dict):
            self._spawn(self._notified(canceller, request_params))
            return
        self._withdrawn.add(key)
        task.cancel()

    def _resolve(self, message: dict[str, Any]) -> None:
        future = self._pending.get(message.get("id"))  # type: ignore[arg-type]
        if future is None or future.done():
            return
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            future.set_exception(AcpError(int(error.get("code", INTERNAL_ERROR)), str(error.get("message"))))
        else:
            future.set_result(message.get("result"))

    async def _answer(self, request_id: Any, method: str, params: Any) -> None:
        handler = self._requests.get(method)
        try:
            if handler is None:
                raise AcpError(METHOD_NOT_FOUND, f"unknown method {method!r}")
            if not isinstance(params, dict):
                raise AcpError(INVALID_PARAMS, "params must be an object")
            result = await handler(params)
        except AcpError as exc:
            await self._send({"id": request_id, "error": exc.body()})
        except Exception:
            log.exception("%s failed", method)
            await self._send({"id": request_id, "error": {"code": INTERNAL_ERROR, "message": f"{method} failed"}})
        else:
            await self._send({"id": request_id, "result": result})

    async def _notified(self, handler: Handler, params: Any) -> None:
        try:
            await handler(params if isinstance(params, dict) else {})
        except Exception:
            log.exception("a notification's handler failed")


def _key(request_id: Any) -> str:
    """A request id as a dict key (JSON-RPC ids are numbers or strings; 1 and "1" are different ids)."""
    return json.dumps(request_id)

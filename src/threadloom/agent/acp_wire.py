"""JSON-RPC 2.0 lines for the ACP face: responses, notifications, and the agent's own requests to the client.

The agent's requests (permissions, elicitations) may be outstanding several at once; each waits on its own id.
When the turn that asked is cancelled, the client is told with `$/cancel_request` so it can close its dialog.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

from threadloom.agent.wire import LineWriter, Message, PeerError

log = logging.getLogger("threadloom.agent")

# ACP's codes beside JSON-RPC's own.
RESOURCE_NOT_FOUND = -32002
REQUEST_CANCELLED = -32800


class Rpc:
    def __init__(self, writer: LineWriter) -> None:
        self._writer = writer
        self._ids = itertools.count(0)
        self._pending: dict[int, asyncio.Future[Message]] = {}

    async def send(self, message: Message) -> None:
        await self._writer.send({"jsonrpc": "2.0", **message})

    async def notify(self, method: str, params: Message) -> None:
        await self.send({"method": method, "params": params})

    async def respond(self, request_id: Any, result: Message) -> None:
        await self.send({"id": request_id, "result": result})

    async def fail(self, request_id: Any, code: int, message: str) -> None:
        await self.send({"id": request_id, "error": {"code": code, "message": message}})

    async def request(self, method: str, params: Message) -> Message:
        """Asks the client and waits for its `result` (raises `PeerError` on `error`); cancelled while waiting,
        it tells the client with `$/cancel_request`."""
        request_id = next(self._ids)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        try:
            await self.send({"id": request_id, "method": method, "params": params})
            return await future
        except asyncio.CancelledError:
            await asyncio.shield(self.notify("$/cancel_request", {"requestId": request_id}))
            raise
        finally:
            self._pending.pop(request_id, None)

    def outstanding(self) -> int:
        """How many of the agent's requests wait for an answer."""
        return len(self._pending)

    def resolve(self, message: Message) -> None:
        request_id = message.get("id")
        future = self._pending.get(request_id) if isinstance(request_id, int) else None
        if future is None or future.done():
            log.warning("response to unknown request id %r ignored", request_id)
            return
        if "error" in message:
            error = message["error"]
            text = error.get("message") if isinstance(error, dict) else None
            future.set_exception(PeerError(str(text or error)))
            return
        result = message.get("result")
        future.set_result(result if isinstance(result, dict) else {})

"""A JSON-lines peer over a child process's stdio (Codex app-server framing: no "jsonrpc").

Requests get integer ids and await their response; notifications and the child's own
requests go to `incoming`. When the child exits, pending requests fail and `incoming`
ends with `None`. Spawning, reading, writing and stopping are `child_process.ChildProcess`'s.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from threadloom.providers.child_process import ChildProcess, spawn_process
from threadloom.providers.contract import ProviderError


class JsonLinesProcess(ChildProcess):
    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        super().__init__(proc, name)
        self.incoming: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 0
        self.start()

    @classmethod
    async def spawn(
        cls, argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None, name: str = "provider"
    ) -> JsonLinesProcess:
        return cls(await spawn_process(argv, env=env, cwd=cwd), name)

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """The child's notifications and requests, until it exits (then `exit_code` is set)."""
        while (message := await self.incoming.get()) is not None:
            yield message

    async def handle(self, message: dict[str, Any]) -> None:
        """Route responses to their requests, everything else to `incoming`."""
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

    def exited(self, code: int) -> None:
        for future in self._pending.values():
            if not future.done():
                future.set_exception(ProviderError("exited", f"{self.name} exited ({code})"))
        self._pending.clear()
        self.incoming.put_nowait(None)

    async def request(self, method: str, params: dict[str, Any], wait_s: float = 60.0) -> Any:
        self._next_id += 1
        request_id = self._next_id
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[request_id] = future
        if not self.alive:
            self._pending.pop(request_id, None)
            raise ProviderError("exited", f"{self.name} is not running")
        try:
            await self.write({"id": request_id, "method": method, "params": params})
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
        await self.write(message)

    async def respond(self, request_id: Any, result: dict[str, Any]) -> None:
        await self.write({"id": request_id, "result": result})

"""A small asyncio ACP (Agent Client Protocol v1) client for tests: JSON-RPC 2.0 lines over a process's stdio.

API
---
    async with AcpClient.spawn([sys.executable, "-m", "threadloom.agent", "--acp", "--state-dir", d]) as agent:
        init = await agent.initialize()                 # the `initialize` result (elicitation offered by default)
        sid = await agent.new_session(cwd)              # `session/new` -> the session id
        result = await agent.prompt(sid, "hello")       # `session/prompt`, waits for its response (dict)
        agent.texts(sid)                                # the agent_message_chunk texts so far, joined
        agent.updates(sid, "tool_call")                 # the session's updates (optionally of some kinds)

- `AcpClient.spawn(argv, env=None, cwd=None, limit=64 MiB)`: starts the process (stdin/stdout pipes, stderr
  inherited); use as an async context manager, or call `close()` (ends stdin, waits, kills after 10 s).
- `call(method, params, within=30)`: a request; returns the whole response (`{"result"}` or `{"error"}`).
  `request(...)` returns the `result` and fails the test on an error; `error(...)` returns the `error` and fails
  on a result. `notify(method, params)` sends a notification. `send_line(bytes)` writes raw bytes.
- `start_prompt(sid, text_or_blocks)` -> (request id, future of the whole response): a prompt left running,
  to cancel or steer. `prompt(sid, text)` = start and await its `result`.
- `cancel(sid)` (`session/cancel`), `cancel_request(id)` (`$/cancel_request`), `steer(sid, text)`
  (`_session/steering`), `load(sid, cwd)`, `resume(sid, cwd)`, `fork(sid, cwd)`, `list_sessions(cwd=None)`,
  `close_session(sid)`, `set_config(sid, config_id, value)`, `rewind(sid, n)`, `revert_files(sid, n)`.
- Updates: every `session/update` is kept in `notifications` (arrival order). `updates(sid, *kinds)` filters by
  `sessionUpdate`. `await wait_update(sid, predicate, within=30)` waits for one that matches (including ones
  already received) and returns it; `await wait_for(predicate)` waits for any message (notification or request)
  matching `predicate`.
- Requests from the agent (`session/request_permission`, `elicitation/create`, anything else) are answered by
  `on_permission(params) -> optionId | None` (None: the `cancelled` outcome), `on_elicitation(params) -> result`
  and `on_request(method, params) -> result`; all are async-or-plain callables you may replace; the default
  permission answer is `"allow"`, the default elicitation answer declines. Set `hold_requests = True` to keep
  them unanswered: they collect in `held` (dicts with `id`, `method`, `params`) for `answer(id, result)` or
  `answer_error(id, code, message)`. `cancelled_requests` holds the ids the agent sent `$/cancel_request` for.
- `received`: every message in arrival order, responses included (to check what came before a response).
- `oversized`: lines the reader skipped for exceeding `limit` (their sizes); the reader goes on after them.
- `returncode`: the process's exit code once it ended (`await wait_exit(within)` waits for it).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import json
from collections.abc import Callable, Sequence
from typing import Any

Message = dict[str, Any]
Predicate = Callable[[Message], bool]
LINE_LIMIT = 64 * 1024 * 1024


class AcpClient:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.notifications: list[Message] = []  # session/update params, in arrival order
        self.messages: list[Message] = []  # every notification and agent request, in arrival order
        self.received: list[Message] = []  # everything, responses too, in arrival order
        self.held: list[Message] = []
        self.hold_requests = False
        self.cancelled_requests: list[Any] = []
        self.oversized: list[int] = []
        self.on_permission: Callable[[Message], Any] = lambda params: "allow"
        self.on_elicitation: Callable[[Message], Any] = lambda params: {"action": "decline"}
        self.on_request: Callable[[str, Message], Any] = lambda method, params: {}
        self._ids = itertools.count(1)
        self._responses: dict[Any, asyncio.Future[Message]] = {}
        self._changed = asyncio.Event()
        self._closed = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def spawn(
        cls, argv: Sequence[str], env: dict[str, str] | None = None, cwd: str | None = None, limit: int = LINE_LIMIT
    ) -> AcpClient:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, env=env, cwd=cwd, limit=limit
        )
        return cls(proc)

    async def __aenter__(self) -> AcpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def returncode(self) -> int | None:
        return self.proc.returncode

    async def close(self) -> None:
        """Ends stdin (the agent's cue to exit), waits up to 10 s, then kills."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except TimeoutError:
            self.proc.kill()
            await self.proc.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader

    async def wait_exit(self, within: float = 30) -> int:
        return await asyncio.wait_for(self.proc.wait(), within)

    # --- reading ---

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        stdout = self.proc.stdout
        try:
            while True:
                line, skipped = await _read_line(stdout)
                if skipped:  # over the limit: dropped, and the reader goes on
                    self.oversized.append(skipped)
                    continue
                if not line:
                    break
                if line.strip():
                    self._dispatch(json.loads(line))
        finally:
            self._closed = True
            for future in self._responses.values():
                if not future.done():
                    future.set_exception(ConnectionError("the agent's stdout closed"))
            self._changed.set()

    def _dispatch(self, message: Message) -> None:
        self.received.append(message)
        method = message.get("method")
        if method is None:
            future = self._responses.pop(message.get("id"), None)
            if future is not None and not future.done():
                future.set_result(message)
        elif "id" in message:
            self.messages.append(message)
            task = asyncio.create_task(self._answer(message))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self.messages.append(message)
            params = message.get("params") or {}
            if method == "session/update":
                self.notifications.append(params)
            elif method == "$/cancel_request":
                self.cancelled_requests.append(params.get("requestId"))
        self._changed.set()

    async def _answer(self, message: Message) -> None:
        if self.hold_requests:
            self.held.append(message)
            self._changed.set()
            return
        method, params = message["method"], message.get("params") or {}
        if method == "session/request_permission":
            option = await _maybe_await(self.on_permission(params))
            outcome = {"outcome": "cancelled"} if option is None else {"outcome": "selected", "optionId": option}
            result: Message = {"outcome": outcome}
        elif method == "elicitation/create":
            result = await _maybe_await(self.on_elicitation(params))
        else:
            result = await _maybe_await(self.on_request(method, params))
        await self.answer(message["id"], result)

    # --- writing ---

    async def send(self, message: Message) -> None:
        await self.send_line(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def send_line(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        await self.proc.stdin.drain()

    async def answer(self, request_id: Any, result: Message) -> None:
        await self.send({"id": request_id, "result": result})

    async def answer_error(self, request_id: Any, code: int, message: str) -> None:
        await self.send({"id": request_id, "error": {"code": code, "message": message}})

    async def notify(self, method: str, params: Message) -> None:
        await self.send({"method": method, "params": params})

    def start(self, method: str, params: Message) -> tuple[int, asyncio.Future[Message]]:
        """Sends a request without waiting: its id and the future of its whole response."""
        request_id = next(self._ids)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._responses[request_id] = future
        task = asyncio.create_task(self.send({"id": request_id, "method": method, "params": params}))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return request_id, future

    async def call(self, method: str, params: Message, within: float = 30) -> Message:
        _, future = self.start(method, params)
        return await asyncio.wait_for(future, within)

    async def request(self, method: str, params: Message, within: float = 30) -> Message:
        response = await self.call(method, params, within)
        assert "error" not in response, response
        result: Message = response["result"]
        return result

    async def error(self, method: str, params: Message, within: float = 30) -> Message:
        response = await self.call(method, params, within)
        assert "error" in response, response
        error: Message = response["error"]
        return error

    # --- ACP methods ---

    async def initialize(self, elicitation: bool = True) -> Message:
        capabilities: Message = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False}
        if elicitation:
            capabilities["elicitation"] = {"form": {}}
        info = {"name": "tests", "version": "0"}  # ACP's Implementation needs both (Qwen Code refuses less)
        params = {"protocolVersion": 1, "clientCapabilities": capabilities, "clientInfo": info}
        return await self.request("initialize", params)

    async def new_session(self, cwd: str) -> str:
        result = await self.request("session/new", {"cwd": cwd, "mcpServers": []})
        return str(result["sessionId"])

    def start_prompt(self, session_id: str, prompt: str | list[Message]) -> tuple[int, asyncio.Future[Message]]:
        blocks = [{"type": "text", "text": prompt}] if isinstance(prompt, str) else prompt
        return self.start("session/prompt", {"sessionId": session_id, "prompt": blocks})

    async def prompt(self, session_id: str, prompt: str | list[Message], within: float = 30) -> Message:
        _, future = self.start_prompt(session_id, prompt)
        response = await asyncio.wait_for(future, within)
        assert "error" not in response, response
        result: Message = response["result"]
        return result

    async def cancel(self, session_id: str) -> None:
        await self.notify("session/cancel", {"sessionId": session_id})

    async def cancel_request(self, request_id: Any) -> None:
        await self.notify("$/cancel_request", {"requestId": request_id})

    async def steer(self, session_id: str, text: str) -> Message:
        params = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
        return await self.request("_session/steering", params)

    async def load(self, session_id: str, cwd: str) -> Message:
        return await self.request("session/load", {"sessionId": session_id, "cwd": cwd, "mcpServers": []})

    async def resume(self, session_id: str, cwd: str) -> Message:
        return await self.request("session/resume", {"sessionId": session_id, "cwd": cwd})

    async def fork(self, session_id: str, cwd: str) -> str:
        result = await self.request("session/fork", {"sessionId": session_id, "cwd": cwd})
        return str(result["sessionId"])

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None) -> Message:
        params = {k: v for k, v in (("cwd", cwd), ("cursor", cursor)) if v is not None}
        return await self.request("session/list", params)

    async def close_session(self, session_id: str) -> Message:
        return await self.request("session/close", {"sessionId": session_id})

    async def set_config(self, session_id: str, config_id: str, value: str) -> Message:
        params = {"sessionId": session_id, "configId": config_id, "value": value}
        return await self.request("session/set_config_option", params)

    async def rewind(self, session_id: str, turns: int) -> Message:
        return await self.request("_session/rewind", {"sessionId": session_id, "numTurns": turns})

    async def revert_files(self, session_id: str, turns: int) -> Message:
        return await self.request("_session/files/revert", {"sessionId": session_id, "numTurns": turns})

    # --- what arrived ---

    def updates(self, session_id: str, *kinds: str) -> list[Message]:
        return [
            n["update"]
            for n in self.notifications
            if n.get("sessionId") == session_id and (not kinds or n["update"].get("sessionUpdate") in kinds)
        ]

    def texts(self, session_id: str, kind: str = "agent_message_chunk") -> str:
        return "".join(u["content"].get("text", "") for u in self.updates(session_id, kind))

    async def wait_for(self, predicate: Predicate, within: float = 30) -> Message:
        """The first message (notification or agent request) matching `predicate`, received or to come."""
        checked = 0
        async with asyncio.timeout(within):
            while True:
                for message in self.messages[checked:]:
                    if predicate(message):
                        return message
                checked = len(self.messages)
                if self._closed:
                    raise ConnectionError("the agent's stdout closed")
                self._changed.clear()
                await self._changed.wait()

    async def wait_update(self, session_id: str, predicate: Predicate, within: float = 30) -> Message:
        def match(message: Message) -> bool:
            params = message.get("params") or {}
            return (
                message.get("method") == "session/update"
                and params.get("sessionId") == session_id
                and predicate(params["update"])
            )

        found = await self.wait_for(match, within)
        update: Message = found["params"]["update"]
        return update

    async def wait_held(self, count: int, within: float = 30) -> list[Message]:
        """Waits until `count` agent requests are held (`hold_requests`), and returns them."""
        async with asyncio.timeout(within):
            while len(self.held) < count:
                if self._closed:
                    raise ConnectionError("the agent's stdout closed")
                self._changed.clear()
                await self._changed.wait()
        return list(self.held)


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


async def _read_line(stream: asyncio.StreamReader) -> tuple[bytes, int]:
    """The next line (b"" at the end), or (b"", its size) for a line longer than the stream's limit, dropped.

    `readuntil` leaves an over-long line in the buffer (unlike `readline`), so it is dropped piece by piece."""
    skipped = 0
    while True:
        try:
            line = await stream.readuntil(b"\n")
        except asyncio.IncompleteReadError as exc:  # the end, maybe after a last line without a newline
            line = exc.partial
        except asyncio.LimitOverrunError as exc:
            skipped += len(await stream.readexactly(max(exc.consumed, 1)))
            continue
        return (b"", skipped + len(line)) if skipped else (line, 0)

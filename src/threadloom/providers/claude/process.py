"""One `claude -p` child: its command line, and the stream-json messages the driver writes to it.

Spawning, reading, the stderr tail and stopping are `child_process.ChildProcess`'s; what a
message means is the runtime's (`on_message`, `on_exit`). No `initialize` control request is
needed (it only lists commands, models, agents).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from threadloom.providers.child_process import ChildProcess, spawn_process
from threadloom.providers.claude.permissions import permission_mode
from threadloom.providers.contract import ProviderError

log = logging.getLogger("threadloom.providers.claude")


def claude_argv(
    binary: str, *, mode: str, settings: dict[str, Any] | None, model: str | None, session: list[str]
) -> list[str]:
    """The command line of a thread's process: stream-json both ways, prompts over stdio, its sandbox."""
    argv = [
        binary,
        "-p",
        "--output-format",
        "stream-json",
        "--input-format",
        "stream-json",
        "--verbose",
        "--include-partial-messages",
        "--replay-user-messages",
        "--permission-prompt-tool",
        "stdio",
        "--permission-mode",
        permission_mode(mode),
        "--setting-sources",
        "user",  # never the workspace's .claude/settings.json: its hooks would run outside the sandbox
    ]
    if settings is not None:
        argv += ["--settings", orjson.dumps(settings).decode()]
    if model:
        argv += ["--model", model]
    return argv + session


class ClaudeProcess(ChildProcess):
    """A running `claude -p`; each stdout message goes to `on_message`, its exit to `on_exit`."""

    def __init__(
        self,
        proc: asyncio.subprocess.Process,
        name: str = "claude",
        scrub: Callable[[str], str] | None = None,
        on_message: Callable[[ClaudeProcess, dict[str, Any]], Awaitable[None]] | None = None,
        on_exit: Callable[[ClaudeProcess, int], None] | None = None,
    ) -> None:
        super().__init__(proc, name, scrub)
        self._on_message = on_message
        self._on_exit = on_exit
        self._next_control = 0

    @classmethod
    async def spawn(
        cls,
        argv: list[str],
        *,
        env: dict[str, str],
        cwd: str,
        name: str,
        scrub: Callable[[str], str],
        on_message: Callable[[ClaudeProcess, dict[str, Any]], Awaitable[None]],
        on_exit: Callable[[ClaudeProcess, int], None],
    ) -> ClaudeProcess:
        try:
            proc = await spawn_process(argv, env=env, cwd=cwd)
        except OSError as error:
            raise ProviderError("spawn_failed", f"could not start claude in {cwd}: {error}") from error
        child = cls(proc, name, scrub, on_message, on_exit)
        child.start()
        return child

    async def handle(self, message: dict[str, Any]) -> None:
        """One message to the runtime; a handler's failure is logged and the next message read."""
        if self._on_message is None:
            return
        try:
            await self._on_message(self, message)
        except Exception:
            log.exception("claude: could not handle a %s message", message.get("type"))

    def exited(self, code: int) -> None:
        if self._on_exit is not None:
            self._on_exit(self, code)

    async def send_user(self, text: str, handoff: str | None = None) -> None:
        """A user message; a handoff goes as a text block of its own ahead of the user's (the Messages API
        keeps a message's content blocks apart), so the user's words reach the model unchanged."""
        content: str | list[dict[str, str]] = text
        if handoff is not None:
            content = [{"type": "text", "text": handoff}, {"type": "text", "text": text}]
        message = {"role": "user", "content": content}
        await self.write({"type": "user", "session_id": "", "parent_tool_use_id": None, "message": message})

    async def send_interrupt(self) -> None:
        """Interrupt the running query (a no-op while idle); a process that is gone is ignored."""
        self._next_control += 1
        request = {"subtype": "interrupt"}
        with contextlib.suppress(ProviderError):
            await self.write({"type": "control_request", "request_id": f"tl-{self._next_control}", "request": request})

    async def answer(self, request_id: str, response: dict[str, Any]) -> None:
        """Answer a control request (a permission prompt) of the CLI."""
        body = {"subtype": "success", "request_id": request_id, "response": response}
        await self.write({"type": "control_response", "response": body})

    async def answer_error(self, request_id: str, error: str) -> None:
        body = {"subtype": "error", "request_id": request_id, "error": error}
        await self.write({"type": "control_response", "response": body})

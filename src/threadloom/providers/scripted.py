"""The `scripted` driver: runs `python -m threadloom.agent` and speaks its Codex-shaped protocol."""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal

import orjson

from threadloom.providers.contract import (
    Capabilities,
    ItemCompleted,
    ItemKind,
    ItemStarted,
    OutputDelta,
    ProviderError,
    ProviderEvent,
    RequestOpened,
    RuntimeExited,
    TextDelta,
    ThreadSettings,
    TodoUpdated,
    TurnCompleted,
    TurnStarted,
    Warning,
)
from threadloom.providers.jsonlines import JsonLinesProcess

_ITEM_KINDS: dict[str, ItemKind] = {
    "agentMessage": "assistant_message",
    "commandExecution": "tool_call",
    "fileChange": "file_change",
    "plan": "plan",
    "reasoning": "reasoning",
    "collabAgentToolCall": "subagent",
}
_ITEM_STATUSES: dict[str, Literal["completed", "failed", "declined", "interrupted"]] = {
    "completed": "completed",
    "failed": "failed",
    "declined": "declined",
    "interrupted": "interrupted",
}
_REQUEST_KINDS = {
    "item/commandExecution/requestApproval": "command_approval",
    "item/fileChange/requestApproval": "file_change_approval",
    "item/tool/requestUserInput": "user_input",
}


def _item_title(item: dict[str, Any]) -> str | None:
    kind = item.get("type")
    if kind == "commandExecution":
        return str(item.get("command"))
    if kind == "fileChange":
        return ", ".join(str(c.get("path")) for c in item.get("changes") or [])
    if kind == "collabAgentToolCall":
        return str(item.get("prompt"))
    return None


def _item_detail(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in ("id", "type", "text")}


def translate(message: dict[str, Any]) -> ProviderEvent | None:
    """One agent notification or request → one normalized event (None: ignored noise)."""
    method = message.get("method")
    params = message.get("params") or {}
    thread = str(params.get("threadId", ""))
    turn = str(params.get("turnId", ""))
    if method == "turn/started":
        t = params.get("turn") or {}
        return TurnStarted(thread, str(t.get("id")), t.get("parentTurnId"))
    if method == "turn/completed":
        t = params.get("turn") or {}
        error = (t.get("error") or {}).get("message")
        return TurnCompleted(thread, str(t.get("id")), t.get("status", "completed"), error, t.get("parentTurnId"))
    if method in ("item/started", "item/completed"):
        item = params.get("item") or {}
        kind = _ITEM_KINDS.get(str(item.get("type")), "other")
        if method == "item/started":
            return ItemStarted(thread, turn, str(item.get("id")), kind, _item_title(item), _item_detail(item))
        status = _ITEM_STATUSES.get(str(item.get("status") or "completed"), "completed")
        return ItemCompleted(thread, turn, str(item.get("id")), kind, status, item.get("text"), _item_detail(item))
    if method in ("item/agentMessage/delta", "item/plan/delta"):
        return TextDelta(thread, turn, str(params.get("itemId")), str(params.get("delta", "")))
    if method == "item/commandExecution/outputDelta":
        return OutputDelta(thread, turn, str(params.get("itemId")), str(params.get("delta", "")))
    if method == "turn/plan/updated":
        return TodoUpdated(thread, turn, list(params.get("plan") or []))
    if method in _REQUEST_KINDS and "id" in message:
        return RequestOpened(thread, turn, str(message["id"]), _REQUEST_KINDS[method], dict(params))
    if method in ("warning", "error"):
        return Warning(thread or None, str(params.get("message", method)))
    return None


class ScriptedRuntime:
    def __init__(self, process: JsonLinesProcess, capabilities: Capabilities) -> None:
        self.process = process
        self.capabilities = capabilities

    @property
    def alive(self) -> bool:
        return self.process.alive

    async def events(self) -> AsyncIterator[ProviderEvent]:
        while True:
            message = await self.process.incoming.get()
            if message is None:
                yield RuntimeExited("the scripted agent exited", self.process.exit_code)
                return
            event = translate(message)
            if event is not None:
                yield event

    async def start_thread(self, settings: ThreadSettings) -> str:
        result = await self.process.request("thread/start", {"cwd": settings.cwd})
        return str(result["thread"]["id"])

    async def resume_thread(self, native_thread: str, settings: ThreadSettings) -> None:
        await self.process.request("thread/resume", {"threadId": native_thread})

    async def start_turn(self, native_thread: str, text: str) -> str:
        result = await self.process.request(
            "turn/start", {"threadId": native_thread, "input": [{"type": "text", "text": text}]}
        )
        return str(result["turn"]["id"])

    async def steer_turn(self, native_thread: str, native_turn: str, text: str) -> None:
        await self.process.request(
            "turn/steer",
            {"threadId": native_thread, "expectedTurnId": native_turn, "input": [{"type": "text", "text": text}]},
        )

    async def interrupt_turn(self, native_thread: str, native_turn: str) -> None:
        await self.process.request("turn/interrupt", {"threadId": native_thread, "turnId": native_turn})

    async def respond_to_request(self, request_ref: str, response: dict[str, Any]) -> None:
        await self.process.respond(request_ref, response)

    async def fork_thread(self, native_thread: str, native_turn: str | None) -> str:
        raise ProviderError("unsupported", "the scripted agent cannot fork threads")

    async def rollback_thread(self, native_thread: str, before_turn: str) -> None:
        raise ProviderError("unsupported", "the scripted agent cannot roll back threads")

    async def read_thread_snapshot(self, native_thread: str) -> dict[str, Any]:
        result = await self.process.request("thread/read", {"threadId": native_thread})
        return dict(result["thread"])

    async def close(self) -> None:
        await self.process.close()


class ScriptedDriver:
    """One configured `scripted` instance: its state folder, chunk delay and capability flags."""

    def __init__(self, instance_id: str, state_dir: Path, options: dict[str, Any]) -> None:
        self.instance_id = instance_id
        self.state_dir = state_dir
        self.chunk_delay_ms = int(options.get("chunk_delay_ms", 0))
        self.steering = bool(options.get("supports_active_steering", True))
        self.interrupt = bool(options.get("supports_interrupt", True))
        self.questions = bool(options.get("supports_structured_questions", True))

    def capabilities(self) -> Capabilities:
        return Capabilities(
            supports_active_steering=self.steering,
            supports_interrupt=self.interrupt,
            supports_steering_by_interrupt_restart=self.interrupt,
            can_read_thread_snapshot=True,
            supports_structured_questions=self.questions,
            emits_todo_list=True,
            supports_subagents=True,
            pending_requests_survive_restart=False,
        )

    async def open_session(self) -> ScriptedRuntime:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        flags = {"supportsActiveSteering": self.steering, "supportsInterrupt": self.interrupt}
        argv = [
            sys.executable,
            "-m",
            "threadloom.agent",
            "--state-dir",
            str(self.state_dir),
            "--chunk-delay-ms",
            str(self.chunk_delay_ms),
            "--capabilities",
            orjson.dumps(flags).decode(),
        ]
        process = await JsonLinesProcess.spawn(argv, env=os.environ, name=f"scripted:{self.instance_id}")
        try:
            await process.request("initialize", {"clientInfo": {"name": "threadloom", "version": "0.1.0"}})
        except ProviderError:
            await process.close()
            raise
        return ScriptedRuntime(process, self.capabilities())

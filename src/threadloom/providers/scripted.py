"""The `scripted` driver: runs `python -m threadloom.agent` and speaks its Codex-shaped protocol.

Its messages are translated by the codex driver's `Translator`: one translation of one protocol.

One agent process per project (`open_session(scope)`): it starts with the minimal environment of
`agent_cli.child_env` (none of the server's variables, no database URL, no tokens), keeps its state in
the project's own folder, may start threads only inside the project's workspace, and runs every command
and file write under bubblewrap (agent/sandbox.py) with the data dir hidden. The thread's runtime mode
travels with `thread/start`/`thread/resume`; `full_access` gets the network only where the instance's
`allow_full_access` is set. It holds no secret (no API key, no `env`), so nothing of its output is redacted:
redacting a value it cannot know would only confirm guesses of it (see `agent_cli.driver_secrets`).
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from threadloom.domain.settings_compat import InPlace
from threadloom.providers.agent_cli import StreamRedactor, child_env
from threadloom.providers.codex_events import Translator
from threadloom.providers.contract import Capabilities, ProviderError, RuntimeExited
from threadloom.providers.jsonlines import JsonLinesProcess

if TYPE_CHECKING:
    from threadloom.providers.contract import ProviderEvent, SessionScope, ThreadSettings


class ScriptedRuntime:
    def __init__(self, process: JsonLinesProcess, capabilities: Capabilities, secrets: tuple[str, ...] = ()) -> None:
        self.process = process
        self.capabilities = capabilities
        self._redactor = StreamRedactor(secrets)
        self._translator = Translator(self._redactor.text)

    @property
    def alive(self) -> bool:
        return self.process.alive

    async def events(self) -> AsyncIterator[ProviderEvent]:
        async for message in self.process.messages():
            for event in self._translator.translate(message):
                for cleaned in self._redactor.events(event):  # a command may print what it can read
                    yield cleaned
        for tail in self._redactor.flush():
            yield tail
        yield RuntimeExited("the scripted agent exited", self.process.exit_code)

    async def start_thread(self, settings: ThreadSettings) -> str:
        params = {"cwd": settings.cwd, "runtimeMode": settings.runtime_mode}
        result = await self.process.request("thread/start", params)
        return str(result["thread"]["id"])

    async def resume_thread(self, native_thread: str, settings: ThreadSettings) -> None:
        params = {"threadId": native_thread, "runtimeMode": settings.runtime_mode, "cwd": settings.cwd}
        await self.process.request("thread/resume", params)

    async def start_turn(
        self, native_thread: str, text: str, settings: ThreadSettings | None = None, handoff: str | None = None
    ) -> str:
        # A handoff travels as its own `context` item: remembered, never read for directives.
        context = [] if handoff is None else [{"type": "context", "text": handoff}]
        result = await self.process.request(
            "turn/start", {"threadId": native_thread, "input": [*context, {"type": "text", "text": text}]}
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
        request_id, result = self._translator.answer(request_ref, response)
        await self.process.respond(request_id, result)

    async def fork_thread(self, native_thread: str, native_turn: str | None) -> str:
        if not self.capabilities.can_fork_thread:
            raise ProviderError("unsupported", "this scripted instance does not fork threads natively")
        params = {"threadId": native_thread}
        if native_turn is not None:
            params["lastTurnId"] = native_turn
        result = await self.process.request("thread/fork", params)
        return str(result["thread"]["id"])

    async def rollback_thread(self, native_thread: str, before_turn: str) -> None:
        if not self.capabilities.can_rollback_thread:
            raise ProviderError("unsupported", "this scripted instance does not roll back threads natively")
        await self.process.request("thread/revert", {"threadId": native_thread, "beforeTurnId": before_turn})

    async def read_thread_snapshot(self, native_thread: str) -> dict[str, Any]:
        result = await self.process.request("thread/read", {"threadId": native_thread})
        return dict(result["thread"])

    async def close(self) -> None:
        await self.process.close()


# The scripted agent's optional features (the driver's attribute) and the capabilities each stands for;
# it has all the others.
_OPTIONAL: dict[str, tuple[str, ...]] = {
    "steering": ("supports_active_steering",),
    "interrupt": ("supports_interrupt", "supports_steering_by_interrupt_restart"),
    "fork": ("can_fork_thread", "can_fork_from_turn"),
    "rollback": ("can_rollback_thread",),
    "questions": ("supports_structured_questions",),
    "cost": ("reports_cost",),
}


class ScriptedDriver:
    """One configured `scripted` instance: its state folder, chunk delay and capability flags.

    `hidden` are folders the agent's commands must never see even when a workspace contains them
    (the data dir).
    """

    def __init__(
        self, instance_id: str, state_dir: Path, options: dict[str, Any], hidden: tuple[Path, ...] = ()
    ) -> None:
        self.instance_id = instance_id
        self.state_dir = state_dir
        self.hidden = hidden
        self.allow_full_access = bool(options.get("allow_full_access", False))
        self.chunk_delay_ms = int(options.get("chunk_delay_ms", 0))
        self.steering = bool(options.get("supports_active_steering", True))
        self.interrupt = bool(options.get("supports_interrupt", True))
        self.questions = bool(options.get("supports_structured_questions", True))
        self.fork = bool(options.get("supports_native_fork", True))
        self.rollback = bool(options.get("supports_native_rollback", True))
        self.cost = bool(options.get("reports_cost", True))  # false: stands for an agent reporting tokens only

    def capabilities(self) -> Capabilities:
        flags = {cap: bool(getattr(self, option)) for option, caps in _OPTIONAL.items() for cap in caps}
        return Capabilities.every(pending_requests_survive_restart=False, **flags)

    def settings_in_place(self) -> InPlace:
        """Nothing: the agent takes its runtime mode with `thread/start`/`thread/resume` only, and has no model
        (a model change stands for one the provider cannot make: the next run gets a new thread and a summary)."""
        return InPlace(model=False, runtime_mode=False)

    async def open_session(self, scope: SessionScope) -> ScriptedRuntime:
        scope.state_dir.mkdir(parents=True, exist_ok=True)
        flags = {
            "supportsActiveSteering": self.steering,
            "supportsInterrupt": self.interrupt,
            "supportsFork": self.fork,
            "supportsRollback": self.rollback,
        }
        argv = [
            sys.executable,
            "-m",
            "threadloom.agent",
            "--state-dir",
            str(scope.state_dir),
            "--workspace",
            scope.workspace_root,
            "--chunk-delay-ms",
            str(self.chunk_delay_ms),
            "--capabilities",
            orjson.dumps(flags).decode(),
        ]
        if self.allow_full_access:
            argv.append("--allow-network")
        for folder in (*self.hidden, self.state_dir):
            argv += ["--hide", str(folder)]
        if scope.own_workspaces is not None:  # forks' own folders, under the data dir
            argv += ["--own-workspaces", scope.own_workspaces]
        name = f"scripted:{self.instance_id}:{scope.project_id}"
        process = await JsonLinesProcess.spawn(argv, env=child_env(None, {}), cwd=str(scope.state_dir), name=name)
        try:
            await process.request("initialize", {"clientInfo": {"name": "threadloom", "version": "0.1.0"}})
        except ProviderError:
            await process.close()
            raise
        return ScriptedRuntime(process, self.capabilities())  # it holds no secret: nothing to redact

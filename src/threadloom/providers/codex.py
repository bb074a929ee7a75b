"""The `codex` driver: the real OpenAI Codex CLI, driven over `codex app-server` (JSON lines on stdio).

Why: Codex's app-server already speaks in threads, turns, items and server-side requests
(approvals, questions), so this driver is mostly a translation (`codex_events`) plus process
care. What it does:

- One runtime = one `codex app-server` child serving one project (`open_session(scope)`),
  with its own CODEX_HOME (`<project state dir>/codex-home`, persistent so threads resume
  across processes), HOME and TMPDIR under the same folder. A `config.toml` is written there on
  every `open_session` from the instance options; the API key is never written: the model
  provider names the variable (`env_key`) and only that variable (plus the basics of
  `agent_cli.child_env`) reaches the child.
- `runtime_mode` → Codex approval policy + permission profile (`MODE_POLICIES`), chosen per
  thread through the `config` override `default_permissions`. The two profiles written into
  config.toml let commands read only Codex's `:minimal` system set (/usr, /etc, /bin, /lib...)
  plus the workspace and Codex's own helper binary: a file beside the workspace, the data dir or
  another project's workspace does not exist inside the sandbox. workspace_write and
  approval_required may write the workspace (and the project's TMPDIR); read_only writes
  nothing; network is off in all three. full_access is the built-in `:danger-full-access`.
- Codex runs its Linux sandbox (bubblewrap) as `codex-linux-sandbox`, an alias of its own
  binary that it creates under CODEX_HOME/tmp at start. It refuses to create the alias when
  CODEX_HOME is under the temporary directory, and then every sandboxed command fails; TMPDIR is
  set to the project's own folder, which also keeps one project's temporary files from another.
- Structured questions (`request_user_input`) are Plan-mode only in 0.171 unless the
  (under development) feature `default_mode_request_user_input` is on; it is, so any turn
  can ask, and its "unstable feature" warning is suppressed.
- Server requests (approvals, permission grants, questions) become `RequestOpened` with
  `request_ref = str(json id)`; the original id (an int) is kept to answer with.
- Quirks handled: after `turn/interrupt` the items that were started never complete, so the
  still-open items of a turn are closed (as interrupted) before its `TurnCompleted`;
  `thread/started` arrives after the `thread/start` response and is ignored.

Instance options (all optional): `binary` (path or name of the codex executable), `model`
(default "gpt-5.5"), `base_url` (default https://api.openai.com/v1), `api_key_env` (default
"OPENAI_API_KEY"; must be set in the server's environment), `env` (extra variables for the
child; HOME defaults to the private `<project state dir>/home`, so the agent's login shells do
not run the server user's profile).

The model provider is always the custom Responses-API provider "threadloom" (no retries,
`env_key` = `api_key_env`), also for api.openai.com: 0.171's built-in OpenAI provider sends no
key from the environment in app-server mode (it expects `codex login`, which would store the
key in CODEX_HOME/auth.json), while a custom provider sends `Authorization: Bearer $env_key`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import os
import re
from collections.abc import AsyncIterator, Coroutine, Mapping, Sequence
from pathlib import Path
from typing import Any

from threadloom import unprivileged
from threadloom.domain.settings_compat import InPlace
from threadloom.providers.agent_cli import (
    CliOptions,
    StreamRedactor,
    child_env,
    driver_secrets,
    find_cli,
    permitted,
    redact,
)
from threadloom.providers.child_process import spawn_process
from threadloom.providers.codex_events import SERVER_NOTIFICATIONS, SERVER_REQUESTS, Translator
from threadloom.providers.contract import (
    Capabilities,
    ProviderError,
    ProviderEvent,
    RuntimeExited,
    SessionScope,
    ThreadSettings,
    UsageReported,
    Warning,
)
from threadloom.providers.jsonlines import JsonLinesProcess
from threadloom.providers.netns import NetworkSandboxUnavailable, isolated, loopback_ports

__all__ = ["CLIENT_METHODS", "SERVER_NOTIFICATIONS", "SERVER_REQUESTS", "CodexDriver", "CodexRuntime"]

log = logging.getLogger("threadloom.providers.codex")

PACKAGE = "@openai/codex"
DEFAULT_MODEL = "gpt-5.5"
DEFAULT_API_KEY_ENV = "OPENAI_API_KEY"
OPENAI_BASE_URL = "https://api.openai.com/v1"

# Requests and notifications this driver sends (checked against the CLI's schema in tests).
CLIENT_METHODS = (
    "initialize",
    "initialized",
    "thread/start",
    "thread/resume",
    "thread/fork",
    "thread/revert",
    "thread/read",
    "turn/start",
    "turn/steer",
    "turn/interrupt",
)

WORKSPACE_PROFILE = "threadloom-workspace"
READ_ONLY_PROFILE = "threadloom-read-only"
# runtime_mode → (approvalPolicy, permission profile); see the module docstring for why.
# "untrusted" asks before every command not on Codex's small known-safe list (even `touch x`).
MODE_POLICIES: dict[str, tuple[str, str]] = {
    "workspace_write": ("never", WORKSPACE_PROFILE),
    "approval_required": ("untrusted", WORKSPACE_PROFILE),
    "read_only": ("never", READ_ONLY_PROFILE),
    "full_access": ("never", ":danger-full-access"),
}

# Codex refuses `thread/revert` on a collab agent's thread ("direct app-server input is not allowed for
# multi-agent v2 sub-agents"): its conversation is not rolled back with its files (rollbackNode: NOT_SUPPORTED).
CAPABILITIES = Capabilities.every(
    pending_requests_survive_restart=False, can_rollback_subagent_thread=False, reports_cost=False
)  # tokens only, no cost


ANSI = re.compile(r"\x1b\[[0-9;]*m")


class CodexProcess(JsonLinesProcess):
    """The app-server peer: stderr is logged redacted and without colour codes, its tail kept for the exit reason."""

    def __init__(
        self, proc: asyncio.subprocess.Process, name: str, secrets: Mapping[str, str], secret_names: tuple[str, ...]
    ) -> None:
        self.secrets = secrets
        self.secret_names = secret_names
        super().__init__(proc, name)

    def clean_stderr(self, line: bytes) -> str:
        return self.scrub(ANSI.sub("", line.decode(errors="replace")).strip())

    def scrub(self, text: str) -> str:
        return redact(text, self.secrets, self.secret_names)

    async def respond_error(self, request_id: Any, message: str) -> None:
        await self.write({"id": request_id, "error": {"code": -32601, "message": message}})


def _text_input(text: str, handoff: str | None = None) -> list[dict[str, Any]]:
    """`turn/start`/`turn/steer` input: the user's text, after a handoff's own text item when there is one.

    Codex makes one user message of a turn's input items, each item its own `input_text` part, so the
    model reads the handoff as a part of its own and the user's words unchanged after it."""
    context = [] if handoff is None else [{"type": "text", "text": handoff, "text_elements": []}]
    return [*context, {"type": "text", "text": text, "text_elements": []}]


class CodexRuntime:
    """One live `codex app-server`; many native threads can share it."""

    def __init__(self, process: CodexProcess, model: str, env: Mapping[str, str], secret_names: tuple[str, ...]):
        self.process = process
        self.capabilities = CAPABILITIES
        self.model = model
        self.allow_full_access = False  # the driver sets the instance's `allow_full_access`
        self._env = env
        self._redactor = StreamRedactor(driver_secrets(env, secret_names))
        self._translator = Translator(self._redact)
        self._settings: dict[str, ThreadSettings] = {}
        self._models: dict[str, str] = {}  # the model each loaded thread runs with
        self._tasks: set[asyncio.Task[None]] = set()  # collab agents being interrupted

    @property
    def alive(self) -> bool:
        return self.process.alive

    async def initialize(self) -> None:
        """The handshake: `initialize` (with the experimental API, as the reference setup uses), then `initialized`."""
        client = {"name": "threadloom", "title": "Threadloom", "version": "0.1.0"}
        await self._request("initialize", {"clientInfo": client, "capabilities": {"experimentalApi": True}})
        await self.process.notify("initialized")

    def _redact(self, text: str) -> str:
        return self._redactor.text(text)

    async def _request(self, method: str, params: dict[str, Any], wait_s: float = 60.0) -> Any:
        try:
            return await self.process.request(method, params, wait_s)
        except ProviderError as error:
            raise ProviderError(error.code, self._redact(f"codex {method}: {error.message}")) from error

    async def events(self) -> AsyncIterator[ProviderEvent]:
        async for message in self.process.messages():
            if "id" in message and "method" in message and message["method"] not in SERVER_REQUESTS:
                with contextlib.suppress(ProviderError):  # if it is gone, the None that follows says so
                    await self.process.respond_error(message["id"], f"threadloom does not handle {message['method']}")
                continue
            auto = self._translator.auto_answer(message)
            if auto is not None:
                with contextlib.suppress(ProviderError):
                    await self.process.respond(message["id"], auto)
                continue
            try:
                events = self._translator.translate(message)
            except Exception:  # one malformed message must not end the stream of every thread
                log.exception("codex: could not translate %s", message.get("method"))
                events = [Warning(str((message.get("params") or {}).get("threadId") or "") or None, "unreadable event")]
            for agent_thread, agent_turn in self._translator.collab.take_interrupts():
                self._later(self._interrupt_quietly(agent_thread, agent_turn))
            for event in events:
                if isinstance(event, UsageReported) and event.model is None:  # Codex names no model: ours
                    event = dataclasses.replace(event, model=self._models.get(event.native_thread))
                for cleaned in self._redactor.events(event):
                    yield cleaned
        for event in self._translator.close_all("interrupted"):
            for cleaned in self._redactor.events(event):
                yield cleaned
        for held in self._redactor.flush():
            yield held
        tail = "; ".join(self.process.stderr_tail)
        reason = "codex app-server exited" + (f": {tail}" if tail else "")
        yield RuntimeExited(self._redact(reason), self.process.exit_code)

    def _thread_params(self, settings: ThreadSettings) -> dict[str, Any]:
        settings = permitted(settings, self.allow_full_access)
        if settings.runtime_mode not in MODE_POLICIES:
            raise ProviderError("bad_settings", f"unknown runtime mode {settings.runtime_mode!r}")
        approval, profile = MODE_POLICIES[settings.runtime_mode]
        # No `sandbox` field: it would switch Codex back to its legacy modes, which read everything.
        return {
            "cwd": settings.cwd,
            "approvalPolicy": approval,
            "config": {"default_permissions": profile},
            "model": settings.model or self.model,
        }

    async def start_thread(self, settings: ThreadSettings) -> str:
        params = self._thread_params(settings)
        result = await self._request("thread/start", params)
        thread = str(result["thread"]["id"])
        self._settings[thread] = settings
        self._models[thread] = params["model"]
        return thread

    async def resume_thread(self, native_thread: str, settings: ThreadSettings) -> None:
        params = self._thread_params(settings)
        await self._request("thread/resume", {"threadId": native_thread, **params})
        self._settings[native_thread] = settings
        self._models[native_thread] = params["model"]

    async def start_turn(
        self, native_thread: str, text: str, settings: ThreadSettings | None = None, handoff: str | None = None
    ) -> str:
        params: dict[str, Any] = {"threadId": native_thread, "input": _text_input(text, handoff)}
        model = None if settings is None else settings.model or self.model
        # turn/start's model holds for this turn and the next ones. Sent only when it changes: Codex takes
        # 5-8 ms longer to start a turn that names a model, even the one the thread already runs with.
        if model is not None and model != self._models.get(native_thread):
            params["model"] = model
        result = await self._request("turn/start", params)
        if model is not None:
            self._models[native_thread] = model
        return str(result["turn"]["id"])

    async def steer_turn(self, native_thread: str, native_turn: str, text: str) -> None:
        params = {"threadId": native_thread, "expectedTurnId": native_turn, "input": _text_input(text)}
        await self._request("turn/steer", params)

    async def interrupt_turn(self, native_thread: str, native_turn: str) -> None:
        """The turn, and first the collab agents it spawned that still run: Codex leaves them running when
        their parent's turn is interrupted (Stop must stop them too)."""
        for agent_thread, agent_turn in self._translator.collab.running_children(native_thread, native_turn):
            await self._interrupt_quietly(agent_thread, agent_turn)
        await self._request("turn/interrupt", {"threadId": native_thread, "turnId": native_turn})

    async def _interrupt_quietly(self, native_thread: str, native_turn: str) -> None:
        """A collab agent's turn interrupted; one that ended meanwhile is no error."""
        try:
            await self._request("turn/interrupt", {"threadId": native_thread, "turnId": native_turn}, 10.0)
        except ProviderError as error:
            log.info("codex: interrupt of collab agent turn %s: %s", native_turn, error.message)

    def _later(self, step: Coroutine[Any, Any, None]) -> None:
        """Run `step` beside the event stream (a request awaits an answer read by that same stream)."""
        task = asyncio.create_task(step)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def respond_to_request(self, request_ref: str, response: dict[str, Any]) -> None:
        request_id, result = self._translator.answer(request_ref, response)
        try:
            await self.process.respond(request_id, result)
        except ProviderError as error:
            raise ProviderError(error.code, self._redact(error.message)) from error

    async def fork_thread(self, native_thread: str, native_turn: str | None) -> str:
        params: dict[str, Any] = {"threadId": native_thread}
        settings = self._settings.get(native_thread)
        if settings is not None:
            params.update(self._thread_params(settings))
        if native_turn is not None:
            params["lastTurnId"] = native_turn
        result = await self._request("thread/fork", params)
        thread = str(result["thread"]["id"])
        if settings is not None:
            self._settings[thread] = settings
            self._models[thread] = params["model"]
        return thread

    async def rollback_thread(self, native_thread: str, before_turn: str) -> None:
        await self._request("thread/revert", {"threadId": native_thread, "beforeTurnId": before_turn})

    async def read_thread_snapshot(self, native_thread: str) -> dict[str, Any]:
        result = await self._request("thread/read", {"threadId": native_thread, "includeTurns": True})
        return dict(result["thread"])

    async def close(self) -> None:
        await self.process.close()


def _toml(value: str) -> str:
    """A TOML basic string (JSON string escapes are valid TOML)."""
    return json.dumps(value)


_TARGETS = {"x86_64": "x86_64-unknown-linux-musl", "aarch64": "aarch64-unknown-linux-musl"}


def native_codex_dir(binary: str) -> Path | None:
    """The folder of Codex's native build (its binary, bwrap, rg), which sandboxed commands must read.

    The npm `codex` is a node launcher that execs `@openai/codex-<platform>/vendor/<target>/bin/codex`;
    a configured native binary is used as is. None if it cannot be found (commands then fail
    visibly instead of running unsandboxed).
    """
    real = Path(os.path.realpath(binary))
    if real.suffix != ".js":
        return real.parent.parent if real.parent.name == "bin" else real.parent
    scope_dir = real.parent.parent.parent  # node_modules/@openai
    target = _TARGETS.get(os.uname().machine)
    found = sorted(p for p in scope_dir.glob("codex*/vendor/*/bin/codex") if p.parent.parent.name == target)
    return found[0].parent.parent if found else None


def direct_launch(binary: str) -> tuple[str, dict[str, str]]:
    """What to start for `binary`, and the variables to add. The npm launcher (node: ~0.1 s of CPU and
    ~40 MB at every start) only finds the native build for this machine and execs it with two variables
    set; we exec that build ourselves, with the same two. Any other binary is started as configured."""
    real = Path(os.path.realpath(binary))
    native = native_codex_dir(binary) if real.suffix == ".js" else None
    executable = native / "bin" / "codex" if native is not None else None
    if executable is None or not (executable.is_file() and os.access(executable, os.X_OK)):
        return binary, {}
    return str(executable), {"CODEX_MANAGED_PACKAGE_ROOT": str(real.parent.parent), "CODEX_MANAGED_BY_NPM": "1"}


class CodexDriver:
    """One configured `codex` instance: how the CLI is configured, and one runtime per project."""

    def __init__(self, instance_id: str, home: Path, options: dict[str, Any]) -> None:
        self.instance_id = instance_id
        self.home = home
        cli = CliOptions.parse(options, DEFAULT_API_KEY_ENV)
        self.binary = cli.binary
        self.model = cli.model or DEFAULT_MODEL
        self.allow_full_access = options.get("allow_full_access") is True
        self.base_url = cli.base_url
        self.api_key_env = cli.api_key_env
        self.extra_env = cli.env
        self.collab_agents = options.get("collab_agents", True) is not False

    @property
    def state_dir(self) -> Path:
        """The instance's folder; each project's runtime keeps its state in a subfolder (`SessionScope`)."""
        return self.home

    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def settings_in_place(self) -> InPlace:
        """The model, not the runtime mode: `turn/start` takes a model for that turn and the later ones; the
        mode's permission profile is chosen by `thread/start`/`thread/resume`'s `config` alone (`turn/start` has
        only the legacy `sandboxPolicy`, which would read the whole disk, so it is never sent)."""
        return InPlace(model=True, runtime_mode=False)

    def config_toml(self, codex_home: Path | None = None, native: Path | None = None) -> str:
        """The generated config.toml: model, provider (by env var name, never the key), sandbox profiles."""
        helpers = []  # what commands must read for Codex's sandbox helper to start inside the sandbox
        if codex_home is not None:
            helpers.append(f'{_toml(str(codex_home / "tmp" / "arg0-linux"))} = "read"')
        if native is not None:
            helpers.append(f'{_toml(str(native))} = "read"')
        return "\n".join(
            [
                f"model = {_toml(self.model)}",
                'model_provider = "threadloom"',
                "check_for_update_on_startup = false",
                "suppress_unstable_features_warning = true",
                f"default_permissions = {_toml(WORKSPACE_PROFILE)}",
                "",
                "[model_providers.threadloom]",
                'name = "Threadloom"',
                f"base_url = {_toml(self.base_url or OPENAI_BASE_URL)}",
                'wire_api = "responses"',
                f"env_key = {_toml(self.api_key_env)}",
                "request_max_retries = 0",
                "stream_max_retries = 0",
                "",
                "[features]",
                "plugins = false",
                "apps = false",
                "remote_plugin = false",
                "default_mode_request_user_input = true",
                f"multi_agent_v2 = {'true' if self.collab_agents else 'false'}",
                "",
                f"[permissions.{WORKSPACE_PROFILE}.filesystem]",
                '":minimal" = "read"',
                '":project_roots" = { "." = "write" }',
                '":tmpdir" = "write"',
                *helpers,
                "",
                f"[permissions.{READ_ONLY_PROFILE}.filesystem]",
                '":minimal" = "read"',
                '":project_roots" = { "." = "read" }',
                *helpers,
                "",
            ]
        )

    def launch(self) -> tuple[Sequence[str], dict[str, str]]:
        """The app-server's argv and the variables its launcher would set (`direct_launch`)."""
        executable, launcher_env = direct_launch(find_cli("codex", self.binary, PACKAGE))
        return [executable, "app-server"], launcher_env

    async def open_session(self, scope: SessionScope) -> CodexRuntime:
        """A `codex app-server` for the project of `scope`, its state in `scope.state_dir`."""
        argv, launcher_env = self.launch()
        state = scope.state_dir
        codex_home = state / "codex-home"
        extra = {
            **launcher_env,
            "HOME": str(state / "home"),
            **self.extra_env,
            "CODEX_HOME": str(codex_home),
            "TMPDIR": str(state / "tmp"),
        }
        env = child_env(self.api_key_env, extra)
        # The agent user's folders (threadloom.unprivileged), made without following a link it left there.
        state.mkdir(parents=True, exist_ok=True)
        unprivileged.agent_folders(state, ("codex-home", "home", "tmp"))
        # Replaced whole, never rewritten in place: a replica starting Codex on the same shared CODEX_HOME
        # reads the old file or the new one (docs/providers.md, "Replicas"); never written through a link.
        toml = self.config_toml(codex_home, native_codex_dir(argv[0]))
        unprivileged.put_file(codex_home, "config.toml", toml.encode())
        secret_names = (self.api_key_env, *(k for k in self.extra_env if k != "HOME"))
        started = argv
        if self.allow_full_access:  # its full_access threads' commands get a network, never the host's loopback
            try:
                started = isolated(argv, loopback_ports(self.base_url))
            except NetworkSandboxUnavailable as error:
                raise ProviderError("network_sandbox_unavailable", str(error)) from error
        try:
            proc = await spawn_process(started, env=env)
        except OSError as error:
            raise ProviderError("cli_missing", f"cannot start {argv[0]}: {error.strerror}") from error
        process = CodexProcess(proc, f"codex:{self.instance_id}:{scope.project_id}", env, secret_names)
        runtime = CodexRuntime(process, self.model, env, secret_names)
        runtime.allow_full_access = self.allow_full_access
        try:
            await runtime.initialize()
        except ProviderError:
            await process.close()
            raise
        return runtime

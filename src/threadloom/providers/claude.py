"""The `claude` driver: Claude Code (`claude -p`, stream-json over stdio) as a provider runtime.

One `claude -p` process is one session, i.e. one native thread, so a `ClaudeRuntime`
owns a child process per native thread it has loaded (cwd = the thread's workspace) and
merges their output into one event stream. A runtime serves one project (`open_session(scope)`).
The native thread ref is Claude's session id. Processes start lazily on the first turn; `HOME`
and `CLAUDE_CONFIG_DIR` live under the project's state folder, so sessions survive processes
and server restarts. A small record per thread (`<state>/threads/<sid>.json`: cwd, fork
origin, last assistant message per turn) lets a later runtime resume, fork, or fork from a turn
without asking the model. At most `MAX_IDLE_CHILDREN` processes of threads with no running turn
are kept; when a turn ends beyond that, the least recently used idle ones are stopped.

Runtime modes. Outside full_access every process gets Claude Code's own sandbox
(`sandbox_settings`: bubblewrap for each Bash command, every folder but the workspace and the
toolchain hidden, writes only in the workspace, no network; it needs `bwrap` and `socat`, and
refuses to start without them). workspace_write adds `--permission-mode acceptEdits` and
answers every prompt itself: sandboxed commands and file tools inside the workspace are
allowed, file tools outside it (they run in the claude process, not in the sandbox) and other
tools (web, MCP) are refused with a warning. approval_required turns each prompt into an
approval; read_only allows reading tools inside the workspace only. `--setting-sources user`
keeps a workspace's `.claude/settings.json` (whose hooks would run unsandboxed) out.

The API key reaches the CLI as ANTHROPIC_API_KEY, and so the environment of its tools: a
tool running `env` prints it. So every emitted event is passed through `redact_event`
with the instance's secret variables. (Claude Code's `CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1`
removes the key from tool environments, but in 2.1.197 it also leaves the sandbox's empty
mount-point files -- `.env`, `package.json`, `node_modules/`, ... -- in the workspace after
every command, so it is not set; an instance may set it through its `env` option.)

Behaviour of Claude Code 2.1.197 this relies on (observed against the fake model):
- `--session-id UUID` names a new session without a model call; its transcript
  (`$CLAUDE_CONFIG_DIR/projects/<cwd-slug>/<sid>.jsonl`) appears only with the first
  message, and the id is refused once that file exists. So a process is spawned with
  `--resume sid` when the file exists, else with `--session-id sid`. `--resume` works only
  from the session's cwd ("No conversation found with session ID" elsewhere).
- No `initialize` control request is needed (it only lists commands, models, agents).
- `system/init` is re-sent at the start of every query (each user message that is not
  folded into a running one); it is used only to re-interrupt (below).
- Steering (a user message written while a turn runs) has two outcomes. While the model
  streams text, the message is queued and runs as its own query after the current one:
  a second `system/init` ... `result`. While a tool call is pending or running, it is
  folded into the running query (the next model request carries it as a system note
  "The user sent a new message while you were working: ...") and there is one `result`.
  With `--replay-user-messages` the CLI echoes each of our user messages (`isReplay`)
  when it takes it into the conversation, before the `result` of the query that took
  it. So the app turn ends at the first `result` after which every message sent for it
  has been echoed: exactly once, and after the steer was answered.
- Interrupt (`control_request` `interrupt`) ends the running query with the partial
  assistant message, a "[Request interrupted by user]" user line and
  `result/error_during_execution`; the process takes the next message. It does not drop
  queued messages, so after an interrupt every further query of that turn is
  interrupted at its `system/init` too; each such query still echoes its message, so the
  turn ends once (observed for steers queued behind streamed text, behind a pending
  permission prompt, and sent after the interrupt). An interrupt while idle is a no-op.
- Fork: `--resume SID --fork-session --session-id NEW` forks under a chosen id (no model
  call; the new transcript, with the parent's message uuids, appears with the first
  message). `--resume-session-at <assistant message uuid>` (hidden flag) cuts the
  history after that message, so a fork from a turn uses the uuid of the turn's last
  assistant message.
- Permission prompts arrive as `control_request/can_use_tool` (with `tool_use_id`) and
  are answered with `control_response` allow (`updatedInput`) or deny (`message`). In
  the default permission mode Claude Code itself lets read-only commands (e.g. a plain
  `echo`, Read) run without asking. AskUserQuestion asks through `can_use_tool`; the
  answers go back as `updatedInput.answers` {question text: label, multi-select labels
  comma-separated} (sdk-tools.d.ts `AskUserQuestionInput.answers`; observed to work).
  When the CLI abandons a prompt it sends `control_cancel_request`. A prompt while no
  turn runs could not be routed to anyone, so it is denied at once.
- This version plans with TaskCreate/TaskUpdate (TodoWrite is still understood); both
  become `TodoUpdated`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import hashlib
import itertools
import logging
import os
import re
import signal
import tempfile
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import orjson

from threadloom.providers.agent_cli import child_env, find_cli, redact, redact_event
from threadloom.providers.claude_events import (
    FILE_TOOLS,
    SUBAGENT_TOOLS,
    TASK_LIST_TOOLS,
    ItemStatus,
    ThreadTranslator,
)
from threadloom.providers.contract import (
    Capabilities,
    ProviderError,
    ProviderEvent,
    RequestOpened,
    RuntimeExited,
    SessionScope,
    ThreadSettings,
    TurnCompleted,
    TurnStarted,
    TurnStatus,
    Warning,
)
from threadloom.providers.jsonlines import stop_child

log = logging.getLogger("threadloom.providers.claude")
LINE_LIMIT = 64 * 1024 * 1024
PACKAGE = "@anthropic-ai/claude-code"
MAX_IDLE_CHILDREN = 4  # claude processes (~200 MB each) kept for threads with no running turn
READ_ONLY_TOOLS = frozenset(
    {"Read", "Glob", "Grep", "LS", "NotebookRead", "TodoWrite", "TaskCreate", "TaskUpdate", "TaskGet", "TaskList"}
)
# Tools a workspace_write thread runs without asking (paths checked); anything else (web, MCP) is refused.
WORKSPACE_TOOLS = frozenset(
    {"Bash", "BashOutput", "KillShell", "KillBash", *FILE_TOOLS, *READ_ONLY_TOOLS, *SUBAGENT_TOOLS, *TASK_LIST_TOOLS}
)
PATH_KEYS = ("file_path", "notebook_path", "path")
# What sandboxed commands may read besides the workspace: the system's programs, libraries and config.
TOOLCHAIN_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/etc")
CAPABILITIES = Capabilities(
    supports_active_steering=True,
    supports_interrupt=True,
    supports_steering_by_interrupt_restart=False,
    can_fork_thread=True,
    can_fork_from_turn=True,
    can_rollback_thread=False,
    can_read_thread_snapshot=False,
    supports_structured_questions=True,
    emits_todo_list=True,
    supports_subagents=True,
    pending_requests_survive_restart=False,
    supports_empty_thread_creation=True,
)


def sandbox_settings(mode: str, cwd: str) -> dict[str, Any] | None:
    """Claude Code's `--settings` for a thread: its bubblewrap sandbox, except in full_access.

    Every Bash command then runs in bubblewrap with the whole filesystem hidden (`denyRead: /`)
    except the workspace and the toolchain folders, writes only to the workspace, and no network
    (no domain is allowed). `failIfUnavailable` makes a missing bwrap or socat a startup error
    instead of unsandboxed commands. workspace_write lets sandboxed commands run unasked.
    """
    if mode == "full_access":
        return None
    readable = [cwd, os.path.realpath(cwd), *(d for d in TOOLCHAIN_DIRS if os.path.isdir(d))]
    return {
        "sandbox": {
            "enabled": True,
            "failIfUnavailable": True,
            "allowUnsandboxedCommands": False,
            "autoAllowBashIfSandboxed": mode == "workspace_write",
            "filesystem": {"denyRead": ["/"], "allowRead": list(dict.fromkeys(readable))},
        }
    }


def outside_path(tool_input: dict[str, Any], cwd: str) -> str | None:
    """The path a file tool names if it leads outside the workspace (symlinks followed), else None.

    File tools run in the claude process itself, not in the sandbox, so the driver checks them.
    """
    root = os.path.realpath(cwd)
    for key in PATH_KEYS:
        value = tool_input.get(key)
        if isinstance(value, str) and value:
            target = os.path.realpath(os.path.join(cwd, value))
            if target != root and not target.startswith(root + os.sep):
                return value
    return None


def project_tmp(state_dir: Path) -> Path:
    """A private temp folder for one project's claude processes (created 0700).

    Claude Code's sandbox keeps its temp files and its proxy's unix sockets in TMPDIR, so TMPDIR
    must be short (a socket path has at most 107 bytes: under a deep data dir the sandbox fails with
    "Failed to create bridge sockets") and must not be shared by projects (the default /tmp/claude-<uid>
    would be writable by the commands of every project).
    """
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"threadloom-{digest}"
    folder.mkdir(mode=0o700, exist_ok=True)
    return folder


def _slug(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "-", path)


@dataclasses.dataclass(slots=True)
class _Turn:
    id: str
    unechoed: int = 1  # user messages sent for this turn that the CLI has not taken in yet
    interrupted: bool = False


@dataclasses.dataclass(slots=True)
class _Child:
    proc: asyncio.subprocess.Process
    lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)
    stderr_tail: collections.deque[str] = dataclasses.field(default_factory=lambda: collections.deque(maxlen=5))
    tasks: list[asyncio.Task[None]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(slots=True)
class _Thread:
    sid: str
    settings: ThreadSettings
    record: dict[str, Any]
    tr: ThreadTranslator
    child: _Child | None = None
    turn: _Turn | None = None
    allowed: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # accepted for the session
    used: int = 0  # when a turn last started or ended here (a runtime-wide counter), for MAX_IDLE_CHILDREN
    spawn_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # one turn start at a time
    stopping: asyncio.Task[None] | None = None  # its idle process being stopped


@dataclasses.dataclass(slots=True)
class _Request:
    thread: _Thread
    child: _Child
    kind: str
    tool: str
    input: dict[str, Any]
    tool_use_id: str | None
    questions: list[dict[str, Any]]


class ClaudeRuntime:
    """Claude Code processes, one per loaded native thread, as one provider runtime."""

    def __init__(self, binary: str, env: dict[str, str], home: Path, model: str | None, secrets: tuple[str, ...]):
        self.capabilities = CAPABILITIES
        self._binary = binary
        self._env = env
        self._home = home
        self._config_dir = Path(env["CLAUDE_CONFIG_DIR"])
        self._model = model
        self._secrets = secrets
        self._events: asyncio.Queue[ProviderEvent | None] = asyncio.Queue()
        self._threads: dict[str, _Thread] = {}
        self._requests: dict[str, _Request] = {}
        self._closed = False
        self._next_control = 0
        self._clock = itertools.count(1)
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def alive(self) -> bool:
        """True until `close()`: a dead child ends only its own thread's turn, not the runtime."""
        return not self._closed

    # ---- events ----------------------------------------------------------------------

    async def events(self) -> AsyncIterator[ProviderEvent]:
        while True:
            event = await self._events.get()
            if event is None:
                yield RuntimeExited("the claude runtime was closed", None)
                return
            yield event

    def _emit(self, *events: ProviderEvent) -> None:
        """Queue events, with the instance's secrets (e.g. in a tool's `env` output) redacted."""
        if not self._closed:
            for event in events:
                self._events.put_nowait(redact_event(event, self._redact))

    def _redact(self, text: str) -> str:
        return redact(text, self._env, self._secrets)

    # ---- threads ---------------------------------------------------------------------

    def _record_path(self, sid: str) -> Path:
        return self._home / "threads" / f"{sid}.json"

    def _load_record(self, sid: str) -> dict[str, Any] | None:
        try:
            data = orjson.loads(self._record_path(sid).read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return None
        return data if isinstance(data, dict) else None

    def _save_record(self, thread: _Thread) -> None:
        path = self._record_path(thread.sid)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_bytes(orjson.dumps(thread.record))
        tmp.replace(path)

    def _session_file(self, sid: str) -> Path | None:
        """The session's transcript, wherever its project folder is (None before the first message)."""
        found = sorted(self._config_dir.glob(f"projects/*/{sid}.jsonl"))
        return found[0] if found else None

    def _thread(self, native_thread: str) -> _Thread:
        thread = self._threads.get(native_thread)
        if thread is None:
            raise ProviderError("not_loaded", f"claude thread {native_thread} is not loaded in this runtime")
        return thread

    def _add_thread(self, sid: str, settings: ThreadSettings, record: dict[str, Any]) -> _Thread:
        thread = _Thread(sid, settings, record, ThreadTranslator(sid))
        known = [m for m in (record.get("marks") or {}).values() if m]
        thread.tr.last_assistant_uuid = known[-1] if known else None
        self._threads[sid] = thread
        self._save_record(thread)
        return thread

    async def start_thread(self, settings: ThreadSettings) -> str:
        """A new session id; the session itself starts with the first turn (no model call)."""
        if self._closed:
            raise ProviderError("exited", "the claude runtime is closed")
        sid = str(uuid.uuid4())
        self._add_thread(sid, settings, {"cwd": settings.cwd, "marks": {}})
        return sid

    def _check_sid(self, sid: str) -> None:
        try:
            uuid.UUID(sid)
        except ValueError as error:
            raise ProviderError("not_found", f"{sid!r} is not a Claude session id") from error

    async def resume_thread(self, native_thread: str, settings: ThreadSettings) -> None:
        self._check_sid(native_thread)
        if native_thread in self._threads:
            self._threads[native_thread].settings = settings
            return
        record = self._load_record(native_thread)
        transcript = self._session_file(native_thread)
        if transcript is None and record is None:
            raise ProviderError("not_found", f"no Claude session {native_thread}")
        if transcript is not None:
            folder = transcript.parent.name
            wanted = {_slug(settings.cwd), _slug(await asyncio.to_thread(os.path.realpath, settings.cwd))}
            if folder not in wanted and all(len(w) <= 200 for w in wanted):
                raise ProviderError(
                    "cwd_mismatch", f"Claude session {native_thread} belongs to another workspace than {settings.cwd}"
                )
        self._add_thread(native_thread, settings, record or {"cwd": settings.cwd, "marks": {}})

    async def fork_thread(self, native_thread: str, native_turn: str | None) -> str:
        """A new session with the history (up to `native_turn`), materialized by its first turn."""
        parent = self._threads.get(native_thread)
        record = parent.record if parent is not None else self._load_record(native_thread)
        if record is None:
            raise ProviderError("not_found", f"no Claude session {native_thread} known to this instance")
        marks: dict[str, str | None] = dict(record.get("marks") or {})
        at: str | None = None
        if native_turn is not None:
            if native_turn not in marks:
                raise ProviderError("unknown_turn", f"turn {native_turn} is not known in thread {native_thread}")
            at = marks[native_turn]
            keep = list(marks)[: list(marks).index(native_turn) + 1]
            marks = {k: marks[k] for k in keep}
        origin: str | None = native_thread
        if self._session_file(native_thread) is None:  # the parent itself is not materialized yet
            origin = record.get("fork_of")
            at = at or record.get("resume_at")
        if origin is not None and native_turn is not None and at is None:
            origin = None  # the turn left no assistant message in an otherwise empty history
        cwd = str(record.get("cwd") or (parent.settings.cwd if parent else ""))
        settings = parent.settings if parent is not None else ThreadSettings(cwd=cwd)
        sid = str(uuid.uuid4())
        self._add_thread(sid, settings, {"cwd": cwd, "marks": marks, "fork_of": origin, "resume_at": at})
        return sid

    async def rollback_thread(self, native_thread: str, before_turn: str) -> None:
        raise ProviderError("unsupported", "Claude Code has no rollback; fork from an earlier turn instead")

    async def read_thread_snapshot(self, native_thread: str) -> dict[str, Any]:
        raise ProviderError("unsupported", "Claude Code has no thread snapshot")

    def process_id(self, native_thread: str) -> int | None:
        """The pid of the thread's claude process, if one runs (diagnostics and tests)."""
        thread = self._threads.get(native_thread)
        return thread.child.proc.pid if thread is not None and thread.child is not None else None

    # ---- processes -------------------------------------------------------------------

    def _session_args(self, thread: _Thread) -> list[str]:
        if self._session_file(thread.sid) is not None:
            return ["--resume", thread.sid]
        origin = thread.record.get("fork_of")
        if origin:
            args = ["--resume", str(origin), "--fork-session", "--session-id", thread.sid]
            at = thread.record.get("resume_at")
            return [*args, "--resume-session-at", str(at)] if at else args
        return ["--session-id", thread.sid]

    async def _spawn(self, thread: _Thread) -> _Child:
        mode = thread.settings.runtime_mode
        argv = [
            self._binary,
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
            "acceptEdits" if mode == "workspace_write" else "default",
            "--setting-sources",
            "user",  # never the workspace's .claude/settings.json: its hooks would run outside the sandbox
        ]
        settings = await asyncio.to_thread(sandbox_settings, mode, thread.settings.cwd)
        if settings is not None:
            argv += ["--settings", orjson.dumps(settings).decode()]
        model = thread.settings.model or self._model
        if model:
            argv += ["--model", model]
        argv += self._session_args(thread)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                env=self._env,
                cwd=thread.settings.cwd,
                limit=LINE_LIMIT,
                start_new_session=True,
            )
        except OSError as error:
            raise ProviderError("spawn_failed", f"could not start claude in {thread.settings.cwd}: {error}") from error
        child = _Child(proc)
        child.tasks = [
            asyncio.create_task(self._read(thread, child), name=f"claude-{thread.sid}"),
            asyncio.create_task(self._drain_stderr(child), name=f"claude-{thread.sid}-stderr"),
        ]
        return child

    async def _drain_stderr(self, child: _Child) -> None:
        assert child.proc.stderr is not None
        while line := await child.proc.stderr.readline():
            text = self._redact(line.decode(errors="replace").rstrip())
            child.stderr_tail.append(text)
            log.debug("claude: %s", text)

    async def _read(self, thread: _Thread, child: _Child) -> None:
        assert child.proc.stdout is not None
        try:
            while line := await child.proc.stdout.readline():
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    log.warning(
                        "claude sent a non-JSON line: %r",
                        self._redact(line[:200].decode(errors="replace")),
                    )
                    continue
                if isinstance(message, dict) and thread.child is child:
                    try:
                        await self._on_message(thread, child, message)
                    except Exception:
                        log.exception("claude: could not handle a %s message", message.get("type"))
        except (ValueError, ConnectionError) as error:  # an over-long line, a broken pipe
            log.warning("claude output unreadable: %s", error)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(child.proc.pid, signal.SIGKILL)
        finally:
            code = await child.proc.wait()
            self._child_exited(thread, child, code)

    def _child_exited(self, thread: _Thread, child: _Child, code: int) -> None:
        if thread.child is not child:
            return
        thread.child = None
        for ref in [r for r, req in self._requests.items() if req.child is child]:
            del self._requests[ref]
        if self._closed or thread.turn is None:
            return
        tail = "; ".join(line for line in child.stderr_tail if line)
        self._finish(thread, "failed", f"claude exited ({code})" + (f": {tail}" if tail else ""))

    async def _write(self, child: _Child, message: dict[str, Any]) -> None:
        stdin = child.proc.stdin
        assert stdin is not None
        async with child.lock:
            if stdin.is_closing():
                raise ProviderError("exited", "the claude process is not running")
            stdin.write(orjson.dumps(message) + b"\n")
            try:
                await stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as error:
                raise ProviderError("exited", "the claude process is not running") from error

    async def _send_user(self, child: _Child, text: str) -> None:
        message = {"role": "user", "content": text}
        await self._write(child, {"type": "user", "session_id": "", "parent_tool_use_id": None, "message": message})

    async def _send_interrupt(self, child: _Child) -> None:
        self._next_control += 1
        request = {"subtype": "interrupt"}
        with contextlib.suppress(ProviderError):
            await self._write(
                child, {"type": "control_request", "request_id": f"tl-{self._next_control}", "request": request}
            )

    async def _answer(self, child: _Child, request_id: str, response: dict[str, Any]) -> None:
        body = {"subtype": "success", "request_id": request_id, "response": response}
        await self._write(child, {"type": "control_response", "response": body})

    async def _stop(self, child: _Child, grace: float = 5.0) -> None:
        await stop_child(child.proc, grace)
        for task in child.tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # ---- turns -----------------------------------------------------------------------

    def _trim_idle(self) -> None:
        """Stop the least recently used idle processes beyond MAX_IDLE_CHILDREN (a later turn resumes)."""
        idle = sorted(
            (t for t in self._threads.values() if t.child is not None and t.turn is None), key=lambda t: t.used
        )
        for thread in idle[: max(0, len(idle) - max(1, MAX_IDLE_CHILDREN))]:
            child = thread.child
            assert child is not None
            thread.child = None  # its reader now ignores it and its exit ends no turn
            log.info("claude: stopping the idle process %s of thread %s", child.proc.pid, thread.sid)
            task = asyncio.create_task(self._stop_quietly(child), name=f"claude-{thread.sid}-stop")
            thread.stopping = task
            self._stopping.add(task)
            task.add_done_callback(self._stopping.discard)

    async def _stop_quietly(self, child: _Child) -> None:
        try:
            await self._stop(child)
        except Exception:
            log.exception("claude: could not stop process %s", child.proc.pid)

    async def _live_child(self, thread: _Thread) -> _Child:
        if thread.stopping is not None:  # its idle process is on its way out: let it go before resuming
            await thread.stopping
            thread.stopping = None
        child = thread.child
        if child is not None and child.proc.returncode is not None:  # dead, its reader not done yet
            for task in child.tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        if thread.child is None:
            thread.child = await self._spawn(thread)
        return thread.child

    async def start_turn(self, native_thread: str, text: str, settings: ThreadSettings | None = None) -> str:
        thread = self._thread(native_thread)
        async with thread.spawn_lock:  # a concurrent start on this thread waits, then sees the turn
            if self._closed:
                raise ProviderError("exited", "the claude runtime is closed")
            if thread.turn is not None:
                raise ProviderError("turn_active", f"thread {native_thread} already runs turn {thread.turn.id}")
            if settings is not None and settings.model != thread.settings.model:
                # The model is a process flag: another model gets a new process, which resumes the session.
                thread.settings = dataclasses.replace(thread.settings, model=settings.model)
                if thread.child is not None:
                    idle, thread.child = thread.child, None
                    await self._stop(idle)
            child = await self._live_child(thread)
            if self._closed:  # close() ran while the process started: it did not see this one
                thread.child = None
                await self._stop(child)
                raise ProviderError("exited", "the claude runtime is closed")
            turn = _Turn(str(uuid.uuid4()))
            thread.turn = turn
            thread.tr.turn = turn.id
            thread.used = next(self._clock)
            self._emit(TurnStarted(native_thread, turn.id))
        with contextlib.suppress(ProviderError):  # a dead process ends the turn through its reader
            await self._send_user(child, text)
        return turn.id

    def _running(self, native_thread: str, native_turn: str) -> tuple[_Thread, _Turn] | None:
        thread = self._thread(native_thread)
        if thread.turn is None or thread.turn.id != native_turn or thread.child is None:
            return None
        return thread, thread.turn

    async def steer_turn(self, native_thread: str, native_turn: str, text: str) -> None:
        found = self._running(native_thread, native_turn)
        if found is None:
            raise ProviderError("no_active_turn", f"turn {native_turn} is not running")
        thread, turn = found
        assert thread.child is not None
        turn.unechoed += 1
        await self._send_user(thread.child, text)

    async def interrupt_turn(self, native_thread: str, native_turn: str) -> None:
        found = self._running(native_thread, native_turn)
        if found is None:
            return  # already over
        thread, turn = found
        turn.interrupted = True
        assert thread.child is not None
        await self._send_interrupt(thread.child)

    def _finish(self, thread: _Thread, status: TurnStatus, error: str | None) -> None:
        turn = thread.turn
        if turn is None:
            return
        item_status: ItemStatus = "completed" if status == "completed" else status
        events = thread.tr.close_open(item_status)
        thread.turn = None
        thread.tr.turn = None
        thread.record.setdefault("marks", {})[turn.id] = thread.tr.last_assistant_uuid
        with contextlib.suppress(OSError):
            self._save_record(thread)
        for ref in [r for r, req in self._requests.items() if req.thread is thread]:
            del self._requests[ref]
        thread.used = next(self._clock)
        self._emit(*events, TurnCompleted(thread.sid, turn.id, status, error))
        self._trim_idle()

    # ---- output ----------------------------------------------------------------------

    async def _on_message(self, thread: _Thread, child: _Child, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "stream_event":
            self._emit(*thread.tr.on_stream(message))
        elif kind == "assistant":
            self._emit(*thread.tr.on_assistant(message))
        elif kind == "user":
            if message.get("isReplay"):
                if thread.turn is not None:
                    thread.turn.unechoed = max(0, thread.turn.unechoed - 1)
            else:
                self._emit(*thread.tr.on_user(message))
        elif kind == "result":
            self._on_result(thread, message)
        elif kind == "system" and message.get("subtype") == "init":
            if thread.turn is not None and thread.turn.interrupted:
                await self._send_interrupt(child)  # a queued message of an interrupted turn
        elif kind == "control_request":
            await self._on_control_request(thread, child, message)
        elif kind == "control_cancel_request":
            self._requests.pop(str(message.get("request_id")), None)

    def _on_result(self, thread: _Thread, message: dict[str, Any]) -> None:
        turn = thread.turn
        if turn is None or turn.unechoed > 0:
            return  # no app turn, or a queued steer runs as its own query next
        if turn.interrupted:  # even if the last query got to finish first: the user stopped this turn
            self._finish(thread, "interrupted", None)
        elif message.get("subtype") == "success" and not message.get("is_error"):
            self._finish(thread, "completed", None)
        else:
            errors = message.get("errors")
            text = message.get("result") or ("; ".join(map(str, errors)) if isinstance(errors, list) else None)
            self._finish(thread, "failed", self._redact(str(text or message.get("subtype"))))

    # ---- permissions and questions ---------------------------------------------------

    async def _on_control_request(self, thread: _Thread, child: _Child, message: dict[str, Any]) -> None:
        request_id = str(message.get("request_id"))
        request = message.get("request") or {}
        if request.get("subtype") != "can_use_tool":
            body = {"subtype": "error", "request_id": request_id, "error": f"unsupported: {request.get('subtype')}"}
            await self._write(child, {"type": "control_response", "response": body})
            return
        tool = str(request.get("tool_name"))
        tool_input = dict(request.get("input") or {})
        tool_use_id = request.get("tool_use_id")
        turn = thread.tr.turn_of_tool(tool_use_id)
        if thread.turn is None or not turn:  # nobody could answer it, and the CLI would wait forever
            log.warning("claude: denied %s of thread %s: no turn is running", tool, thread.sid)
            await self._answer(child, request_id, {"behavior": "deny", "message": "no turn is running"})
            return
        mode = thread.settings.runtime_mode
        if tool == "AskUserQuestion":
            questions = [
                {
                    "id": f"q{i}",
                    "question": str(q.get("question")),
                    "header": q.get("header"),
                    "multiSelect": bool(q.get("multiSelect")),
                    "options": [
                        {"label": str(o.get("label")), "description": o.get("description")}
                        for o in q.get("options") or []
                    ],
                }
                for i, q in enumerate(tool_input.get("questions") or [])
            ]
            self._requests[request_id] = _Request(thread, child, "user_input", tool, tool_input, tool_use_id, questions)
            self._emit(RequestOpened(thread.sid, turn, request_id, "user_input", {"questions": questions}))
            return
        key = (tool, str(tool_input.get("command") or tool_input.get("file_path") or ""))
        if mode == "full_access" or key in thread.allowed:
            await self._answer(child, request_id, {"behavior": "allow", "updatedInput": tool_input})
            return
        if mode in ("workspace_write", "read_only"):
            outside = await asyncio.to_thread(outside_path, tool_input, thread.settings.cwd)
            if outside is not None:
                await self._refuse(
                    thread, child, request_id, tool_use_id, f"{tool} of {outside}: outside the workspace"
                )
                return
        if mode == "workspace_write":
            if tool in WORKSPACE_TOOLS:
                await self._answer(child, request_id, {"behavior": "allow", "updatedInput": tool_input})
            else:
                await self._refuse(thread, child, request_id, tool_use_id, f"{tool} is not allowed in workspace_write")
            return
        if mode == "read_only":
            if tool in READ_ONLY_TOOLS:
                await self._answer(child, request_id, {"behavior": "allow", "updatedInput": tool_input})
                return
            if tool_use_id:
                thread.tr.declined.add(str(tool_use_id))
            why = f"{tool} is not allowed: this thread is read-only"
            await self._answer(child, request_id, {"behavior": "deny", "message": why})
            self._emit(Warning(thread.sid, why))
            return
        kind = "command_approval" if tool == "Bash" else "file_change_approval" if tool in FILE_TOOLS else "permission"
        payload: dict[str, Any] = {"tool": tool, "input": tool_input, "reason": request.get("description")}
        if tool == "Bash":
            payload["command"] = str(tool_input.get("command", ""))
        elif tool in FILE_TOOLS:
            payload["path"] = str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")
        self._requests[request_id] = _Request(thread, child, kind, tool, tool_input, tool_use_id, [])
        self._emit(RequestOpened(thread.sid, turn, request_id, kind, payload))

    async def _refuse(self, thread: _Thread, child: _Child, request_id: str, tool_use_id: Any, why: str) -> None:
        """Deny a tool the thread's mode does not allow, and say so (a `runtime.warning`)."""
        if tool_use_id:
            thread.tr.declined.add(str(tool_use_id))
        await self._answer(child, request_id, {"behavior": "deny", "message": why})
        self._emit(Warning(thread.sid, why))

    async def respond_to_request(self, request_ref: str, response: dict[str, Any]) -> None:
        request = self._requests.get(request_ref)
        if request is None:
            raise ProviderError("unknown_request", f"no pending claude request {request_ref}")
        if request.thread.child is not request.child:
            self._requests.pop(request_ref, None)
            raise ProviderError("exited", "the claude process that asked is gone")
        answer = self._answers(request, response) if request.kind == "user_input" else self._decision(request, response)
        self._requests.pop(request_ref, None)
        await self._answer(request.child, request_ref, answer)
        if response.get("decision") == "cancel" and request.thread.turn is not None:
            request.thread.turn.interrupted = True
            await self._send_interrupt(request.child)

    def _answers(self, request: _Request, response: dict[str, Any]) -> dict[str, Any]:
        given = response.get("answers") or {}
        answers: dict[str, str] = {}
        for question in request.questions:
            labels = (given.get(question["id"]) or {}).get("answers") or []
            if labels:
                answers[question["question"]] = ", ".join(str(label) for label in labels)
        if not answers:
            return {"behavior": "deny", "message": "the user did not answer"}
        return {"behavior": "allow", "updatedInput": {**request.input, "answers": answers}}

    def _decision(self, request: _Request, response: dict[str, Any]) -> dict[str, Any]:
        decision = response.get("decision")
        if decision in ("accept", "acceptForSession"):
            if decision == "acceptForSession":
                key = str(request.input.get("command") or request.input.get("file_path") or "")
                request.thread.allowed.add((request.tool, key))
            return {"behavior": "allow", "updatedInput": request.input}
        if decision in ("decline", "cancel"):
            if request.tool_use_id:
                request.thread.tr.declined.add(str(request.tool_use_id))
            if decision == "cancel":
                return {"behavior": "deny", "message": "cancelled by the user", "interrupt": True}
            return {"behavior": "deny", "message": "declined by the user"}
        raise ProviderError("invalid_response", f"unknown decision {decision!r}")

    # ---- lifecycle -------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        children = [t.child for t in self._threads.values() if t.child is not None]
        stopping = list(self._stopping)
        await asyncio.gather(*(self._stop(c) for c in children), *stopping, return_exceptions=True)
        self._requests.clear()
        self._events.put_nowait(None)


class ClaudeDriver:
    """Runtimes for one configured Claude Code instance.

    Options: `binary` (path or name; default node_modules/.bin/claude, then PATH), `model`,
    `base_url` (ANTHROPIC_BASE_URL), `api_key_env` (the variable holding the key, passed to the
    CLI as ANTHROPIC_API_KEY; default ANTHROPIC_API_KEY), `env` (extra variables for the CLI).
    """

    def __init__(self, instance_id: str, home: Path, options: dict[str, Any]) -> None:
        self.instance_id = instance_id
        self.home = home
        self.options = options

    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    @property
    def state_dir(self) -> Path:
        """The instance's folder; each project's runtime keeps its state in a subfolder (`SessionScope`)."""
        return self.home

    async def open_session(self, scope: SessionScope) -> ClaudeRuntime:
        """A runtime for the project of `scope`, its sessions under `scope.state_dir`.

        Checks the CLI and the API key now, so a misconfiguration fails here, not mid-turn.
        """
        binary = find_cli("claude", self.options.get("binary"), PACKAGE)
        key_env = str(self.options.get("api_key_env") or "ANTHROPIC_API_KEY")
        extra = {str(k): str(v) for k, v in (self.options.get("env") or {}).items()}
        env = child_env(key_env, extra)
        env["ANTHROPIC_API_KEY"] = env.pop(key_env)
        state = scope.state_dir
        claude_home = state / "claude-home"
        (claude_home / ".claude").mkdir(parents=True, exist_ok=True)
        tmp = project_tmp(state)
        env.update(
            {
                "HOME": str(claude_home),
                "CLAUDE_CONFIG_DIR": str(claude_home / ".claude"),
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
                "TMPDIR": str(tmp),  # the sandbox's temp dir is TMPDIR/claude-<uid>: one per project
            }
        )
        if self.options.get("base_url"):
            env["ANTHROPIC_BASE_URL"] = str(self.options["base_url"])
        secrets = ("ANTHROPIC_API_KEY", *extra)
        model = str(self.options["model"]) if self.options.get("model") else None
        return ClaudeRuntime(binary, env, state, model, secrets)

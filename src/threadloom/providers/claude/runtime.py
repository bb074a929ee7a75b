"""`ClaudeRuntime`: the claude processes of one project's loaded threads, as one provider runtime.

One `claude -p` process is one session, i.e. one native thread, so a runtime owns a child
process per native thread it has loaded (cwd = the thread's workspace) and merges their output
into one event stream. Processes start lazily on the first turn. At most `MAX_IDLE_CHILDREN`
processes of threads with no running turn are kept; when a turn ends beyond that, the least
recently used idle ones are stopped (a later turn resumes the session in a new process).

Every emitted event is passed through a `StreamRedactor` with the instance's secret variables (a tool
running `env` would print the API key). When the CLI abandons a prompt it sends
`control_cancel_request`; a prompt while no turn runs could not be routed to anyone, so it is
denied at once. This version plans with TaskCreate/TaskUpdate (TodoWrite is still understood);
both become `TodoUpdated`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from threadloom.domain.failures import ModelFailure
from threadloom.providers.agent_cli import StreamRedactor, driver_secrets, permitted
from threadloom.providers.claude import sessions
from threadloom.providers.claude.events import ItemStatus, ThreadTranslator
from threadloom.providers.claude.permissions import judge, reply_to_approval, reply_to_questions, sandbox_settings
from threadloom.providers.claude.process import ClaudeProcess, claude_argv
from threadloom.providers.claude.sessions import Record, SessionStore
from threadloom.providers.claude.turns import Turn
from threadloom.providers.claude.usage import Meter
from threadloom.providers.contract import (
    Capabilities,
    ProviderError,
    ProviderEvent,
    RequestOpened,
    RuntimeExited,
    ThreadSettings,
    TurnCompleted,
    TurnStarted,
    TurnStatus,
    Warning,
)
from threadloom.providers.netns import NetworkSandboxUnavailable, isolated, loopback_ports

log = logging.getLogger("threadloom.providers.claude")


def retry_warning(message: dict[str, Any]) -> str:
    """What the user sees of the CLI retrying a failed model request (an `api_retry` line)."""
    status = message.get("error_status")
    what = f"answered {status}" if status is not None else "could not be reached"
    kind = f" ({message['error']})" if message.get("error") else ""
    delay = float(message.get("retry_delay_ms") or 0) / 1000
    attempt, most = message.get("attempt"), message.get("max_retries")
    return f"the model API {what}{kind}; Claude Code retries in {delay:.1f} s (retry {attempt} of {most})"


MAX_IDLE_CHILDREN = 4  # claude processes (~200 MB each) kept for threads with no running turn
CAPABILITIES = Capabilities.every(
    supports_steering_by_interrupt_restart=False,
    can_rollback_thread=False,
    can_read_thread_snapshot=False,
    pending_requests_survive_restart=False,
)


@dataclasses.dataclass(slots=True)
class _Thread:
    sid: str
    settings: ThreadSettings
    record: Record
    tr: ThreadTranslator
    child: ClaudeProcess | None = None
    turn: Turn | None = None
    allowed: set[tuple[str, str]] = dataclasses.field(default_factory=set)  # accepted for the session
    used: int = 0  # when a turn last started or ended here (a runtime-wide counter), for MAX_IDLE_CHILDREN
    spawn_lock: asyncio.Lock = dataclasses.field(default_factory=asyncio.Lock)  # one turn start at a time
    stopping: asyncio.Task[None] | None = None  # its idle process being stopped


@dataclasses.dataclass(slots=True)
class _Request:
    thread: _Thread
    child: ClaudeProcess
    kind: str
    tool: str
    input: dict[str, Any]
    tool_use_id: str | None
    questions: list[dict[str, Any]]


class ClaudeRuntime:
    """Claude Code processes, one per loaded native thread, as one provider runtime."""

    def __init__(self, binary: str, env: dict[str, str], home: Path, model: str | None, secrets: tuple[str, ...]):
        self.capabilities = CAPABILITIES
        self.allow_full_access = False  # the driver sets the instance's `allow_full_access`
        self._binary = binary
        self._env = env
        self._sessions = SessionStore(home, Path(env["CLAUDE_CONFIG_DIR"]))
        self._model = model
        self._redactor = StreamRedactor(driver_secrets(env, secrets))
        self._events: asyncio.Queue[ProviderEvent | None] = asyncio.Queue()
        self._threads: dict[str, _Thread] = {}
        self._requests: dict[str, _Request] = {}
        self._closed = False
        self._clock = itertools.count(1)
        self._stopping: set[asyncio.Task[None]] = set()

    @property
    def alive(self) -> bool:
        """True until `close()`: a dead child ends only its own thread's turn, not the runtime."""
        return not self._closed

    # ---- events ----------------------------------------------------------------------

    async def events(self) -> AsyncIterator[ProviderEvent]:
        while (event := await self._events.get()) is not None:
            yield event
        yield RuntimeExited("the claude runtime was closed", None)

    def _emit(self, *events: ProviderEvent) -> None:
        """Queue events, with the instance's secrets (e.g. in a tool's `env` output) redacted."""
        if not self._closed:
            for event in events:
                for cleaned in self._redactor.events(event):
                    self._events.put_nowait(cleaned)

    def _redact(self, text: str) -> str:
        return self._redactor.text(text)

    # ---- threads ---------------------------------------------------------------------

    def _thread(self, native_thread: str) -> _Thread:
        thread = self._threads.get(native_thread)
        if thread is None:
            raise ProviderError("not_loaded", f"claude thread {native_thread} is not loaded in this runtime")
        return thread

    def _add_thread(self, sid: str, settings: ThreadSettings, record: Record) -> _Thread:
        thread = _Thread(sid, permitted(settings, self.allow_full_access), record, ThreadTranslator(sid))
        thread.tr.last_assistant_uuid = sessions.last_mark(record)
        self._threads[sid] = thread
        self._sessions.save(sid, record)
        return thread

    async def start_thread(self, settings: ThreadSettings) -> str:
        """A new session id; the session itself starts with the first turn (no model call)."""
        if self._closed:
            raise ProviderError("exited", "the claude runtime is closed")
        sid = str(uuid.uuid4())
        self._add_thread(sid, settings, sessions.new_record(settings.cwd))
        return sid

    async def resume_thread(self, native_thread: str, settings: ThreadSettings) -> None:
        sessions.check_sid(native_thread)
        if native_thread in self._threads:
            self._threads[native_thread].settings = permitted(settings, self.allow_full_access)
            return
        record = self._sessions.load(native_thread)
        transcript = self._sessions.transcript(native_thread)
        if transcript is None and record is None:
            raise ProviderError("not_found", f"no Claude session {native_thread}")
        if transcript is not None:
            await self._sessions.check_workspace(native_thread, transcript, settings.cwd)
        self._add_thread(native_thread, settings, record or sessions.new_record(settings.cwd))

    async def fork_thread(self, native_thread: str, native_turn: str | None) -> str:
        """A new session with the history (up to `native_turn`), materialized by its first turn."""
        parent = self._threads.get(native_thread)
        record = parent.record if parent is not None else self._sessions.load(native_thread)
        if record is None:
            raise ProviderError("not_found", f"no Claude session {native_thread} known to this instance")
        cwd = str(record.get("cwd") or (parent.settings.cwd if parent else ""))
        await self._sessions.wait_flushed(native_thread, record, sessions.last_mark(record), within=10.0)
        fork = self._sessions.fork_record(native_thread, record, native_turn, cwd)
        settings = parent.settings if parent is not None else ThreadSettings(cwd=cwd)
        sid = str(uuid.uuid4())
        self._add_thread(sid, settings, fork)
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

    async def _spawn(self, thread: _Thread) -> ClaudeProcess:
        thread.tr.meter = Meter(thread.sid)  # a new process counts its usage from zero
        mode = thread.settings.runtime_mode
        argv = claude_argv(
            self._binary,
            mode=mode,
            settings=await asyncio.to_thread(sandbox_settings, mode, thread.settings.cwd),
            model=thread.settings.model or self._model,
            session=self._sessions.args(thread.sid, thread.record),
        )
        if mode == "full_access":  # unsandboxed commands: a network of its own, never the host's loopback
            try:
                argv = isolated(argv, loopback_ports(self._env.get("ANTHROPIC_BASE_URL")))
            except NetworkSandboxUnavailable as error:
                raise ProviderError("network_sandbox_unavailable", str(error)) from error

        async def on_message(child: ClaudeProcess, message: dict[str, Any]) -> None:
            if thread.child is child:  # a process being stopped speaks for no one
                await self._on_message(thread, child, message)

        return await ClaudeProcess.spawn(
            argv,
            env=self._env,
            cwd=thread.settings.cwd,
            name=f"claude:{thread.sid}",
            scrub=self._redact,
            on_message=on_message,
            on_exit=lambda child, code: self._child_exited(thread, child, code),
        )

    def _child_exited(self, thread: _Thread, child: ClaudeProcess, code: int) -> None:
        if thread.child is not child:
            return
        thread.child = None
        for ref in [r for r, req in self._requests.items() if req.child is child]:
            del self._requests[ref]
        if self._closed or thread.turn is None:
            return
        tail = "; ".join(line for line in child.stderr_tail if line)
        self._finish(thread, "failed", f"claude exited ({code})" + (f": {tail}" if tail else ""))

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

    async def _stop_quietly(self, child: ClaudeProcess) -> None:
        try:
            await child.close()
        except Exception:
            log.exception("claude: could not stop process %s", child.proc.pid)

    async def _live_child(self, thread: _Thread) -> ClaudeProcess:
        if thread.stopping is not None:  # its idle process is on its way out: let it go before resuming
            await thread.stopping
            thread.stopping = None
        child = thread.child
        if child is not None and child.dead:  # dead (maybe not reaped yet), its reader not done yet
            await child.wait_closed()
        if thread.child is None:
            thread.child = await self._spawn(thread)
        return thread.child

    # ---- turns -----------------------------------------------------------------------

    async def start_turn(
        self, native_thread: str, text: str, settings: ThreadSettings | None = None, handoff: str | None = None
    ) -> str:
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
                    await idle.close()
            child = await self._live_child(thread)
            if self._closed:  # close() ran while the process started: it did not see this one
                thread.child = None
                await child.close()
                raise ProviderError("exited", "the claude runtime is closed")
            turn = Turn(str(uuid.uuid4()))
            thread.turn = turn
            thread.tr.turn = turn.id
            thread.used = next(self._clock)
            self._emit(TurnStarted(native_thread, turn.id))
        with contextlib.suppress(ProviderError):  # a dead process ends the turn through its reader
            await child.send_user(text, handoff)
        return turn.id

    def _running(self, native_thread: str, native_turn: str) -> tuple[_Thread, Turn, ClaudeProcess] | None:
        thread = self._thread(native_thread)
        turn = thread.turn
        if turn is None or turn.id != native_turn or turn.finishing or thread.child is None:
            return None
        return thread, turn, thread.child

    async def steer_turn(self, native_thread: str, native_turn: str, text: str) -> None:
        found = self._running(native_thread, native_turn)
        if found is None:
            raise ProviderError("no_active_turn", f"turn {native_turn} is not running")
        _, turn, child = found
        turn.steered()
        await child.send_user(text)

    async def interrupt_turn(self, native_thread: str, native_turn: str) -> None:
        found = self._running(native_thread, native_turn)
        if found is None:
            return  # already over
        _, turn, child = found
        turn.interrupted = True
        await child.send_interrupt()

    async def _settle(self, thread: _Thread) -> None:
        """Hold a completed turn until the CLI has written it, so a crash right after cannot lose it."""
        if thread.turn is None:
            return
        thread.turn.finishing = True  # no steer or interrupt reaches a turn that is over
        try:
            await self._sessions.wait_flushed(thread.sid, thread.record, thread.tr.last_assistant_uuid, within=3.0)
        except ProviderError:
            log.warning("claude session %s: transcript not written within 3 s of a completed turn", thread.sid)

    def _finish(
        self, thread: _Thread, status: TurnStatus, error: str | None, failure: ModelFailure | None = None
    ) -> None:
        turn = thread.turn
        if turn is None:
            return
        item_status: ItemStatus = "completed" if status == "completed" else status
        events = thread.tr.close_open(item_status)
        thread.turn = None
        thread.tr.turn = None
        sessions.mark_turn(thread.record, turn.id, thread.tr.last_assistant_uuid)
        with contextlib.suppress(OSError):
            self._sessions.save(thread.sid, thread.record)
        for ref in [r for r, req in self._requests.items() if req.thread is thread]:
            del self._requests[ref]
        thread.used = next(self._clock)
        self._emit(*events, TurnCompleted(thread.sid, turn.id, status, error, None, failure))
        self._trim_idle()

    # ---- output ----------------------------------------------------------------------

    async def _on_message(self, thread: _Thread, child: ClaudeProcess, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "stream_event":
            self._emit(*thread.tr.on_stream(message))
        elif kind == "assistant":
            self._emit(*thread.tr.on_assistant(message))
        elif kind == "user":
            if message.get("isReplay"):
                if thread.turn is not None:
                    thread.turn.echoed()
            else:
                self._emit(*thread.tr.on_user(message))
        elif kind == "result":
            self._emit(*thread.tr.meter.result(thread.tr.turn or "", message))  # before the turn's end
            if thread.turn is not None and thread.tr.broke_off(thread.turn.id):
                thread.turn.stream_cut = True
            outcome = thread.turn.outcome(message) if thread.turn is not None else None
            if outcome is not None:
                status, error, failure = outcome
                if status == "completed":
                    await self._settle(thread)
                self._finish(thread, status, self._redact(error) if error is not None else None, failure)
        elif kind == "system" and message.get("subtype") == "api_retry":
            if thread.turn is not None:
                thread.turn.retrying(message)
            self._emit(Warning(thread.sid, retry_warning(message)))
        elif kind == "system" and message.get("subtype") == "init":
            if thread.turn is not None and thread.turn.interrupted:
                await child.send_interrupt()  # a queued message of an interrupted turn
        elif kind == "control_request":
            await self._on_control_request(thread, child, message)
        elif kind == "control_cancel_request":
            self._requests.pop(str(message.get("request_id")), None)

    # ---- permissions and questions ---------------------------------------------------

    async def _on_control_request(self, thread: _Thread, child: ClaudeProcess, message: dict[str, Any]) -> None:
        request_id = str(message.get("request_id"))
        request = message.get("request") or {}
        if request.get("subtype") != "can_use_tool":
            await child.answer_error(request_id, f"unsupported: {request.get('subtype')}")
            return
        tool = str(request.get("tool_name"))
        tool_input = dict(request.get("input") or {})
        tool_use_id = request.get("tool_use_id")
        turn = thread.tr.turn_of_tool(tool_use_id)
        if thread.turn is None or not turn:  # nobody could answer it, and the CLI would wait forever
            log.warning("claude: denied %s of thread %s: no turn is running", tool, thread.sid)
            await child.answer(request_id, {"behavior": "deny", "message": "no turn is running"})
            return
        verdict = await judge(
            tool,
            tool_input,
            mode=thread.settings.runtime_mode,
            cwd=thread.settings.cwd,
            allowed=thread.allowed,
            description=request.get("description"),
        )
        if verdict.action == "allow":
            await child.answer(request_id, {"behavior": "allow", "updatedInput": tool_input})
        elif verdict.action == "refuse":
            if tool_use_id:
                thread.tr.declined.add(str(tool_use_id))
            await child.answer(request_id, {"behavior": "deny", "message": verdict.why})
            self._emit(Warning(thread.sid, verdict.why))
        else:
            self._requests[request_id] = _Request(
                thread, child, verdict.kind, tool, tool_input, tool_use_id, verdict.questions
            )
            self._emit(RequestOpened(thread.sid, turn, request_id, verdict.kind, verdict.payload))

    async def respond_to_request(self, request_ref: str, response: dict[str, Any]) -> None:
        request = self._requests.get(request_ref)
        if request is None:
            raise ProviderError("unknown_request", f"no pending claude request {request_ref}")
        if request.thread.child is not request.child:
            self._requests.pop(request_ref, None)
            raise ProviderError("exited", "the claude process that asked is gone")
        if request.kind == "user_input":
            reply = reply_to_questions(request.questions, request.input, response)
        else:
            reply = reply_to_approval(request.tool, request.input, response)
            if reply.remember is not None:
                request.thread.allowed.add(reply.remember)
            if reply.declined and request.tool_use_id:
                request.thread.tr.declined.add(str(request.tool_use_id))
        self._requests.pop(request_ref, None)
        await request.child.answer(request_ref, reply.answer)
        if response.get("decision") == "cancel" and request.thread.turn is not None:
            request.thread.turn.interrupted = True
            await request.child.send_interrupt()

    # ---- lifecycle -------------------------------------------------------------------

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        children = [t.child for t in self._threads.values() if t.child is not None]
        stopping = list(self._stopping)
        await asyncio.gather(*(c.close() for c in children), *stopping, return_exceptions=True)
        self._requests.clear()
        for tail in self._redactor.flush():  # the kept-back end of a stream cut off by the close
            self._events.put_nowait(tail)
        self._events.put_nowait(None)

"""The JSON-lines loop: reads client messages, answers requests, runs turns as tasks.

Requests are handled one at a time in the read loop (each handler is quick); turns run as their own tasks, so
turns of different threads stream concurrently while the loop keeps reading (an interrupt, an approval answer).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from threadloom.agent import VERSION, recall
from threadloom.agent.sandbox import Sandbox
from threadloom.agent.state import (
    DEFAULT_MODE,
    HANDOFF,
    IN_PROGRESS,
    USER,
    ContextEntry,
    StateError,
    StateStore,
    ThreadRecord,
    TurnRecord,
)
from threadloom.agent.turns import ChildTurn, Hooks, Io, Turn, TurnResult
from threadloom.agent.wire import (
    CAPABILITY_OFF,
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    NO_THREAD,
    NOT_RUNNING_TURN,
    PARSE_ERROR,
    TURN_RUNNING,
    LineReader,
    Message,
    Peer,
    RpcError,
    Sink,
)

log = logging.getLogger("threadloom.agent")

SERVER_NAME = "threadloom-scripted"
SHUTDOWN_GRACE_S = 5.0
# What a thread's commands may do (docs/scripted-agent.md, "Runtime modes").
RUNTIME_MODES = ("workspace_write", "full_access", "approval_required", "read_only")


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    state_dir: Path
    chunk_delay_ms: int
    capabilities: dict[str, Any]
    workspace: Path | None = None  # the one folder threads may work in; None: each thread's own cwd
    allow_network: bool = False  # `full_access` threads share the network only when this is set
    hidden: tuple[Path, ...] = ()  # folders covered inside the sandbox even if the workspace contains them
    # The folder of the project's forks' own workspaces (under the server's data dir), one subfolder each.
    own_workspaces: Path | None = None

    def own_folder(self, cwd: str) -> Path | None:
        """The fork's own folder `cwd` lies in (a subfolder of `own_workspaces`), else None."""
        if self.own_workspaces is None:
            return None
        base, path = self.own_workspaces.resolve(), Path(cwd).resolve()
        if path == base or not path.is_relative_to(base):
            return None
        return base / path.relative_to(base).parts[0]

    def root_of(self, cwd: str) -> Path:
        """The one folder a thread working in `cwd` may use: its fork's own folder (never the project's
        workspace nor another fork's), else `workspace`, else `cwd` itself."""
        own = self.own_folder(cwd)
        if own is not None:
            return own
        return self.workspace if self.workspace is not None else Path(cwd)

    def sandbox(self, thread: ThreadRecord) -> Sandbox:
        """How the thread's commands are confined: its workspace, writable unless read-only."""
        return Sandbox(
            self.root_of(thread.cwd),
            writable=thread.runtime_mode != "read_only",
            network=self.allow_network and thread.runtime_mode == "full_access",
            hidden=self.hidden,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class Answer:
    """A handler's result, and what must happen only after the response is on the wire."""

    result: Message
    then: Callable[[], Awaitable[None]] | None = None


@dataclasses.dataclass(slots=True)
class Session:
    """A thread this process has started or resumed."""

    record: ThreadRecord
    active: Turn | ChildTurn | None = None  # ChildTurn: a subagent's thread, its one turn running


@dataclasses.dataclass(slots=True)
class SpawnedThread:
    """A `@subagent`'s own thread: saved with its turn running when the subagent starts, and again when it
    ends, so `thread/read`, `thread/revert` and `thread/fork` see it like any thread."""

    session: Session
    store: StateStore

    @property
    def thread_id(self) -> str:
        return self.session.record.id

    def running(self, turn: ChildTurn) -> None:
        self.session.active = turn

    def finish(self, status: str, output: str) -> None:
        record = self.session.record
        record.turns[-1].status = status
        record.turns[-1].output = output
        self.session.active = None
        try:
            self.store.save(record)
        except (OSError, StateError):
            log.exception("cannot save subagent thread %s", record.id)


class Server:
    def __init__(self, options: Options, writer: Sink, io: Io | None = None) -> None:
        """`io`: where turns send and ask (the ACP face passes its translation); else straight to `writer`."""
        self.options = options
        self.writer = writer
        self.store = StateStore(options.state_dir)
        self.sessions: dict[str, Session] = {}
        # Unique across processes too: a resumed thread's new items must not reuse its old items' ids.
        self.io = io or Io(writer, Peer(writer), lambda: f"item-{uuid.uuid4()}")
        self.hooks: Callable[[ThreadRecord], Hooks] | None = None  # per thread; the ACP face sets it
        self.handlers: dict[str, Callable[[Message], Answer]] = {
            "initialize": self._initialize,
            "thread/start": self._thread_start,
            "thread/resume": self._thread_resume,
            "thread/read": self._thread_read,
            "thread/fork": self._thread_fork,
            "thread/revert": self._thread_revert,
            "thread/rollback": self._thread_rollback,
            "turn/start": self._turn_start,
            "turn/steer": self._turn_steer,
            "turn/interrupt": self._turn_interrupt,
        }

    async def serve(self, reader: LineReader) -> None:
        """Runs until stdin closes, then interrupts whatever is still running."""
        while True:
            try:
                line = await reader.readline()
            except ValueError as exc:
                await self._error(None, PARSE_ERROR, f"unreadable line: {exc}")
                continue
            if line is None:
                break
            await self._handle_line(line)
        await self._shutdown()

    async def _shutdown(self) -> None:
        turns = [session.active for session in self.sessions.values() if session.active is not None]
        for turn in turns:
            turn.interrupt()
        tasks = [turn.task for turn in turns if turn.task is not None]
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
            for task in pending:
                task.cancel()

    async def _handle_line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except ValueError as exc:
            await self._error(None, PARSE_ERROR, f"invalid JSON: {exc}")
            return
        if not isinstance(message, dict):
            await self._error(None, INVALID_REQUEST, "a message must be a JSON object")
            return
        if "method" not in message:
            if "id" in message and isinstance(self.io.peer, Peer):
                self.io.peer.resolve(message)
            else:
                log.warning("message without method or id ignored")
            return
        if "id" not in message:
            log.info("client notification %r ignored", message.get("method"))
            return
        await self._handle_request(message)

    async def _handle_request(self, message: Message) -> None:
        request_id = message["id"]
        method = message["method"]
        handler = self.handlers.get(method) if isinstance(method, str) else None
        params = message.get("params")
        try:
            if handler is None:
                raise RpcError(METHOD_NOT_FOUND, f"unknown method {method}")
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            answer = handler(params)
        except RpcError as exc:
            await self._error(request_id, exc.code, exc.message)
            return
        except Exception as exc:
            log.exception("%s failed", method)
            await self._error(request_id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            return
        await self.writer.send({"id": request_id, "result": answer.result})
        if answer.then is not None:
            await answer.then()

    async def _error(self, request_id: Any, code: int, message: str) -> None:
        await self.writer.send({"id": request_id, "error": {"code": code, "message": message}})

    async def _notify(self, method: str, params: Message) -> None:
        await self.writer.send({"method": method, "params": params})

    # --- methods ---

    def _initialize(self, params: Message) -> Answer:
        capabilities = dict(self.options.capabilities)
        return Answer({"serverInfo": {"name": SERVER_NAME, "version": VERSION}, "capabilities": capabilities})

    def _thread_start(self, params: Message) -> Answer:
        default = str(self.options.workspace) if self.options.workspace is not None else os.getcwd()
        path = self._cwd_param(params, default)
        record = ThreadRecord(str(uuid.uuid4()), path, runtime_mode=_mode_param(params) or DEFAULT_MODE)
        self.store.save(record)
        self.sessions[record.id] = Session(record)
        started = {"threadId": record.id, "thread": {"id": record.id}}
        return Answer({"thread": {"id": record.id, "cwd": record.cwd}}, lambda: self._notify("thread/started", started))

    def _thread_resume(self, params: Message) -> Answer:
        session = self._open(_str_param(params, "threadId"))
        record = session.record
        mode = _mode_param(params)
        if mode is not None and mode != record.runtime_mode:  # the app thread's mode is the truth
            record.runtime_mode = mode
            self.store.save(record)
        # And its folder (a fork's own folder moved under the data dir; an idle thread only).
        cwd = self._cwd_param(params, record.cwd) if params.get("cwd") is not None else record.cwd
        if cwd != record.cwd and session.active is None:
            record.cwd = cwd
            self.store.save(record)
        return Answer({"thread": {"id": record.id, "cwd": record.cwd, "turns": len(record.turns)}})

    def _thread_read(self, params: Message) -> Answer:
        record = self._current(_str_param(params, "threadId"))
        return Answer({"thread": record.to_json()})

    def _thread_fork(self, params: Message) -> Answer:
        """A new thread holding the source's turns up to and including `lastTurnId` (all of them without it)."""
        if not self.options.capabilities.get("supportsFork"):
            raise RpcError(CAPABILITY_OFF, "forking is not supported")
        source = self._current(_str_param(params, "threadId"))  # a dead process's turn copied as on resume
        last = params.get("lastTurnId")
        if last is not None and not isinstance(last, str):
            raise RpcError(INVALID_PARAMS, "lastTurnId must be a string")
        turns = source.turns if last is None else source.turns[: _turn_index(source, last) + 1]
        if any(turn.status == IN_PROGRESS for turn in turns):
            raise RpcError(TURN_RUNNING, "cannot fork at a running turn; name an earlier lastTurnId")
        path = self._cwd_param(params, source.cwd)
        mode = _mode_param(params) or source.runtime_mode
        record = ThreadRecord(str(uuid.uuid4()), path, [turn.copy() for turn in turns], mode)
        self.store.save(record)
        self.sessions[record.id] = Session(record)
        started = {"threadId": record.id, "thread": {"id": record.id}}
        thread = {"id": record.id, "cwd": record.cwd, "turns": len(record.turns)}
        return Answer({"thread": thread}, lambda: self._notify("thread/started", started))

    def _thread_revert(self, params: Message) -> Answer:
        """Drops `beforeTurnId` and every later turn from the thread (what the codex driver sends)."""
        session = self._rollback_target(params)
        return self._truncate(session, _turn_index(session.record, _str_param(params, "beforeTurnId")))

    def _thread_rollback(self, params: Message) -> Answer:
        """Drops the last `numTurns` turns (Codex's count-based form of the same operation)."""
        session = self._rollback_target(params)
        count = params.get("numTurns")
        turns = len(session.record.turns)
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= turns:
            raise RpcError(INVALID_PARAMS, f"numTurns must be a whole number from 1 to {turns}")
        return self._truncate(session, turns - count)

    def _turn_start(self, params: Message) -> Answer:
        session = self._session(params)
        if session.active is not None:
            raise RpcError(TURN_RUNNING, "turn already running")
        text, handoffs = _input(params)
        thread = session.record
        # Threadloom restarts a turn it cannot steer in place with the interrupted turn's input, a blank line and
        # the steering message: that turn has been steered, and its `@await-steer` must not wait for another.
        previous = thread.turns[-1] if thread.turns else None
        restarted = previous is not None and previous.status != "completed" and text.startswith(previous.input + "\n\n")
        context = [*(ContextEntry(HANDOFF, handoff) for handoff in handoffs), ContextEntry(USER, text)]
        record = TurnRecord(str(uuid.uuid4()), text, context=context)
        thread.turns.append(record)
        try:
            self.store.save(thread)
        except BaseException:
            thread.turns.pop()
            raise

        def finish(turn: Turn, result: TurnResult) -> None:
            record.status = result.status
            record.output = result.output
            if session.active is turn:
                session.active = None
            try:
                self.store.save(thread)
            except (OSError, StateError):
                log.exception("cannot save thread %s", thread.id)

        turn = Turn(
            self.io,
            thread_id=thread.id,
            cwd=thread.cwd,
            turn_id=record.id,
            text=text,
            delay_ms=self.options.chunk_delay_ms,
            mode=thread.runtime_mode,
            sandbox=self.options.sandbox(thread),
            on_finish=finish,
            recall=lambda: recall.render(thread.turns),
            spawn=lambda prompt, turn_id: self._spawn(thread, prompt, turn_id),
            hooks=self.hooks(thread) if self.hooks is not None else None,
            steered=restarted,
        )
        session.active = turn
        return Answer({"turn": {"id": turn.id, "status": "inProgress"}}, turn.begin)

    def _turn_steer(self, params: Message) -> Answer:
        if not self.options.capabilities.get("supportsActiveSteering"):
            raise RpcError(CAPABILITY_OFF, "steering is not supported")
        session = self._session(params)
        turn = self._running(session, _str_param(params, "expectedTurnId"))
        if not isinstance(turn, Turn):
            raise RpcError(CAPABILITY_OFF, "a subagent's turn cannot be steered")
        text, handoffs = _input(params)
        turn.steer(text)
        record = session.record.turns[-1]  # the running turn is always the latest
        assert record.id == turn.id
        record.input = f"{record.input}\n{text}" if record.input else text
        record.context.extend([*(ContextEntry(HANDOFF, handoff) for handoff in handoffs), ContextEntry(USER, text)])
        self.store.save(session.record)
        return Answer({})

    def _turn_interrupt(self, params: Message) -> Answer:
        if not self.options.capabilities.get("supportsInterrupt"):
            raise RpcError(CAPABILITY_OFF, "interrupt is not supported")
        session = self._session(params)
        turn = self._running(session, _str_param(params, "turnId"))

        async def interrupt() -> None:
            turn.interrupt()

        return Answer({}, interrupt)

    # --- helpers ---

    def _spawn(self, parent: ThreadRecord, prompt: str, turn_id: str) -> SpawnedThread:
        """The thread of a `@subagent` of `parent`: same folder and mode, its one turn the prompt."""
        turn = TurnRecord(turn_id, prompt, context=[ContextEntry(USER, prompt)])
        record = ThreadRecord(str(uuid.uuid4()), parent.cwd, [turn], parent.runtime_mode)
        self.store.save(record)
        session = self.sessions[record.id] = Session(record)
        return SpawnedThread(session, self.store)

    def _cwd_param(self, params: Message, default: str) -> str:
        """`cwd` (else `default`) as an absolute path, refused outside `--workspace` unless it lies in a fork's
        own folder (`--own-workspaces`)."""
        cwd = params.get("cwd")
        if cwd is not None and not isinstance(cwd, str):
            raise RpcError(INVALID_PARAMS, "cwd must be a string")
        path = os.path.abspath(cwd or default)
        workspace = self.options.workspace
        if self.options.own_folder(path) is not None:
            return path
        if workspace is not None and not Path(path).resolve().is_relative_to(workspace.resolve()):
            raise RpcError(INVALID_PARAMS, f"cwd {path} is outside this agent's workspace {workspace}")
        return path

    def _open(self, thread_id: str) -> Session:
        """The thread's session, loading it from the state folder (as `thread/resume`) if this process lacks it."""
        session = self.sessions.get(thread_id)
        if session is None:
            record = self._load(thread_id)
            if record.settle_stale_turns():
                self.store.save(record)
            session = self.sessions[thread_id] = Session(record)
        return session

    def _rollback_target(self, params: Message) -> Session:
        if not self.options.capabilities.get("supportsRollback"):
            raise RpcError(CAPABILITY_OFF, "rollback is not supported")
        session = self._open(_str_param(params, "threadId"))
        if session.active is not None:
            raise RpcError(TURN_RUNNING, "cannot roll back while a turn is running")
        return session

    def _truncate(self, session: Session, keep: int) -> Answer:
        """Keeps the first `keep` turns; the file is replaced atomically, so a crash leaves old or new."""
        record = session.record
        dropped = record.turns[keep:]
        del record.turns[keep:]
        try:
            self.store.save(record)
        except BaseException:
            record.turns.extend(dropped)
            raise
        return Answer({"thread": {"id": record.id, "cwd": record.cwd, "turns": len(record.turns)}})

    def _current(self, thread_id: str) -> ThreadRecord:
        """The thread as it stands: the open session's record, or the saved one with its stale turns
        settled as they will be on resume (in memory only; the file is left alone)."""
        session = self.sessions.get(thread_id)
        if session is not None:
            return session.record
        record = self._load(thread_id)
        record.settle_stale_turns()
        return record

    def _load(self, thread_id: str) -> ThreadRecord:
        try:
            record = self.store.load(thread_id)
        except StateError as exc:
            raise RpcError(INTERNAL_ERROR, str(exc)) from exc
        if record is None:
            raise RpcError(NO_THREAD, f"no thread {thread_id}")
        return record

    def _session(self, params: Message) -> Session:
        """The thread a turn method names; it must have been started or resumed by this process."""
        thread_id = _str_param(params, "threadId")
        session = self.sessions.get(thread_id)
        if session is None:
            raise RpcError(NO_THREAD, f"no thread {thread_id}")
        return session

    @staticmethod
    def _running(session: Session, turn_id: str) -> Turn | ChildTurn:
        turn = session.active
        if turn is None or turn.closed or turn.id != turn_id:
            raise RpcError(NOT_RUNNING_TURN, f"turn {turn_id} is not running")
        return turn


def _str_param(params: Message, name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str):
        raise RpcError(INVALID_PARAMS, f"{name} must be a string")
    return value


def _mode_param(params: Message) -> str | None:
    """`runtimeMode`, if given; one of RUNTIME_MODES."""
    mode = params.get("runtimeMode")
    if mode is None:
        return None
    if mode not in RUNTIME_MODES:
        raise RpcError(INVALID_PARAMS, f"runtimeMode must be one of {', '.join(RUNTIME_MODES)}")
    return str(mode)


def _turn_index(record: ThreadRecord, turn_id: str) -> int:
    for index, turn in enumerate(record.turns):
        if turn.id == turn_id:
            return index
    raise RpcError(INVALID_PARAMS, f"no turn {turn_id} in thread {record.id}")


def _input(params: Message) -> tuple[str, list[str]]:
    """The user message (the texts of the input's `text` items, one per line) and the `context` items' texts.

    A `context` item is context Threadloom injects (a handoff, a fork's or merge-back's summary): it is
    remembered (`@recall` shows it as `handoff:`) but never read for directives, since it quotes old messages.
    """
    items = params.get("input")
    if not isinstance(items, list):
        raise RpcError(INVALID_PARAMS, "input must be a list")
    texts: list[str] = []
    handoffs: list[str] = []
    for item in items:
        if not isinstance(item, dict):
            raise RpcError(INVALID_PARAMS, "input items must be objects")
        kind = item.get("type")
        if kind in ("text", "context"):
            text = item.get("text")
            if not isinstance(text, str):
                raise RpcError(INVALID_PARAMS, f"a {kind} input item needs a string text")
            (texts if kind == "text" else handoffs).append(text)
    return "\n".join(texts), handoffs

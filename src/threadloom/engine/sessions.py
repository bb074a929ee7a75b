"""SessionManager: the live provider runtimes of this process.

Sessions open lazily on first work, one runtime per (provider instance, project) per
process: an agent process serves exactly one project, so its files, its sandbox and its
crash stay inside that project. Ownership is recorded on the ProviderSession row (`owner` = this worker, alive while its
advisory lock is held). A runtime that dies is marked `error` and forgotten; the next
work opens a new one and resumes the provider thread from its `nativeThreadRef`.

Idle runtimes are reaped: one with no turn bound and nobody using it for the instance's
`idle_timeout_s` (by the injected clock) is closed and marked `stopped`; the next work
opens a new one and resumes, exactly as after a crash, minus the failed turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import datetime
from pathlib import Path

from threadloom import tracing, unprivileged
from threadloom.domain.changes import Change, EventVerb, Outcome
from threadloom.domain.entities import Project, ProviderSession
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import ProviderSessionStatus
from threadloom.domain.threads import own_workspaces_of
from threadloom.engine.pipeline import GlobalCommand, Pipeline
from threadloom.providers.child_process import AGENT_USER_CANNOT_RUN
from threadloom.providers.contract import ProviderDriver, ProviderError, ProviderRuntime, SessionScope
from threadloom.providers.traced import traced
from threadloom.store import entities
from threadloom.store import workers as worker_store
from threadloom.store.db import Reader
from threadloom.store.runs import SessionOf

log = logging.getLogger("threadloom.sessions")
SETTLE_SECONDS = 10.0

SessionKey = tuple[str, uuid.UUID]  # (provider instance, project)


@dataclasses.dataclass(slots=True)
class TurnBinding:
    """Routes a native thread's events to the app run it is executing."""

    thread_id: uuid.UUID
    run_id: uuid.UUID
    attempt_id: uuid.UUID
    root_node_id: uuid.UUID
    provider_turn_id: uuid.UUID
    native_thread: str
    native_turn: str | None = None
    items: dict[str, uuid.UUID] = dataclasses.field(default_factory=dict)  # native item → node
    messages: dict[str, uuid.UUID] = dataclasses.field(default_factory=dict)  # native item → message
    child_turns: dict[str, uuid.UUID] = dataclasses.field(default_factory=dict)  # native child turn → node
    todo_plans: dict[uuid.UUID, uuid.UUID] = dataclasses.field(default_factory=dict)  # node → plan artifact
    requests: dict[str, uuid.UUID] = dataclasses.field(default_factory=dict)  # provider request ref → request
    settled: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)  # turn id known, or unbound

    def know_turn(self, native_turn: str) -> None:
        """The provider named the turn (start response or turn-started event, whichever is first)."""
        self.native_turn = self.native_turn or native_turn
        self.settled.set()

    async def wait_turn(self, within: float) -> str | None:
        """The native turn id, waiting up to `within` s while the start is in flight; None if it never came."""
        if self.native_turn is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.settled.wait(), within)
        return self.native_turn


@dataclasses.dataclass(slots=True)
class LiveSession:
    instance_id: str
    project_id: uuid.UUID
    session_id: uuid.UUID
    runtime: ProviderRuntime
    loaded: set[str] = dataclasses.field(default_factory=set)
    bindings: dict[str, TurnBinding] = dataclasses.field(default_factory=dict)
    task: asyncio.Task[None] | None = None
    stopping: bool = False  # closed on purpose (interrupt policy, idle), not crashed
    busy: int = 0  # callers between `using()` and their turn being bound
    idle_since: datetime | None = None  # when the last turn ended or the last user left
    _changed: asyncio.Event = dataclasses.field(default_factory=asyncio.Event)

    @property
    def key(self) -> SessionKey:
        return (self.instance_id, self.project_id)

    def bind(self, binding: TurnBinding) -> None:
        self.bindings[binding.native_thread] = binding

    def unbind(self, native_thread: str) -> None:
        binding = self.bindings.pop(native_thread, None)
        if binding is not None:
            binding.settled.set()
        self.idle_since = None  # set by the manager's clock on the next reap pass
        self._changed.set()

    @property
    def in_use(self) -> bool:
        return bool(self.bindings) or self.busy > 0

    def binding_of_attempt(self, attempt_id: uuid.UUID) -> TurnBinding | None:
        return next((b for b in self.bindings.values() if b.attempt_id == attempt_id), None)

    async def wait_unbound(self, native_thread: str, within: float) -> bool:
        """Wait until no turn is bound to the native thread; False after `within` seconds."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        while native_thread in self.bindings:
            self._changed.clear()
            remaining = deadline - loop.time()
            if remaining <= 0:
                return False
            try:
                await asyncio.wait_for(self._changed.wait(), remaining)
            except TimeoutError:
                return False
        return True


def _hand_over(instance_dir: Path, project: str, workspace: str, own: str | None) -> None:
    """Before a project's agent starts: what it runs as (the agent user, when the server is root) must own
    its state folder and be able to work in the project's workspace and its forks' folders -- including
    files put there since its last start (`threadloom.unprivileged`)."""
    unprivileged.own_state_dir(instance_dir, project)
    unprivileged.grant_workspace(workspace)
    unprivileged.check_reach([workspace, str(instance_dir / project)])  # the folders above them too
    if own is None or unprivileged.current() is None:
        return
    forks = Path(own)
    if not forks.is_dir() or forks.is_symlink():
        return
    for folder in (forks.parent, forks):  # made 0700 by older releases; root's, so never an agent's link
        os.chmod(folder, 0o711)
    for entry in os.scandir(forks):
        if entry.is_dir(follow_symlinks=False) and not entry.name.endswith(".partial"):
            unprivileged.grant_workspace(entry.path)


class SessionManager:
    def __init__(
        self,
        pipeline: Pipeline,
        drivers: dict[str, ProviderDriver],
        worker_id: uuid.UUID,
        idle_timeouts: dict[str, float] | None = None,
        workspaces_root: Path | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.workspaces_root = workspaces_root  # `<data dir>/workspaces`: forks' own folders, per project
        self.drivers = drivers
        self.worker_id = worker_id
        self.idle_timeouts = idle_timeouts or {}  # instance → seconds; absent or 0: never reaped
        self.live: dict[SessionKey, LiveSession] = {}
        self.retiring: dict[uuid.UUID, asyncio.Task[None]] = {}  # session id → closes it once its turns end
        self._retired: list[LiveSession] = []
        self._locks: dict[SessionKey, asyncio.Lock] = {}
        self.on_open: Callable[[LiveSession], Awaitable[None]] | None = None

    @contextlib.asynccontextmanager
    async def using(self, instance_id: str, project_id: uuid.UUID) -> AsyncIterator[LiveSession]:
        """The live runtime of an instance for one project, kept from the reaper until the block ends."""
        session = await self.runtime_for(instance_id, project_id)
        session.busy += 1
        try:
            yield session
        finally:
            session.busy -= 1
            session.idle_since = None

    def sessions_of(self, instance_id: str, project_id: uuid.UUID | None = None) -> list[LiveSession]:
        """The live runtimes of an instance (of one project, if given)."""
        return [
            s
            for s in self.live.values()
            if s.instance_id == instance_id and (project_id is None or s.project_id == project_id)
        ]

    async def reap_idle(self) -> list[SessionKey]:
        """Close the runtimes idle for longer than their instance's timeout; returns their keys."""
        now = self.pipeline.clock.now()
        reaped: list[SessionKey] = []
        for key, session in list(self.live.items()):
            instance_id = key[0]
            timeout = self.idle_timeouts.get(instance_id, 0)
            if timeout <= 0 or session.in_use:
                continue
            if session.idle_since is None:
                session.idle_since = now
                continue
            if (now - session.idle_since).total_seconds() < timeout:
                continue
            async with self._locks.setdefault(key, asyncio.Lock()):
                if self.live.get(key) is not session or session.in_use:
                    continue
                session.stopping = True
                del self.live[key]
            try:
                await session.runtime.close()
            except Exception:  # it is forgotten either way
                log.exception("closing idle %s failed", key)
            await self.mark(session, ProviderSessionStatus.STOPPED, "idle")
            reaped.append(key)
        return reaped

    async def runtime_for(self, instance_id: str, project_id: uuid.UUID) -> LiveSession:
        """The live runtime serving `project_id` on `instance_id`, opened (or reopened) if needed."""
        key = (instance_id, project_id)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            session = self.live.get(key)
            if session is not None and not session.runtime.alive:
                await self._settle(session)  # died, maybe unnoticed yet: its ingestor fails its turns first
                session = self.live.get(key)
            if session is not None:
                return session
            driver = self.drivers.get(instance_id)
            if driver is None:
                raise DomainError(ErrorCode.UNKNOWN_PROVIDER_INSTANCE, f"no provider instance {instance_id!r}")
            scope = await self._scope(driver, project_id)
            now = self.pipeline.clock.now()
            record = ProviderSession(
                id=new_id(),
                provider_instance_id=instance_id,
                status=ProviderSessionStatus.STARTING,
                owner=str(self.worker_id),
                capabilities=driver.capabilities().to_json(),
                created_at=now,
                updated_at=now,
            )
            await self._write(record, EventVerb.CREATED)
            try:
                with tracing.span("provider open_session", {"threadloom.provider.instance": instance_id}):
                    runtime = traced(await driver.open_session(scope), instance_id)
            except Exception as error:
                await self._write(
                    record.evolve(
                        status=ProviderSessionStatus.ERROR, last_error=str(error), updated_at=self.pipeline.clock.now()
                    ),
                    EventVerb.UPDATED,
                )
                raise
            await self._write(
                record.evolve(status=ProviderSessionStatus.READY, updated_at=self.pipeline.clock.now()),
                EventVerb.UPDATED,
            )
            session = LiveSession(instance_id, project_id, record.id, runtime)
            self.live[key] = session
            if self.on_open is not None:
                await self.on_open(session)
            return session

    async def _scope(self, driver: ProviderDriver, project_id: uuid.UUID) -> SessionScope:
        """What the project's runtime may touch: its workspace, and its own state folder under the driver's."""
        async with self.pipeline.db.read() as db:
            project = await entities.get(db, Project, project_id)
        if project is None:
            raise DomainError(ErrorCode.NOT_FOUND, "no such project", "projectId")
        # Drivers keep one state folder per instance; each project gets its own folder inside it.
        root = getattr(driver, "state_dir", None)
        if not isinstance(root, Path):
            raise TypeError(f"driver {type(driver).__name__} has no state_dir")
        own = None if self.workspaces_root is None else own_workspaces_of(str(self.workspaces_root), project.id)
        try:
            await asyncio.to_thread(_hand_over, root, str(project.id), project.workspace_root, own)
        except unprivileged.CannotReach as error:
            raise ProviderError(AGENT_USER_CANNOT_RUN, str(error)) from error
        return SessionScope(str(project.id), project.workspace_root, root / str(project.id), own)

    async def _settle(self, session: LiveSession) -> None:
        """Let a dead runtime's ingestor handle its exit (RuntimeExited → session lost), then forget it."""
        if session.task is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(asyncio.shield(session.task), SETTLE_SECONDS)
        if self.live.get(session.key) is session:
            await self.mark(session, ProviderSessionStatus.ERROR, "the agent process exited")

    async def mark(self, session: LiveSession, status: ProviderSessionStatus, error: str | None = None) -> None:
        if self.live.get(session.key) is session:
            del self.live[session.key]
        async with self.pipeline.db.read() as db:
            record = await entities.get(db, ProviderSession, session.session_id)
        if record is not None:
            await self._write(
                record.evolve(status=status, last_error=error, updated_at=self.pipeline.clock.now()),
                EventVerb.UPDATED,
            )

    async def _write(self, record: ProviderSession, verb: EventVerb) -> None:
        change = Change.of(verb, record)

        async def decide(db: Reader) -> Outcome:
            return Outcome([change])

        await self.pipeline.execute(GlobalCommand(command_type=change.event_type, decide=decide))

    def retire(self, session: LiveSession, reason: str) -> None:
        """Take a runtime out of service without ending its other turns: new work opens a fresh
        runtime, and this one is closed (marked stopped with `reason`) once its bound turns end."""
        if self.live.get(session.key) is session:
            del self.live[session.key]
        session.stopping = True
        if session.session_id not in self.retiring:
            self._retired.append(session)
            self.retiring[session.session_id] = asyncio.create_task(
                self._close_when_idle(session, reason), name=f"retire-{session.session_id}"
            )

    async def _close_when_idle(self, session: LiveSession, reason: str) -> None:
        while session.in_use:
            session._changed.clear()
            with contextlib.suppress(TimeoutError):  # `busy` drops without a signal: look again now and then
                await asyncio.wait_for(session._changed.wait(), 1.0)
        try:
            await session.runtime.close()
        except Exception:  # it is forgotten either way
            log.exception("closing retired %s failed", session.key)
        await self.mark(session, ProviderSessionStatus.STOPPED, reason)
        self._retired.remove(session)
        self.retiring.pop(session.session_id, None)

    def binding_of_attempt(self, attempt_id: uuid.UUID | None) -> tuple[LiveSession, TurnBinding] | None:
        if attempt_id is None:
            return None
        for session in [*self.live.values(), *self._retired]:
            binding = session.binding_of_attempt(attempt_id)
            if binding is not None:
                return session, binding
        return None

    async def owner_of(
        self, db: Reader, provider_thread_id: uuid.UUID | None, known: SessionOf | None = None
    ) -> uuid.UUID | None:
        """The live worker holding this provider thread's runtime, if any. `known`: its session's owner and
        status as the caller read them already (`runs.routed_thread_state`), when read for this thread."""
        if known is not None and known[0] == provider_thread_id:
            found = known[1]
        elif provider_thread_id is not None:
            found = await worker_store.session_of(db, provider_thread_id)
        else:
            found = None
        if found is None:
            return None
        owner_text, status = found
        if owner_text is None or status in (ProviderSessionStatus.STOPPED.value, ProviderSessionStatus.ERROR.value):
            return None
        owner = uuid.UUID(owner_text)
        if owner == self.worker_id:
            return owner
        return owner if owner in await worker_store.alive(db, [owner]) else None

    async def close_all(self) -> None:
        for task in self.retiring.values():
            task.cancel()
        for session in [*self.live.values(), *self._retired]:
            bindings = list(session.bindings.values())
            if session.task is not None:
                session.task.cancel()
            try:
                await session.runtime.close()
            except Exception:  # closing must go on for the others
                log.exception("closing %s failed", session.key)
            try:
                error = "server shut down during a turn" if bindings else None
                await self.mark(session, ProviderSessionStatus.STOPPED, error)
            except Exception as failure:  # the database is gone: the next sessions' agents must stop all the same
                log.warning("could not record %s as stopped (%s)", session.key, failure)

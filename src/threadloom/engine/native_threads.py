"""A run's native thread in a live runtime: created, resumed, forked from the source's (a fork's first run)
or replaced when it cannot resume, and recorded; and the `provider-thread.ensure` effect (eager creation
for instances configured so). Called by `engine.turns` before a turn is recorded; the agent is asked
outside any transaction, and what it answered is recorded after."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadloom.domain import threads as thread_rules
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, Outcome, Valued
from threadloom.domain.effects import EnsureThread
from threadloom.domain.entities import AppThread, Project, ProviderThread, Run
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import ProviderThreadStatus
from threadloom.engine.checkpoints import Checkpoints
from threadloom.engine.forks import NativeFork, fall_back_to_handoff, natively_forked
from threadloom.engine.pipeline import Command, Pipeline, Step
from threadloom.engine.sessions import LiveSession, SessionManager
from threadloom.engine.switching import replacement_handoff
from threadloom.providers.contract import ProviderError, ThreadSettings
from threadloom.store import entities
from threadloom.store.db import Reader

Decide = Callable[[Reader, AppThread], Awaitable[Outcome]]


@dataclasses.dataclass(frozen=True, slots=True)
class Target:
    """Where a native thread must exist: the app thread, its workspace, the run asking (if any)."""

    thread_id: uuid.UUID
    settings: ThreadSettings
    run_id: uuid.UUID | None
    provider_thread: ProviderThread
    project_id: uuid.UUID  # whose runtime serves it
    fork: NativeFork | None = None  # a fork's first run: the provider forks the source's thread


def thread_settings(thread: AppThread, cwd: str, model: str | None = None) -> ThreadSettings:
    """A run's settings carry its own model (sendMessage's `model`, else the thread's)."""
    return ThreadSettings(cwd=cwd, runtime_mode=thread.runtime_mode, model=model or thread.model)


class NativeThreads:
    def __init__(self, pipeline: Pipeline, sessions: SessionManager, checkpoints: Checkpoints) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.checkpoints = checkpoints

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    async def ensure_thread(self, effect: EnsureThread) -> None:
        """The `provider-thread.ensure` effect: eager provider-thread creation for instances configured so."""
        thread_id = effect.thread_id
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Valued[Target | None]:
            current = await entities.get(db, ProviderThread, thread.active_provider_thread_id)
            if current is not None and current.native_thread_ref is not None:
                return Outcome().carrying(None)
            project = await entities.require(db, Project, thread.project_id)
            pt, changes = thread_rules.attach_provider_thread(thread, current, thread.provider_instance_id, now, new_id)
            return Outcome(changes).carrying(
                Target(
                    thread.id,
                    thread_settings(thread, str(self.checkpoints.workspace_of(thread, project))),
                    None,
                    pt,
                    project.id,
                )
            )

        step = Step(command_type="provider_thread.ensure", thread_id=thread_id, decide=decide)
        target = await self.pipeline.execute(step)
        if target is not None:
            instance = target.provider_thread.provider_instance_id
            async with self.sessions.using(instance, target.project_id) as session:
                await self.ensure(session, target)

    async def ensure(self, session: LiveSession, p: Target) -> ProviderThread:
        """Lazily create the native thread, or resume it in this runtime (Follow-Up Turns), and record it."""
        pt, ready = await self.native_thread(session, p)
        await self.record(p.thread_id, ready)
        return pt

    async def record(self, thread_id: uuid.UUID, decide: Decide) -> None:
        await self.pipeline.execute(Command(command_type="provider_thread.ready", decide=decide, thread_id=thread_id))

    async def native_thread(self, session: LiveSession, p: Target) -> tuple[ProviderThread, Decide]:
        """The native thread, created or resumed in this runtime, and the decision recording it (for the
        caller to write, alone or before the turn's record)."""
        pt = p.provider_thread
        runtime = session.runtime
        warning: str | None = None
        if pt.native_thread_ref is not None and pt.native_thread_ref not in session.loaded:
            try:
                await runtime.resume_thread(pt.native_thread_ref, p.settings)
            except ProviderError as error:
                if error.code == "exited":
                    raise
                warning = f"could not resume provider thread {pt.native_thread_ref}: {error}; starting a new one"
                pt = await self._replace_provider_thread(p, pt)
        if pt.native_thread_ref is None and p.fork is not None:
            try:
                ref = await runtime.fork_thread(p.fork.native_thread, p.fork.native_turn)
                pt = pt.evolve(native_thread_ref=ref, forked_from_provider_thread_id=p.fork.provider_thread_id)
            except ProviderError as error:
                if error.code == "exited":
                    raise
                warning = (
                    f"the provider could not fork thread {p.fork.native_thread}: {error}; context goes as a handoff"
                )
                await self._fork_portably(p, pt)
        if pt.native_thread_ref is None:
            with contextlib.suppress(OSError):
                os.makedirs(p.settings.cwd, exist_ok=True)
            ref = await runtime.start_thread(p.settings)
            pt = pt.evolve(native_thread_ref=ref)
        session.loaded.add(str(pt.native_thread_ref))
        pt = pt.evolve(session_id=session.session_id, status=ProviderThreadStatus.ACTIVE)
        return pt, self._provider_thread_ready(p, pt, warning)

    async def _fork_portably(self, p: Target, pt: ProviderThread) -> None:
        """The provider refused the native fork: resolve the fork's transfer with a handoff instead."""
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            return Outcome(await fall_back_to_handoff(db, thread, p.run_id, pt.id, now, new_id))

        await self.pipeline.execute(Command(command_type="fork.portable", decide=decide, thread_id=p.thread_id))

    async def _replace_provider_thread(self, p: Target, broken: ProviderThread) -> ProviderThread:
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Valued[ProviderThread]:
            replacement, changes = thread_rules.replace_provider_thread(thread, broken, now, new_id)
            run = await entities.get(db, Run, p.run_id)
            if run is not None:  # the replacement starts blank: tell it the conversation so far
                changes += await replacement_handoff(db, thread, run, replacement, now, new_id)
            return Outcome(changes).carrying(replacement)

        return await self.pipeline.execute(
            Step(command_type="provider_thread.replace", thread_id=p.thread_id, decide=decide)
        )

    def _provider_thread_ready(self, p: Target, pt: ProviderThread, warning: str | None) -> Decide:
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            outcome = Outcome([Change.updated(pt.evolve(updated_at=now))])
            if p.fork is not None and pt.forked_from_provider_thread_id is not None:
                outcome.changes.extend(await natively_forked(db, p.fork, p.run_id, now))
            if warning:
                outcome.changes.append(
                    activity(p.thread_id, ActivityKind.RUNTIME_WARNING, warning, now, new_id, run_id=p.run_id)
                )
            return outcome

        return decide

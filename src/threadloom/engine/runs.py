"""The run lifecycle in the engine: starting a provider turn, finishing a run through the completion
barrier, and the helpers every command on a run shares (`execute_on_run`, `route`, `ability`).
Rules live in `domain.runs`; sendMessage is in `engine.dispatch`, resumeQueue in `engine.queue`."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from threadloom.checkpoints import CheckpointError
from threadloom.domain import dispatch as dispatch_rules
from threadloom.domain import retries as retry_rules
from threadloom.domain import runs as rules
from threadloom.domain import threads as thread_rules
from threadloom.domain.access import Principal
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, Outcome, Valued
from threadloom.domain.effects import EnsureThread, StartTurn
from threadloom.domain.entities import (
    AppThread,
    ContextHandoff,
    ConversationMessage,
    Project,
    ProviderThread,
    ProviderTurn,
    Run,
    RunAttempt,
)
from threadloom.domain.errors import not_found
from threadloom.domain.failures import ModelFailure
from threadloom.domain.handoffs import DEFAULT_POLICY, SwitchPolicy
from threadloom.domain.ids import new_id
from threadloom.domain.retries import RetryPolicy
from threadloom.domain.settings_compat import InPlace
from threadloom.domain.statuses import (
    AttemptStatus,
    ProviderSessionStatus,
    ProviderThreadStatus,
    ProviderTurnStatus,
    RunStatus,
    TokenScope,
)
from threadloom.engine.checkpoints import Checkpoints, RunCapture
from threadloom.engine.forks import (
    NativeFork,
    consume_merges,
    fall_back_to_handoff,
    fork_resolution,
    joined,
    natively_forked,
)
from threadloom.engine.pipeline import Command, Pipeline, Step
from threadloom.engine.rollback import handoff_delivered
from threadloom.engine.sessions import LiveSession, SessionManager, TurnBinding
from threadloom.engine.switching import provider_for_run, replacement_handoff
from threadloom.providers.contract import ProviderError, ThreadSettings
from threadloom.store import entities, rollback_facts, runs
from threadloom.store.db import Reader
from threadloom.store.runs import SessionOf

log = logging.getLogger("threadloom.runs")
TURN_END_WAIT = 30.0
Decide = Callable[[Reader, AppThread, Run], Awaitable[Outcome]]  # a command on a run, under its thread lock
R = TypeVar("R", Run, RunAttempt)
E = TypeVar("E", RunAttempt, Project, ConversationMessage)


@dataclasses.dataclass(frozen=True, slots=True)
class _Target:
    """Where a native thread must exist: the app thread, its workspace, the run asking (if any)."""

    thread_id: uuid.UUID
    settings: ThreadSettings
    run_id: uuid.UUID | None
    provider_thread: ProviderThread
    project_id: uuid.UUID  # whose runtime serves it
    fork: NativeFork | None = None  # a fork's first run: the provider forks the source's thread


@dataclasses.dataclass(frozen=True, slots=True)
class _Prepared:
    run: Run
    attempt: RunAttempt
    thread: AppThread
    provider_thread: ProviderThread
    text: str
    cwd: str
    handoffs: tuple[ContextHandoff, ...] = ()  # context the agent lacks (rollback, portable fork, merge-backs)
    fork: NativeFork | None = None
    baseline_due: bool = True  # the thread has no checkpoint N-1 yet (`Checkpoints.ensure_baseline` has work)
    recorded: tuple[LiveSession, uuid.UUID] | None = None  # turn recorded with the preparing: its runtime, turn
    next_ordinal: int | None = None  # the provider thread's next turn ordinal, when read with the preparing

    @property
    def target(self) -> _Target:
        settings = _settings(self.thread, self.cwd, self.run.model)
        return _Target(self.thread.id, settings, self.run.id, self.provider_thread, self.thread.project_id, self.fork)


def _latest(changes: list[Change], entity: R) -> R:
    """`entity` as `changes` leave it."""
    for change in reversed(changes):
        if isinstance(change.entity, type(entity)) and change.entity.id == entity.id:
            return change.entity
    return entity


def _required(found: E | None, cls: type[E], entity_id: uuid.UUID | None) -> E:
    """As `entities.require` raises for a missing entity."""
    if found is None:
        raise LookupError(f"{cls.entity_type} {entity_id} not found")
    return found


def _release(session: LiveSession) -> None:
    """The end of a hold taken by `RunEngine._holding` (as `SessionManager.using` ends)."""
    session.busy -= 1
    session.idle_since = None


def _settings(thread: AppThread, cwd: str, model: str | None = None) -> ThreadSettings:
    """A run's settings carry its own model (sendMessage's `model`, else the thread's)."""
    return ThreadSettings(cwd=cwd, runtime_mode=thread.runtime_mode, model=model or thread.model)


class RunEngine:
    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionManager,
        checkpoints: Checkpoints | None = None,
        retry_policies: dict[str, RetryPolicy] | None = None,
        switch_policies: dict[str, SwitchPolicy] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.checkpoints = checkpoints or Checkpoints(pipeline, None, ())
        self.retry_policies = retry_policies or {}  # per instance: retries after a crash mid-turn
        self.switch_policies = switch_policies or {}  # per instance: when a returning provider thread is too stale

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    # ---- commands ---------------------------------------------------------------------

    def ability(self, instance_id: str) -> dispatch_rules.SteerAbility:
        driver = self.sessions.drivers.get(instance_id)
        caps = driver.capabilities() if driver is not None else None
        return dispatch_rules.SteerAbility(
            native=bool(caps and caps.supports_active_steering),
            restart=bool(caps and caps.supports_steering_by_interrupt_restart),
        )

    async def execute_on_thread(
        self,
        principal: Principal,
        command_type: str,
        thread_id: uuid.UUID,
        key: str | None,
        decide: Callable[[Reader, AppThread], Awaitable[Outcome]],
    ) -> uuid.UUID:
        """A client's command on a thread (operate scope) under its lock, its effects routed; answers the thread."""

        async def locked(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            outcome = await decide(db, thread)
            await self.route(db, thread, outcome)
            outcome.result = {"threadId": str(thread.id)}
            return outcome

        data = {"threadId": str(thread_id)}
        command = Command(
            command_type=command_type, principal=principal, key=key, input=data, decide=locked, thread_id=thread_id
        )
        await self.pipeline.execute(command)
        return thread_id

    async def execute_on_run(
        self,
        principal: Principal,
        command_type: str,
        run_id: uuid.UUID,
        key: str | None,
        data: dict[str, Any],
        decide: Decide,
    ) -> dict[str, Any]:
        """A command on a run under its thread's lock; the command's result (stored or new)."""
        thread_id = await self.thread_of(run_id)

        async def locked(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "runId")
            run = await entities.get(db, Run, run_id)
            if run is None:
                raise not_found("runId")
            outcome = await decide(db, thread, run)
            await self.route(db, thread, outcome)
            return outcome

        asked = {"command_type": command_type, "principal": principal, "key": key, "decide": locked}
        return await self.pipeline.execute(Command.naming("runId", run_id, data, thread_id=thread_id, **asked))

    async def thread_of(self, run_id: uuid.UUID) -> uuid.UUID:
        async with self.pipeline.db.read() as db:
            run = await entities.get(db, Run, run_id)
        if run is None:
            raise not_found("runId")
        return run.thread_id

    async def route(self, db: Reader, thread: AppThread, outcome: Outcome, known: SessionOf | None = None) -> None:
        """Send turn starts to the worker whose live runtime holds the thread's provider thread (`known`: its
        session as read already, `SessionManager.owner_of`)."""
        if not outcome.effects:
            return
        owner = await self.sessions.owner_of(db, thread.active_provider_thread_id, known)
        if owner is not None:
            outcome.effects = [dataclasses.replace(e, affinity=owner) for e in outcome.effects]

    async def finish(
        self,
        run_id: uuid.UUID,
        status: RunStatus,
        reason: str | None,
        *,
        hold_reason: str | None = None,
        attempt_id: uuid.UUID | None = None,
        guard: Callable[[Reader, Run], Awaitable[bool]] | None = None,
        before: tuple[Callable[[Reader, AppThread], Awaitable[Outcome]], ...] = (),
        thread_id: uuid.UUID | None = None,
        model_failure: ModelFailure | None = None,
    ) -> bool:
        """End a run through the completion barrier. A no-op (False) if it already ended,
        or if `guard`, checked under the thread lock, says no. `before` (the turn's last events)
        is written first, in the same transaction. `thread_id`, the run's thread when the caller
        knows it, saves a read on the turn's critical path. `model_failure`: the driver's reading of
        a failed turn (the run's failure code, `domain.failures`).

        The workspace's capture (git work, no lock) runs alongside the transaction's first part (the
        thread lock, `before`, the barrier's read); the checkpoint is recorded once it is done, so its
        ref is written before the commit that names it, as when the capture came first."""
        capturing = asyncio.ensure_future(self.checkpoints.capture_run_end(run_id, attempt_id))
        try:
            return await self._finish(
                run_id, status, reason, capturing, hold_reason, attempt_id, guard, before, thread_id, model_failure
            )
        finally:
            if not capturing.done():  # not needed after all (the run had ended): let it finish, as before
                await asyncio.gather(capturing, return_exceptions=True)

    async def _finish(
        self,
        run_id: uuid.UUID,
        status: RunStatus,
        reason: str | None,
        capturing: asyncio.Future[RunCapture | None],
        hold_reason: str | None,
        attempt_id: uuid.UUID | None,
        guard: Callable[[Reader, Run], Awaitable[bool]] | None,
        before: tuple[Callable[[Reader, AppThread], Awaitable[Outcome]], ...],
        thread_id: uuid.UUID | None,
        model_failure: ModelFailure | None = None,
    ) -> bool:
        if thread_id is None:
            thread_id = await self._thread_of_run(run_id)
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Valued[bool]:
            facts = await runs.finish_facts(db, thread, run_id)  # the run, its graph, its checkpoint slot
            run = facts.run
            if run is None or not rules.is_active(run):
                return Outcome().carrying(False)
            if attempt_id is not None and run.active_attempt_id != attempt_id:
                return (await self._close_superseded_turn(db, attempt_id, status)).carrying(False)
            if guard is not None and not await guard(db, run):
                return Outcome().carrying(False)
            graph = facts.graph()
            slot = (facts.scope, facts.checkpoint)
            capture = await capturing
            checkpoint = self.checkpoints.record_run_end(thread, run, graph.root.id, capture, status, slot)
            outcome = rules.finish_run(
                graph,
                status,
                reason,
                now,
                new_id,
                hold_reason=hold_reason,
                checkpoint=checkpoint,
                model_failure=model_failure,
            )
            await self.route(db, thread, outcome)
            return outcome.carrying(True)

        if thread_id is None:
            return False
        step = Step(command_type="run.finish", thread_id=thread_id, decide=decide, before=before)
        ended = await self.pipeline.execute(step)
        if ended:
            await self.checkpoints.close_scopes(run_id)  # subagents whose end was never reported
        return ended

    async def _close_superseded_turn(self, db: Reader, attempt_id: uuid.UUID, status: RunStatus) -> Outcome:
        """The provider ended the turn of a superseded attempt: record that, and nothing else."""
        attempt = await entities.get(db, RunAttempt, attempt_id)
        turn = await entities.get(db, ProviderTurn, attempt.provider_turn_id if attempt else None)
        if turn is None or turn.status not in (ProviderTurnStatus.PENDING, ProviderTurnStatus.RUNNING):
            return Outcome()
        ended = ProviderTurnStatus.INTERRUPTED if status == RunStatus.INTERRUPTED else ProviderTurnStatus.COMPLETED
        return Outcome([Change.updated(turn.evolve(status=ended, completed_at=self.now))])

    async def _thread_of_run(self, run_id: uuid.UUID) -> uuid.UUID | None:
        async with self.pipeline.db.read() as db:
            run = await entities.get(db, Run, run_id)
        return None if run is None else run.thread_id

    # ---- the provider-turn.start effect ---------------------------------------------------

    async def start_turn(self, effect: StartTurn) -> None:
        """ensure session → ensure provider thread → record the turn → start it.

        A follow-up turn on a native thread its live runtime already holds (nothing to create, resume,
        fork, capture first or wait for) is prepared and recorded in one transaction (`_prepare`); the
        turn's row still commits before the provider is asked to start it."""
        prepared = await self._prepare(effect.run_id, effect.input, effect.thread_id)
        if prepared is None:
            return
        if prepared.recorded is not None:
            session, turn = prepared.recorded
            try:
                await self._send(session, prepared, prepared.provider_thread, turn, prepared.handoffs)
            finally:
                _release(session)
            return
        try:
            if prepared.thread.workspace_path:
                # A fork's own folder: made once (again for a fork an older release made inside the workspace).
                await self.checkpoints.ensure_own_workspace(prepared.thread.id, prepared.run.ordinal)
        except (CheckpointError, OSError) as error:
            reason = f"the fork's workspace could not be made: {error}"
            await self.finish(effect.run_id, RunStatus.FAILED, "workspace_error", hold_reason=reason)
            return
        if prepared.baseline_due:
            await self.checkpoints.ensure_baseline(effect.run_id)  # the workspace before this run
        try:
            # The project's own runtime, kept from the reaper meanwhile.
            async with self.sessions.using(prepared.run.provider_instance_id, prepared.thread.project_id) as session:
                await self._start_on(session, prepared)
        except ProviderError as error:
            await self.finish(effect.run_id, RunStatus.FAILED, "provider_error", hold_reason=f"provider error: {error}")

    async def _start_on(self, session: LiveSession, prepared: _Prepared) -> None:
        run_id = prepared.run.id
        # The provider thread's record is written with the turn's, in one transaction.
        provider_thread, ready = await self._native_thread(session, prepared.target)
        previous = session.bindings.get(str(provider_thread.native_thread_ref))
        superseded = previous if previous is not None and previous.attempt_id != prepared.attempt.id else None
        # A restart: the superseded attempt's turn must end before the new one starts.
        if superseded is not None and not await session.wait_unbound(superseded.native_thread, TURN_END_WAIT):
            await self._record(prepared.thread.id, ready)
            await self.finish(
                run_id, RunStatus.FAILED, "provider_error", hold_reason="the interrupted turn did not end in time"
            )
            return
        turn = await self._record_turn(prepared, provider_thread, ready)
        if turn is None:
            return
        handoffs = prepared.handoffs
        fell_back = prepared.fork is not None and provider_thread.forked_from_provider_thread_id is None
        if fell_back or provider_thread.id != prepared.provider_thread.id:  # a handoff made after preparing
            handoffs = await self._pending_handoffs(provider_thread.id)
        await self._send(session, prepared, provider_thread, turn, handoffs)

    async def _send(
        self,
        session: LiveSession,
        prepared: _Prepared,
        provider_thread: ProviderThread,
        turn: uuid.UUID,
        handoffs: tuple[ContextHandoff, ...],
    ) -> None:
        """Bind the recorded turn and ask the provider to start it (the turn's row is committed)."""
        run_id = prepared.run.id
        handoff = joined(handoffs)
        binding = TurnBinding(
            thread_id=prepared.thread.id,
            run_id=run_id,
            attempt_id=prepared.attempt.id,
            root_node_id=prepared.attempt.root_node_id,
            provider_turn_id=turn,
            native_thread=str(provider_thread.native_thread_ref),
        )
        session.bind(binding)
        try:
            # The handoff goes as the driver's own context input; the user's text stays theirs.
            native_turn = await session.runtime.start_turn(
                binding.native_thread, prepared.text, prepared.target.settings, handoff
            )
        except ProviderError as error:
            session.unbind(binding.native_thread)
            crashed = error.code == "exited"
            await self.finish(
                run_id,
                RunStatus.FAILED,
                "provider_crashed" if crashed else "provider_error",
                hold_reason=f"{'agent process exited' if crashed else 'provider refused the turn'}: {error}",
            )
            return
        binding.know_turn(native_turn)
        for delivered in handoffs:
            await handoff_delivered(self.pipeline, delivered, run_id)

    async def _pending_handoffs(self, provider_thread_id: uuid.UUID) -> tuple[ContextHandoff, ...]:
        async with self.pipeline.db.read() as db:
            return tuple(await rollback_facts.pending_handoffs(db, provider_thread_id))

    async def _prepare(
        self, run_id: uuid.UUID, text: str | None = None, thread_id: uuid.UUID | None = None
    ) -> _Prepared | None:
        """Read what the turn needs (`turn.prepare`); when the native thread is already loaded in a live
        runtime, also record the provider thread and the requested turn in the same transaction, the
        runtime kept from the reaper until the caller `_release`s it (`_Prepared.recorded`)."""
        now = self.now
        found: list[_Prepared] = []
        held: list[LiveSession] = []

        async def prepare(db: Reader, thread: AppThread) -> Outcome:
            start = await runs.turn_start(db, thread, run_id)  # one statement for five reads
            run = start.run
            if run is None or run.status != RunStatus.PREPARING:
                return Outcome()
            attempt = _required(start.attempt, RunAttempt, run.active_attempt_id)
            if attempt.status != AttemptStatus.PENDING:
                return Outcome()
            project = _required(start.project, Project, thread.project_id)
            message = _required(start.message, ConversationMessage, run.user_message_id)
            current = start.provider_thread
            policy = self.switch_policies.get(run.provider_instance_id, DEFAULT_POLICY)
            in_place = self._settings_in_place(run.provider_instance_id)
            provider_thread, changes, switched = await provider_for_run(
                db, thread, current, run, now, new_id, policy, in_place
            )
            outcome = Outcome(changes)
            # `start` read the pending handoffs and the last turn of the thread's active provider thread.
            same = current is not None and provider_thread.id == current.id
            pending = start.handoffs if same else await rollback_facts.pending_handoffs(db, provider_thread.id)
            handoffs = [*pending, *switched]
            fork = await fork_resolution(db, thread, run, provider_thread, self._fork_ability(run), now, new_id)
            if fork is not None:
                outcome.changes.extend(fork.changes)
                handoffs.extend([fork.handoff] if fork.handoff else [])
            merged = await consume_merges(db, thread, run, provider_thread.id, now, new_id, start.merges)
            outcome.changes.extend(merged.changes)
            handoffs.extend(merged.handoffs)
            # The run and attempt as these changes leave them (the turn's record starts from them).
            run, attempt = _latest(outcome.changes, run), _latest(outcome.changes, attempt)
            found.append(
                _Prepared(
                    run,
                    attempt,
                    thread,
                    provider_thread,
                    text or message.text,
                    str(self.checkpoints.workspace_of(thread, project)),
                    tuple(handoffs),
                    fork.native if fork is not None else None,
                    self.checkpoints.baseline_due(run, start.baseline),
                    next_ordinal=start.last_turn + 1 if same else None,
                )
            )
            return outcome

        async def request(db: Reader, thread: AppThread) -> Valued[_Prepared | None]:
            if not found:
                return Outcome().carrying(None)
            p = found[0]
            session = self._holding(p)
            if session is None:
                return Outcome().carrying(p)  # the turn is recorded later, after the runtime is ready
            held.append(session)
            pt = p.provider_thread.evolve(session_id=session.session_id, status=ProviderThreadStatus.ACTIVE)
            ordinal = p.next_ordinal or await runs.next_turn_ordinal(db, pt.id)
            outcome, turn = rules.turn_requested(p.run, p.attempt, pt, ordinal, now, new_id)
            outcome.changes.insert(0, Change.updated(pt.evolve(updated_at=now)))  # as `_provider_thread_ready`
            return outcome.carrying(dataclasses.replace(p, provider_thread=pt, recorded=(session, turn.id)))

        thread_id = thread_id or await self._thread_of_run(run_id)
        if thread_id is None:
            return None
        step = Step(command_type="turn.prepare", thread_id=thread_id, decide=request, before=(prepare,))
        try:
            return await self.pipeline.execute(step)
        except BaseException:
            for session in held:
                _release(session)
            raise

    def _holding(self, p: _Prepared) -> LiveSession | None:
        """The live runtime that already holds the turn's native thread, now kept from the reaper (as by
        `SessionManager.using`), when the turn needs nothing before its record: no runtime to open, native
        thread to create, resume or fork, fork folder or baseline to make, nor earlier turn to wait for."""
        if p.fork is not None or p.baseline_due or p.thread.workspace_path:
            return None
        ref = p.provider_thread.native_thread_ref
        session = self.sessions.live.get((p.run.provider_instance_id, p.thread.project_id))
        if ref is None or session is None or session.stopping or not session.runtime.alive:
            return None
        if ref not in session.loaded or ref in session.bindings:
            return None
        session.busy += 1
        return session

    async def _ensure_native_thread(self, session: LiveSession, p: _Target) -> ProviderThread:
        """Lazily create the native thread, or resume it in this runtime (Follow-Up Turns), and record it."""
        pt, ready = await self._native_thread(session, p)
        await self._record(p.thread_id, ready)
        return pt

    async def _record(self, thread_id: uuid.UUID, decide: Callable[[Reader, AppThread], Awaitable[Outcome]]) -> None:
        await self.pipeline.execute(Command(command_type="provider_thread.ready", decide=decide, thread_id=thread_id))

    async def _native_thread(
        self, session: LiveSession, p: _Target
    ) -> tuple[ProviderThread, Callable[[Reader, AppThread], Awaitable[Outcome]]]:
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

    def _settings_in_place(self, instance_id: str) -> InPlace:
        """What the instance's driver changes on a live provider thread (`domain.settings_compat`)."""
        driver = self.sessions.drivers.get(instance_id)
        return driver.settings_in_place() if driver is not None else InPlace()

    def _fork_ability(self, run: Run) -> tuple[bool, bool]:
        """Whether the run's provider can fork a thread natively, and at a given turn."""
        driver = self.sessions.drivers.get(run.provider_instance_id)
        caps = driver.capabilities() if driver is not None else None
        return (bool(caps and caps.can_fork_thread), bool(caps and caps.can_fork_from_turn))

    async def _fork_portably(self, p: _Target, pt: ProviderThread) -> None:
        """The provider refused the native fork: resolve the fork's transfer with a handoff instead."""
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            return Outcome(await fall_back_to_handoff(db, thread, p.run_id, pt.id, now, new_id))

        await self.pipeline.execute(Command(command_type="fork.portable", decide=decide, thread_id=p.thread_id))

    async def _replace_provider_thread(self, p: _Target, broken: ProviderThread) -> ProviderThread:
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

    def _provider_thread_ready(
        self, p: _Target, pt: ProviderThread, warning: str | None
    ) -> Callable[[Reader, AppThread], Awaitable[Outcome]]:
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

    async def _record_turn(
        self, p: _Prepared, pt: ProviderThread, ready: Callable[[Reader, AppThread], Awaitable[Outcome]]
    ) -> uuid.UUID | None:
        """Record the provider thread (`ready`) and the requested turn, in one transaction."""
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Valued[uuid.UUID | None]:
            run = await entities.get(db, Run, p.run.id)
            attempt = await entities.get(db, RunAttempt, p.attempt.id)
            if run is None or attempt is None or run.status != RunStatus.PREPARING:
                return Outcome().carrying(None)
            ordinal = await runs.next_turn_ordinal(db, pt.id)
            outcome, turn = rules.turn_requested(run, attempt, pt, ordinal, now, new_id)
            return outcome.carrying(turn.id)

        step = Step(command_type="turn.request", thread_id=p.thread.id, decide=decide, before=(ready,))
        return await self.pipeline.execute(step)

    async def ensure_thread(self, effect: EnsureThread) -> None:
        """The `provider-thread.ensure` effect: eager provider-thread creation for instances configured so."""
        thread_id = effect.thread_id
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Valued[_Target | None]:
            current = await entities.get(db, ProviderThread, thread.active_provider_thread_id)
            if current is not None and current.native_thread_ref is not None:
                return Outcome().carrying(None)
            project = await entities.require(db, Project, thread.project_id)
            pt, changes = thread_rules.attach_provider_thread(thread, current, thread.provider_instance_id, now, new_id)
            return Outcome(changes).carrying(
                _Target(
                    thread.id,
                    _settings(thread, str(self.checkpoints.workspace_of(thread, project))),
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
                await self._ensure_native_thread(session, target)

    async def _retry_after_crash(self, instance: str, binding: TurnBinding, reason: str) -> bool:
        """A new PROVIDER_RECOVERY attempt for the crashed turn, if the policy allows it (domain.retries)."""
        policy = self.retry_policies.get(instance)
        if policy is None or policy.retries <= 0:
            return False
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Valued[bool]:
            run = await entities.get(db, Run, binding.run_id)
            if run is None or not rules.is_active(run) or run.active_attempt_id != binding.attempt_id:
                return Outcome().carrying(False)
            attempts = await runs.attempts_of(db, run.id)
            if not retry_rules.may_retry(policy, attempts, await runs.nodes_of_attempt(db, binding.attempt_id)):
                return Outcome().carrying(False)
            graph = await runs.run_graph(db, thread, run)
            outcome = retry_rules.retry(graph, attempts, await runs.run_input(db, run), reason, policy, now, new_id)
            return outcome.carrying(True)

        return await self.pipeline.execute(Step(command_type="run.retry", thread_id=binding.thread_id, decide=decide))

    async def session_lost(self, session: LiveSession, reason: str) -> None:
        """The runtime died: its live turns are retried where the instance allows it and nothing irreversible
        happened yet, else they fail; the provider threads stay resumable."""
        for binding in list(session.bindings.values()):
            if await self._retry_after_crash(session.instance_id, binding, f"agent process exited: {reason}"):
                continue
            await self.finish(
                binding.run_id,
                RunStatus.FAILED,
                "provider_crashed",
                hold_reason=f"agent process exited: {reason}",
                attempt_id=binding.attempt_id,
            )
        if not session.stopping:
            await self.sessions.mark(session, ProviderSessionStatus.ERROR, reason)

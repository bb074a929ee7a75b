"""A run's turn: the `provider-turn.start` effect. Prepare (one transaction: the provider thread the run
goes to, the context it lacks), make sure the native thread exists in a live runtime (`engine.native_threads`),
record the requested turn, then bind it and ask the provider to start it (`_send`) after that commit.

A follow-up turn on a native thread its live runtime already holds (nothing to create, resume, fork, capture
first or wait for) is prepared and recorded in one transaction; the turn's row still commits before the
provider is asked to start it."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from threadloom.checkpoints import CheckpointError
from threadloom.domain import runs as rules
from threadloom.domain.changes import Change, Outcome, Valued
from threadloom.domain.effects import StartTurn
from threadloom.domain.entities import (
    AppThread,
    ContextHandoff,
    ConversationMessage,
    Project,
    ProviderThread,
    Run,
    RunAttempt,
)
from threadloom.domain.handoffs import DEFAULT_POLICY, SwitchPolicy
from threadloom.domain.ids import new_id
from threadloom.domain.settings_compat import InPlace
from threadloom.domain.statuses import AttemptStatus, ProviderThreadStatus, RunStatus
from threadloom.engine.checkpoints import Checkpoints
from threadloom.engine.forks import NativeFork, consume_merges, fork_resolution, joined
from threadloom.engine.handoff_delivery import handoff_delivered
from threadloom.engine.lost_turns import drop_lost_turns
from threadloom.engine.native_threads import NativeThreads, Target, thread_settings
from threadloom.engine.pipeline import Pipeline, Step
from threadloom.engine.run_finish import RunFinish, thread_of_run
from threadloom.engine.sessions import LiveSession, SessionManager, TurnBinding
from threadloom.engine.switching import provider_for_run
from threadloom.faults import hold_point
from threadloom.providers.contract import ProviderError
from threadloom.store import entities, rollback_facts, runs
from threadloom.store.db import Reader

TURN_END_WAIT = 30.0
Decide = Callable[[Reader, AppThread], Awaitable[Outcome]]
R = TypeVar("R", Run, RunAttempt)
E = TypeVar("E", RunAttempt, Project, ConversationMessage)


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
    def target(self) -> Target:
        settings = thread_settings(self.thread, self.cwd, self.run.model)
        return Target(self.thread.id, settings, self.run.id, self.provider_thread, self.thread.project_id, self.fork)


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
    """The end of a hold taken by `_Holds.take` (as `SessionManager.using` ends)."""
    session.busy -= 1
    session.idle_since = None


class _Holds:
    """Runtimes a turn's preparation kept from the reaper inside its transaction (`_Holds.take`), given back
    if that transaction fails. A hold is a resource handed over with the decision's value
    (`_Prepared.recorded`), and a failed commit loses the value: this is how it is still given back."""

    def __init__(self) -> None:
        self._held: list[LiveSession] = []

    def take(self, session: LiveSession) -> None:
        session.busy += 1
        self._held.append(session)

    def release(self) -> None:
        for session in self._held:
            _release(session)
        self._held.clear()


class Turns:
    """Starts runs' turns; `RunEngine.start_turn` is this object's."""

    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionManager,
        checkpoints: Checkpoints,
        native: NativeThreads,
        ending: RunFinish,
        switch_policies: dict[str, SwitchPolicy],
    ) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.checkpoints = checkpoints
        self.native = native
        self.finish = ending.finish  # a turn that cannot start fails its run through the barrier
        self.switch_policies = switch_policies  # per instance: when a returning provider thread is too stale
        # Asked before a turn is sent (engine.budgets): False holds it (a budget stopped or asks about it).
        self.gate: Callable[[uuid.UUID, uuid.UUID], Awaitable[bool]] | None = None

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    async def start_turn(self, effect: StartTurn) -> None:
        """ensure session → ensure provider thread → record the turn → start it.

        A follow-up turn on a native thread its live runtime already holds (nothing to create, resume,
        fork, capture first or wait for) is prepared and recorded in one transaction (`_prepare`); the
        turn's row still commits before the provider is asked to start it."""
        thread_id = effect.thread_id or await thread_of_run(self.pipeline, effect.run_id)
        if self.gate is not None and thread_id is not None and not await self.gate(effect.run_id, thread_id):
            return  # past a budget: stopped, or held behind its question
        # A superseded attempt's start (a restart replaced it while this effect waited or prepared) is a no-op:
        # the new attempt's own effect starts the run with the restart's input.
        prepared = await self._prepare(effect.run_id, effect.input, thread_id, effect.attempt_id)
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
        provider_thread, ready = await self.native.native_thread(session, prepared.target)
        # A recovery attempt: the lost turn the resumed thread still holds goes first (its message once).
        await drop_lost_turns(self.pipeline, session.runtime.capabilities, session, prepared.attempt, provider_thread)
        previous = session.bindings.get(str(provider_thread.native_thread_ref))
        superseded = previous if previous is not None and previous.attempt_id != prepared.attempt.id else None
        # A restart: the superseded attempt's turn must end before the new one starts.
        if superseded is not None and not await session.wait_unbound(superseded.native_thread, TURN_END_WAIT):
            await self.native.record(prepared.thread.id, ready)
            await self.finish(
                run_id, RunStatus.FAILED, "provider_error", hold_reason="the interrupted turn did not end in time"
            )
            return
        await hold_point("turn-recording")  # tests: a restart supersedes the attempt while it is prepared
        turn = await self._record_turn(prepared, provider_thread, ready)
        if turn is None:
            return  # superseded or ended meanwhile: nothing to start (its provider thread is recorded)
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
        async with self.pipeline.db.statements() as db:  # one statement: no transaction around it
            return tuple(await rollback_facts.pending_handoffs(db, provider_thread_id))

    async def _prepare(
        self,
        run_id: uuid.UUID,
        text: str | None = None,
        thread_id: uuid.UUID | None = None,
        attempt_id: uuid.UUID | None = None,
    ) -> _Prepared | None:
        """Read and decide what the turn needs (`turn.prepare`); when the native thread is already loaded in a
        live runtime, also record the provider thread and the requested turn in the same transaction, the
        runtime kept from the reaper until the caller `_release`s it (`_Prepared.recorded`)."""
        now = self.now
        holds = _Holds()

        async def decide(db: Reader, thread: AppThread) -> Valued[_Prepared | None]:
            outcome, prepared = await self._read_turn(db, thread, run_id, text, now, attempt_id)
            if prepared is None:
                return outcome.carrying(None)
            session = self._holding(prepared)
            if session is None:
                return outcome.carrying(prepared)  # the turn is recorded later, after the runtime is ready
            holds.take(session)
            requested, recorded = await self._request_turn(db, prepared, session, now)
            outcome.changes.extend(requested.changes)
            outcome.effects.extend(requested.effects)
            return outcome.carrying(recorded)

        thread_id = thread_id or await thread_of_run(self.pipeline, run_id)
        if thread_id is None:
            return None
        try:
            return await self.pipeline.execute(Step(command_type="turn.prepare", thread_id=thread_id, decide=decide))
        except BaseException:
            holds.release()
            raise

    async def _read_turn(
        self,
        db: Reader,
        thread: AppThread,
        run_id: uuid.UUID,
        text: str | None,
        now: Any,
        attempt_id: uuid.UUID | None = None,
    ) -> tuple[Outcome, _Prepared | None]:
        """What the run's turn needs, and the changes that give it (its provider thread chosen, switched or
        replaced, a fork's transfer and merge-backs resolved); no `_Prepared` when the run is not waiting
        for its turn, or waits for another attempt than `attempt_id` (the effect's, None in older rows):
        that attempt was superseded, and the effect of the one that replaced it carries its own input."""
        start = await runs.turn_start(db, thread, run_id)  # one statement for five reads
        run = start.run
        if run is None or run.status != RunStatus.PREPARING:
            return Outcome(), None
        if attempt_id is not None and run.active_attempt_id != attempt_id:
            return Outcome(), None
        attempt = _required(start.attempt, RunAttempt, run.active_attempt_id)
        if attempt.status != AttemptStatus.PENDING:
            return Outcome(), None
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
        prepared = _Prepared(
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
        return outcome, prepared

    async def _request_turn(
        self, db: Reader, p: _Prepared, session: LiveSession, now: Any
    ) -> tuple[Outcome, _Prepared]:
        """The provider thread, active in `session`, and its requested turn: the changes recording them and
        the preparation that names them."""
        pt = p.provider_thread.evolve(session_id=session.session_id, status=ProviderThreadStatus.ACTIVE)
        ordinal = p.next_ordinal or await runs.next_turn_ordinal(db, pt.id)
        outcome, turn = rules.turn_requested(p.run, p.attempt, pt, ordinal, now, new_id)
        outcome.changes.insert(0, Change.updated(pt.evolve(updated_at=now)))  # as `NativeThreads.native_thread`
        return outcome, dataclasses.replace(p, provider_thread=pt, recorded=(session, turn.id))

    def _holding(self, p: _Prepared) -> LiveSession | None:
        """The live runtime that already holds the turn's native thread (to be kept from the reaper by
        `_Holds.take`, as by `SessionManager.using`), when the turn needs nothing before its record: no runtime
        to open, native thread to create, resume or fork, fork folder or baseline to make, nor earlier turn to
        wait for."""
        if p.fork is not None or p.baseline_due or p.thread.workspace_path:
            return None
        ref = p.provider_thread.native_thread_ref
        session = self.sessions.live.get((p.run.provider_instance_id, p.thread.project_id))
        if ref is None or session is None or session.stopping or not session.runtime.alive:
            return None
        if ref not in session.loaded or ref in session.bindings:
            return None
        return session

    async def _record_turn(self, p: _Prepared, pt: ProviderThread, ready: Decide) -> uuid.UUID | None:
        """Record the provider thread (`ready`) and the requested turn, in one transaction."""
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Valued[uuid.UUID | None]:
            run = await entities.get(db, Run, p.run.id)
            attempt = await entities.get(db, RunAttempt, p.attempt.id)
            if run is None or attempt is None or run.status != RunStatus.PREPARING:
                return Outcome().carrying(None)
            if attempt.status != AttemptStatus.PENDING or run.active_attempt_id != attempt.id:
                return Outcome().carrying(None)  # superseded while it was prepared: a restart started another
            ordinal = await runs.next_turn_ordinal(db, pt.id)
            outcome, turn = rules.turn_requested(run, attempt, pt, ordinal, now, new_id)
            return outcome.carrying(turn.id)

        step = Step(command_type="turn.request", thread_id=p.thread.id, decide=decide, before=(ready,))
        return await self.pipeline.execute(step)

    def _settings_in_place(self, instance_id: str) -> InPlace:
        """What the instance's driver changes on a live provider thread (`domain.settings_compat`)."""
        driver = self.sessions.drivers.get(instance_id)
        return driver.settings_in_place() if driver is not None else InPlace()

    def _fork_ability(self, run: Run) -> tuple[bool, bool]:
        """Whether the run's provider can fork a thread natively, and at a given turn."""
        driver = self.sessions.drivers.get(run.provider_instance_id)
        caps = driver.capabilities() if driver is not None else None
        return (bool(caps and caps.can_fork_thread), bool(caps and caps.can_fork_from_turn))

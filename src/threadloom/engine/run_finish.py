"""How a run ends: the completion barrier (`finish`), the late end of a superseded attempt's turn, and the
turns of a runtime that died (a new PROVIDER_RECOVERY attempt where the instance allows it, else failed).
Rules in `domain.runs` and `domain.retries`; the checkpoint of the run's end is captured outside the
barrier's transaction (`engine.checkpoints`)."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadloom.domain import retries as retry_rules
from threadloom.domain import runs as rules
from threadloom.domain.changes import Change, Outcome, Valued
from threadloom.domain.entities import AppThread, ProviderTurn, Run, RunAttempt
from threadloom.domain.failures import ModelFailure
from threadloom.domain.ids import new_id
from threadloom.domain.retries import RetryPolicy
from threadloom.domain.statuses import ProviderSessionStatus, ProviderTurnStatus, RunStatus
from threadloom.engine.checkpoints import Checkpoints, RunCapture
from threadloom.engine.pipeline import Pipeline, Step
from threadloom.engine.routing import route
from threadloom.engine.sessions import LiveSession, SessionManager, TurnBinding
from threadloom.store import entities, runs
from threadloom.store.db import Reader


async def thread_of_run(pipeline: Pipeline, run_id: uuid.UUID) -> uuid.UUID | None:
    """The run's thread (None: no such run)."""
    async with pipeline.db.statements() as db:  # one statement: no transaction around it
        run = await entities.get(db, Run, run_id)
    return None if run is None else run.thread_id


class RunFinish:
    """Ends runs; `RunEngine.finish` and `RunEngine.session_lost` are this object's."""

    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionManager,
        checkpoints: Checkpoints,
        retry_policies: dict[str, RetryPolicy],
    ) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.checkpoints = checkpoints
        self.retry_policies = retry_policies  # per instance: retries after a crash mid-turn

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

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
            thread_id = await thread_of_run(self.pipeline, run_id)
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
            await route(self.sessions, db, thread, outcome)
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

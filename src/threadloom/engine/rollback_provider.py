"""A rollback's provider step: per provider thread, how its conversation loses the undone runs (natively, by a
fork, by a replacement given the app's context), which other provider threads saw an undone run (retired),
and what kept runs the one that stays active must be handed again."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable, Collection
from pathlib import Path
from typing import Any

from threadloom.domain import handoff_rollback as handoff_rules
from threadloom.domain import rollback as plan_rules
from threadloom.domain import switching
from threadloom.domain.entities import (
    AppThread,
    ContextHandoff,
    Project,
    ProviderThread,
    ProviderTurn,
    Run,
)
from threadloom.domain.handoffs import (
    NOT_IN_CONVERSATION,
    HandoffKind,
    Selection,
    build_handoff,
    pending_handoff,
)
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import (
    ProviderThreadStatus,
)
from threadloom.domain.threads import new_provider_thread
from threadloom.engine import node_rollback
from threadloom.engine.pipeline import Pipeline
from threadloom.engine.rollback_operation import (
    Operation,
    ProviderStep,
    StepFailed,
)
from threadloom.engine.sessions import SessionManager
from threadloom.providers.contract import ThreadSettings
from threadloom.store import entities, handoff_facts
from threadloom.store import switching as switch_facts
from threadloom.store import tables as t
from threadloom.store.db import Reader


class ProviderSteps:
    """The provider work of rollbacks, with the drivers' capabilities (`sessions`)."""

    def __init__(
        self, pipeline: Pipeline, sessions: SessionManager, workspace_of: Callable[[AppThread, Project], Path]
    ) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.workspace_of = workspace_of

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    async def rebridge(
        self,
        db: Reader,
        thread: AppThread,
        op: Operation,
        plan: plan_rules.RollbackPlan,
        runs: list[Run],
        dropped: Collection[uuid.UUID] = (),
    ) -> ContextHandoff | None:
        """A handoff for kept runs the provider thread that stays active does not hold: an undone run's first
        turn may have carried a handoff telling of earlier runs (a return after a switch), and rolling that
        turn back, natively or by forking before it, drops them too; a pending handoff that told of them along
        with an undone run is `dropped` by this rollback (`domain.handoff_rollback`), so they are told again
        here. None when it lacks nothing."""
        replaced = next((s for s in op.providers if s.replacement is not None), None)
        if replaced is not None and replaced.strategy != plan_rules.Strategy.NATIVE_FORK:
            return None  # a replacement is given the whole context up to the target (or starts empty)
        assert replaced is None or replaced.replacement is not None
        pt_id = (
            replaced.replacement.id
            if replaced is not None and replaced.replacement
            else thread.active_provider_thread_id
        )
        if pt_id is None:
            return None
        histories = (await switch_facts.histories(db, thread.id)).undoing(plan.rolled_back_run_ordinals)
        histories = histories.without(dropped)
        if replaced is not None and replaced.replacement is not None:
            histories = histories.with_thread(switching.History(replaced.replacement))
        kept = [r.ordinal for r in runs if r.status not in NOT_IN_CONVERSATION and r.ordinal <= op.target]
        seen = switching.seen_runs(pt_id, histories)
        missed = plan_rules.lost_runs(kept, seen)
        if not missed:
            return None
        facts_of = await handoff_facts.read_run_facts(db, thread.id, missed)
        history = histories.threads.get(pt_id)
        kind = (
            handoff_rules.rebridge_kind(history.provider_thread, seen)
            if history is not None
            else HandoffKind.DELTA_SINCE_TARGET_LAST_SEEN
        )
        built = build_handoff(kind, facts_of, Selection.of(missed))
        came_from = sorted({r.provider_thread_id for r in facts_of if r.provider_thread_id is not None}, key=str)
        return pending_handoff(built, thread.id, came_from, pt_id, self.now, new_id)

    def fact(self, pt: ProviderThread) -> plan_rules.ProviderThreadFact:
        caps = self.caps(pt.provider_instance_id)
        base = None if pt.first_run_ordinal is None else pt.first_run_ordinal - 1
        return plan_rules.ProviderThreadFact(
            pt.id,
            can_rollback=bool(caps and caps.can_rollback_thread),
            can_fork_from_turn=bool(caps and caps.can_fork_from_turn),
            base_ordinal=base,
        )

    def caps(self, instance: str) -> Any:
        driver = self.sessions.drivers.get(instance)
        return None if driver is None else driver.capabilities()

    def forks(self, step: ProviderStep) -> bool:
        caps = self.caps(step.provider_thread.provider_instance_id)
        return bool(caps and caps.can_fork_thread)

    def steps(
        self, plan: plan_rules.RollbackPlan, thread: AppThread, pts: dict[uuid.UUID, ProviderThread]
    ) -> list[ProviderStep]:
        """The provider work on the thread's active provider thread. Retired provider threads (an earlier
        rollback's or replacement's) are never resumed, so their conversations are left as they are. An active
        provider thread the plan does not name but whose starting context covers runs after the target (a fork
        made by an earlier rollback) is discarded too."""
        active = pts.get(thread.active_provider_thread_id) if thread.active_provider_thread_id else None
        if active is None:
            return []
        planned = next((p for p in plan.provider_threads if p.provider_thread_id == active.id), None)
        if planned is None:
            base = None if active.first_run_ordinal is None else active.first_run_ordinal - 1
            covers_later = active.native_thread_ref is not None and (base is None or base > plan.target_ordinal)
            if not covers_later or not plan.rolled_back_run_ordinals:
                return []
            return [ProviderStep(active, plan_rules.Strategy.DISCARD)]
        if planned.strategy == plan_rules.Strategy.UNCHANGED:
            return []
        return [ProviderStep(active, planned.strategy, planned=planned)]

    async def roll_back(
        self,
        thread: AppThread,
        project: Project,
        op: Operation,
        step: ProviderStep,
        progress: Callable[[Operation, str | None], Awaitable[None]],
    ) -> None:
        """Carry out one provider thread's part; `progress` records the operation (the undo fork first)."""
        pt = step.provider_thread
        now = self.now
        fresh = new_provider_thread(thread, pt.provider_instance_id, now, new_id, first_run_ordinal=op.target + 1)
        if step.strategy in (plan_rules.Strategy.REPLACE, plan_rules.Strategy.DISCARD):
            step.replacement = fresh
            if op.target > 0:
                async with self.pipeline.db.read() as db:
                    runs = await handoff_facts.read_run_facts(db, thread.id, range(1, op.target + 1))
                built = build_handoff(HandoffKind.ROLLBACK_CONTEXT, runs, Selection.up_to(op.target))
                step.handoff = pending_handoff(built, thread.id, [pt.id], fresh.id, now, new_id)
            return
        if pt.native_thread_ref is None:
            return
        planned = step.planned
        if planned is None:
            raise StepFailed("provider", "no plan for this provider thread")
        cwd = str(self.workspace_of(thread, project))
        settings = ThreadSettings(cwd=cwd, runtime_mode=thread.runtime_mode, model=thread.model)
        async with self.sessions.using(pt.provider_instance_id, project.id) as session:
            runtime = session.runtime
            ref = pt.native_thread_ref
            if ref not in session.loaded:
                await runtime.resume_thread(ref, settings)
                session.loaded.add(ref)
            if step.strategy == plan_rules.Strategy.NATIVE_FORK:
                forked = await runtime.fork_thread(ref, planned.fork_at_turn_ref)
                session.loaded.add(forked)
                step.replacement = dataclasses.replace(
                    fresh,
                    native_thread_ref=forked,
                    forked_from_provider_thread_id=pt.id,
                    status=ProviderThreadStatus.IDLE,
                    session_id=session.session_id,
                )
            elif step.strategy == plan_rules.Strategy.NATIVE_ROLLBACK:
                if self.forks(step):
                    step.undo_native_ref = await runtime.fork_thread(ref, None)
                    session.loaded.add(step.undo_native_ref)
                    await progress(op, "forked")  # recorded first: after a crash, the undo fork takes it back
                if planned.before_turn_ref is None:
                    raise StepFailed("provider", "no native turn to roll back to")
                await runtime.rollback_thread(ref, planned.before_turn_ref)
                step.rolled_back = True
                await self._read_back(runtime, pt, ref, planned)

    async def _read_back(
        self, runtime: Any, pt: ProviderThread, ref: str, planned: plan_rules.ProviderThreadRollback
    ) -> None:
        """Where the provider can show what its thread holds (Codex's `thread/read`, the scripted agent), check
        that none of the dropped turns is still there; a provider that kept one fails the step (and the undo
        fork takes the conversation back), so the log never says a turn is gone that the agent still holds."""
        caps = self.caps(pt.provider_instance_id)
        if caps is None:
            return
        async with self.pipeline.db.read() as db:
            turns = await entities.where(db, ProviderTurn, t.provider_turns.c.provider_thread_id == pt.id)
        dropped = [turn for turn in turns if turn.ordinal in set(planned.dropped_turn_ordinals)]
        await node_rollback.read_back(runtime, caps, ref, [], dropped)


async def stale_provider_threads(
    db: Reader, thread: AppThread, plan: plan_rules.RollbackPlan, steps: list[ProviderStep]
) -> tuple[ProviderThread, ...]:
    """The open provider threads besides the active one that saw a run this rollback undoes
    (`domain.rollback.stale_provider_threads`)."""
    if not plan.rolled_back_run_ordinals:
        return ()
    histories = await switch_facts.histories(db, thread.id)
    done = (ProviderThreadStatus.CLOSED, ProviderThreadStatus.ERROR)
    seen = {
        pt: switching.seen_runs(pt, histories)
        for pt, h in histories.threads.items()
        if h.provider_thread.status not in done
    }
    handled = [s.provider_thread.id for s in steps]
    if thread.active_provider_thread_id is not None:
        handled.append(thread.active_provider_thread_id)
    stale = plan_rules.stale_provider_threads(seen, plan.rolled_back_run_ordinals, handled)
    return tuple(histories.threads[pt].provider_thread for pt in stale)

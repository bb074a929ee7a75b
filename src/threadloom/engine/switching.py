"""The provider a run goes to (rules in `domain.switching`): continue, return with a delta, or start fresh
with a full summary. Called by `engine.turns` when it prepares a run's turn, inside that transaction."""

from __future__ import annotations

from datetime import datetime

from threadloom.domain import settings_compat, switching
from threadloom.domain.changes import Change, NewId
from threadloom.domain.entities import AppThread, ContextHandoff, ProviderThread, Run
from threadloom.domain.handoffs import DEFAULT_POLICY, ChoiceReason, SwitchPolicy, build_handoff
from threadloom.store import handoff_facts
from threadloom.store import switching as facts
from threadloom.store.db import Reader


async def provider_for_run(
    db: Reader,
    thread: AppThread,
    current: ProviderThread | None,
    run: Run,
    now: datetime,
    new_id: NewId,
    policy: SwitchPolicy = DEFAULT_POLICY,
    in_place: settings_compat.InPlace = settings_compat.NOTHING_IN_PLACE,
) -> tuple[ProviderThread, list[Change], list[ContextHandoff]]:
    """The run's provider thread, the changes that make it active, and the handoff it must get (if any).
    `in_place`: what the run's driver changes on a live provider thread; a model or runtime mode it cannot
    change there gets a new provider thread with a full summary (`domain.settings_compat`)."""
    want = settings_compat.wanted(thread, run)
    continuing = current is not None and switching.continues(current, run)
    if current is not None and continuing and settings_compat.keeps(current, want, in_place):
        kept, recorded_now = settings_compat.recording(current, [], want, now)
        return kept, recorded_now, []
    candidates = await facts.provider_threads_of(db, thread.id, run.provider_instance_id)
    histories = await facts.histories(db, thread.id) if candidates else switching.Histories({})
    earlier = await facts.conversation_before(db, thread.id, run.ordinal)
    target = current if continuing else (candidates[0] if candidates else None)
    plan = settings_compat.replacing(thread, run, target, want, in_place, earlier, now, new_id) or (
        switching.plan_provider(thread, run, candidates, histories, earlier, now, new_id, policy)
    )
    plan = settings_compat.with_recorded(plan, want, now)
    choice = plan.choice
    if choice is None or choice.strategy is None:
        return plan.provider_thread, plan.changes, []
    runs = await handoff_facts.read_run_facts(db, thread.id, sorted(choice.selection.ordinals))
    built = build_handoff(choice.strategy, runs, choice.selection)
    came_from = sorted({r.provider_thread_id for r in runs if r.provider_thread_id is not None}, key=str)
    handoff, recorded = switching.handoff_records(thread, run, plan, built, came_from, now, new_id)
    return plan.provider_thread, [*plan.changes, *recorded], [handoff]


async def replacement_handoff(
    db: Reader, thread: AppThread, run: Run, replacement: ProviderThread, now: datetime, new_id: NewId
) -> list[Change]:
    """A provider thread that could not resume was replaced: the replacement gets a full summary of the
    conversation before `run` (nothing when there was none)."""
    earlier = await facts.conversation_before(db, thread.id, run.ordinal)
    choice = switching.fresh_choice(ChoiceReason.CANNOT_RESUME, earlier)
    if choice.strategy is None:
        return []
    runs = await handoff_facts.read_run_facts(db, thread.id, earlier)
    built = build_handoff(choice.strategy, runs, choice.selection)
    plan = switching.ProviderPlan(replacement, [], choice)
    came_from = sorted({r.provider_thread_id for r in runs if r.provider_thread_id is not None}, key=str)
    _, recorded = switching.handoff_records(thread, run, plan, built, came_from, now, new_id)
    return recorded

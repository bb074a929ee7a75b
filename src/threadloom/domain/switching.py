"""Provider switching: which provider thread a run goes to, and what it must be told.

A run carries its provider instance. When that is the instance of the thread's active provider
thread (and the user did not ask for a fresh context), the run simply continues there. Otherwise
`plan_provider` applies `handoffs.choose_strategy`: a provider seen before resumes its own provider
thread and gets a `DELTA_SINCE_TARGET_LAST_SEEN` handoff of exactly the runs it missed; a provider
seen for the first time, a `freshContext` run, a provider thread that cannot resume, or one too far
behind gets a new provider thread and a `FULL_THREAD_SUMMARY` of the conversation so far.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime

from threadloom.domain import lineage
from threadloom.domain.changes import Change, NewId
from threadloom.domain.dispatch import AppliedDispatch, Dispatch, DispatchMode
from threadloom.domain.entities import AppThread, ContextHandoff, ContextTransfer, ProviderThread, Run
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.handoffs import (
    DEFAULT_POLICY,
    ChoiceReason,
    Handoff,
    StrategyChoice,
    SwitchPolicy,
    TargetThread,
    choose_strategy,
    pending_handoff,
)
from threadloom.domain.statuses import (
    HandoffStrategy,
    ProviderThreadStatus,
    TransferStatus,
    TransferType,
)
from threadloom.domain.threads import attach_provider_thread


def switched(thread: AppThread, instance: str, model: str | None, known: Iterable[str], now: datetime) -> AppThread:
    """The thread moved to another provider instance: later runs go there too. The model is the one asked
    for, else the provider's default (a model name of one provider means nothing to another)."""
    if instance not in set(known):
        raise DomainError(ErrorCode.UNKNOWN_PROVIDER_INSTANCE, "no such provider instance", "providerInstanceId")
    return thread.evolve(provider_instance_id=instance, model=model, updated_at=now)


def switch(
    thread: AppThread, instance: str, model: str | None, known: Iterable[str], now: datetime, new_id: NewId
) -> tuple[AppThread, list[Change]]:
    """`switched`, with the `lineage.provider_switched` activity saying from what to what (none if unchanged)."""
    after = switched(thread, instance, model, known, now)
    said = lineage.provider_switched(thread, after, now, new_id)
    return after, [Change.updated(after), *([said] if said is not None else [])]


def dispatch_across(applied: AppliedDispatch, dispatch: Dispatch) -> AppliedDispatch:
    """A message for another provider cannot join the active run: `auto` queues it after the active run, an
    explicit steer or restart is refused (`PROVIDER_SWITCH_UNAVAILABLE`)."""
    if applied not in (AppliedDispatch.STEER_ACTIVE, AppliedDispatch.RESTART_ACTIVE):
        return applied
    if dispatch.mode in (DispatchMode.STEER_ACTIVE, DispatchMode.RESTART_ACTIVE):
        raise DomainError(
            ErrorCode.PROVIDER_SWITCH_UNAVAILABLE,
            "a message for another provider cannot steer or restart the active run; queue it instead",
            "providerInstanceId",
        )
    return AppliedDispatch.QUEUE_AFTER_ACTIVE


@dataclasses.dataclass(frozen=True, slots=True)
class ProviderPlan:
    """The provider thread a run goes to, the changes that make it the thread's active one, and the choice."""

    provider_thread: ProviderThread
    changes: list[Change]
    choice: StrategyChoice | None = None  # None: the run continues on the active provider thread


def continues(current: ProviderThread | None, run: Run) -> bool:
    """The run goes on where the thread is: same provider instance, no fresh context asked."""
    return current is not None and current.provider_instance_id == run.provider_instance_id and not run.fresh_context


def target_facts(pt: ProviderThread, delivered: Sequence[ContextHandoff]) -> TargetThread:
    """What a provider thread holds: its own runs and the runs handed to it, and delta handoffs since a full one."""
    covered = [int(o) for h in delivered for o in (h.covered_run_ordinals or [])]
    first = pt.first_run_ordinal
    last_seen = max([pt.last_run_ordinal or 0, *covered, (first - 1) if first else 0])
    received = 0
    for handoff in sorted(delivered, key=lambda h: (h.created_at, str(h.id))):
        received = 0 if handoff.strategy == HandoffStrategy.FULL_THREAD_SUMMARY else received + 1
    resumable = pt.status not in (ProviderThreadStatus.ERROR, ProviderThreadStatus.CLOSED)
    return TargetThread(pt.id, last_seen, resumable=resumable, handoffs_received=received)


def plan_provider(
    thread: AppThread,
    run: Run,
    candidates: Sequence[ProviderThread],
    delivered: Sequence[ContextHandoff],
    earlier: Iterable[int],
    now: datetime,
    new_id: NewId,
    policy: SwitchPolicy = DEFAULT_POLICY,
) -> ProviderPlan:
    """Where `run` goes when it does not simply continue (see `continues`).

    `candidates`: the thread's provider threads of the run's instance, newest first (the newest is the one a
    return resumes); `delivered`: the handoffs delivered to that newest one; `earlier`: the ordinals of the
    thread's earlier runs that are part of its conversation.
    """
    target = candidates[0] if candidates else None
    facts = None if target is None else target_facts(target, delivered)
    choice = choose_strategy(
        conversation_run_ordinals=earlier, target=facts, fresh_context=run.fresh_context, policy=policy
    )
    if not choice.new_provider_thread and target is not None:
        pt = target
        changes = [Change.updated(thread.evolve(active_provider_thread_id=pt.id, updated_at=now))]
        return ProviderPlan(pt, changes, choice)
    pt, changes = attach_provider_thread(thread, None, run.provider_instance_id, now, new_id)
    return ProviderPlan(pt, changes, choice)


def fresh_choice(reason: ChoiceReason, earlier: Sequence[int]) -> StrategyChoice:
    """A new provider thread for `reason`: a full summary of the earlier runs (none when there are none)."""
    return (
        choose_strategy(conversation_run_ordinals=earlier, target=None)
        if reason == ChoiceReason.FIRST_TIME
        else (dataclasses.replace(choose_strategy(conversation_run_ordinals=earlier, target=None), reason=reason))
    )


def handoff_records(
    thread: AppThread,
    run: Run,
    plan: ProviderPlan,
    built: Handoff,
    came_from: Sequence[uuid.UUID],
    now: datetime,
    new_id: NewId,
) -> tuple[ContextHandoff, list[Change]]:
    """The PROVIDER_HANDOFF transfer (consumed by `run`) and its handoff for the plan's provider thread."""
    transfer = ContextTransfer(
        id=new_id(),
        type=TransferType.PROVIDER_HANDOFF,
        source_thread_id=thread.id,
        thread_id=thread.id,
        source_point={
            "reason": plan.choice.reason.value if plan.choice else ChoiceReason.FIRST_TIME.value,
            "providerInstanceId": run.provider_instance_id,
            "coveredRunOrdinals": list(built.covered_run_ordinals),
            "omittedRunOrdinals": list(built.omitted_run_ordinals),
        },
        status=TransferStatus.CONSUMED,
        resolution_strategy=built.strategy.value,
        resolution_fidelity="summary",
        target_run_id=run.id,
        created_at=now,
        updated_at=now,
    )
    to = plan.provider_thread.id
    handoff = pending_handoff(built, thread.id, came_from, to, now, new_id, transfer_id=transfer.id)
    return handoff, [Change.created(transfer), Change.created(handoff)]

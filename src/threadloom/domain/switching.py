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
from collections.abc import Iterable, Mapping, Sequence
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
    HandoffStatus,
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


@dataclasses.dataclass(frozen=True, slots=True)
class History:
    """What one provider thread was given: the app runs it ran a turn of, and the handoffs to it (delivered,
    or pending: those go with its next turn). `carried_by`: for a delivered handoff, the ordinal of the run
    whose first turn carried it (the handoff is part of the conversation from that turn on)."""

    provider_thread: ProviderThread
    ran: frozenset[int] = frozenset()
    handoffs: tuple[ContextHandoff, ...] = ()
    carried_by: Mapping[uuid.UUID, int] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class Histories:
    """The thread's provider threads' `History`s, and its rolled-back runs: a turn of an undone run is gone
    from every provider thread still open (rolled back natively, or the thread was retired or replaced), and
    so is a handoff that such a turn carried, with the kept runs it told of."""

    threads: Mapping[uuid.UUID, History]
    rolled_back: frozenset[int] = frozenset()

    def undoing(self, runs: Iterable[int]) -> Histories:
        """As they will be once `runs` are rolled back too."""
        return dataclasses.replace(self, rolled_back=self.rolled_back | frozenset(runs))

    def with_thread(self, history: History) -> Histories:
        return dataclasses.replace(self, threads={**self.threads, history.provider_thread.id: history})

    def without(self, handoff_ids: Iterable[uuid.UUID]) -> Histories:
        """As they will be once these (pending) handoffs are dropped: no provider thread is told of them."""
        gone = set(handoff_ids)
        if not gone:
            return self
        threads = {
            pt: dataclasses.replace(h, handoffs=tuple(x for x in h.handoffs if x.id not in gone))
            for pt, h in self.threads.items()
        }
        return dataclasses.replace(self, threads=threads)


def told(handoff: ContextHandoff) -> set[int]:
    """The runs a handoff accounts for: the ones in its text and the ones it listed as left out for length."""
    return {int(o) for field in (handoff.covered_run_ordinals, handoff.omitted_run_ordinals) for o in (field or [])}


def seen_runs(provider_thread_id: uuid.UUID, histories: Histories) -> frozenset[int]:
    """The app runs a provider thread holds or was told of.

    Its own runs and those its handoffs told of, less what an undone run's turn carried. A native fork (a
    rollback's, at the last kept turn) holds what its source held before the fork's first run: the source's
    runs before it, and the handoffs carried by those runs; the chain is followed through `histories`."""
    seen: set[int] = set()
    current: uuid.UUID | None = provider_thread_id
    before: int | None = None  # a fork holds only what its source held before the fork's first run
    visited: set[uuid.UUID] = set()
    gone = histories.rolled_back
    while current is not None and current not in visited and (history := histories.threads.get(current)) is not None:
        visited.add(current)
        pt = history.provider_thread
        for handoff in history.handoffs:
            carrier = history.carried_by.get(handoff.id)
            if carrier in gone or (before is not None and (carrier is None or carrier >= before)):
                continue  # dropped with its turn, or not in the fork's part of the conversation
            seen |= told(handoff)
        seen |= {o for o in history.ran if before is None or o < before}
        if pt.first_run_ordinal is not None:
            before = pt.first_run_ordinal if before is None else min(before, pt.first_run_ordinal)
        current = pt.forked_from_provider_thread_id
    return frozenset(seen)


def target_facts(pt: ProviderThread, histories: Histories) -> TargetThread:
    """What a provider thread holds (`seen_runs`), and how many delta handoffs it got since its last full one."""
    history = histories.threads.get(pt.id, History(pt))
    delivered = [h for h in history.handoffs if h.status == HandoffStatus.DELIVERED]
    received = 0
    for handoff in sorted(delivered, key=lambda h: (h.created_at, str(h.id))):
        received = 0 if handoff.strategy == HandoffStrategy.FULL_THREAD_SUMMARY else received + 1
    resumable = pt.status not in (ProviderThreadStatus.ERROR, ProviderThreadStatus.CLOSED)
    return TargetThread(pt.id, seen_runs(pt.id, histories), resumable=resumable, handoffs_received=received)


def plan_provider(
    thread: AppThread,
    run: Run,
    candidates: Sequence[ProviderThread],
    histories: Histories,
    earlier: Iterable[int],
    now: datetime,
    new_id: NewId,
    policy: SwitchPolicy = DEFAULT_POLICY,
) -> ProviderPlan:
    """Where `run` goes when it does not simply continue (see `continues`).

    `candidates`: the thread's provider threads of the run's instance, newest first (the newest is the one a
    return resumes); `histories`: what the thread's provider threads were given (`History`, for `seen_runs`);
    `earlier`: the ordinals of the thread's earlier runs that are part of its conversation.
    """
    target = candidates[0] if candidates else None
    facts = None if target is None else target_facts(target, histories)
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

"""Lineage activities: the line a person reads when a thread's conversation is forked, merged back, moved to
another provider or handed to a run.

Each rule here builds the one activity its operation writes, in the same command as the change it reports
(so it is in the log and replays with it). Rollbacks (`rollback.*`, engine/rollback.py) and retries
(`run.retried`, domain/retries.py) write their own activities where they are decided.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, NewId
from threadloom.domain.entities import AppThread, ContextHandoff, ContextTransfer, Run
from threadloom.domain.handoffs import ranges
from threadloom.domain.statuses import HandoffStrategy, TransferType


def forked(
    fork: AppThread,
    source: AppThread,
    transfer: ContextTransfer,
    run_ordinal: int,
    run_id: uuid.UUID | None,
    now: datetime,
    new_id: NewId,
) -> Change:
    """On the fork: which thread it came from and at which run (its run: the source's run at the fork point)."""
    where = f"at run {run_ordinal}" if run_ordinal > 0 else "before its first run"
    return activity(
        fork.id,
        ActivityKind.LINEAGE_FORKED,
        f'forked from "{source.title}" {where}',
        now,
        new_id,
        run_id=run_id,
        payload={"sourceThreadId": str(source.id), "runOrdinal": run_ordinal, "transferId": str(transfer.id)},
    )


def merged_back(
    fork: AppThread,
    merge: ContextTransfer,
    since: int,
    upto: int,
    run_id: uuid.UUID | None,
    now: datetime,
    new_id: NewId,
) -> Change:
    """On the fork's source: which of the fork's runs (after `since`, up to `upto`) its next run will be told;
    its run (`run_id`): the fork's latest run merged."""
    runs = ranges(range(since + 1, upto + 1))
    label = "run" if since + 1 == upto else "runs"
    return activity(
        merge.thread_id,
        ActivityKind.LINEAGE_MERGED_BACK,
        f'merge-back from fork "{fork.title}": {label} {runs}, for the next run',
        now,
        new_id,
        run_id=run_id,
        payload={
            "sourceThreadId": str(fork.id),
            "transferId": str(merge.id),
            "fromOrdinal": since + 1,
            "toOrdinal": upto,
        },
    )


def provider_switched(before: AppThread, after: AppThread, now: datetime, new_id: NewId) -> Change | None:
    """The thread's later runs go to another provider (or model): from → to. None when nothing changed."""
    if (before.provider_instance_id, before.model) == (after.provider_instance_id, after.model):
        return None
    old = _label(before.provider_instance_id, before.model)
    new = _label(after.provider_instance_id, after.model)
    return activity(
        after.id,
        ActivityKind.LINEAGE_PROVIDER_SWITCHED,
        f"provider switched from {old} to {new}",
        now,
        new_id,
        payload={
            "fromProviderInstanceId": before.provider_instance_id,
            "fromModel": before.model,
            "toProviderInstanceId": after.provider_instance_id,
            "toModel": after.model,
        },
    )


def _label(instance: str, model: str | None) -> str:
    return instance if not model else f"{instance} ({model})"


_STRATEGY = {
    HandoffStrategy.FULL_THREAD_SUMMARY: "a summary of the conversation",
    HandoffStrategy.DELTA_SINCE_TARGET_LAST_SEEN: "the runs its provider had not seen",
}
_TRANSFER = {
    TransferType.FORK: "the conversation it was forked from",
    TransferType.MERGE_BACK: "a fork's merge-back",
}


def handoff_delivered(
    handoff: ContextHandoff, run: Run, transfer: TransferType | None, now: datetime, new_id: NewId
) -> Change:
    """The handoff went out with `run`'s first turn: what it carried (`transfer`: the type of the transfer it
    belongs to; none for a rollback's), on the run and its root node."""
    covered = [int(o) for o in (handoff.covered_run_ordinals or [])]
    if transfer in _TRANSFER:
        what = _TRANSFER[transfer]
    elif transfer is None:
        what = "the conversation up to a rollback"
    else:
        what = _STRATEGY.get(handoff.strategy, handoff.strategy.value)
    whose = "the fork's " if transfer == TransferType.MERGE_BACK else ""
    runs = f" ({whose}{'run' if len(covered) == 1 else 'runs'} {ranges(covered)})" if covered else ""
    return activity(
        run.thread_id,
        ActivityKind.LINEAGE_HANDOFF_DELIVERED,
        f"run {run.ordinal} was given {what}{runs}",
        now,
        new_id,
        run_id=run.id,
        node_id=run.root_node_id,
        payload={
            "handoffId": str(handoff.id),
            "transferId": None if handoff.transfer_id is None else str(handoff.transfer_id),
            "strategy": handoff.strategy.value,
            "coveredRunOrdinals": covered,
            "tokenEstimate": handoff.token_estimate,
        },
    )

"""A rollback as a durable operation: what is recorded before and after each step, and what a crash leaves.

`rollbackToRun` commits its plan first (the thread then reads ROLLING_BACK), runs its steps (capture,
provider, files) outside any transaction, each recorded as it completes, and records the outcome last. A
process killed anywhere in between leaves the record; the next process to start (or a surviving replica)
reads it and either carries the operation on or takes back what it did (`resume_action`), so that files,
conversation and log agree. Pure: the record is a plain dict (the `rollback.started` activity's payload).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from enum import StrEnum
from typing import Any

from threadloom.domain.entities import AppThread
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.rollback import ProviderThreadRollback, RollbackPlan, Strategy

# What a client may still do to a thread while a rollback is carried out: nothing that changes its
# conversation, runs or files (those are refused with THREAD_ROLLING_BACK until the rollback is over).
ALLOWED_WHILE_ROLLING_BACK = frozenset({"renameThread", "archiveThread", "unarchiveThread", "stopThread"})


def refuse_while_rolling_back(thread: AppThread, command_type: str) -> None:
    """A client's command on a thread whose rollback is under way is refused, unless it cannot interfere."""
    if thread.rollback_operation_id is not None and command_type not in ALLOWED_WHILE_ROLLING_BACK:
        raise DomainError(
            ErrorCode.THREAD_ROLLING_BACK,
            "a rollback of this thread is being carried out; try again when the thread is no longer ROLLING_BACK",
            "threadId",
        )


class StepStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"  # started, not known to be over (after a crash: in doubt)
    DONE = "done"
    SKIPPED = "skipped"
    FAILED = "failed"
    UNDONE = "undone"


class Resume(StrEnum):
    ROLL_FORWARD = "roll_forward"  # carry on from the first step not done: every step can run again
    COMPENSATE = "compensate"  # take back what was done: a provider rollback in place may or may not have run


def resume_action(providers: Sequence[Mapping[str, Any]]) -> Resume:
    """What the process that finds an abandoned operation does.

    Every step is safe to run again except an in-place provider rollback: repeating it after it ran would drop
    more turns. When one was started and not recorded as done but its undo fork was made first, the operation
    is compensated (the undo fork holds the conversation as it was, the files go back to the pre-rollback
    capture). Without an undo fork the in-place rollback runs last, after the files: carried on, a provider
    that finds the turn already gone fails the step, and the ordinary failure path reports it."""
    for step in providers:
        in_doubt = step.get("status") == StepStatus.RUNNING and step.get("strategy") == Strategy.NATIVE_ROLLBACK
        if in_doubt and step.get("undoNativeRef"):
            return Resume.COMPENSATE
    return Resume.ROLL_FORWARD


def plan_record(plan: RollbackPlan) -> dict[str, Any]:
    return {
        "targetOrdinal": plan.target_ordinal,
        "rolledBackRunOrdinals": list(plan.rolled_back_run_ordinals),
        "providerThreads": [provider_record(p) for p in plan.provider_threads],
        "staleCheckpointIds": [str(c) for c in plan.stale_checkpoint_ids],
        "restoreCheckpointId": str(plan.restore_checkpoint_id) if plan.restore_checkpoint_id else None,
    }


def plan_from(record: Mapping[str, Any]) -> RollbackPlan:
    restore = record.get("restoreCheckpointId")
    return RollbackPlan(
        int(record["targetOrdinal"]),
        tuple(int(o) for o in record.get("rolledBackRunOrdinals") or ()),
        tuple(provider_from(p) for p in record.get("providerThreads") or ()),
        tuple(uuid.UUID(c) for c in record.get("staleCheckpointIds") or ()),
        uuid.UUID(restore) if restore else None,
    )


def provider_record(p: ProviderThreadRollback) -> dict[str, Any]:
    return {
        "providerThreadId": str(p.provider_thread_id),
        "strategy": p.strategy.value,
        "droppedTurnOrdinals": list(p.dropped_turn_ordinals),
        "beforeTurnRef": p.before_turn_ref,
        "turnCount": p.turn_count,
        "forkAtTurnRef": p.fork_at_turn_ref,
    }


def provider_from(record: Mapping[str, Any]) -> ProviderThreadRollback:
    return ProviderThreadRollback(
        uuid.UUID(record["providerThreadId"]),
        Strategy(record["strategy"]),
        tuple(int(o) for o in record.get("droppedTurnOrdinals") or ()),
        before_turn_ref=record.get("beforeTurnRef"),
        turn_count=int(record.get("turnCount") or 0),
        fork_at_turn_ref=record.get("forkAtTurnRef"),
    )


def files_touched(steps: Mapping[str, str]) -> bool:
    """Whether the file restore may have started: from then on, taking the operation back restores the
    pre-rollback capture (before it, the workspace was never touched and is left alone)."""
    return steps.get("files") in (StepStatus.RUNNING, StepStatus.DONE, StepStatus.FAILED)


def abandoned(records: Iterable[Mapping[str, Any]], alive: set[uuid.UUID], me: uuid.UUID) -> list[Mapping[str, Any]]:
    """Operations under way whose process is gone (not alive, and not this one)."""
    found = []
    for record in records:
        owner = record.get("workerId")
        owner_id = uuid.UUID(owner) if owner else None
        if owner_id is None or (owner_id != me and owner_id not in alive):
            found.append(record)
    return found

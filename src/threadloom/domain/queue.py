"""Managing queued runs: cancel, reorder, edit, promote to a steer (docs/lifecycles/steering-and-queue.md)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import AppThread, ConversationMessage, ExecutionNode, Run, RunAttempt
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.runs import NewId, activity, clean_text
from threadloom.domain.statuses import AttemptStatus, NodeStatus, RunStatus


def require_queued(run: Run) -> None:
    if run.status != RunStatus.QUEUED:
        raise DomainError(ErrorCode.RUN_NOT_QUEUED, f"run {run.ordinal} is {run.status}, not queued", "runId")


def renumber(queue: Sequence[Run]) -> list[Change]:
    """Positions 1..n in the given order, writing only the runs whose position changes."""
    return [
        Change("run.updated", run.evolve(queue_position=position))
        for position, run in enumerate(queue, start=1)
        if run.queue_position != position
    ]


def cancel(
    thread: AppThread,
    queue: Sequence[Run],
    run: Run,
    attempt: RunAttempt,
    root: ExecutionNode,
    now: datetime,
    new_id: NewId,
    *,
    reason: str = "cancelled by the user",
) -> Outcome:
    require_queued(run)
    rest = [r for r in queue if r.id != run.id]
    return Outcome(
        [
            Change("node.updated", root.evolve(status=NodeStatus.CANCELLED, updated_at=now, completed_at=now)),
            Change("attempt.updated", attempt.evolve(status=AttemptStatus.CANCELLED, completed_at=now)),
            Change(
                "run.updated",
                run.evolve(status=RunStatus.CANCELLED, status_reason=reason, queue_position=None, completed_at=now),
            ),
            *renumber(rest),
            activity(thread.id, "run.cancelled", f"run {run.ordinal}: {reason}", now, new_id, run_id=run.id),
        ],
        result={"runId": str(run.id)},
    )


def reorder(thread: AppThread, queue: Sequence[Run], run: Run, position: int, now: datetime, new_id: NewId) -> Outcome:
    require_queued(run)
    if not 1 <= position <= len(queue):
        raise DomainError(ErrorCode.INVALID_INPUT, f"position must be between 1 and {len(queue)}", "position")
    rest = [r for r in queue if r.id != run.id]
    rest.insert(position - 1, run)
    return Outcome(
        [
            *renumber(rest),
            activity(
                thread.id,
                "queue.reordered",
                f"run {run.ordinal} moved to position {position}",
                now,
                new_id,
                run_id=run.id,
            ),
        ],
        result={"runId": str(run.id)},
    )


def edit(thread: AppThread, run: Run, message: ConversationMessage, text: str, now: datetime, new_id: NewId) -> Outcome:
    require_queued(run)
    updated = message.evolve(text=clean_text(text), updated_at=now)
    return Outcome(
        [
            Change("message.updated", updated),
            activity(thread.id, "queue.edited", f"run {run.ordinal} edited", now, new_id, run_id=run.id),
        ],
        result={"runId": str(run.id)},
    )

"""The queue of runs waiting for a thread (docs/lifecycles/steering-and-queue.md): how the first one
starts (`start_run`, `drain_queue`), holding and resuming, and managing queued runs (cancel, reorder,
edit; promoting one to a steer composes these with `domain.dispatch`)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from threadloom.domain.activities import ActivityKind, activity, run_activity
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.effects import StartTurn
from threadloom.domain.entities import AppThread, ConversationMessage, ExecutionNode, Run, RunAttempt
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import AttemptStatus, NodeStatus, RunStatus
from threadloom.domain.threads import ThreadState, clean_text


def require_queued(run: Run) -> None:
    if run.status != RunStatus.QUEUED:
        raise DomainError(ErrorCode.RUN_NOT_QUEUED, f"run {run.ordinal} is {run.status}, not queued", "runId")


def order_key(queue: Sequence[Run], *, first: bool = False) -> int:
    """The order key of a run joining `queue` last (or first): after the last key (before the first)."""
    if not queue:
        return 1
    if first:
        return (queue[0].queue_position or 1) - 1
    return (queue[-1].queue_position or 0) + 1


def renumber(queue: Sequence[Run]) -> list[Change]:
    """Order keys 1..n in the given order, writing only the runs whose key changes.

    `queue_position` is the queue's order key, not the place a client sees (`Run.queuePosition` is
    counted when read): a run leaving the queue rewrites no other run, only a reorder does."""
    return [
        Change.updated(run.evolve(queue_position=position))
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
    return Outcome(
        [
            Change.updated(root.evolve(status=NodeStatus.CANCELLED, updated_at=now, completed_at=now)),
            Change.updated(attempt.evolve(status=AttemptStatus.CANCELLED, completed_at=now)),
            Change.updated(
                run.evolve(status=RunStatus.CANCELLED, status_reason=reason, queue_position=None, completed_at=now),
            ),
            run_activity(run, ActivityKind.RUN_CANCELLED, f"run {run.ordinal}: {reason}", now, new_id),
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
            run_activity(
                run,
                ActivityKind.QUEUE_REORDERED,
                f"run {run.ordinal} moved to position {position}",
                now,
                new_id,
            ),
        ],
        result={"runId": str(run.id)},
    )


def edit(thread: AppThread, run: Run, message: ConversationMessage, text: str, now: datetime, new_id: NewId) -> Outcome:
    require_queued(run)
    updated = message.evolve(text=clean_text(text), updated_at=now)
    return Outcome(
        [
            Change.updated(updated),
            run_activity(run, ActivityKind.QUEUE_EDITED, f"run {run.ordinal} edited", now, new_id),
        ],
        result={"runId": str(run.id)},
    )


def start_run(outcome: Outcome, thread: AppThread, run: Run, now: datetime, new_id: NewId) -> None:
    """Make `run` the thread's active run and ask the outbox to start its provider turn."""
    started = run.evolve(status=RunStatus.PREPARING, queue_position=None)
    outcome.changes.append(Change.updated(started))
    outcome.changes.append(Change.updated(thread.evolve(active_run_id=run.id, updated_at=now)))
    outcome.changes.append(
        run_activity(
            run,
            ActivityKind.RUN_PREPARING,
            f"run {run.ordinal} is starting",
            now,
            new_id,
            node_id=run.root_node_id,
        )
    )
    start = StartTurn(run_id=run.id, attempt_id=run.active_attempt_id, thread_id=run.thread_id)
    outcome.effects.append(start.envelope())


def drain_queue(thread: AppThread, queue: Sequence[Run], now: datetime, new_id: NewId) -> Outcome:
    """When nothing runs: start the first queued run unless the queue is held (the rest keep their
    order keys: their places move up without an event each)."""
    outcome = Outcome()
    if thread.queue_held or thread.active_run_id is not None or not queue:
        return outcome
    start_run(outcome, thread, queue[0], now, new_id)
    return outcome


def resume_queue(state: ThreadState, now: datetime, new_id: NewId) -> Outcome:
    thread = state.thread
    if not thread.queue_held:
        raise DomainError(ErrorCode.QUEUE_NOT_HELD, "the queue is not held", "threadId")
    released = thread.evolve(queue_held=False, queue_hold_reason=None, updated_at=now)
    outcome = Outcome(
        [Change.updated(released), activity(thread.id, ActivityKind.QUEUE_RESUMED, "queue resumed", now, new_id)]
    )
    drained = drain_queue(released, state.queue, now, new_id)
    outcome.changes += drained.changes
    outcome.effects += drained.effects
    return outcome

"""Activities: the thread's history for people (what the UI lists), one row per thing that happened.

`ActivityKind` is the public list of kinds (docs/activities.md says what each means); every activity is
built by `activity()` with one of them. A kind is not an event type: `plan.updated` is both, the
activity summarizing a todo list's progress for people and the event carrying the plan's new state.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

from threadloom.domain.changes import Change, EventVerb, NewId
from threadloom.domain.entities import Activity, Run
from threadloom.domain.statuses import RunStatus


class ActivityKind(StrEnum):
    # runs
    RUN_QUEUED = "run.queued"
    RUN_PREPARING = "run.preparing"
    RUN_STARTED = "run.started"
    RUN_STEERED = "run.steered"
    RUN_RESTARTED = "run.restarted"
    RUN_RETRIED = "run.retried"
    RUN_WOKEN = "run.woken"
    RUN_INTERRUPT_REQUESTED = "run.interrupt_requested"
    RUN_INTERRUPT_UNSUPPORTED = "run.interrupt_unsupported"
    RUN_COMPLETED = "run.completed"
    RUN_INTERRUPTED = "run.interrupted"
    RUN_FAILED = "run.failed"
    RUN_CANCELLED = "run.cancelled"
    STEER_BECAME_RUN = "steer.became_run"
    CHECKPOINT_SKIPPED = "checkpoint.skipped"
    CHECKPOINT_CAPTURED = "checkpoint.captured"
    CHECKPOINT_FAILED = "checkpoint.failed"
    RUNTIME_WARNING = "runtime.warning"
    # rollback (engine/rollback.py)
    ROLLBACK_STARTED = "rollback.started"
    ROLLBACK_COMPLETED = "rollback.completed"
    ROLLBACK_FAILED = "rollback.failed"
    ROLLBACK_UNDONE = "rollback.undone"
    # lineage (domain/lineage.py): where a thread's conversation came from and went
    LINEAGE_FORKED = "lineage.forked"
    LINEAGE_MERGED_BACK = "lineage.merged_back"
    LINEAGE_PROVIDER_SWITCHED = "lineage.provider_switched"
    LINEAGE_HANDOFF_DELIVERED = "lineage.handoff_delivered"
    LINEAGE_PROVIDER_THREAD_REPLACED = "lineage.provider_thread_replaced"  # settings it cannot change live
    # the queue
    QUEUE_HELD = "queue.held"
    BUDGET_EXCEEDED = "budget.exceeded"
    QUEUE_RESUMED = "queue.resumed"
    QUEUE_REORDERED = "queue.reordered"
    QUEUE_EDITED = "queue.edited"
    # the agent's work inside a turn
    TOOL_STARTED = "tool.started"
    TOOL_COMPLETED = "tool.completed"
    FILE_CHANGED = "file.changed"
    PLAN_UPDATED = "plan.updated"
    # approvals and questions
    APPROVAL_REQUESTED = "approval.requested"
    APPROVAL_RESOLVED = "approval.resolved"
    QUESTION_ASKED = "question.asked"
    QUESTION_ANSWERED = "question.answered"
    # delegated tasks
    SUBAGENT_STARTED = "subagent.started"
    SUBAGENT_COMPLETED = "subagent.completed"
    # webhooks (engine/webhooks.py): on the thread whose delivery was the last to fail
    WEBHOOK_ENDPOINT_DISABLED = "webhook.endpoint_disabled"
    # the writer lease (domain/leases.py)
    LEASE_ACQUIRED = "lease.acquired"
    LEASE_TAKEN_OVER = "lease.taken_over"
    LEASE_RELEASED = "lease.released"


_RUN_ENDED = {
    RunStatus.COMPLETED: ActivityKind.RUN_COMPLETED,
    RunStatus.INTERRUPTED: ActivityKind.RUN_INTERRUPTED,
    RunStatus.FAILED: ActivityKind.RUN_FAILED,
    RunStatus.CANCELLED: ActivityKind.RUN_CANCELLED,
}


def run_ended(status: RunStatus) -> ActivityKind:
    """The activity of a run ending in `status` (a terminal status)."""
    return _RUN_ENDED[status]


def activity(
    thread_id: uuid.UUID,
    kind: ActivityKind,
    summary: str,
    now: datetime,
    new_id: NewId,
    *,
    run_id: uuid.UUID | None = None,
    node_id: uuid.UUID | None = None,
    payload: dict[str, Any] | None = None,
) -> Change:
    """An activity for the UI; its sequence is assigned when the event is appended."""
    entity = Activity(
        id=new_id(),
        thread_id=thread_id,
        sequence=0,
        kind=kind,
        run_id=run_id,
        node_id=node_id,
        summary=summary,
        payload=payload,
        created_at=now,
    )
    return Change.of(EventVerb.RECORDED, entity, run_id=run_id, node_id=node_id)


def run_activity(
    run: Run,
    kind: ActivityKind,
    summary: str,
    now: datetime,
    new_id: NewId,
    *,
    node_id: uuid.UUID | None = None,
    payload: dict[str, Any] | None = None,
) -> Change:
    """An activity about `run`, in the run's own thread."""
    return activity(run.thread_id, kind, summary, now, new_id, run_id=run.id, node_id=node_id, payload=payload)

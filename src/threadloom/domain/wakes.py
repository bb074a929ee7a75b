"""Waking an idle parent with a delegated task's result (docs/lifecycles/delegation.md, "A task owes a wake").

The wake is a run like a user's, started at once on the parent, but Threadloom's: its message is a system
message saying which task ended, its first attempt's reason is `WAKE`, and the task's result goes to the agent
as the context of that turn (the pending handoff `domain.delegation.deliver` recorded), not in the message.
Whether a result wakes its parent at all is `domain.delegation.wake_for`. Pure.
"""

from __future__ import annotations

from datetime import datetime

from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.dispatch import open_attempt
from threadloom.domain.entities import AppThread, ContextTransfer, ConversationMessage, Run
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.nodes import Place
from threadloom.domain.queue import start_run
from threadloom.domain.statuses import AttemptReason, InputIntent, MessageRole, RunStatus


def wake_message(title: str, status: RunStatus) -> str:
    """The wake run's message: what happened, and where the result is (the turn's context)."""
    return f"Delegated task {title!r} ended ({status.value}); its result is in the context of this turn."


def wake_run(
    parent: AppThread,
    last_ordinal: int,
    transfer: ContextTransfer,
    child_title: str,
    child_status: RunStatus,
    now: datetime,
    new_id: NewId,
) -> Outcome:
    """A new run on the idle parent, started now: a system message, the run, its root node and a `WAKE`
    attempt, the transfer pointing at it (`targetRun`), a `run.woken` activity naming the task."""
    if parent.active_run_id is not None or parent.queue_held:
        raise DomainError(ErrorCode.THREAD_BUSY, "only an idle parent is woken", "threadId")
    run_id, node_id, attempt_id, message_id = new_id(), new_id(), new_id(), new_id()
    text = wake_message(child_title, child_status)
    message = ConversationMessage(
        id=message_id,
        thread_id=parent.id,
        run_id=run_id,
        role=MessageRole.SYSTEM,
        text=text,
        input_intent=InputIntent.TURN_START,
        created_at=now,
        updated_at=now,
    )
    run = Run(
        id=run_id,
        thread_id=parent.id,
        ordinal=last_ordinal + 1,
        provider_instance_id=parent.provider_instance_id,
        model=parent.model,
        status=RunStatus.QUEUED,
        user_message_id=message_id,
        root_node_id=node_id,
        active_attempt_id=attempt_id,
        requested_at=now,
    )
    place = Place(parent.id, run_id, attempt_id, node_id)
    title = f"woken by task {child_title!r}"[:80]
    root, attempt = open_attempt(place, 1, AttemptReason.WAKE, parent.active_provider_thread_id, title, now)
    outcome = Outcome(
        [
            Change.created(message),
            Change.created(run),
            Change.created(root),
            Change.created(attempt),
            Change.updated(transfer.evolve(target_run_id=run_id, updated_at=now)),
            activity(
                parent.id,
                ActivityKind.RUN_WOKEN,
                f"run {run.ordinal} woken by delegated task {child_title!r} ({child_status.value})",
                now,
                new_id,
                run_id=run_id,
                node_id=node_id,
                payload={"childThreadId": str(transfer.source_thread_id), "transferId": str(transfer.id)},
            ),
        ],
        result={"runId": str(run_id)},
    )
    start_run(outcome, parent, run, now, new_id)
    return outcome

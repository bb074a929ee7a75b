"""Steering the active run (docs/lifecycles/steering-and-queue.md).

In place: the message joins the active run and the provider is asked to steer its turn.
By restart: the active attempt is superseded (its root node interrupted), a new attempt
with a new root node opens under the same run, and its turn carries the interrupted
input plus the steering message.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

from threadloom.domain.changes import Change, Effect, Outcome
from threadloom.domain.entities import (
    AppThread,
    ConversationMessage,
    ExecutionNode,
    Run,
    RunAttempt,
    RuntimeRequest,
)
from threadloom.domain.requests import expire
from threadloom.domain.runs import (
    START_EFFECT,
    AppliedDispatch,
    NewId,
    ThreadState,
    activity,
    clean_text,
    new_run,
)
from threadloom.domain.statuses import (
    AttemptReason,
    AttemptStatus,
    InputIntent,
    MessageRole,
    NodeKind,
    NodeStatus,
    RunStatus,
)

STEER_EFFECT = "provider-turn.steer"
INTERRUPT_EFFECT = "provider-turn.interrupt"


def _message(
    thread: AppThread,
    run: Run,
    text: str,
    intent: InputIntent,
    client_message_id: str | None,
    now: datetime,
    new_id: NewId,
) -> ConversationMessage:
    return ConversationMessage(
        id=new_id(),
        thread_id=thread.id,
        run_id=run.id,
        role=MessageRole.USER,
        text=clean_text(text),
        input_intent=intent,
        client_message_id=client_message_id,
        created_at=now,
        updated_at=now,
    )


def steer(
    thread: AppThread, run: Run, text: str, client_message_id: str | None, now: datetime, new_id: NewId
) -> Outcome:
    message = _message(thread, run, text, InputIntent.STEER, client_message_id, now, new_id)
    return Outcome(
        [
            Change("message.created", message),
            activity(
                thread.id,
                "run.steered",
                f"run {run.ordinal} steered",
                now,
                new_id,
                run_id=run.id,
                node_id=run.root_node_id,
            ),
        ],
        [
            Effect(
                STEER_EFFECT,
                {"runId": str(run.id), "attemptId": str(run.active_attempt_id), "messageId": str(message.id)},
                replay_safe=False,
            )
        ],
        result={
            "runId": str(run.id),
            "messageId": str(message.id),
            "appliedDispatch": AppliedDispatch.STEER_ACTIVE.value,
        },
    )


def restart(
    thread: AppThread,
    run: Run,
    attempt: RunAttempt,
    root: ExecutionNode,
    open_children: Sequence[ExecutionNode],
    original_input: str,
    text: str,
    client_message_id: str | None,
    now: datetime,
    new_id: NewId,
    pending_requests: Sequence[RuntimeRequest] = (),
) -> Outcome:
    """Supersede the active attempt and open a new one under the same run. The superseded turn's
    open requests (approvals, questions) end with it: expired, not resumable."""
    message = _message(thread, run, text, InputIntent.RESTART, client_message_id, now, new_id)
    new_root_id, new_attempt_id = new_id(), new_id()
    new_root = ExecutionNode(
        id=new_root_id,
        thread_id=thread.id,
        run_id=run.id,
        attempt_id=new_attempt_id,
        root_node_id=new_root_id,
        kind=NodeKind.ROOT_TURN,
        status=NodeStatus.PENDING,
        counts_for_run=True,
        title=root.title,
        created_at=now,
        updated_at=now,
    )
    new_attempt = RunAttempt(
        id=new_attempt_id,
        thread_id=thread.id,
        run_id=run.id,
        attempt_ordinal=attempt.attempt_ordinal + 1,
        root_node_id=new_root_id,
        provider_thread_id=attempt.provider_thread_id,
        reason=AttemptReason.STEERING_RESTART,
        status=AttemptStatus.PENDING,
        created_at=now,
    )
    changes = [Change("message.created", message)]
    for request in pending_requests:
        changes += expire(request, None, "the turn was restarted by a steering message", now)
    for child in open_children:
        changes.append(
            Change("node.updated", child.evolve(status=NodeStatus.INTERRUPTED, updated_at=now, completed_at=now))
        )
    changes += [
        Change("node.updated", root.evolve(status=NodeStatus.INTERRUPTED, updated_at=now, completed_at=now)),
        Change(
            "attempt.updated",
            attempt.evolve(status=AttemptStatus.SUPERSEDED, status_reason="steering_restart", completed_at=now),
        ),
        Change("node.created", new_root),
        Change("attempt.created", new_attempt),
        Change(
            "run.updated",
            run.evolve(status=RunStatus.PREPARING, active_attempt_id=new_attempt_id, root_node_id=new_root_id),
        ),
        activity(
            thread.id,
            "run.restarted",
            f"run {run.ordinal} restarted with a steering message",
            now,
            new_id,
            run_id=run.id,
            node_id=new_root_id,
        ),
    ]
    text_for_turn = f"{original_input}\n\n{message.text}"
    effects = [
        Effect(INTERRUPT_EFFECT, {"runId": str(run.id), "attemptId": str(attempt.id)}, replay_safe=False),
        Effect(
            START_EFFECT,
            {"runId": str(run.id), "attemptId": str(new_attempt_id), "input": text_for_turn},
            replay_safe=False,
        ),
    ]
    return Outcome(
        changes,
        effects,
        result={
            "runId": str(run.id),
            "messageId": str(message.id),
            "appliedDispatch": AppliedDispatch.RESTART_ACTIVE.value,
        },
    )


def steer_target(run: Run | None) -> uuid.UUID | None:
    return None if run is None else run.id


def restart_as_new_run(
    state: ThreadState,
    active: Run,
    text: str,
    client_message_id: str | None,
    model: str | None,
    now: datetime,
    new_id: NewId,
) -> Outcome:
    """The alternative representation: the interrupted run stays a counted turn (it ends `interrupted`), and
    the steering message becomes a new run, first in the queue, linked by `supersedesRunId`."""
    outcome = new_run(
        state,
        applied=AppliedDispatch.QUEUE_AFTER_ACTIVE,
        text=text,
        provider_instance_id=active.provider_instance_id,
        model=model,
        client_message_id=client_message_id,
        now=now,
        new_id=new_id,
        supersedes=active,
    )
    outcome.result["appliedDispatch"] = AppliedDispatch.RESTART_ACTIVE.value
    if active.interrupt_requested_at is None:
        outcome.changes.append(Change("run.updated", active.evolve(interrupt_requested_at=now)))
        outcome.effects.append(
            Effect(
                INTERRUPT_EFFECT,
                {"runId": str(active.id), "attemptId": str(active.active_attempt_id)},
                replay_safe=False,
            )
        )
    return outcome

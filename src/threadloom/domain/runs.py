"""Rules of the run lifecycle: dispatch, queueing, start, and the completion barrier.

Behaviour: docs/lifecycles/threads-and-runs.md and steering-and-queue.md. Every function is
pure: it gets the current entities and returns the changes (events) and effects to commit.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from threadloom.domain.changes import Change, Effect, Outcome
from threadloom.domain.entities import (
    Activity,
    AppThread,
    ConversationMessage,
    ExecutionNode,
    PlanArtifact,
    ProviderThread,
    ProviderTurn,
    Run,
    RunAttempt,
    RuntimeRequest,
)
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import (
    ACTIVE_RUN_STATUSES,
    AttemptReason,
    AttemptStatus,
    InputIntent,
    LineageRelationship,
    MessageRole,
    NodeKind,
    NodeStatus,
    PlanKind,
    PlanStatus,
    ProviderThreadStatus,
    ProviderTurnStatus,
    ResponseCapability,
    RunStatus,
    RuntimeRequestStatus,
)

MAX_MESSAGE = 200_000
START_EFFECT = "provider-turn.start"
ENSURE_THREAD_EFFECT = "provider-thread.ensure"
DELIVER_EFFECT = "subagent.deliver"  # a delegated thread's run ended: tell its parent

NewId = Callable[[], uuid.UUID]


class DispatchMode(StrEnum):
    AUTO = "auto"
    START_IMMEDIATELY = "start_immediately"
    QUEUE_AFTER_ACTIVE = "queue_after_active"
    STEER_ACTIVE = "steer_active"
    RESTART_ACTIVE = "restart_active"


class AppliedDispatch(StrEnum):
    START_IMMEDIATELY = "start_immediately"
    QUEUE_AFTER_ACTIVE = "queue_after_active"
    STEER_ACTIVE = "steer_active"
    RESTART_ACTIVE = "restart_active"


@dataclasses.dataclass(frozen=True, slots=True)
class ThreadState:
    """What a run decision needs to know about a thread, read under its row lock."""

    thread: AppThread
    active: Run | None
    queue: Sequence[Run]  # queued runs by queue_position
    last_ordinal: int


def activity(
    thread_id: uuid.UUID,
    kind: str,
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
    return Change("activity.recorded", entity, run_id=run_id, node_id=node_id)


def clean_text(text: str) -> str:
    if not text.strip():
        raise DomainError(ErrorCode.INVALID_INPUT, "text must not be blank", "text")
    if len(text) > MAX_MESSAGE:
        raise DomainError(ErrorCode.INVALID_INPUT, f"text is longer than {MAX_MESSAGE} characters", "text")
    return text


def new_run(
    state: ThreadState,
    *,
    applied: AppliedDispatch,
    text: str,
    provider_instance_id: str,
    model: str | None,
    client_message_id: str | None,
    now: datetime,
    new_id: NewId,
    message_id: uuid.UUID | None = None,
    supersedes: Run | None = None,
) -> Outcome:
    """A user message becomes a run: message → run(queued) → root node → initial attempt, started
    now or queued. `message_id` reuses an existing message (a late steer turned into a run)."""
    thread = state.thread
    text = clean_text(text)
    run_id, node_id, attempt_id = new_id(), new_id(), new_id()
    reused = message_id is not None
    message_id = message_id or new_id()
    starting = applied == AppliedDispatch.START_IMMEDIATELY
    message = ConversationMessage(
        id=message_id,
        thread_id=thread.id,
        run_id=run_id,
        role=MessageRole.USER,
        text=text,
        input_intent=InputIntent.TURN_START if starting else InputIntent.QUEUED_TURN,
        client_message_id=client_message_id,
        created_at=now,
        updated_at=now,
    )
    run = Run(
        id=run_id,
        thread_id=thread.id,
        ordinal=state.last_ordinal + 1,
        provider_instance_id=provider_instance_id,
        model=model if model is not None else thread.model,
        status=RunStatus.QUEUED,
        user_message_id=message_id,
        root_node_id=node_id,
        active_attempt_id=attempt_id,
        queue_position=1 if supersedes is not None else len(state.queue) + 1,
        supersedes_run_id=None if supersedes is None else supersedes.id,
        requested_at=now,
    )
    root = ExecutionNode(
        id=node_id,
        thread_id=thread.id,
        run_id=run_id,
        attempt_id=attempt_id,
        root_node_id=node_id,
        kind=NodeKind.ROOT_TURN,
        status=NodeStatus.PENDING,
        counts_for_run=True,
        title=_title(text),
        created_at=now,
        updated_at=now,
    )
    attempt = RunAttempt(
        id=attempt_id,
        thread_id=thread.id,
        run_id=run_id,
        attempt_ordinal=1,
        root_node_id=node_id,
        provider_thread_id=thread.active_provider_thread_id,
        reason=AttemptReason.INITIAL,
        status=AttemptStatus.PENDING,
        created_at=now,
    )
    outcome = Outcome(
        [
            Change("message.updated" if reused else "message.created", message),
            Change("run.created", run),
            Change("node.created", root),
            Change("attempt.created", attempt),
        ],
        result={"runId": str(run_id), "messageId": str(message_id), "appliedDispatch": applied.value},
    )
    if supersedes is not None:  # it goes first in the queue: the others move down by one
        outcome.changes += [
            Change("run.updated", r.evolve(queue_position=position)) for position, r in enumerate(state.queue, start=2)
        ]
    if starting:
        _start(outcome, thread.evolve(queue_held=False, queue_hold_reason=None), run, now, new_id)
    else:
        outcome.changes.append(
            activity(
                thread.id,
                "run.queued",
                f"run {run.ordinal} queued at position {run.queue_position}",
                now,
                new_id,
                run_id=run_id,
            )
        )
    return outcome


def _title(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:80]


def _start(outcome: Outcome, thread: AppThread, run: Run, now: datetime, new_id: NewId) -> None:
    """Make `run` the thread's active run and ask the outbox to start its provider turn."""
    started = run.evolve(status=RunStatus.PREPARING, queue_position=None)
    outcome.changes.append(Change("run.updated", started))
    outcome.changes.append(Change("thread.updated", thread.evolve(active_run_id=run.id, updated_at=now)))
    outcome.changes.append(
        activity(
            thread.id,
            "run.preparing",
            f"run {run.ordinal} is starting",
            now,
            new_id,
            run_id=run.id,
            node_id=run.root_node_id,
        )
    )
    outcome.effects.append(
        Effect(START_EFFECT, {"runId": str(run.id), "attemptId": str(run.active_attempt_id)}, replay_safe=False)
    )


def drain_queue(thread: AppThread, queue: Sequence[Run], now: datetime, new_id: NewId) -> Outcome:
    """When nothing runs: start the first queued run unless the queue is held; renumber the rest."""
    outcome = Outcome()
    if thread.queue_held or thread.active_run_id is not None or not queue:
        return outcome
    first, rest = queue[0], queue[1:]
    for position, run in enumerate(rest, start=1):
        if run.queue_position != position:
            outcome.changes.append(Change("run.updated", run.evolve(queue_position=position)))
    _start(outcome, thread, first, now, new_id)
    return outcome


def resume_queue(state: ThreadState, now: datetime, new_id: NewId) -> Outcome:
    thread = state.thread
    if not thread.queue_held:
        raise DomainError(ErrorCode.QUEUE_NOT_HELD, "the queue is not held", "threadId")
    released = thread.evolve(queue_held=False, queue_hold_reason=None, updated_at=now)
    outcome = Outcome(
        [Change("thread.updated", released), activity(thread.id, "queue.resumed", "queue resumed", now, new_id)]
    )
    drained = drain_queue(released, state.queue, now, new_id)
    outcome.changes += drained.changes
    outcome.effects += drained.effects
    return outcome


def is_active(run: Run) -> bool:
    return run.status in ACTIVE_RUN_STATUSES


def completes_run(node: ExecutionNode, run: Run) -> bool:
    """Only the root node of the selected attempt completes a run; a child never does."""
    return node.counts_for_run and node.id == run.root_node_id and node.attempt_id == run.active_attempt_id


# ---- execution -----------------------------------------------------------------------


def turn_requested(
    run: Run, attempt: RunAttempt, provider_thread: ProviderThread, turn_ordinal: int, now: datetime, new_id: NewId
) -> tuple[Outcome, ProviderTurn]:
    """Before the turn is sent: record a pending ProviderTurn, so recovery knows it may have started."""
    if run.status != RunStatus.PREPARING or attempt.status != AttemptStatus.PENDING:
        raise DomainError(ErrorCode.RUN_NOT_STARTABLE, f"run is {run.status}, attempt {attempt.status}")
    turn = ProviderTurn(
        id=new_id(),
        thread_id=run.thread_id,
        provider_thread_id=provider_thread.id,
        run_attempt_id=attempt.id,
        node_id=attempt.root_node_id,
        ordinal=turn_ordinal,
        status=ProviderTurnStatus.PENDING,
        created_at=now,
    )
    outcome = Outcome(
        [
            Change("provider_turn.created", turn),
            Change("attempt.updated", attempt.evolve(provider_thread_id=provider_thread.id, provider_turn_id=turn.id)),
            Change(
                "run.updated",
                run.evolve(
                    status=RunStatus.STARTING, provider_thread_id=provider_thread.id, started_at=run.started_at or now
                ),
            ),
        ]
    )
    return outcome, turn


def turn_started(
    run: Run,
    attempt: RunAttempt,
    root: ExecutionNode,
    turn: ProviderTurn,
    native_turn: str,
    now: datetime,
    new_id: NewId,
) -> Outcome:
    outcome = Outcome(
        [Change("provider_turn.updated", turn.evolve(native_turn_ref=native_turn, status=ProviderTurnStatus.RUNNING))]
    )
    if attempt.status == AttemptStatus.PENDING:
        outcome.changes += [
            Change("attempt.updated", attempt.evolve(status=AttemptStatus.RUNNING)),
            Change("node.updated", root.evolve(status=NodeStatus.RUNNING, provider_turn_id=turn.id, updated_at=now)),
            Change("run.updated", run.evolve(status=RunStatus.RUNNING)),
            activity(
                run.thread_id, "run.started", f"run {run.ordinal} started", now, new_id, run_id=run.id, node_id=root.id
            ),
        ]
    return outcome


_NODE_AFTER_TURN = {
    RunStatus.COMPLETED: NodeStatus.COMPLETED,
    RunStatus.INTERRUPTED: NodeStatus.INTERRUPTED,
    RunStatus.FAILED: NodeStatus.FAILED,
    RunStatus.CANCELLED: NodeStatus.CANCELLED,
}
_OPEN_CHILD_AFTER_TURN = {
    RunStatus.COMPLETED: NodeStatus.COMPLETED,
    RunStatus.INTERRUPTED: NodeStatus.INTERRUPTED,
    RunStatus.FAILED: NodeStatus.CANCELLED,
    RunStatus.CANCELLED: NodeStatus.CANCELLED,
}
_ATTEMPT_AFTER_TURN = {
    RunStatus.COMPLETED: AttemptStatus.COMPLETED,
    RunStatus.INTERRUPTED: AttemptStatus.INTERRUPTED,
    RunStatus.FAILED: AttemptStatus.FAILED,
    RunStatus.CANCELLED: AttemptStatus.CANCELLED,
}
_TURN_AFTER_TURN = {
    RunStatus.COMPLETED: ProviderTurnStatus.COMPLETED,
    RunStatus.INTERRUPTED: ProviderTurnStatus.INTERRUPTED,
    RunStatus.FAILED: ProviderTurnStatus.FAILED,
    RunStatus.CANCELLED: ProviderTurnStatus.FAILED,
}


@dataclasses.dataclass(frozen=True, slots=True)
class RunGraph:
    """A run and everything the completion barrier closes, read under the thread lock."""

    thread: AppThread
    run: Run
    attempt: RunAttempt
    root: ExecutionNode
    turn: ProviderTurn | None
    provider_thread: ProviderThread | None
    open_messages: Sequence[ConversationMessage]
    open_children: Sequence[ExecutionNode]
    active_plans: Sequence[PlanArtifact]
    queue: Sequence[Run]
    pending_requests: Sequence[RuntimeRequest] = ()


def finish_run(
    graph: RunGraph,
    status: RunStatus,
    reason: str | None,
    now: datetime,
    new_id: NewId,
    *,
    hold_reason: str | None = None,
) -> Outcome:
    """The completion barrier, in its documented order, as one set of changes.

    flush (done by the caller) → close streaming messages → finalize todo/plan artifacts →
    close open child nodes → checkpoint step → root node, attempt, turn terminal → run
    terminal → drain or hold the queue.
    """
    run, thread = graph.run, graph.thread
    out = Outcome()
    gone = {
        "provider_crashed": "the agent process exited",
        "provider_lost": "the server that held the turn is gone",
        "server_stopped": "the server stopped during the turn",
    }
    for request in graph.pending_requests:  # the provider's callback ends with its turn
        out.changes.append(
            Change(
                "request.updated",
                request.evolve(
                    status=RuntimeRequestStatus.EXPIRED,
                    response_capability=ResponseCapability.NOT_RESUMABLE,
                    not_resumable_reason=gone.get(reason or "", "the turn ended"),
                    resolved_at=now,
                ),
                node_id=request.node_id,
            )
        )
    for message in graph.open_messages:
        out.changes.append(Change("message.updated", message.evolve(streaming=False, updated_at=now)))
    for plan in graph.active_plans:
        out.changes.append(Change("plan.updated", finalize_plan(plan, status, now), node_id=plan.node_id))
    child_status = _OPEN_CHILD_AFTER_TURN[status]
    for child in graph.open_children:
        out.changes.append(Change("node.updated", child.evolve(status=child_status, updated_at=now, completed_at=now)))
    out.changes.append(
        activity(
            thread.id, "checkpoint.skipped", "no checkpoint policy", now, new_id, run_id=run.id, node_id=graph.root.id
        )
    )
    out.changes.append(
        Change("node.updated", graph.root.evolve(status=_NODE_AFTER_TURN[status], updated_at=now, completed_at=now))
    )
    out.changes.append(
        Change(
            "attempt.updated",
            graph.attempt.evolve(status=_ATTEMPT_AFTER_TURN[status], status_reason=reason, completed_at=now),
        )
    )
    if graph.turn is not None:
        out.changes.append(
            Change("provider_turn.updated", graph.turn.evolve(status=_TURN_AFTER_TURN[status], completed_at=now))
        )
    if graph.provider_thread is not None:
        pt = graph.provider_thread
        out.changes.append(
            Change(
                "provider_thread.updated",
                pt.evolve(
                    status=ProviderThreadStatus.NOT_LOADED
                    if reason == "provider_crashed"
                    else ProviderThreadStatus.IDLE,
                    first_run_ordinal=pt.first_run_ordinal or run.ordinal,
                    last_run_ordinal=run.ordinal,
                    updated_at=now,
                ),
            )
        )
    out.changes.append(Change("run.updated", run.evolve(status=status, status_reason=reason, completed_at=now)))
    summary = f"run {run.ordinal} {status}" + (f": {reason}" if reason else "")
    out.changes.append(activity(thread.id, f"run.{status}", summary, now, new_id, run_id=run.id, node_id=graph.root.id))
    after = thread.evolve(active_run_id=None, updated_at=now)
    if status == RunStatus.FAILED and hold_reason is None:
        # Every failure holds the queue, a crash too: a person decides what runs next.
        hold_reason = f"run {run.ordinal} failed: " + gone.get(reason or "", reason or "no reason given")
    if hold_reason is not None:
        after = after.evolve(queue_held=True, queue_hold_reason=hold_reason)
        out.changes.append(activity(thread.id, "queue.held", hold_reason, now, new_id, run_id=run.id))
    out.changes.append(Change("thread.updated", after))
    drained = drain_queue(after, graph.queue, now, new_id)
    out.changes += drained.changes
    out.effects += drained.effects
    if after.parent_thread_id is not None and after.lineage_relationship == LineageRelationship.SUBAGENT:
        out.effects.append(
            Effect(
                DELIVER_EFFECT,
                {
                    "parentThreadId": str(after.parent_thread_id),
                    "childThreadId": str(after.id),
                    "runId": str(run.id),
                },
            )
        )
    return out


def finalize_plan(plan: PlanArtifact, status: RunStatus, now: datetime) -> PlanArtifact:
    """A todo list ends with the run: items still open are marked as the run ended."""
    if plan.kind != PlanKind.TODO_LIST:
        return plan.evolve(status=PlanStatus.FINALIZED, updated_at=now)
    ended = {RunStatus.COMPLETED: "completed"}.get(status, str(status))
    items = [item if item.get("status") == "completed" else {**item, "status": ended} for item in (plan.items or [])]
    return plan.evolve(items=items, status=PlanStatus.FINALIZED, updated_at=now)

"""Rules of a run's execution: its provider turn (requested, started) and the completion barrier.

Behaviour: docs/lifecycles/threads-and-runs.md. A message becomes a run in `domain.dispatch`; it waits
and starts in `domain.queue`. Every function is pure: it gets the current entities and returns the
changes (events) and effects to commit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime
from typing import TYPE_CHECKING

from threadloom.domain.activities import ActivityKind, run_activity, run_ended
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.checkpoints import Recorded
from threadloom.domain.delegation import closable
from threadloom.domain.effects import DeliverToParent
from threadloom.domain.entities import ProviderTurn
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.failures import ModelFailure, failure_code
from threadloom.domain.queue import drain_queue
from threadloom.domain.statuses import (
    ACTIVE_RUN_STATUSES,
    AttemptStatus,
    LineageRelationship,
    NodeStatus,
    PlanKind,
    PlanStatus,
    ProviderThreadStatus,
    ProviderTurnStatus,
    ResponseCapability,
    RunStatus,
    RuntimeRequestStatus,
)

if TYPE_CHECKING:  # the entities this module only names in signatures and fields
    from threadloom.domain.entities import (
        AppThread,
        ConversationMessage,
        ExecutionNode,
        PlanArtifact,
        ProviderThread,
        Run,
        RunAttempt,
        RuntimeRequest,
    )


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
            Change.created(turn),
            Change.updated(attempt.evolve(provider_thread_id=provider_thread.id, provider_turn_id=turn.id)),
            Change.updated(
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
    outcome = Outcome([Change.updated(turn.evolve(native_turn_ref=native_turn, status=ProviderTurnStatus.RUNNING))])
    if attempt.status == AttemptStatus.PENDING:
        outcome.changes += [
            Change.updated(attempt.evolve(status=AttemptStatus.RUNNING)),
            Change.updated(root.evolve(status=NodeStatus.RUNNING, provider_turn_id=turn.id, updated_at=now)),
            Change.updated(run.evolve(status=RunStatus.RUNNING)),
            run_activity(run, ActivityKind.RUN_STARTED, f"run {run.ordinal} started", now, new_id, node_id=root.id),
        ]
    return outcome


def late_turn_started(turn: ProviderTurn, native_turn: str) -> Outcome:
    """The provider started the turn of an attempt that is no longer live (a restart superseded it, or its run
    ended, while the turn start was in flight). Nothing of the run changes, but the turn is in the provider's
    conversation all the same: its native ref is recorded, so a rollback of its run drops it there too."""
    if turn.native_turn_ref is not None:
        return Outcome()
    status = ProviderTurnStatus.RUNNING if turn.status == ProviderTurnStatus.PENDING else turn.status
    return Outcome([Change.updated(turn.evolve(native_turn_ref=native_turn, status=status))])


@dataclasses.dataclass(frozen=True, slots=True)
class _Ended:
    """How each part of a run ends when the run ends in a given status."""

    root: NodeStatus
    open_child: NodeStatus  # a child still open when a run fails was never finished: cancelled
    attempt: AttemptStatus
    turn: ProviderTurnStatus


_ENDED = {
    RunStatus.COMPLETED: _Ended(
        NodeStatus.COMPLETED, NodeStatus.COMPLETED, AttemptStatus.COMPLETED, ProviderTurnStatus.COMPLETED
    ),
    RunStatus.INTERRUPTED: _Ended(
        NodeStatus.INTERRUPTED, NodeStatus.INTERRUPTED, AttemptStatus.INTERRUPTED, ProviderTurnStatus.INTERRUPTED
    ),
    RunStatus.FAILED: _Ended(NodeStatus.FAILED, NodeStatus.CANCELLED, AttemptStatus.FAILED, ProviderTurnStatus.FAILED),
    RunStatus.CANCELLED: _Ended(
        NodeStatus.CANCELLED, NodeStatus.CANCELLED, AttemptStatus.CANCELLED, ProviderTurnStatus.FAILED
    ),
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
    # A provider subagent's own provider thread still ACTIVE, and its turns still RUNNING (`domain.subagents`):
    # a run ended by a crash, a lost server or a Stop never saw their end events.
    subagent_threads: Sequence[ProviderThread] = ()
    subagent_turns: Sequence[ProviderTurn] = ()


def finish_run(
    graph: RunGraph,
    status: RunStatus,
    reason: str | None,
    now: datetime,
    new_id: NewId,
    *,
    hold_reason: str | None = None,
    checkpoint: Recorded | None = None,
    model_failure: ModelFailure | None = None,
) -> Outcome:
    """The completion barrier, in its documented order, as one set of changes.

    flush (done by the caller) → close streaming messages → finalize todo/plan artifacts →
    close open child nodes, but not a delegated task's (`delegation.outlives_run`: its child thread
    still runs) → checkpoint step → root node, attempt, turn terminal → run terminal → drain or hold
    the queue. `checkpoint` is the run's root checkpoint, captured by the caller before this
    transaction (git work never runs inside it); None: none kept.
    A FAILED run gets its failure code (`domain.failures`): the driver's `model_failure` when
    it read one, else its `reason`'s.
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
            Change.updated(
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
        out.changes.append(Change.updated(message.evolve(streaming=False, updated_at=now)))
    for plan in graph.active_plans:
        out.changes.append(Change.updated(finalize_plan(plan, status, now), node_id=plan.node_id))
    ended = _ENDED[status]
    child_status = ended.open_child
    for child in closable(graph.open_children):  # a delegated task's node stays open: its child still runs
        out.changes.append(Change.updated(child.evolve(status=child_status, updated_at=now, completed_at=now)))
    for sub_turn in graph.subagent_turns:  # a subagent's own turn ends with the run that spawned it
        out.changes.append(
            Change.updated(sub_turn.evolve(status=ended.turn, completed_at=now), node_id=sub_turn.node_id)
        )
    for owned in graph.subagent_threads:
        idle = ProviderThreadStatus.NOT_LOADED if reason == "provider_crashed" else ProviderThreadStatus.IDLE
        out.changes.append(Change.updated(owned.evolve(status=idle, updated_at=now), node_id=owned.owner_node_id))
    root = graph.root
    if checkpoint is not None:
        out.changes += checkpoint.changes
        run = run.evolve(checkpoint_id=checkpoint.checkpoint.id)
        root = root.evolve(checkpoint_scope_id=checkpoint.checkpoint.scope_id)
    else:
        out.changes.append(
            run_activity(run, ActivityKind.CHECKPOINT_SKIPPED, "no checkpoint kept", now, new_id, node_id=graph.root.id)
        )
    out.changes.append(Change.updated(root.evolve(status=ended.root, updated_at=now, completed_at=now)))
    out.changes.append(
        Change.updated(
            graph.attempt.evolve(status=ended.attempt, status_reason=reason, completed_at=now),
        )
    )
    if graph.turn is not None:
        out.changes.append(Change.updated(graph.turn.evolve(status=ended.turn, completed_at=now)))
    if graph.provider_thread is not None:
        pt = graph.provider_thread
        out.changes.append(
            Change.updated(
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
    failed = status == RunStatus.FAILED
    out.changes.append(
        Change.updated(
            run.evolve(
                status=status,
                status_reason=reason,
                failure_code=failure_code(reason, model_failure) if failed else None,
                failure_http_status=model_failure.http_status if failed and model_failure else None,
                completed_at=now,
            )
        )
    )
    summary = f"run {run.ordinal} {status}" + (f": {reason}" if reason else "")
    out.changes.append(run_activity(run, run_ended(status), summary, now, new_id, node_id=graph.root.id))
    after = thread.evolve(active_run_id=None, updated_at=now)
    if status == RunStatus.FAILED and hold_reason is None:
        # Every failure holds the queue, a crash too: a person decides what runs next.
        hold_reason = f"run {run.ordinal} failed: " + gone.get(reason or "", reason or "no reason given")
    if hold_reason is not None:
        after = after.evolve(queue_held=True, queue_hold_reason=hold_reason)
        out.changes.append(run_activity(run, ActivityKind.QUEUE_HELD, hold_reason, now, new_id))
    out.changes.append(Change.updated(after))
    drained = drain_queue(after, graph.queue, now, new_id)
    out.changes += drained.changes
    out.effects += drained.effects
    if after.parent_thread_id is not None and after.lineage_relationship == LineageRelationship.SUBAGENT:
        out.effects.append(
            DeliverToParent(parent_thread_id=after.parent_thread_id, child_thread_id=after.id, run_id=run.id).envelope()
        )
    return out


def finalize_plan(plan: PlanArtifact, status: RunStatus, now: datetime) -> PlanArtifact:
    """A todo list ends with the run: items still open are marked as the run ended."""
    if plan.kind != PlanKind.TODO_LIST:
        return plan.evolve(status=PlanStatus.FINALIZED, updated_at=now)
    ended = {RunStatus.COMPLETED: "completed"}.get(status, str(status))
    items = [item if item.get("status") == "completed" else {**item, "status": ended} for item in (plan.items or [])]
    return plan.evolve(items=items, status=PlanStatus.FINALIZED, updated_at=now)

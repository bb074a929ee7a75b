"""In-memory entities for the pure rule tests (tests/test_rules_*.py): no database, no server.

The rules in `threadloom.domain` take entities and return an `Outcome`; these builders make the
entities with only the fields a rule reads set, and `latest` folds an outcome's changes back into
the newest state of each entity, the way the store applies events.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import TypeVar

from threadloom.domain.changes import Change, Outcome
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
from threadloom.domain.records import Record
from threadloom.domain.runs import RunGraph
from threadloom.domain.statuses import (
    AttemptReason,
    AttemptStatus,
    MessageRole,
    NodeKind,
    NodeStatus,
    PlanKind,
    PlanStatus,
    ProviderThreadStatus,
    ProviderTurnStatus,
    ResponseCapability,
    RunStatus,
    RuntimeRequestKind,
    RuntimeRequestStatus,
)
from threadloom.domain.threads import ThreadState

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
LATER = datetime(2026, 11, 30, 12, 5, tzinfo=UTC)

R = TypeVar("R", bound=Record)


class Ids:
    """A `NewId` that counts, so two runs of a test make the same ids (readable in a failure)."""

    def __init__(self) -> None:
        self._next = itertools.count(1)

    def __call__(self) -> uuid.UUID:
        return uuid.UUID(int=next(self._next))


_ids = Ids()


def uid() -> uuid.UUID:
    """A fresh id for a fixture entity (distinct from the ids a rule makes with its own `Ids`)."""
    return uuid.UUID(int=(1 << 100) + _ids().int)


def thread(**fields: object) -> AppThread:
    base = AppThread(
        id=uid(),
        project_id=uid(),
        title="T",
        provider_instance_id="scripted",
        model=None,
        runtime_mode="full_access",
        created_at=NOW,
        updated_at=NOW,
    )
    return base.evolve(**fields)


def run(owner: AppThread, ordinal: int, status: RunStatus = RunStatus.QUEUED, **fields: object) -> Run:
    """A run with its own (not built) root node and attempt ids; queued runs get their ordinal as position
    unless `queue_position` is given."""
    base = Run(
        id=uid(),
        thread_id=owner.id,
        ordinal=ordinal,
        provider_instance_id=owner.provider_instance_id,
        model=None,
        status=status,
        user_message_id=uid(),
        root_node_id=uid(),
        active_attempt_id=uid(),
        queue_position=ordinal if status == RunStatus.QUEUED else None,
        requested_at=NOW,
    )
    return base.evolve(**fields)


def queue(owner: AppThread, size: int, first_ordinal: int = 2) -> list[Run]:
    """`size` queued runs at positions 1..size."""
    return [run(owner, first_ordinal + i, RunStatus.QUEUED, queue_position=i + 1) for i in range(size)]


def attempt_of(r: Run, status: AttemptStatus = AttemptStatus.RUNNING, **fields: object) -> RunAttempt:
    assert r.active_attempt_id is not None and r.root_node_id is not None
    base = RunAttempt(
        id=r.active_attempt_id,
        thread_id=r.thread_id,
        run_id=r.id,
        attempt_ordinal=1,
        root_node_id=r.root_node_id,
        reason=AttemptReason.INITIAL,
        status=status,
        created_at=NOW,
    )
    return base.evolve(**fields)


def root_of(r: Run, status: NodeStatus = NodeStatus.RUNNING) -> ExecutionNode:
    assert r.root_node_id is not None
    return ExecutionNode(
        id=r.root_node_id,
        thread_id=r.thread_id,
        run_id=r.id,
        attempt_id=r.active_attempt_id,
        root_node_id=r.root_node_id,
        kind=NodeKind.ROOT_TURN,
        status=status,
        counts_for_run=True,
        title="root",
        created_at=NOW,
        updated_at=NOW,
    )


def child_of(root: ExecutionNode, status: NodeStatus = NodeStatus.RUNNING) -> ExecutionNode:
    return ExecutionNode(
        id=uid(),
        thread_id=root.thread_id,
        run_id=root.run_id,
        attempt_id=root.attempt_id,
        parent_node_id=root.id,
        root_node_id=root.id,
        kind=NodeKind.TOOL_CALL,
        status=status,
        created_at=NOW,
        updated_at=NOW,
    )


def message_of(r: Run, text: str = "hello", *, streaming: bool = False) -> ConversationMessage:
    return ConversationMessage(
        id=r.user_message_id or uid(),
        thread_id=r.thread_id,
        run_id=r.id,
        role=MessageRole.USER,
        text=text,
        streaming=streaming,
        created_at=NOW,
        updated_at=NOW,
    )


def agent_message(r: Run, text: str = "partial answer") -> ConversationMessage:
    """An assistant message still streaming when its turn ends."""
    return message_of(r, text, streaming=True).evolve(id=uid(), role=MessageRole.ASSISTANT)


def provider_thread_of(owner: AppThread) -> ProviderThread:
    return ProviderThread(
        id=uid(),
        provider_instance_id=owner.provider_instance_id,
        thread_id=owner.id,
        native_thread_ref="native-1",
        status=ProviderThreadStatus.ACTIVE,
        created_at=NOW,
        updated_at=NOW,
    )


def turn_of(attempt: RunAttempt, pt: ProviderThread) -> ProviderTurn:
    return ProviderTurn(
        id=uid(),
        thread_id=attempt.thread_id,
        provider_thread_id=pt.id,
        run_attempt_id=attempt.id,
        node_id=attempt.root_node_id,
        ordinal=1,
        status=ProviderTurnStatus.RUNNING,
        created_at=NOW,
    )


def approval_of(r: Run, node: ExecutionNode) -> RuntimeRequest:
    return RuntimeRequest(
        id=uid(),
        thread_id=r.thread_id,
        run_id=r.id,
        node_id=node.id,
        kind=RuntimeRequestKind.COMMAND_APPROVAL,
        status=RuntimeRequestStatus.PENDING,
        response_capability=ResponseCapability.LIVE,
        created_at=NOW,
    )


def todo_of(r: Run, items: list[dict[str, str]]) -> PlanArtifact:
    return PlanArtifact(
        id=uid(),
        thread_id=r.thread_id,
        run_id=r.id,
        node_id=r.root_node_id,
        kind=PlanKind.TODO_LIST,
        items=items,
        status=PlanStatus.ACTIVE,
        created_at=NOW,
        updated_at=NOW,
    )


def state(owner: AppThread, active: Run | None = None, queued: Sequence[Run] = ()) -> ThreadState:
    """A thread as a run decision reads it; `active_run_id` follows `active`."""
    owner = owner.evolve(active_run_id=None if active is None else active.id)
    ordinals = [r.ordinal for r in [*queued, *([active] if active else [])]]
    return ThreadState(thread=owner, active=active, queue=list(queued), last_ordinal=max(ordinals, default=0))


def graph(
    owner: AppThread,
    r: Run,
    *,
    queued: Sequence[Run] = (),
    children: int = 0,
    streaming: int = 0,
    plans: Sequence[PlanArtifact] = (),
    requests: int = 0,
    turn: bool = True,
) -> RunGraph:
    """The active run `r` with everything the completion barrier closes."""
    owner = owner.evolve(active_run_id=r.id)
    attempt = attempt_of(r)
    root = root_of(r)
    pt = provider_thread_of(owner)
    return RunGraph(
        thread=owner,
        run=r,
        attempt=attempt.evolve(provider_thread_id=pt.id),
        root=root,
        turn=turn_of(attempt, pt) if turn else None,
        provider_thread=pt,
        open_messages=[agent_message(r) for _ in range(streaming)],
        open_children=[child_of(root) for _ in range(children)],
        active_plans=list(plans),
        queue=list(queued),
        pending_requests=[approval_of(r, root) for _ in range(requests)],
    )


def latest(changes: Iterable[Change], of: type[R]) -> dict[uuid.UUID, R]:
    """The newest state of each entity of type `of` after the changes, by id (events apply as upserts)."""
    found: dict[uuid.UUID, R] = {}
    for change in changes:
        if isinstance(change.entity, of):
            found[change.entity.id] = change.entity
    return found


def apply_to_queue(before: Sequence[Run], outcome: Outcome) -> list[Run]:
    """The queued runs after `outcome`, in queue order (runs that left the queue dropped)."""
    updated = latest(outcome.changes, Run)
    after = [updated.get(r.id, r) for r in before]
    after += [r for r in updated.values() if r.id not in {b.id for b in before}]
    waiting = [r for r in after if r.status == RunStatus.QUEUED]
    return sorted(waiting, key=lambda r: (r.queue_position or 0, r.ordinal))  # as store.runs.queue reads it


def event_types(outcome: Outcome) -> list[str]:
    """The outcome's changes as event types, activities as `activity:<kind>` (the order the UI sees)."""
    return [f"activity:{c.entity.kind}" if isinstance(c.entity, Activity) else c.event_type for c in outcome.changes]

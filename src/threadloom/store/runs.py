"""Reads of run state that command handlers and the ingestor take under the thread lock."""

from __future__ import annotations

import dataclasses
import uuid

import sqlalchemy as sa

from threadloom.domain.entities import (
    AppThread,
    ConversationMessage,
    ExecutionNode,
    PlanArtifact,
    Project,
    ProviderThread,
    ProviderTurn,
    Run,
    RunAttempt,
    RuntimeRequest,
)
from threadloom.domain.runs import RunGraph
from threadloom.domain.statuses import ACTIVE_RUN_STATUSES, NodeStatus, PlanStatus, RunStatus, RuntimeRequestStatus
from threadloom.domain.threads import ThreadState
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader


async def queue(db: Reader, thread_id: uuid.UUID) -> list[Run]:
    c = t.runs.c
    return await entities.where(
        db, Run, c.thread_id == thread_id, c.status == RunStatus.QUEUED.value, order_by=[c.queue_position, c.ordinal]
    )


async def queue_positions(db: Reader, thread_ids: list[uuid.UUID]) -> dict[uuid.UUID, dict[uuid.UUID, int]]:
    """By thread: each queued run's place (1, 2 …) in the queue, for many threads in one statement.

    `queue_position` is only the queue's order key: starting or cancelling a run leaves the others'
    keys as they are (no event per queued run), so the place is counted here when it is read.
    """
    place = sa.func.row_number().over(
        partition_by=t.runs.c.thread_id, order_by=[t.runs.c.queue_position, t.runs.c.ordinal]
    )
    rows = await db.rows(
        sa.select(t.runs.c.thread_id, t.runs.c.id, place.label("place")).where(
            t.runs.c.thread_id.in_(thread_ids), t.runs.c.status == RunStatus.QUEUED.value
        )
    )
    found: dict[uuid.UUID, dict[uuid.UUID, int]] = {i: {} for i in thread_ids}
    for row in rows:
        found[row["thread_id"]][row["id"]] = int(row["place"])
    return found


_STATE = sa.text(
    """
    SELECT 'active' AS part, to_jsonb(r) AS row FROM runs r WHERE r.id = :active
    UNION ALL SELECT 'queued', to_jsonb(q) FROM runs q WHERE q.thread_id = :thread AND q.status = :queued
    UNION ALL SELECT 'last', to_jsonb(coalesce(max(o.ordinal), 0)) FROM runs o WHERE o.thread_id = :thread
    """
)


async def thread_state(db: Reader, thread: AppThread) -> ThreadState:
    """The thread's active run, its queue (in order) and its last run's ordinal, in one statement
    (sendMessage reads it)."""
    params = {"active": thread.active_run_id, "thread": thread.id, "queued": RunStatus.QUEUED.value}
    active: Run | None = None
    queued: list[Run] = []
    last = 0
    for part, row in await db.tuples(_STATE, params):
        if part == "last":
            last = int(row)
        elif part == "active":
            active = Run.from_mapping(row)
        else:
            queued.append(Run.from_mapping(row))
    return ThreadState(thread=thread, active=active, queue=_queue_order(queued), last_ordinal=last)


def _queue_order(queued: list[Run]) -> list[Run]:
    """`queue`'s order (NULL positions last, as PostgreSQL sorts them)."""
    return sorted(queued, key=lambda r: (r.queue_position is None, r.queue_position or 0, r.ordinal))


_GRAPH = sa.text(
    """
    WITH a AS (SELECT * FROM run_attempts WHERE id = :attempt)
    SELECT 'attempt' AS part, to_jsonb(a) AS row FROM a
    UNION ALL SELECT 'root', to_jsonb(n) FROM execution_nodes n JOIN a ON n.id = a.root_node_id
    UNION ALL SELECT 'turn', to_jsonb(pt) FROM provider_turns pt JOIN a ON pt.id = a.provider_turn_id
    UNION ALL SELECT 'provider_thread', to_jsonb(p) FROM provider_threads p JOIN a ON p.id = a.provider_thread_id
    UNION ALL SELECT 'message', to_jsonb(m) FROM conversation_messages m WHERE m.run_id = :run AND m.streaming
    UNION ALL SELECT 'child', to_jsonb(n) FROM execution_nodes n JOIN a ON n.attempt_id = a.id
      WHERE n.id <> a.root_node_id AND n.status IN :open_nodes
    UNION ALL SELECT 'plan', to_jsonb(pa) FROM plan_artifacts pa WHERE pa.run_id = :run AND pa.status = :active_plan
    UNION ALL SELECT 'queued', to_jsonb(q) FROM runs q WHERE q.thread_id = :thread AND q.status = :queued
    UNION ALL SELECT 'request', to_jsonb(r) FROM runtime_requests r WHERE r.run_id = :run AND r.status = :pending
    """
).bindparams(sa.bindparam("open_nodes", expanding=True))
_OPEN_NODES = [NodeStatus.PENDING.value, NodeStatus.RUNNING.value, NodeStatus.WAITING.value]


async def run_graph(db: Reader, thread: AppThread, run: Run) -> RunGraph:
    """Everything the completion barrier closes, in one statement (a run's end waits for it): the
    same rows as one read per part, each part in id order, the queue in its order."""
    found: dict[str, list[dict[str, object]]] = {}
    params = {
        "attempt": run.active_attempt_id,
        "run": run.id,
        "thread": thread.id,
        "open_nodes": _OPEN_NODES,
        "active_plan": PlanStatus.ACTIVE.value,
        "queued": RunStatus.QUEUED.value,
        "pending": RuntimeRequestStatus.PENDING.value,
    }
    for part, row in await db.tuples(_GRAPH, params):
        found.setdefault(part, []).append(row)

    def each(part: str, cls: type[entities.R]) -> list[entities.R]:
        return sorted((cls.from_mapping(r) for r in found.get(part, [])), key=lambda e: e.id)

    def one(part: str, cls: type[entities.R]) -> entities.R | None:
        rows = each(part, cls)
        return rows[0] if rows else None

    attempt, root = one("attempt", RunAttempt), one("root", ExecutionNode)
    if attempt is None or root is None:
        raise LookupError(f"run {run.id}: attempt {run.active_attempt_id} or its root node not found")
    queued = _queue_order(each("queued", Run))
    return RunGraph(
        thread=thread,
        run=run,
        attempt=attempt,
        root=root,
        turn=one("turn", ProviderTurn),
        provider_thread=one("provider_thread", ProviderThread),
        open_messages=each("message", ConversationMessage),
        open_children=each("child", ExecutionNode),
        active_plans=each("plan", PlanArtifact),
        queue=queued,
        pending_requests=each("request", RuntimeRequest),
    )


_TURN_START = sa.text(
    """
    WITH r AS (SELECT * FROM runs WHERE id = :run)
    SELECT 'run' AS part, to_jsonb(r) AS row FROM r
    UNION ALL SELECT 'attempt', to_jsonb(a) FROM run_attempts a JOIN r ON a.id = r.active_attempt_id
    UNION ALL SELECT 'message', to_jsonb(m) FROM conversation_messages m JOIN r ON m.id = r.user_message_id
    UNION ALL SELECT 'project', to_jsonb(p) FROM projects p WHERE p.id = :project
    UNION ALL SELECT 'provider_thread', to_jsonb(pt) FROM provider_threads pt WHERE pt.id = :provider_thread
    """
)


@dataclasses.dataclass(frozen=True, slots=True)
class TurnStart:
    """What a turn's start reads first (each None when missing): the run, its active attempt and its
    message, the thread's project and active provider thread."""

    run: Run | None
    attempt: RunAttempt | None
    message: ConversationMessage | None
    project: Project | None
    provider_thread: ProviderThread | None


async def turn_start(db: Reader, thread: AppThread, run_id: uuid.UUID) -> TurnStart:
    """`TurnStart` in one statement (five reads by id)."""
    params = {"run": run_id, "project": thread.project_id, "provider_thread": thread.active_provider_thread_id}
    rows = {part: row for part, row in await db.tuples(_TURN_START, params)}

    def one(part: str, cls: type[entities.R]) -> entities.R | None:
        return cls.from_mapping(rows[part]) if part in rows else None

    return TurnStart(
        one("run", Run),
        one("attempt", RunAttempt),
        one("message", ConversationMessage),
        one("project", Project),
        one("provider_thread", ProviderThread),
    )


async def next_turn_ordinal(db: Reader, provider_thread_id: uuid.UUID) -> int:
    last = await db.scalar(
        sa.select(sa.func.coalesce(sa.func.max(t.provider_turns.c.ordinal), 0)).where(
            t.provider_turns.c.provider_thread_id == provider_thread_id
        )
    )
    return int(last) + 1


async def active_runs(db: Reader) -> list[Run]:
    return await entities.in_order(db, Run, t.runs.c.status.in_([s.value for s in ACTIVE_RUN_STATUSES]))


async def run_input(db: Reader, run: Run) -> str:
    """What the run was asked so far: its user message and every steer or restart message after it."""
    messages = await entities.in_order(
        db, ConversationMessage, t.conversation_messages.c.run_id == run.id, t.conversation_messages.c.role == "user"
    )
    return "\n\n".join(m.text for m in messages)


async def attempts_of(db: Reader, run_id: uuid.UUID) -> list[RunAttempt]:
    return await entities.in_order(db, RunAttempt, t.run_attempts.c.run_id == run_id)


async def nodes_of_attempt(db: Reader, attempt_id: uuid.UUID) -> list[ExecutionNode]:
    return await entities.in_order(db, ExecutionNode, t.execution_nodes.c.attempt_id == attempt_id)

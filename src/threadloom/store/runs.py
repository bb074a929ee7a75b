"""Reads of run state that command handlers and the ingestor take under the thread lock."""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import sqlalchemy as sa

from threadloom.domain.entities import (
    AppThread,
    Checkpoint,
    CheckpointScope,
    ContextHandoff,
    ContextTransfer,
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
from threadloom.domain.statuses import (
    ACTIVE_RUN_STATUSES,
    CheckpointScopeKind,
    HandoffStatus,
    NodeStatus,
    PlanStatus,
    ProviderThreadStatus,
    ProviderTurnStatus,
    RunStatus,
    RuntimeRequestStatus,
    TransferStatus,
    TransferType,
)
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
    UNION ALL SELECT 'session', jsonb_build_object('owner', s.owner, 'status', s.status)
      FROM provider_threads pt JOIN provider_sessions s ON s.id = pt.session_id WHERE pt.id = :provider_thread
    """
)
SessionOf = tuple[uuid.UUID | None, tuple[str | None, str] | None]  # a provider thread; its session's owner, status


async def thread_state(db: Reader, thread: AppThread) -> ThreadState:
    """The thread's active run, its queue (in order) and its last run's ordinal, in one statement."""
    return (await routed_thread_state(db, thread))[0]


async def routed_thread_state(db: Reader, thread: AppThread) -> tuple[ThreadState, SessionOf]:
    """`thread_state`, and in the same statement the owner and status of the session its active provider
    thread was last live in (`workers.session_of`), which routes a new turn (sendMessage reads both)."""
    params = {
        "active": thread.active_run_id,
        "thread": thread.id,
        "queued": RunStatus.QUEUED.value,
        "provider_thread": thread.active_provider_thread_id,
    }
    active: Run | None = None
    queued: list[Run] = []
    last = 0
    session: tuple[str | None, str] | None = None
    for part, row in await db.tuples(_STATE, params):
        if part == "last":
            last = int(row)
        elif part == "active":
            active = Run.from_mapping(row)
        elif part == "session":
            session = (row["owner"], row["status"])
        else:
            queued.append(Run.from_mapping(row))
    state = ThreadState(thread=thread, active=active, queue=_queue_order(queued), last_ordinal=last)
    return state, (thread.active_provider_thread_id, session)


def _queue_order(queued: list[Run]) -> list[Run]:
    """`queue`'s order (NULL positions last, as PostgreSQL sorts them)."""
    return sorted(queued, key=lambda r: (r.queue_position is None, r.queue_position or 0, r.ordinal))


# The barrier's parts, given `a` (the run's active attempt) and :run, :thread.
_GRAPH_PARTS = """
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
    UNION ALL SELECT 'subagent_turn', to_jsonb(st) FROM provider_turns st JOIN a ON st.run_attempt_id = a.id
      WHERE st.node_id <> a.root_node_id AND st.status = :running_turn
    UNION ALL SELECT 'subagent_thread', to_jsonb(sp) FROM provider_threads sp
      JOIN execution_nodes sn ON sp.owner_node_id = sn.id JOIN a ON sn.attempt_id = a.id
      WHERE sp.status = :active_thread
"""
_GRAPH = sa.text("WITH a AS (SELECT * FROM run_attempts WHERE id = :attempt)" + _GRAPH_PARTS).bindparams(
    sa.bindparam("open_nodes", expanding=True)
)
# A run's end: the run itself, its barrier's parts, and the thread's root checkpoint scope with the
# checkpoint of the run's ordinal.
_FINISH = sa.text(
    """
    WITH rn AS (SELECT * FROM runs WHERE id = :run),
      a AS (SELECT * FROM run_attempts WHERE id = (SELECT active_attempt_id FROM rn)),
      sc AS (SELECT * FROM checkpoint_scopes WHERE thread_id = :thread AND kind = :root_scope
             ORDER BY created_at, id LIMIT 1)
    SELECT 'run' AS part, to_jsonb(rn) AS row FROM rn
    UNION ALL SELECT 'scope', to_jsonb(sc) FROM sc
    UNION ALL SELECT 'checkpoint', to_jsonb(c) FROM checkpoints c JOIN sc ON c.scope_id = sc.id
      WHERE c.ordinal = (SELECT ordinal FROM rn)
    UNION ALL"""
    + _GRAPH_PARTS
).bindparams(sa.bindparam("open_nodes", expanding=True))
_OPEN_NODES = [NodeStatus.PENDING.value, NodeStatus.RUNNING.value, NodeStatus.WAITING.value]


def _graph_params(thread: AppThread, run_id: uuid.UUID) -> dict[str, object]:
    return {
        "run": run_id,
        "thread": thread.id,
        "open_nodes": _OPEN_NODES,
        "active_plan": PlanStatus.ACTIVE.value,
        "queued": RunStatus.QUEUED.value,
        "pending": RuntimeRequestStatus.PENDING.value,
        "running_turn": ProviderTurnStatus.RUNNING.value,
        "active_thread": ProviderThreadStatus.ACTIVE.value,
    }


def _graph(thread: AppThread, run: Run, found: dict[str, list[dict[str, object]]]) -> RunGraph:
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
        subagent_threads=each("subagent_thread", ProviderThread),
        subagent_turns=each("subagent_turn", ProviderTurn),
    )


async def run_graph(db: Reader, thread: AppThread, run: Run) -> RunGraph:
    """Everything the completion barrier closes, in one statement (a run's end waits for it): the
    same rows as one read per part, each part in id order, the queue in its order."""
    found: dict[str, list[dict[str, object]]] = {}
    for part, row in await db.tuples(_GRAPH, {"attempt": run.active_attempt_id, **_graph_params(thread, run.id)}):
        found.setdefault(part, []).append(row)
    return _graph(thread, run, found)


@dataclasses.dataclass(frozen=True, slots=True)
class FinishFacts:
    """What a run's end reads under the thread lock: the run (None: no such run), the thread's root
    checkpoint scope and its checkpoint of the run's ordinal, and the parts of the barrier's graph."""

    run: Run | None
    scope: CheckpointScope | None
    checkpoint: Checkpoint | None
    _thread: AppThread
    _parts: dict[str, list[dict[str, object]]]

    def graph(self) -> RunGraph:
        """The run's `RunGraph` (as `run_graph` reads it); LookupError without its attempt or root node."""
        if self.run is None:
            raise LookupError("no run")
        return _graph(self._thread, self.run, self._parts)


async def finish_facts(db: Reader, thread: AppThread, run_id: uuid.UUID) -> FinishFacts:
    """`FinishFacts` in one statement: a run's end reads its run, graph and checkpoint slot at once."""
    found: dict[str, list[dict[str, object]]] = {}
    params = {"root_scope": CheckpointScopeKind.ROOT_RUN.value, **_graph_params(thread, run_id)}
    for part, row in await db.tuples(_FINISH, params):
        found.setdefault(part, []).append(row)

    def single(part: str, cls: type[entities.R]) -> entities.R | None:
        rows = found.pop(part, None)
        return cls.from_mapping(rows[0]) if rows else None

    run, scope, checkpoint = single("run", Run), single("scope", CheckpointScope), single("checkpoint", Checkpoint)
    return FinishFacts(run, scope, checkpoint, thread, found)


_TURN_START = sa.text(
    """
    WITH r AS (SELECT * FROM runs WHERE id = :run)
    SELECT 'run' AS part, to_jsonb(r) AS row FROM r
    UNION ALL SELECT 'attempt', to_jsonb(a) FROM run_attempts a JOIN r ON a.id = r.active_attempt_id
    UNION ALL SELECT 'message', to_jsonb(m) FROM conversation_messages m JOIN r ON m.id = r.user_message_id
    UNION ALL SELECT 'project', to_jsonb(p) FROM projects p WHERE p.id = :project
    UNION ALL SELECT 'provider_thread', to_jsonb(pt) FROM provider_threads pt WHERE pt.id = :provider_thread
    UNION ALL SELECT 'handoff', to_jsonb(h) FROM context_handoffs h
      WHERE h.to_provider_thread_id = :provider_thread AND h.status = :pending_handoff
    UNION ALL SELECT 'merge', to_jsonb(x) FROM context_transfers x
      WHERE x.thread_id = :thread AND x.type = :merge_back AND x.status = :pending_transfer
    UNION ALL SELECT 'baseline', to_jsonb(EXISTS (
      SELECT 1 FROM checkpoints c JOIN checkpoint_scopes s ON c.scope_id = s.id JOIN r ON c.ordinal = r.ordinal - 1
      WHERE s.thread_id = :thread AND s.kind = :root_scope))
    UNION ALL SELECT 'last_turn', to_jsonb(coalesce(max(t.ordinal), 0)) FROM provider_turns t
      WHERE t.provider_thread_id = :provider_thread
    """
)


@dataclasses.dataclass(frozen=True, slots=True)
class TurnStart:
    """What a turn's start reads first (each None when missing): the run, its active attempt and its
    message, the thread's project and active provider thread; and what its preparing asks next, for that
    provider thread (`rollback_facts.pending_handoffs`, `next_turn_ordinal` less one) and the thread
    (`forks.merges` into it, and whether its root scope holds the run's previous checkpoint)."""

    run: Run | None
    attempt: RunAttempt | None
    message: ConversationMessage | None
    project: Project | None
    provider_thread: ProviderThread | None
    handoffs: list[ContextHandoff]
    merges: list[ContextTransfer]
    baseline: bool
    last_turn: int


async def turn_start(db: Reader, thread: AppThread, run_id: uuid.UUID) -> TurnStart:
    """`TurnStart` in one statement (what used to be nine reads)."""
    params = {
        "run": run_id,
        "thread": thread.id,
        "project": thread.project_id,
        "provider_thread": thread.active_provider_thread_id,
        "pending_handoff": HandoffStatus.PENDING.value,
        "merge_back": TransferType.MERGE_BACK.value,
        "pending_transfer": TransferStatus.PENDING.value,
        "root_scope": CheckpointScopeKind.ROOT_RUN.value,
    }
    rows: dict[str, list[Any]] = {}
    for part, row in await db.tuples(_TURN_START, params):
        rows.setdefault(part, []).append(row)

    def one(part: str, cls: type[entities.R]) -> entities.R | None:
        return cls.from_mapping(rows[part][0]) if part in rows else None

    handoffs = sorted(map(ContextHandoff.from_mapping, rows.get("handoff", [])), key=lambda h: (h.created_at, h.id))
    merges = sorted(map(ContextTransfer.from_mapping, rows.get("merge", [])), key=lambda x: (x.created_at, x.id))
    return TurnStart(
        one("run", Run),
        one("attempt", RunAttempt),
        one("message", ConversationMessage),
        one("project", Project),
        one("provider_thread", ProviderThread),
        handoffs,
        merges,
        bool(rows["baseline"][0]) if "baseline" in rows else False,
        int(rows["last_turn"][0]) if "last_turn" in rows else 0,
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


async def started_after(db: Reader, run: Run) -> list[Run]:
    """The other runs of `run`'s thread that started a turn after it did (all that started, when it never did),
    in creation order (retryRun's check, `domain.retries.newer_ran`)."""
    later = [t.runs.c.started_at > run.started_at] if run.started_at is not None else []
    return await entities.in_order(
        db, Run, t.runs.c.thread_id == run.thread_id, t.runs.c.id != run.id, t.runs.c.started_at.is_not(None), *later
    )

"""Reads of run state that command handlers and the ingestor take under the thread lock."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from threadloom.domain.entities import (
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
from threadloom.domain.runs import RunGraph
from threadloom.domain.statuses import ACTIVE_RUN_STATUSES, NodeStatus, PlanStatus, RunStatus, RuntimeRequestStatus
from threadloom.domain.threads import ThreadState
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader


async def queue(db: Reader, thread_id: uuid.UUID) -> list[Run]:
    return await entities.where(
        db,
        Run,
        t.runs.c.thread_id == thread_id,
        t.runs.c.status == RunStatus.QUEUED.value,
        order_by=[t.runs.c.queue_position, t.runs.c.ordinal],
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


async def thread_state(db: Reader, thread: AppThread) -> ThreadState:
    last = await db.scalar(
        sa.select(sa.func.coalesce(sa.func.max(t.runs.c.ordinal), 0)).where(t.runs.c.thread_id == thread.id)
    )
    return ThreadState(
        thread=thread,
        active=await entities.get(db, Run, thread.active_run_id),
        queue=await queue(db, thread.id),
        last_ordinal=int(last),
    )


async def run_graph(db: Reader, thread: AppThread, run: Run) -> RunGraph:
    attempt = await entities.require(db, RunAttempt, run.active_attempt_id)
    root = await entities.require(db, ExecutionNode, attempt.root_node_id)
    open_statuses = [NodeStatus.PENDING.value, NodeStatus.RUNNING.value, NodeStatus.WAITING.value]
    return RunGraph(
        thread=thread,
        run=run,
        attempt=attempt,
        root=root,
        turn=await entities.get(db, ProviderTurn, attempt.provider_turn_id),
        provider_thread=await entities.get(db, ProviderThread, attempt.provider_thread_id),
        open_messages=await entities.in_order(
            db,
            ConversationMessage,
            t.conversation_messages.c.run_id == run.id,
            t.conversation_messages.c.streaming.is_(True),
        ),
        open_children=await entities.in_order(
            db,
            ExecutionNode,
            t.execution_nodes.c.attempt_id == attempt.id,
            t.execution_nodes.c.id != root.id,
            t.execution_nodes.c.status.in_(open_statuses),
        ),
        active_plans=await entities.in_order(
            db, PlanArtifact, t.plan_artifacts.c.run_id == run.id, t.plan_artifacts.c.status == PlanStatus.ACTIVE.value
        ),
        queue=await queue(db, thread.id),
        pending_requests=await entities.in_order(
            db,
            RuntimeRequest,
            t.runtime_requests.c.run_id == run.id,
            t.runtime_requests.c.status == RuntimeRequestStatus.PENDING.value,
        ),
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

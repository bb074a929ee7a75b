"""Reading what a rollback is planned from, and the record of the last rollback (for its undo).

Everything is read under the thread's lock by the rollback command, so the plan and the state it changes are
the same. The facts are the planner's (`domain.rollback`): runs with their root turns, provider threads,
checkpoints with the run they belong to.
"""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa

from threadloom.domain.entities import (
    Activity,
    Checkpoint,
    CheckpointScope,
    ContextHandoff,
    ContextTransfer,
    ProviderThread,
    ProviderTurn,
    Run,
    RunAttempt,
)
from threadloom.domain.statuses import HandoffStatus, TransferType
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader


async def runs_of(db: Reader, thread_id: uuid.UUID) -> list[Run]:
    return await entities.where(db, Run, t.runs.c.thread_id == thread_id, order_by=[t.runs.c.ordinal])


async def root_turns(db: Reader, thread_id: uuid.UUID) -> list[tuple[uuid.UUID, ProviderTurn]]:
    """(run id, turn) for every root provider turn of every attempt of the thread's runs, by turn ordinal.

    A root turn is the one an attempt started on its root node; a subagent's child turns are not the thread's
    conversation and are left out."""
    attempts = t.run_attempts
    turns = t.provider_turns
    rows = await db.rows(
        sa.select(turns, attempts.c.run_id.label("owning_run_id"))
        .select_from(turns.join(attempts, attempts.c.id == turns.c.run_attempt_id))
        .where(turns.c.thread_id == thread_id, turns.c.node_id == attempts.c.root_node_id)
        .order_by(turns.c.ordinal, turns.c.id)
    )
    found: list[tuple[uuid.UUID, ProviderTurn]] = []
    for row in rows:
        values = {k: v for k, v in row.items() if k != "owning_run_id"}
        found.append((row["owning_run_id"], ProviderTurn.from_mapping(values)))
    return found


async def provider_threads_of(db: Reader, thread_id: uuid.UUID) -> list[ProviderThread]:
    return await entities.where(
        db, ProviderThread, t.provider_threads.c.thread_id == thread_id, order_by=[t.provider_threads.c.created_at]
    )


async def checkpoints_of(db: Reader, thread_id: uuid.UUID) -> list[tuple[Checkpoint, CheckpointScope]]:
    """Every checkpoint of the thread with its scope, oldest first."""
    checkpoints = await entities.where(
        db, Checkpoint, t.checkpoints.c.thread_id == thread_id, order_by=[t.checkpoints.c.created_at]
    )
    scopes = {s.id: s for s in await scopes_of(db, thread_id)}
    return [(c, scopes[c.scope_id]) for c in checkpoints if c.scope_id in scopes]


async def scopes_of(db: Reader, thread_id: uuid.UUID) -> list[CheckpointScope]:
    return await entities.where(db, CheckpointScope, t.checkpoint_scopes.c.thread_id == thread_id)


async def attempts_of(db: Reader, run_ids: list[uuid.UUID]) -> list[RunAttempt]:
    if not run_ids:
        return []
    return await entities.where(db, RunAttempt, t.run_attempts.c.run_id.in_(run_ids))


async def last_activity(db: Reader, thread_id: uuid.UUID, kinds: list[str]) -> Activity | None:
    """The thread's newest activity of one of these kinds."""
    table = t.activities
    row = await db.one_or_none(
        sa.select(table)
        .where(table.c.thread_id == thread_id, table.c.kind.in_(kinds))
        .order_by(table.c.sequence.desc())
        .limit(1)
    )
    return None if row is None else Activity.from_mapping(row)


async def activities_of_operation(db: Reader, thread_id: uuid.UUID, operation_id: str) -> list[Activity]:
    """The rollback activities (started, completed, failed) of one operation, newest first."""
    table = t.activities
    kinds = ["rollback.started", "rollback.completed", "rollback.failed"]
    rows = await db.rows(
        sa.select(table)
        .where(
            table.c.thread_id == thread_id,
            table.c.kind.in_(kinds),
            table.c.payload["operationId"].astext == operation_id,
        )
        .order_by(table.c.sequence.desc())
    )
    return [Activity.from_mapping(row) for row in rows]


async def rollbacks_under_way(db: Reader) -> list[Activity]:
    """The `rollback.started` records of every thread still ROLLING_BACK (its operation not over)."""
    table, threads = t.activities, t.threads
    rows = await db.rows(
        sa.select(table)
        .join(threads, threads.c.id == table.c.thread_id)
        .where(
            threads.c.rollback_operation_id.is_not(None),
            table.c.kind == "rollback.started",
            table.c.payload["operationId"].astext == sa.cast(threads.c.rollback_operation_id, sa.Text),
        )
    )
    return [Activity.from_mapping(row) for row in rows]


def payload(activity: Activity) -> dict[str, Any]:
    return dict(activity.payload) if isinstance(activity.payload, dict) else {}


async def pending_handoffs(db: Reader, provider_thread_id: uuid.UUID) -> list[ContextHandoff]:
    """The handoffs waiting to go to this provider thread with its next turn, oldest first (a rollback's
    replacement, a portable fork, merge-backs, a provider switch)."""
    return await handoffs_to(db, provider_thread_id, HandoffStatus.PENDING)


async def handoffs_to(db: Reader, provider_thread_id: uuid.UUID, status: HandoffStatus) -> list[ContextHandoff]:
    """The handoffs for this provider thread in `status`, oldest first."""
    c = t.context_handoffs.c
    to_it = c.to_provider_thread_id == provider_thread_id
    return await entities.where(db, ContextHandoff, to_it, c.status == status.value, order_by=[c.created_at, c.id])


async def pending_results_asked_by(db: Reader, thread_id: uuid.UUID, run_ids: list[uuid.UUID]) -> list[ContextHandoff]:
    """The thread's pending handoffs of the results of tasks that these runs delegated (each task's subagent
    node on the thread belongs to the run that delegated it), oldest first."""
    if not run_ids:
        return []
    c, tr = t.context_handoffs.c, t.context_transfers.c
    result = sa.select(tr.id).where(tr.id == c.transfer_id, tr.type == TransferType.SUBAGENT_RESULT.value)
    asked = result.where(_asked_by(run_ids)).exists()
    return await entities.where(
        db,
        ContextHandoff,
        c.thread_id == thread_id,
        c.status == HandoffStatus.PENDING.value,
        asked,
        order_by=[c.created_at, c.id],
    )


def _asked_by(run_ids: list[uuid.UUID]) -> sa.ColumnElement[bool]:
    """A `context_transfers` row is the result of a task one of these runs delegated: the task's subagent node
    on the transfer's thread belongs to that run."""
    tr, n = t.context_transfers.c, t.execution_nodes.c
    same_task = sa.and_(n.thread_id == tr.thread_id, n.child_thread_id == tr.source_thread_id)
    return sa.select(n.id).where(same_task, n.run_id.in_(run_ids)).exists()


async def untold_results_asked_by(db: Reader, thread_id: uuid.UUID, run_ids: list[uuid.UUID]) -> list[ContextTransfer]:
    """The results of tasks these runs delegated that arrived while the runs stood rolled back (`wake` "undone")
    and were never handed to the thread's agent, oldest first: an undo of that rollback tells them."""
    if not run_ids:
        return []
    tr, h = t.context_transfers.c, t.context_handoffs.c
    return await entities.where(
        db,
        ContextTransfer,
        tr.thread_id == thread_id,
        tr.type == TransferType.SUBAGENT_RESULT.value,
        tr.source_point["wake"].astext == "undone",
        _asked_by(run_ids),
        ~sa.select(h.id).where(h.transfer_id == tr.id).exists(),
        order_by=[tr.created_at, tr.id],
    )


async def pending_own_handoffs(db: Reader, thread_id: uuid.UUID) -> list[ContextHandoff]:
    """The thread's pending handoffs that tell of its own runs, oldest first: made without a transfer (a
    rollback's) or by a transfer from the thread to itself (a provider switch). A fork's context and a
    merge-back tell of another thread's runs, so their ordinals are not this thread's (`domain.handoff_rollback`)."""
    c, tr = t.context_handoffs.c, t.context_transfers.c
    own_transfer = sa.select(tr.id).where(tr.id == c.transfer_id, tr.source_thread_id == thread_id).exists()
    return await entities.where(
        db,
        ContextHandoff,
        c.thread_id == thread_id,
        c.status == HandoffStatus.PENDING.value,
        sa.or_(c.transfer_id.is_(None), own_transfer),
        order_by=[c.created_at, c.id],
    )


async def handoffs_by_id(db: Reader, ids: list[uuid.UUID]) -> list[ContextHandoff]:
    """These handoffs (those that exist), oldest first."""
    if not ids:
        return []
    c = t.context_handoffs.c
    return await entities.where(db, ContextHandoff, c.id.in_(ids), order_by=[c.created_at, c.id])

"""Reads of checkpoint scopes and checkpoints that the capture steps take (under the thread lock or before it)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from threadloom.domain.entities import AppThread, Checkpoint, CheckpointScope, ContextTransfer
from threadloom.domain.forks import ForkPoint
from threadloom.domain.statuses import CheckpointScopeKind
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader


async def root_scope(db: Reader, thread_id: uuid.UUID) -> CheckpointScope | None:
    """The thread's root scope (one per thread, created with its first checkpoint)."""
    found = await entities.where(
        db,
        CheckpointScope,
        t.checkpoint_scopes.c.thread_id == thread_id,
        t.checkpoint_scopes.c.kind == CheckpointScopeKind.ROOT_RUN.value,
        order_by=[t.checkpoint_scopes.c.created_at, t.checkpoint_scopes.c.id],
    )
    return found[0] if found else None


async def root_has(db: Reader, thread_id: uuid.UUID, ordinal: int) -> bool:
    """Whether the thread's root scope holds checkpoint `ordinal` (one statement: a turn's start asks)."""
    scopes, checkpoints = t.checkpoint_scopes, t.checkpoints
    found = sa.exists().where(
        checkpoints.c.scope_id == scopes.c.id,
        checkpoints.c.ordinal == ordinal,
        scopes.c.thread_id == thread_id,
        scopes.c.kind == CheckpointScopeKind.ROOT_RUN.value,
    )
    return bool(await db.scalar(sa.select(found)))


async def node_scope(db: Reader, node_id: uuid.UUID) -> CheckpointScope | None:
    found = await entities.where(db, CheckpointScope, t.checkpoint_scopes.c.node_id == node_id)
    return found[0] if found else None


async def child_scopes_of_run(db: Reader, run_id: uuid.UUID) -> list[CheckpointScope]:
    """The child scopes opened during a run (its subagents')."""
    return await entities.in_order(
        db,
        CheckpointScope,
        t.checkpoint_scopes.c.run_id == run_id,
        t.checkpoint_scopes.c.kind == CheckpointScopeKind.SUBAGENT.value,
    )


async def of_scope(db: Reader, scope_id: uuid.UUID) -> list[Checkpoint]:
    """A scope's checkpoints by ordinal."""
    return await entities.where(
        db, Checkpoint, t.checkpoints.c.scope_id == scope_id, order_by=[t.checkpoints.c.ordinal]
    )


async def fork_point_checkpoint(db: Reader, thread: AppThread) -> Checkpoint | None:
    """The checkpoint a fork was made at (its files are the fork's starting files), if any."""
    transfer = await entities.get(db, ContextTransfer, thread.forked_from_transfer_id)
    if transfer is None:
        return None
    return await entities.get(db, Checkpoint, ForkPoint.from_json(transfer.source_point).checkpoint_id)

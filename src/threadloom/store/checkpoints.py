"""Reads of checkpoint scopes and checkpoints that the capture steps take (under the thread lock or before it)."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from threadloom.domain.entities import AppThread, Checkpoint, CheckpointScope, ContextTransfer, Project, Run
from threadloom.domain.forks import ForkPoint
from threadloom.domain.statuses import CheckpointScopeKind, CheckpointStatus
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


_RUN_END = sa.text(
    """
    SELECT to_jsonb(r) AS run, to_jsonb(th) AS thread, to_jsonb(p) AS project,
      (SELECT to_jsonb(c) FROM checkpoints c
        WHERE c.scope_id = (SELECT s.id FROM checkpoint_scopes s WHERE s.thread_id = r.thread_id AND s.kind = :root
                            ORDER BY s.created_at, s.id LIMIT 1)
          AND c.ordinal < r.ordinal AND c.status = :ready AND c.ref IS NOT NULL AND c.ref <> ''
        ORDER BY c.ordinal DESC LIMIT 1) AS base
    FROM runs r JOIN threads th ON th.id = r.thread_id JOIN projects p ON p.id = th.project_id
    WHERE r.id = :run
    """
)


async def run_end_facts(db: Reader, run_id: uuid.UUID) -> tuple[Run, AppThread, Project, Checkpoint | None] | None:
    """What a run's end capture reads, in one statement: the run, its thread and project (the workspace),
    and the checkpoint its capture diffs against (`domain.checkpoints.base_of` of the run's ordinal)."""
    params = {"run": run_id, "root": CheckpointScopeKind.ROOT_RUN.value, "ready": CheckpointStatus.READY.value}
    row = await db.one_or_none(_RUN_END, params)
    if row is None:
        return None
    base = Checkpoint.from_mapping(row["base"]) if row["base"] is not None else None
    thread, project = AppThread.from_mapping(row["thread"]), Project.from_mapping(row["project"])
    return Run.from_mapping(row["run"]), thread, project, base


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

"""Reads a fork needs: a thread's runs with their checkpoints, a provider thread's turns, a run's last turn."""

from __future__ import annotations

import uuid

from threadloom.domain.entities import Checkpoint, ContextTransfer, ProviderTurn, Run, RunAttempt
from threadloom.domain.statuses import TransferStatus, TransferType
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader


async def runs_with_checkpoints(db: Reader, thread_id: uuid.UUID) -> list[tuple[Run, Checkpoint | None]]:
    """Every run of the thread with its end checkpoint (two statements)."""
    runs = await entities.where(db, Run, t.runs.c.thread_id == thread_id, order_by=[t.runs.c.ordinal])
    ids = [r.checkpoint_id for r in runs if r.checkpoint_id is not None]
    found = await entities.where(db, Checkpoint, t.checkpoints.c.id.in_(ids)) if ids else []
    by_id = {c.id: c for c in found}
    return [(r, by_id.get(r.checkpoint_id) if r.checkpoint_id else None) for r in runs]


async def last_turn(db: Reader, run: Run) -> ProviderTurn | None:
    """The provider turn of the run's current attempt (the turn a native fork cuts after)."""
    attempt = await entities.get(db, RunAttempt, run.active_attempt_id)
    return await entities.get(db, ProviderTurn, attempt.provider_turn_id if attempt else None)


async def run_of_turn(db: Reader, turn: ProviderTurn) -> Run | None:
    attempt = await entities.get(db, RunAttempt, turn.run_attempt_id)
    return await entities.get(db, Run, attempt.run_id if attempt else None)


async def latest_turn(db: Reader, provider_thread_id: uuid.UUID) -> ProviderTurn | None:
    table = t.provider_turns
    turns = await entities.where(
        db, ProviderTurn, table.c.provider_thread_id == provider_thread_id, order_by=[table.c.ordinal.desc()]
    )
    return turns[0] if turns else None


async def pending_fork(db: Reader, transfer_id: uuid.UUID | None) -> ContextTransfer | None:
    """The fork transfer a thread's first run still has to resolve, if any."""
    transfer = await entities.get(db, ContextTransfer, transfer_id)
    if transfer is None or transfer.type != TransferType.FORK or transfer.status != TransferStatus.PENDING:
        return None
    return transfer


async def merges(
    db: Reader, *, into: uuid.UUID | None = None, of_fork: uuid.UUID | None = None
) -> list[ContextTransfer]:
    """MERGE_BACK transfers into a thread (pending ones only) or of a fork (all), oldest first."""
    table = t.context_transfers
    where = [table.c.type == TransferType.MERGE_BACK.value]
    if into is not None:
        where += [table.c.thread_id == into, table.c.status == TransferStatus.PENDING.value]
    if of_fork is not None:
        where.append(table.c.source_thread_id == of_fork)
    return await entities.where(db, ContextTransfer, *where, order_by=[table.c.created_at, table.c.id])

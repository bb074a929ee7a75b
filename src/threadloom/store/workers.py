"""Server processes and their liveness (an advisory lock per process, see tables.workers)."""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Sequence
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncConnection

from threadloom.store import tables as t
from threadloom.store.db import Reader


def alive_sql(alias: str) -> str:
    """SQL condition: the worker row `alias` still holds its advisory lock."""
    return (
        "EXISTS (SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.granted "
        "AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        f"AND l.classid = {t.WORKER_LOCK_SPACE} AND l.objid = {alias}.lock_no::oid AND l.objsubid = 2)"
    )


_HELD = sa.text(alive_sql("workers"))


async def register(conn: AsyncConnection, worker_id: uuid.UUID, now: datetime) -> int:
    """Insert this process's row and take its lock on `conn`, which must stay open for the process's life."""
    result = await conn.execute(
        sa.insert(t.workers)
        .values(id=worker_id, host=socket.gethostname(), pid=os.getpid(), started_at=now)
        .returning(t.workers.c.lock_no)
    )
    lock_no = int(result.scalar_one())
    await conn.commit()
    await conn.execute(sa.select(sa.func.pg_advisory_lock(t.WORKER_LOCK_SPACE, lock_no)))
    await conn.commit()
    return lock_no


async def ping(conn: AsyncConnection) -> None:
    """One round trip on the lock's connection (raises if it broke); leaves no transaction open."""
    await conn.execute(sa.text("SELECT 1"))
    await conn.rollback()


async def mark_stopped(db: Reader, worker_id: uuid.UUID, now: datetime) -> None:
    await db.execute(sa.update(t.workers).where(t.workers.c.id == worker_id).values(stopped_at=now))


async def alive(db: Reader, worker_ids: Sequence[uuid.UUID]) -> set[uuid.UUID]:
    if not worker_ids:
        return set()
    rows = await db.rows(sa.select(t.workers.c.id).where(t.workers.c.id.in_(list(set(worker_ids))), _HELD))
    return {r["id"] for r in rows}


_SESSION_OF = sa.text(
    "SELECT s.owner, s.status FROM provider_threads pt JOIN provider_sessions s ON s.id = pt.session_id "
    "WHERE pt.id = :provider_thread"
)


async def session_of(db: Reader, provider_thread_id: uuid.UUID) -> tuple[str | None, str] | None:
    """The owner and status of the session a provider thread was last live in, in one statement (a
    sendMessage routes its turn by it); None when it has none."""
    row = await db.one_or_none(_SESSION_OF, {"provider_thread": provider_thread_id})
    return None if row is None else (row["owner"], row["status"])


def alive_clause(worker_id_column: sa.ColumnElement[uuid.UUID]) -> sa.ColumnElement[bool]:
    """SQL: the worker in `worker_id_column` is alive."""
    return sa.exists(sa.select(1).select_from(t.workers).where(t.workers.c.id == worker_id_column, _HELD))

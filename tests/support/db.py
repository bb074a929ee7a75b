"""Helpers to look at the database the way an auditor would."""

from __future__ import annotations

import uuid
from typing import Any

import sqlalchemy as sa

from threadloom.store import log
from threadloom.store import tables as t
from threadloom.store.db import Database


async def snapshot(db: Database) -> dict[str, list[dict[str, Any]]]:
    """Every projection row, sorted by id: comparable across rebuilds."""
    out: dict[str, list[dict[str, Any]]] = {}
    async with db.read() as r:
        for table in t.PROJECTIONS.values():
            rows = await r.rows(sa.select(table).order_by(table.c.id))
            out[table.name] = [dict(row) for row in rows]
    return out


async def assert_log_replays(database_url: str) -> None:
    """The event log, replayed, makes the projections as they are (the server writing to it is stopped)."""
    db = Database.from_url(database_url)
    try:
        live = await snapshot(db)
        async with db.transaction() as tx:
            await log.rebuild_projections(tx)
        assert await snapshot(db) == live
    finally:
        await db.dispose()


async def count(db: Database, table: sa.Table) -> int:
    async with db.read() as r:
        return int(await r.scalar(sa.select(sa.func.count()).select_from(table)))


async def sequences(db: Database) -> dict[Any, list[int]]:
    async with db.read() as r:
        rows = await r.rows(
            sa.select(t.events.c.thread_id, t.events.c.sequence)
            .where(t.events.c.thread_id.is_not(None))
            .order_by(t.events.c.thread_id, t.events.c.sequence)
        )
    out: dict[Any, list[int]] = {}
    for row in rows:
        out.setdefault(row["thread_id"], []).append(row["sequence"])
    return out


async def troubled_effects(database_url: str) -> list[dict[str, Any]]:
    """Outbox effects that went wrong, as an auditor reads them: failed for good, waiting to retry after an
    error, or done only after a retry (`attempts` > 1: a claim after a failure, or after a lost worker)."""
    db = Database.from_url(database_url)
    try:
        async with db.read() as r:
            rows = await r.rows(
                sa.select(
                    t.effects.c.id,
                    t.effects.c.kind,
                    t.effects.c.status,
                    t.effects.c.attempts,
                    t.effects.c.last_error,
                )
                .where(
                    (t.effects.c.status == "failed") | t.effects.c.last_error.is_not(None) | (t.effects.c.attempts > 1)
                )
                .order_by(t.effects.c.id)
            )
        return [dict(row) for row in rows]
    finally:
        await db.dispose()


async def unfinished_effects(database_url: str, thread_ids: list[str]) -> int:
    """How many effects of these threads (uuids) are still to run or running."""
    db = Database.from_url(database_url)
    try:
        async with db.read() as r:
            query = (
                sa.select(sa.func.count())
                .select_from(t.effects)
                .where(t.effects.c.status.in_(("pending", "running")))
                .where(t.effects.c.thread_id.in_([uuid.UUID(i) for i in thread_ids]))
            )
            return int(await r.scalar(query))
    finally:
        await db.dispose()

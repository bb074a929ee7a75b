"""Helpers to look at the database the way an auditor would."""

from __future__ import annotations

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

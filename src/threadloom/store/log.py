"""The append-only event log and its projections, written in the caller's transaction.

Per-thread `sequence` numbers are taken from `threads.last_sequence` while the caller
holds the thread's row lock, so they are gapless and in commit order. The global
`position` is an identity column; readers of cross-thread feeds only read below the
oldest in-flight writer's transaction id (see `reads.project_feed`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert

from threadloom.domain.changes import Change
from threadloom.domain.entities import (
    ENTITY_BY_TYPE,
    Activity,
    AppThread,
    ExecutionNode,
    Run,
)
from threadloom.domain.records import Record
from threadloom.store import tables as t
from threadloom.store.db import Reader

_UPSERT_CACHE: dict[str, sa.Insert] = {}


def thread_of(entity: Record) -> uuid.UUID | None:
    """Which thread's log an entity's events belong to (None: global entities)."""
    if isinstance(entity, AppThread):
        return entity.id
    value = getattr(entity, "thread_id", None)
    return value if isinstance(value, uuid.UUID) else None


def _upsert(table: sa.Table) -> sa.Insert:
    stmt = _UPSERT_CACHE.get(table.name)
    if stmt is None:
        ins = pg_insert(table)
        columns = [c.name for c in table.columns if c.name not in ("id", "last_sequence")]
        stmt = ins.on_conflict_do_update(index_elements=["id"], set_={c: ins.excluded[c] for c in columns})
        _UPSERT_CACHE[table.name] = stmt
    return stmt


_TABLE_ORDER = {table.name: i for i, table in enumerate(t.metadata.sorted_tables)}


async def upsert_entities(db: Reader, entities: Iterable[Record]) -> None:
    """Write the latest state of each entity: one statement per table, in foreign-key order."""
    latest: dict[str, dict[uuid.UUID, Record]] = {}
    for entity in entities:
        latest.setdefault(entity.entity_type, {})[entity.id] = entity
    tables = sorted(latest, key=lambda et: _TABLE_ORDER[t.TABLE_BY_ENTITY_TYPE[et].name])
    for entity_type in tables:
        table = t.TABLE_BY_ENTITY_TYPE[entity_type]
        await db.execute(_upsert(table), [e.to_payload() for e in latest[entity_type].values()])


async def append(
    db: Reader,
    changes: Sequence[Change],
    *,
    project_id: uuid.UUID | None,
    command_id: str | None,
    now: datetime,
) -> list[int]:
    """Append events for one thread (or for no thread) and update projections.

    Returns the sequences assigned (empty for thread-less events).
    """
    if not changes:
        return []
    thread_ids = {thread_of(c.entity) for c in changes}
    if len(thread_ids) != 1:
        raise ValueError(f"one command writes one thread's log, got {thread_ids}")
    thread_id = thread_ids.pop()
    sequences: list[int | None] = [None] * len(changes)
    created_thread = False
    if thread_id is not None:
        bump = sa.update(t.threads).where(t.threads.c.id == thread_id)
        last = await db.scalar(
            bump.values(last_sequence=t.threads.c.last_sequence + len(changes)).returning(t.threads.c.last_sequence)
        )
        created_thread = last is None  # this command creates the thread: its log starts at 1
        first = 1 if created_thread else int(last) - len(changes) + 1
        sequences = list(range(first, first + len(changes)))
    stamped = [
        c.entity.evolve(sequence=seq) if isinstance(c.entity, Activity) and seq is not None else c.entity
        for c, seq in zip(changes, sequences, strict=True)
    ]
    await upsert_entities(db, stamped)
    if created_thread:
        await db.execute(sa.update(t.threads).where(t.threads.c.id == thread_id).values(last_sequence=len(changes)))
    rows: list[dict[str, Any]] = []
    for change, seq, entity in zip(changes, sequences, stamped, strict=True):
        rows.append(
            {
                "thread_id": thread_id,
                "sequence": seq,
                "project_id": project_id,
                "event_type": change.event_type,
                "entity_type": entity.entity_type,
                "entity_id": entity.id,
                "run_id": change.run_id or (entity.id if isinstance(entity, Run) else getattr(entity, "run_id", None)),
                "node_id": change.node_id
                or (entity.id if isinstance(entity, ExecutionNode) else getattr(entity, "node_id", None)),
                "command_id": command_id,
                "occurred_at": now,
                "payload": entity.to_payload(),
            }
        )
    await db.execute(sa.insert(t.events), rows)
    return [s for s in sequences if s is not None]


async def rebuild_projections(db: Reader) -> int:
    """Recreate every projection from the log, in position order. Returns events applied."""
    names = ", ".join(table.name for table in t.PROJECTIONS.values())
    await db.execute(sa.text(f"TRUNCATE {names}"))
    applied = 0
    after = 0
    while True:
        rows = await db.rows(
            sa.select(t.events.c.position, t.events.c.entity_type, t.events.c.payload)
            .where(t.events.c.position > after)
            .order_by(t.events.c.position)
            .limit(2000)
        )
        if not rows:
            break
        await upsert_entities(db, [ENTITY_BY_TYPE[r["entity_type"]].from_mapping(r["payload"]) for r in rows])
        applied += len(rows)
        after = rows[-1]["position"]
    await db.execute(
        sa.text(
            "UPDATE threads SET last_sequence = s.m FROM "
            "(SELECT thread_id, max(sequence) AS m FROM events WHERE thread_id IS NOT NULL "
            "GROUP BY thread_id) s WHERE threads.id = s.thread_id"
        )
    )
    return applied

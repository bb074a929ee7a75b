"""Reading the event log for live streams: per-thread pages by sequence, and the project
feed ordered by (writer transaction id, position) below the oldest in-flight writer."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

import sqlalchemy as sa

from threadloom.domain.statuses import TERMINAL_RUN_STATUSES
from threadloom.store import tables as t
from threadloom.store.db import Reader


@dataclasses.dataclass(frozen=True, slots=True)
class LogEvent:
    sequence: int
    thread_id: uuid.UUID
    project_id: uuid.UUID | None
    event_type: str
    entity_type: str
    entity_id: uuid.UUID
    run_id: uuid.UUID | None
    node_id: uuid.UUID | None
    occurred_at: datetime
    payload: dict[str, Any]
    xid: int = 0
    position: int = 0
    # Objects built from this row once and shared by every subscriber it fans out to.
    shared: dict[str, Any] = dataclasses.field(default_factory=dict, compare=False, repr=False)


# The columns a LogEvent carries (`shared` is built later, in memory).
_COLUMNS = tuple(t.events.c[f.name] for f in dataclasses.fields(LogEvent) if f.name != "shared")


def _event(row: sa.RowMapping) -> LogEvent:
    return LogEvent(**{k: row[k] for k in row.keys()})  # noqa: SIM118 - RowMapping keys


async def thread_events(
    db: Reader, thread_id: uuid.UUID, after: int, *, before: int | None = None, limit: int = 500
) -> list[LogEvent]:
    conds = [t.events.c.thread_id == thread_id, t.events.c.sequence > after]
    if before is not None:
        conds.append(t.events.c.sequence < before)
    rows = await db.rows(sa.select(*_COLUMNS).where(*conds).order_by(t.events.c.sequence).limit(limit))
    return [_event(r) for r in rows]


_BATCH = (
    sa.text(
        f"SELECT e.* FROM unnest(CAST(:ids AS uuid[]), CAST(:afters AS bigint[])) AS c(tid, after) "
        f"CROSS JOIN LATERAL (SELECT {', '.join(c.name for c in _COLUMNS)} FROM events "
        f"WHERE events.thread_id = c.tid AND events.sequence > c.after ORDER BY events.sequence LIMIT :lim) AS e"
    )
    .columns(*_COLUMNS)
)


async def threads_events(db: Reader, afters: dict[uuid.UUID, int], *, limit: int = 500) -> list[LogEvent]:
    """`thread_events` for many threads at once (each after its own cursor, at most `limit` rows each):
    one statement for every feed a burst of wake-ups woke."""
    rows = await db.tuples(_BATCH, {"ids": list(afters), "afters": list(afters.values()), "lim": limit})
    make = cast(Callable[..., LogEvent], LogEvent)
    return [make(*row) for row in rows]


_HEADS = tuple(c for c in _COLUMNS if c.name != "payload")
_PAYLOAD_AT = [c.name for c in _COLUMNS].index("payload")


async def thread_event_heads(db: Reader, thread_id: uuid.UUID, after: int, *, limit: int = 500) -> list[LogEvent]:
    """Like `thread_events` without the payloads (left empty): for readers that never look inside them."""
    rows = await db.tuples(
        sa.select(*_HEADS)
        .where(t.events.c.thread_id == thread_id, t.events.c.sequence > after)
        .order_by(t.events.c.sequence)
        .limit(limit)
    )
    cut, make = _PAYLOAD_AT, cast(Callable[..., LogEvent], LogEvent)
    return [make(*row[:cut], {}, *row[cut:]) for row in rows]


async def latest_sequence(db: Reader, thread_id: uuid.UUID) -> int:
    return int(await db.scalar(sa.select(t.threads.c.last_sequence).where(t.threads.c.id == thread_id)) or 0)


async def thread_head(db: Reader, thread_id: uuid.UUID) -> tuple[int, uuid.UUID | None]:
    """The thread's latest sequence and its project (None: no such thread)."""
    columns = (t.threads.c.last_sequence, t.threads.c.project_id)
    row = await db.one_or_none(sa.select(*columns).where(t.threads.c.id == thread_id))
    return (0, None) if row is None else (int(row["last_sequence"] or 0), uuid.UUID(str(row["project_id"])))


_VISIBLE = sa.text("events.xid < (pg_snapshot_xmin(pg_current_snapshot())::text)::bigint")


async def project_events(
    db: Reader, project_id: uuid.UUID, after: tuple[int, int], *, entity_type: str = "thread", limit: int = 500
) -> list[LogEvent]:
    """Events of a project after the cursor (xid, position), only those no in-flight writer can precede."""
    cursor = sa.tuple_(t.events.c.xid, t.events.c.position) > sa.tuple_(sa.literal(after[0]), sa.literal(after[1]))
    rows = await db.rows(
        sa.select(*_COLUMNS)
        .where(t.events.c.project_id == project_id, t.events.c.entity_type == entity_type, cursor, _VISIBLE)
        .order_by(t.events.c.xid, t.events.c.position)
        .limit(limit)
    )
    return [_event(r) for r in rows]


async def project_head(db: Reader, project_id: uuid.UUID) -> tuple[int, int]:
    """The feed position now: the last event no in-flight writer can precede."""
    row = await db.one_or_none(
        sa.select(t.events.c.xid, t.events.c.position)
        .where(t.events.c.project_id == project_id, _VISIBLE)
        .order_by(t.events.c.xid.desc(), t.events.c.position.desc())
        .limit(1)
    )
    return (0, 0) if row is None else (int(row["xid"]), int(row["position"]))


async def project_backlog(db: Reader, project_id: uuid.UUID, after: tuple[int, int], *, cap: int) -> int:
    """How many feed events follow the cursor, counted up to `cap` (a bound, never the whole log)."""
    cursor = sa.tuple_(t.events.c.xid, t.events.c.position) > sa.tuple_(sa.literal(after[0]), sa.literal(after[1]))
    rows = (
        sa.select(sa.literal(1))
        .where(t.events.c.project_id == project_id, t.events.c.entity_type == "thread", cursor, _VISIBLE)
        .limit(cap)
        .subquery()
    )
    return int(await db.scalar(sa.select(sa.func.count()).select_from(rows)) or 0)


async def run_states(db: Reader, thread_id: uuid.UUID, upto: int, run_ids: list[uuid.UUID]) -> list[LogEvent]:
    """The last event of each of these runs at or below sequence `upto`: their state at that point."""
    if not run_ids:
        return []
    rows = await db.rows(
        sa.select(*_COLUMNS)
        .where(
            t.events.c.thread_id == thread_id,
            t.events.c.sequence <= upto,
            t.events.c.entity_type == "run",
            t.events.c.entity_id.in_(run_ids),
        )
        .distinct(t.events.c.entity_id)
        .order_by(t.events.c.entity_id, t.events.c.sequence.desc())
    )
    return sorted((_event(r) for r in rows), key=lambda e: e.sequence)


async def current_run_ids(db: Reader, thread_id: uuid.UUID, run_id: uuid.UUID | None) -> list[uuid.UUID]:
    """The runs a status subscription starts from: the one asked for, else the unfinished ones and the latest."""
    runs = t.runs
    if run_id is not None:
        found = await db.scalar(sa.select(runs.c.id).where(runs.c.id == run_id, runs.c.thread_id == thread_id))
        return [] if found is None else [found]
    unfinished = sa.select(runs.c.id).where(
        runs.c.thread_id == thread_id, runs.c.status.not_in([s.value for s in TERMINAL_RUN_STATUSES])
    )
    latest = sa.select(runs.c.id).where(runs.c.thread_id == thread_id).order_by(runs.c.ordinal.desc()).limit(1)
    rows = await db.rows(
        sa.select(runs.c.id).where(sa.or_(runs.c.id.in_(unfinished), runs.c.id == latest.scalar_subquery()))
    )
    return [r["id"] for r in rows]

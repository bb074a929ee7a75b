"""Reads behind the live views (streams.views): where a run or node lives, a run's node parents, the node
states of a run at a sequence, a project's whole log in feed order, and what an `after` cursor points at.

Each is one statement, whatever the size of the graph or the stream: a subtree view reads its run's
parents once and learns the rest from the rows it streams.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

import sqlalchemy as sa

from threadloom.store import tables as t
from threadloom.store.db import Reader
from threadloom.store.events import _COLUMNS, _VISIBLE, LogEvent, _event


@dataclasses.dataclass(frozen=True, slots=True)
class Place:
    """Where an object of a run lives: its thread, its project and its run (None for a run itself)."""

    thread_id: uuid.UUID
    project_id: uuid.UUID
    run_id: uuid.UUID


async def run_place(db: Reader, run_id: uuid.UUID) -> Place | None:
    row = await db.one_or_none(
        sa.select(t.runs.c.thread_id, t.threads.c.project_id)
        .join(t.threads, t.threads.c.id == t.runs.c.thread_id)
        .where(t.runs.c.id == run_id)
    )
    return None if row is None else Place(row["thread_id"], row["project_id"], run_id)


async def node_place(db: Reader, node_id: uuid.UUID) -> Place | None:
    nodes = t.execution_nodes
    row = await db.one_or_none(
        sa.select(nodes.c.thread_id, nodes.c.run_id, t.threads.c.project_id)
        .join(t.threads, t.threads.c.id == nodes.c.thread_id)
        .where(nodes.c.id == node_id)
    )
    return None if row is None else Place(row["thread_id"], row["project_id"], row["run_id"])


async def run_node_parents(db: Reader, run_id: uuid.UUID) -> dict[uuid.UUID, uuid.UUID | None]:
    """Every node of the run and its parent (the node table's (run_id, id) index)."""
    nodes = t.execution_nodes
    rows = await db.tuples(sa.select(nodes.c.id, nodes.c.parent_node_id).where(nodes.c.run_id == run_id))
    return {node: parent for node, parent in rows}


async def node_states(db: Reader, thread_id: uuid.UUID, run_id: uuid.UUID, upto: int) -> list[LogEvent]:
    """The last event of each node of the run at or below sequence `upto`: the run's graph at that point."""
    ev = t.events
    rows = await db.rows(
        sa.select(*_COLUMNS)
        .where(
            ev.c.thread_id == thread_id,
            ev.c.sequence <= upto,
            ev.c.entity_type == "execution_node",
            ev.c.run_id == run_id,
        )
        .distinct(ev.c.entity_id)
        .order_by(ev.c.entity_id, ev.c.sequence.desc())
    )
    return [_event(r) for r in rows]


async def run_start(db: Reader, thread_id: uuid.UUID, run_id: uuid.UUID) -> int:
    """The sequence just before the run's first event, whatever its entity (the user's message comes before the
    run it makes): a stream of the run replays from there; 0 if it has none."""
    ev = t.events
    first = await db.scalar(
        sa.select(sa.func.min(ev.c.sequence)).where(ev.c.thread_id == thread_id, ev.c.run_id == run_id)
    )
    return 0 if first is None else int(first) - 1


@dataclasses.dataclass(frozen=True, slots=True)
class EventPoint:
    """One event of the log, as a stream cursor names it."""

    thread_id: uuid.UUID
    project_id: uuid.UUID | None
    sequence: int
    xid: int
    position: int


_POINT = (t.events.c.thread_id, t.events.c.project_id, t.events.c.sequence, t.events.c.xid, t.events.c.position)


async def event_at(db: Reader, position: int) -> EventPoint | None:
    """The event at a log position (what a feed cursor carries), if it is a thread's."""
    row = await db.one_or_none(
        sa.select(*_POINT).where(t.events.c.position == position, t.events.c.thread_id.is_not(None))
    )
    return None if row is None else EventPoint(**row)


async def activity_event(db: Reader, activity_id: uuid.UUID) -> EventPoint | None:
    """The event that wrote an activity (an activity is written once): an activity's id is its stream cursor."""
    ev = t.events
    row = await db.one_or_none(
        sa.select(*_POINT)
        .where(ev.c.entity_id == activity_id, ev.c.entity_type == "activity", ev.c.thread_id.is_not(None))
        .order_by(ev.c.position)
        .limit(1)
    )
    return None if row is None else EventPoint(**row)


def _project_rows(project_id: uuid.UUID, after: tuple[int, int], entity_type: str | None) -> sa.Select[Any]:
    ev = t.events
    cursor = sa.tuple_(ev.c.xid, ev.c.position) > sa.tuple_(sa.literal(after[0]), sa.literal(after[1]))
    conds: list[Any] = [ev.c.project_id == project_id, ev.c.thread_id.is_not(None), cursor, _VISIBLE]
    if entity_type is not None:
        conds.append(ev.c.entity_type == entity_type)
    return sa.select(sa.literal(1)).where(*conds)


async def project_log(
    db: Reader, project_id: uuid.UUID, after: tuple[int, int], *, entity_type: str | None = None, limit: int = 500
) -> list[LogEvent]:
    """Every thread event of a project after the feed cursor (xid, position), in feed order, only those no
    in-flight writer can precede (as store.events.project_events, for every entity type)."""
    ev = t.events
    query = _project_rows(project_id, after, entity_type).with_only_columns(*_COLUMNS)
    rows = await db.rows(query.order_by(ev.c.xid, ev.c.position).limit(limit))
    return [_event(r) for r in rows]


async def project_log_backlog(
    db: Reader, project_id: uuid.UUID, after: tuple[int, int], *, cap: int, entity_type: str | None = None
) -> int:
    """How many of those events follow the cursor, counted up to `cap`."""
    rows = _project_rows(project_id, after, entity_type).limit(cap).subquery()
    return int(await db.scalar(sa.select(sa.func.count()).select_from(rows)) or 0)

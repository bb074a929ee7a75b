"""The append-only event log and its projections, written in the caller's transaction.

Per-thread `sequence` numbers are taken from `threads.last_sequence` while the caller
holds the thread's row lock, so they are gapless and in commit order. The global
`position` is an identity column; readers of cross-thread feeds only read below the
oldest in-flight writer's transaction id (see `reads.project_feed`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB
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


_EVENT_COLUMNS = (
    "thread_id",
    "sequence",
    "project_id",
    "event_type",
    "entity_type",
    "entity_id",
    "run_id",
    "node_id",
    "command_id",
    "occurred_at",
    "payload",
)
_EFFECT_COLUMNS = (
    "thread_id",
    "kind",
    "payload",
    "status",
    "replay_safe",
    "available_at",
    "command_id",
    "created_at",
    "affinity",
)
_APPEND_SQL: dict[tuple[bool, bool, tuple[str, ...], bool, bool], sa.TextClause] = {}

# One delivery per webhook event and subscribed endpoint of the project (domain.webhooks.hooks_of gives the
# events): a run's end on a subagent's thread only for endpoints that include subagents. A disabled endpoint
# gets none.
_HOOKS_CTE = (
    "wh AS (INSERT INTO webhook_deliveries (endpoint_id, project_id, thread_id, sequence, message_id, event_type, "
    "body, status, available_at, created_at) "
    "SELECT e.id, e.project_id, :hook_thread, {base} + w.\"offset\", w.message_id, w.event_type, w.body, 'pending', "
    ":hook_now, :hook_now "
    "FROM jsonb_to_recordset(CAST(:hooks AS jsonb)) AS w(\"offset\" bigint, event_type text, message_id text, "
    "body text, run_event boolean) "
    "JOIN webhook_endpoints e ON e.project_id = :hook_project AND e.status <> 'disabled' "
    "AND w.event_type = ANY(e.events) "
    "WHERE NOT w.run_event OR e.include_subagents OR NOT EXISTS ("
    "SELECT 1 FROM threads th WHERE th.id = :hook_thread AND th.lineage_relationship = 'subagent') RETURNING 1)"
)


def _entity_columns(table: sa.Table) -> list[str]:
    return [c.name for c in table.columns if c.name != "last_sequence"]


def _upsert_sql(table: sa.Table, base: str | None) -> str:
    """One table's upsert from a JSON array of payloads (`jsonb_populate_recordset` types each value
    by its column). An activity's `sequence` arrives as its offset in the command and `base` adds the
    thread's last sequence before it."""
    columns = _entity_columns(table)
    picked = ", ".join(
        f"{base} + r.sequence" if base is not None and table is t.activities and c == "sequence" else f"r.{c}"
        for c in columns
    )
    updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c != "id")
    return (
        f"INSERT INTO {table.name} ({', '.join(columns)}) SELECT {picked} "
        f"FROM jsonb_populate_recordset(NULL::{table.name}, CAST(:{table.name} AS jsonb)) r "
        f"ON CONFLICT (id) DO UPDATE SET {updates}"
    )


def _append_sql(
    threaded: bool, thread_row: bool, tables: tuple[str, ...], effects: bool, hooks: bool = False
) -> sa.TextClause:
    """The whole append as one statement (one round trip): the thread's sequence counter, every
    projection's upsert and the events, as data-modifying CTEs. Made once per shape and kept.

    Foreign keys are checked at the statement's end, so the order of the CTEs does not matter. The
    thread's row is written once: when the command changes the thread itself, its upsert also advances
    the counter (a new thread's starts at the events' count), else one UPDATE does. `effects`: the
    command's outbox rows go in too (`outbox.rows`), in order (their ids are the outbox's order). `hooks`: the
    webhook deliveries of its events (threaded commands only), at the events' sequences."""
    key = (threaded, thread_row, tables, effects, hooks)
    found = _APPEND_SQL.get(key)
    if found is not None:
        return found
    parts: list[str] = []
    base: str | None = None
    params: list[sa.BindParameter[Any]] = []
    if threaded:
        base = "(SELECT base FROM seq)"
        if thread_row:
            columns = _entity_columns(t.threads)
            updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in columns if c != "id")
            parts.append(
                f"seq AS (INSERT INTO threads AS x ({', '.join(columns)}, last_sequence) "
                f"SELECT {', '.join('r.' + c for c in columns)}, :count "
                "FROM jsonb_populate_recordset(NULL::threads, CAST(:threads AS jsonb)) r "
                f"ON CONFLICT (id) DO UPDATE SET {updates}, last_sequence = x.last_sequence + :count "
                "RETURNING x.last_sequence - :count AS base)"
            )
        else:
            parts.append(
                "seq AS (UPDATE threads SET last_sequence = last_sequence + :count WHERE id = :thread "
                "RETURNING last_sequence - :count AS base)"
            )
            params.append(sa.bindparam("thread", type_=sa.Uuid()))
        params.append(sa.bindparam("count", type_=sa.BigInteger()))
    for name in tables:
        if not (threaded and thread_row and name == t.threads.name):
            parts.append(f"u_{name} AS ({_upsert_sql(t.metadata.tables[name], base)})")
        params.append(sa.bindparam(name, type_=JSONB()))
    sequence = f"{base} + e.sequence" if base is not None else "e.sequence"
    picked = ", ".join(f"e.{c}" if c != "sequence" else sequence for c in _EVENT_COLUMNS[:-1])
    payload = (
        f"CASE WHEN e.entity_type = 'activity' THEN jsonb_set(e.payload, '{{sequence}}', to_jsonb({sequence})) "
        "ELSE e.payload END"
        if base is not None
        else "e.payload"
    )
    parts.append(
        f"ev AS (INSERT INTO events ({', '.join(_EVENT_COLUMNS)}) SELECT {picked}, {payload} "
        "FROM jsonb_populate_recordset(NULL::events, CAST(:events AS jsonb)) e)"
    )
    params.append(sa.bindparam("events", type_=JSONB()))
    if effects:
        listed = ", ".join(_EFFECT_COLUMNS)
        parts.append(
            f"fx AS (INSERT INTO effects ({listed}) SELECT {listed} "
            "FROM jsonb_populate_recordset(NULL::effects, CAST(:effects AS jsonb)))"
        )
        params.append(sa.bindparam("effects", type_=JSONB()))
    if hooks and base is not None:
        parts.append(_HOOKS_CTE.format(base=base))
        params += [
            sa.bindparam("hooks", type_=JSONB()),
            sa.bindparam("hook_thread", type_=sa.Uuid()),
            sa.bindparam("hook_project", type_=sa.Uuid()),
            sa.bindparam("hook_now", type_=sa.DateTime(timezone=True)),
        ]
    final = "SELECT base FROM seq" if threaded else "SELECT NULL::bigint AS base"
    if hooks and base is not None:
        final = "SELECT base, (SELECT count(*) FROM wh) AS delivered FROM seq"
    found = sa.text(f"WITH {', '.join(parts)} {final}").bindparams(*params)
    _APPEND_SQL[key] = found
    return found


@dataclasses.dataclass(frozen=True, slots=True)
class Appended:
    sequences: list[int]  # the thread's sequences of the events, in order (none for thread-less events)
    deliveries: int  # webhook deliveries written: one per hook and subscribed endpoint (none without endpoints)


async def append(
    db: Reader,
    changes: Sequence[Change],
    *,
    project_id: uuid.UUID | None,
    command_id: str | None,
    now: datetime,
    effects: Sequence[dict[str, Any]] = (),
    hooks: Sequence[dict[str, Any]] = (),
) -> Appended:
    """Append events for one thread (or for no thread) and update projections, in one statement, with
    the command's outbox rows when given (`outbox.rows`; written even without changes) and the webhook
    deliveries of its events (`hooks`: `domain.webhooks.Hook.row()`, for a thread's events only).

    Returns the sequences assigned (empty for thread-less events) and the deliveries written (a project
    without webhook endpoints gets none, and its sender need not be woken). The sequences follow the thread's
    `last_sequence`, advanced in the same statement under the caller's thread lock; until then
    events and activities carry their offset in the command (1, 2, ...), which the statement adds
    to the counter's value before it.
    """
    if not changes:
        if effects:
            await db.execute(sa.insert(t.effects), list(effects))
        return Appended([], 0)
    thread_ids = {thread_of(c.entity) for c in changes}
    if len(thread_ids) != 1:
        raise ValueError(f"one command writes one thread's log, got {thread_ids}")
    thread_id = thread_ids.pop()
    threaded = thread_id is not None
    offsets: list[int | None] = list(range(1, len(changes) + 1)) if threaded else [None] * len(changes)
    stamped = [
        c.entity.evolve(sequence=k) if isinstance(c.entity, Activity) and k is not None else c.entity
        for c, k in zip(changes, offsets, strict=True)
    ]
    latest: dict[str, dict[uuid.UUID, Record]] = {}
    for entity in stamped:
        latest.setdefault(entity.entity_type, {})[entity.id] = entity
    names = sorted(t.TABLE_BY_ENTITY_TYPE[et].name for et in latest)
    params: dict[str, Any] = {
        t.TABLE_BY_ENTITY_TYPE[et].name: [e.to_payload() for e in rows.values()] for et, rows in latest.items()
    }
    thread_row = threaded and t.threads.name in params
    rows: list[dict[str, Any]] = []
    for change, k, entity in zip(changes, offsets, stamped, strict=True):
        rows.append(
            {
                "thread_id": thread_id,
                "sequence": k,
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
    params["events"] = rows
    if threaded:
        params["count"] = len(changes)
        if not thread_row:
            params["thread"] = thread_id
    if effects:
        params["effects"] = list(effects)
    with_hooks = threaded and bool(hooks)
    if with_hooks:
        params.update(hooks=list(hooks), hook_thread=thread_id, hook_project=project_id, hook_now=now)
    found = await db.tuples(_append_sql(threaded, thread_row, tuple(names), bool(effects), with_hooks), params)
    if not threaded:
        return Appended([], 0)
    if not found or found[0][0] is None:
        raise LookupError(f"thread {thread_id} not found")
    base, delivered = found[0][0], found[0][1] if with_hooks else 0
    return Appended(list(range(int(base) + 1, int(base) + 1 + len(changes))), int(delivered))


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

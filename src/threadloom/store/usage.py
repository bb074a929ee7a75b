"""The usage ledger's reads: what a scope's model calls add up to, each in one statement (docs/usage.md).

Every roll-up takes many keys at once (the API's loaders batch a page of runs, threads or nodes into one
call) and an optional time window on the records' `created_at`. Delegated work counts where it was
delegated: a thread's usage holds its delegated tasks' threads (lineage SUBAGENT, recursively), a run's and a
node subtree's hold the tasks their nodes started; forks are counted apart (`forks_of_threads`).

`totals()` is the one question a budget asks: a project's, or a thread's with its delegated tasks,
optionally narrowed to one run (and the tasks it started) and to a time window.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from threadloom.domain.usage import Totals
from threadloom.store.db import Reader

# Per (key, attempt): its records' sums, and whether it holds calls whose cost is in a turn's total
# (REPORTED without a figure) but not that total (a REPORTED figure): then that part of its cost is unknown.
_INNER = """count(*) FILTER (WHERE u.input_tokens + u.output_tokens > 0) AS calls,
    coalesce(sum(u.input_tokens), 0) AS input_tokens,
    coalesce(sum(u.cached_input_tokens), 0) AS cached_input_tokens,
    coalesce(sum(u.cache_write_tokens), 0) AS cache_write_tokens,
    coalesce(sum(u.output_tokens), 0) AS output_tokens,
    coalesce(sum(u.reasoning_tokens), 0) AS reasoning_tokens,
    coalesce(sum(u.cost_nano_usd), 0) AS known_cost_nano,
    count(*) FILTER (WHERE u.cost_source = 'priced') AS priced,
    count(*) FILTER (WHERE u.cost_source = 'unknown') AS unknown,
    count(*) FILTER (WHERE u.cost_source = 'reported' AND u.cost_nano_usd IS NULL) AS in_total,
    count(*) FILTER (WHERE u.cost_source = 'reported' AND u.cost_nano_usd IS NOT NULL) AS totals,
    count(*) AS records"""
_OUTER = """sum(g.calls), sum(g.input_tokens), sum(g.cached_input_tokens), sum(g.cache_write_tokens),
    sum(g.output_tokens), sum(g.reasoning_tokens), sum(g.known_cost_nano), sum(g.priced),
    sum(g.unknown) + count(*) FILTER (WHERE g.in_total > 0 AND g.totals = 0), sum(g.records)"""

_WINDOW = (
    "(CAST(:since AS timestamptz) IS NULL OR u.created_at >= :since) AND "
    "(CAST(:until AS timestamptz) IS NULL OR u.created_at < :until)"
)

# The SUBAGENT descendants of each (key, thread) in `tree`: delegated tasks, their tasks, and so on.
_DELEGATED_STEP = """SELECT tree.k, th.id FROM threads th JOIN tree
      ON th.parent_thread_id = tree.thread_id AND th.lineage_relationship = 'subagent'"""

# Each scope: its CTEs and the (k, record id) pairs it counts.
_SCOPES: dict[str, tuple[str, str]] = {
    # A run's own records, and those of the tasks its nodes delegated.
    "runs": (
        f"""WITH RECURSIVE tree(k, thread_id) AS (
      SELECT n.run_id, n.child_thread_id FROM execution_nodes n
       WHERE n.run_id = ANY(:keys) AND n.child_thread_id IS NOT NULL
      UNION {_DELEGATED_STEP})""",
        """SELECT u.run_id AS k, u.id FROM usage_records u WHERE u.run_id = ANY(:keys)
      UNION ALL SELECT tree.k, u.id FROM tree JOIN usage_records u ON u.thread_id = tree.thread_id""",
    ),
    # An attempt's own model calls (its subagents' included: they are nodes of its turn).
    "attempts": ("", "SELECT u.attempt_id AS k, u.id FROM usage_records u WHERE u.attempt_id = ANY(:keys)"),
    # A node's subtree, and the tasks delegated from it.
    "nodes": (
        f"""WITH RECURSIVE sub(k, node_id, child_thread_id) AS (
      SELECT n.id, n.id, n.child_thread_id FROM execution_nodes n WHERE n.id = ANY(:keys)
      UNION ALL SELECT sub.k, n.id, n.child_thread_id FROM execution_nodes n
        JOIN sub ON n.parent_node_id = sub.node_id),
    tree(k, thread_id) AS (
      SELECT sub.k, sub.child_thread_id FROM sub WHERE sub.child_thread_id IS NOT NULL
      UNION {_DELEGATED_STEP})""",
        """SELECT sub.k, u.id FROM sub JOIN usage_records u ON u.node_id = sub.node_id
      UNION ALL SELECT tree.k, u.id FROM tree JOIN usage_records u ON u.thread_id = tree.thread_id""",
    ),
    # A thread and its delegated tasks, forks left out.
    "threads": (
        f"""WITH RECURSIVE tree(k, thread_id) AS (
      SELECT th.id, th.id FROM threads th WHERE th.id = ANY(:keys)
      UNION {_DELEGATED_STEP})""",
        "SELECT tree.k, u.id FROM tree JOIN usage_records u ON u.thread_id = tree.thread_id",
    ),
    # Every thread descending from a thread through at least one fork (forks of forks, their tasks too).
    "forks": (
        """WITH RECURSIVE tree(k, thread_id, forked) AS (
      SELECT th.id, th.id, false FROM threads th WHERE th.id = ANY(:keys)
      UNION SELECT tree.k, th.id, tree.forked OR th.lineage_relationship = 'fork' FROM threads th
        JOIN tree ON th.parent_thread_id = tree.thread_id)""",
        "SELECT tree.k, u.id FROM tree JOIN usage_records u ON u.thread_id = tree.thread_id WHERE tree.forked",
    ),
    # Everything of a project's threads.
    "projects": (
        "",
        """SELECT th.project_id AS k, u.id FROM usage_records u JOIN threads th ON th.id = u.thread_id
      WHERE th.project_id = ANY(:keys)""",
    ),
}
_BY = {
    name: f"""{ctes}
    SELECT g.k, {_OUTER} FROM (
      SELECT x.k, u.attempt_id, {_INNER} FROM ({pairs}) x JOIN usage_records u ON u.id = x.id
       WHERE {_WINDOW} GROUP BY x.k, u.attempt_id
    ) g GROUP BY g.k"""
    for name, (ctes, pairs) in _SCOPES.items()
}
_STATEMENTS: dict[str, sa.TextClause] = {
    name: sa.text(sql).bindparams(
        sa.bindparam("keys", type_=sa.ARRAY(sa.Uuid())),
        sa.bindparam("since", type_=sa.DateTime(timezone=True)),
        sa.bindparam("until", type_=sa.DateTime(timezone=True)),
    )
    for name, sql in _BY.items()
}


def _totals(row: Sequence[Any]) -> Totals:
    return Totals(*(int(v or 0) for v in row))


async def _by(
    db: Reader, scope: str, keys: Sequence[uuid.UUID], since: datetime | None, until: datetime | None
) -> dict[uuid.UUID, Totals]:
    """Each key's totals (an empty `Totals` for a key with no records), in one statement."""
    wanted = list(dict.fromkeys(keys))
    found = {key: Totals() for key in wanted}
    if wanted:
        params = {"keys": wanted, "since": since, "until": until}
        for row in await db.tuples(_STATEMENTS[scope], params):
            found[row[0]] = _totals(row[1:])
    return found


async def of_runs(
    db: Reader, keys: Sequence[uuid.UUID], since: datetime | None = None, until: datetime | None = None
) -> dict[uuid.UUID, Totals]:
    return await _by(db, "runs", keys, since, until)


async def of_attempts(
    db: Reader, keys: Sequence[uuid.UUID], since: datetime | None = None, until: datetime | None = None
) -> dict[uuid.UUID, Totals]:
    return await _by(db, "attempts", keys, since, until)


async def of_nodes(
    db: Reader, keys: Sequence[uuid.UUID], since: datetime | None = None, until: datetime | None = None
) -> dict[uuid.UUID, Totals]:
    return await _by(db, "nodes", keys, since, until)


async def of_threads(
    db: Reader, keys: Sequence[uuid.UUID], since: datetime | None = None, until: datetime | None = None
) -> dict[uuid.UUID, Totals]:
    return await _by(db, "threads", keys, since, until)


async def forks_of_threads(
    db: Reader, keys: Sequence[uuid.UUID], since: datetime | None = None, until: datetime | None = None
) -> dict[uuid.UUID, Totals]:
    return await _by(db, "forks", keys, since, until)


async def of_projects(
    db: Reader, keys: Sequence[uuid.UUID], since: datetime | None = None, until: datetime | None = None
) -> dict[uuid.UUID, Totals]:
    return await _by(db, "projects", keys, since, until)


async def totals(
    db: Reader,
    *,
    project_id: uuid.UUID | None = None,
    thread_id: uuid.UUID | None = None,
    run_id: uuid.UUID | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
) -> Totals:
    """A budget's question, in one statement: what a scope spent within [since, until).

    The scope is one of: `project_id` (every thread of the project); `thread_id` (the thread and its
    delegated tasks, recursively; forks are their own threads); `run_id` (the run and the tasks it delegated:
    a RUN window). Give exactly one."""
    scopes = [(name, key) for name, key in (("projects", project_id), ("threads", thread_id), ("runs", run_id)) if key]
    if len(scopes) != 1:
        raise ValueError("totals() takes exactly one of project_id, thread_id, run_id")
    name, key = scopes[0]
    return (await _by(db, name, [key], since, until))[key]


async def recorded_refs(db: Reader, thread_id: uuid.UUID, refs: Sequence[str]) -> set[str]:
    """Which of these provider call refs the thread already recorded (a report arriving again)."""
    if not refs:
        return set()
    rows = await db.tuples(_RECORDED, {"thread_id": thread_id, "refs": list(refs)})
    return {str(r[0]) for r in rows}


_RECORDED = sa.text(
    "SELECT call_ref FROM usage_records WHERE thread_id = :thread_id AND call_ref = ANY(:refs)"
).bindparams(sa.bindparam("thread_id", type_=sa.Uuid()), sa.bindparam("refs", type_=sa.ARRAY(sa.Text())))


class GroupBy(enum.StrEnum):
    """What a project's usage report is broken down by."""

    DAY = "day"
    THREAD = "thread"
    MODEL = "model"
    PROVIDER_INSTANCE = "provider_instance"


_GROUP_COLUMNS = {
    GroupBy.DAY: "date_trunc('day', u.created_at AT TIME ZONE 'UTC')::date",
    GroupBy.THREAD: "u.thread_id",
    GroupBy.MODEL: "u.model",
    GroupBy.PROVIDER_INSTANCE: "u.provider_instance_id",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """One row of a grouped report: the values of its group columns (None where not grouped) and its totals."""

    day: Any
    thread_id: uuid.UUID | None
    model: str | None
    provider_instance_id: str | None
    totals: Totals


async def grouped(
    db: Reader,
    project_id: uuid.UUID,
    group_by: Sequence[GroupBy],
    since: datetime | None = None,
    until: datetime | None = None,
) -> list[Group]:
    """A project's usage in [since, until) broken down by `group_by` (none: one row), in one statement,
    ordered by the groups in the order asked."""
    chosen = list(dict.fromkeys(GroupBy(g) for g in group_by))
    columns = [f"{_GROUP_COLUMNS[g] if g in chosen else 'NULL'} AS g_{g.value}" for g in GroupBy]
    keys = [f"g_{g.value}" for g in chosen]
    inner_keys = ", ".join([*keys, "u.attempt_id"])
    outer_keys = ", ".join(f"g.{k}" for k in keys)
    group = f"GROUP BY {outer_keys} ORDER BY {', '.join(f'g.{k} NULLS FIRST' for k in keys)}" if keys else ""
    shown = ", ".join(f"g.g_{g.value}" if g in chosen else "NULL" for g in GroupBy)
    sql = f"""SELECT {shown}, {_OUTER} FROM (
      SELECT {", ".join(columns)}, u.attempt_id, {_INNER} FROM usage_records u JOIN threads th ON th.id = u.thread_id
       WHERE th.project_id = :project AND {_WINDOW} GROUP BY {inner_keys}
    ) g {group}"""
    stmt = sa.text(sql).bindparams(
        sa.bindparam("project", type_=sa.Uuid()),
        sa.bindparam("since", type_=sa.DateTime(timezone=True)),
        sa.bindparam("until", type_=sa.DateTime(timezone=True)),
    )
    rows = await db.tuples(stmt, {"project": project_id, "since": since, "until": until})
    found = [Group(r[0], r[1], r[2], r[3], _totals(r[4:])) for r in rows if r[4] is not None]
    return [g for g in found if g.totals.records] or ([] if keys else [Group(None, None, None, None, Totals())])

"""Read queries shared by the API loaders and the engine.

Everything is batched: by-id lookups take many ids, and pages of children are read for
many parents in one statement with a window function, so a GraphQL page costs the same
number of statements whatever its size.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Hashable, Sequence
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

from threadloom.store.db import Reader

# What a page reads from: a table, or a subquery shaped like one (`store.links.THREAD_TRANSFERS`).
Source = sa.Table | sa.Subquery


@dataclasses.dataclass(frozen=True, slots=True)
class PageArgs:
    """A keyset window: `first` after a key, or `last` before a key."""

    first: int | None = None
    after: Any = None
    last: int | None = None
    before: Any = None

    @property
    def backward(self) -> bool:
        return self.last is not None and self.first is None

    @property
    def size(self) -> int:
        return self.last if self.backward else (self.first or 0)  # type: ignore[return-value]


@dataclasses.dataclass(slots=True)
class Page:
    rows: list[dict[str, Any]]
    has_next: bool
    has_previous: bool


_BY_IDS: dict[str, sa.Select[Any]] = {}


def _any(column: sa.ColumnElement[Any], name: str) -> sa.ColumnElement[Any]:
    """`= ANY(:name)` with the values bound as one array: the same rows as an `IN` list, but the
    statement text does not change with the number of values (an expanding `IN` is rendered again
    for every execution, and is a new prepared statement for every length). For primary-key
    lookups only: a page's windowed read keeps its IN (see `_page_statement`)."""
    return sa.func.any(sa.bindparam(name, type_=postgresql.ARRAY(column.type)))


async def by_ids(db: Reader, table: sa.Table, ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, dict[str, Any]]:
    if not ids:
        return {}
    stmt = _BY_IDS.get(table.name)
    if stmt is None:  # built once per table (see _PAGE_STATEMENTS)
        stmt = _BY_IDS[table.name] = sa.select(table).where(table.c.id == _any(table.c.id, "ids"))
    rows = await db.dicts(stmt, {"ids": list(set(ids))})
    return {r["id"]: r for r in rows}


# Page statements by shape, built once: building the windowed select costs about a
# millisecond, far more than running it. Values travel as bound parameters.
_PAGE_STATEMENTS: dict[Hashable, sa.Select[Any]] = {}


def _page_statement(
    table: Source, key: str, parent: str | None, args: PageArgs, where: Sequence[sa.ColumnElement[bool]]
) -> sa.Select[Any]:
    key_col = table.c[key]
    conds: list[sa.ColumnElement[bool]] = list(where)
    if args.after is not None:
        conds.append(key_col > sa.bindparam("page_after"))
    if args.before is not None:
        conds.append(key_col < sa.bindparam("page_before"))
    order = key_col.desc() if args.backward else key_col.asc()
    limit = sa.bindparam("page_limit", type_=sa.Integer())
    if parent is None:
        return sa.select(table).where(*conds).order_by(order).limit(limit)
    parent_col = table.c[parent]
    # An expanding IN, not `= ANY(array)`: with one parent the planner turns it into an equality,
    # drops the partition and reads the page in key order from the index, stopping after it.
    conds.append(parent_col.in_(sa.bindparam("page_parents", expanding=True)))
    rn = sa.func.row_number().over(partition_by=parent_col, order_by=order).label("_rn")
    inner = sa.select(table, rn).where(*conds).subquery()
    return sa.select(inner).where(inner.c._rn <= limit).order_by(inner.c[parent], inner.c._rn)


def _shape(where: Sequence[sa.ColumnElement[bool]]) -> Hashable | None:
    """What the filters look like, or None when one carries a value (it is not cached then)."""
    shape = []
    for condition in where:
        found = condition._generate_cache_key()
        if found is None or found.bindparams:
            return None
        shape.append(found.key)
    return tuple(shape)


async def pages(
    db: Reader,
    table: Source,
    *,
    key: str,
    args: PageArgs,
    parent: str | None = None,
    parents: Sequence[Hashable] = (),
    where: Sequence[sa.ColumnElement[bool]] = (),
) -> dict[Hashable, Page]:
    """One keyset page per parent (or a single page under key None when `parent` is None)."""
    shape = _shape(where)
    if shape is None:
        stmt = _page_statement(table, key, parent, args, where)
    else:
        cache_key = (table.name, key, parent, args.backward, args.after is not None, args.before is not None, shape)
        stmt = _PAGE_STATEMENTS.get(cache_key)  # type: ignore[assignment]
        if stmt is None:
            stmt = _PAGE_STATEMENTS[cache_key] = _page_statement(table, key, parent, args, where)
    limit = args.size + 1
    params: dict[str, Any] = {"page_limit": limit}
    if args.after is not None:
        params["page_after"] = args.after
    if args.before is not None:
        params["page_before"] = args.before
    if parent is None:
        rows = await db.dicts(stmt, params)
        grouped: dict[Hashable, list[dict[str, Any]]] = {None: rows}
    else:
        params["page_parents"] = list(parents)
        rows = await db.dicts(stmt, params)
        grouped = {p: [] for p in parents}
        for r in rows:
            grouped[r[parent]].append(r)
    result: dict[Hashable, Page] = {}
    for p, items in grouped.items():
        more = len(items) > args.size
        items = items[: args.size]
        if args.backward:
            items.reverse()
            result[p] = Page(items, has_next=args.before is not None, has_previous=more)
        else:
            result[p] = Page(items, has_next=more, has_previous=args.after is not None)
    return result


async def counts(
    db: Reader,
    table: Source,
    *,
    parent: str | None,
    parents: Sequence[Hashable] = (),
    where: Sequence[sa.ColumnElement[bool]] = (),
) -> dict[Hashable, int]:
    if parent is None:
        n = await db.scalar(sa.select(sa.func.count()).select_from(table).where(*where))
        return {None: int(n)}
    parent_col = table.c[parent]
    rows = await db.rows(
        sa.select(parent_col.label("p"), sa.func.count().label("n"))
        .where(parent_col.in_(list(parents)), *where)
        .group_by(parent_col)
    )
    found = {r["p"]: int(r["n"]) for r in rows}
    return {p: found.get(p, 0) for p in parents}


async def rows_by_parent(
    db: Reader,
    table: sa.Table,
    *,
    parent: str,
    parents: Sequence[Hashable],
    order_by: str,
    where: Sequence[sa.ColumnElement[bool]] = (),
) -> dict[Hashable, list[sa.RowMapping]]:
    """All children of each parent (for small, bounded sets such as a run's attempts)."""
    rows = await db.rows(sa.select(table).where(table.c[parent].in_(list(parents)), *where).order_by(table.c[order_by]))
    grouped: dict[Hashable, list[sa.RowMapping]] = {p: [] for p in parents}
    for r in rows:
        grouped[r[parent]].append(r)
    return grouped

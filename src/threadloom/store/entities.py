"""Loading entities by id or by simple filters, inside the caller's transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any, TypeVar

import sqlalchemy as sa

from threadloom.domain.records import Record
from threadloom.store import tables as t
from threadloom.store.db import Reader

R = TypeVar("R", bound=Record)


# One select per entity kind, kept: a statement run again is compiled once for the driver (`Reader`).
_BY_ID: dict[type[Record], sa.Select[Any]] = {}


async def get(db: Reader, cls: type[R], entity_id: uuid.UUID | None) -> R | None:
    if entity_id is None:
        return None
    stmt = _BY_ID.get(cls)
    if stmt is None:
        table = t.PROJECTIONS[cls]
        stmt = _BY_ID[cls] = sa.select(table).where(table.c.id == sa.bindparam("entity_id", type_=table.c.id.type))
    row = await db.one_or_none(stmt, {"entity_id": entity_id})
    return None if row is None else cls.from_mapping(row)


async def require(db: Reader, cls: type[R], entity_id: uuid.UUID | None) -> R:
    found = await get(db, cls, entity_id)
    if found is None:
        raise LookupError(f"{cls.entity_type} {entity_id} not found")
    return found


async def where(db: Reader, cls: type[R], *conditions: sa.ColumnElement[bool], order_by: Sequence[Any] = ()) -> list[R]:
    table = t.PROJECTIONS[cls]
    stmt = sa.select(table).where(*conditions)
    if order_by:
        stmt = stmt.order_by(*order_by)
    return [cls.from_mapping(r) for r in await db.rows(stmt)]


async def in_order(db: Reader, cls: type[R], *conditions: sa.ColumnElement[bool]) -> list[R]:
    """`where`, in id order: ids are UUIDv7, so that is the order they were created in."""
    return await where(db, cls, *conditions, order_by=[t.PROJECTIONS[cls].c.id])


_MANY: dict[tuple[type[Record], ...], sa.TextClause] = {}


async def get_many(db: Reader, wanted: Sequence[tuple[type[Record], uuid.UUID | None]]) -> list[Record | None]:
    """`get` of several entities (of any tables) in one statement: each found one, or None, in order."""
    asked = [(i, cls, entity_id) for i, (cls, entity_id) in enumerate(wanted) if entity_id is not None]
    found: list[Record | None] = [None] * len(wanted)
    if not asked:
        return found
    shape = tuple(cls for _, cls, _ in asked)
    stmt = _MANY.get(shape)
    if stmt is None:
        parts = [
            f"SELECT {k} AS k, to_jsonb(x) AS row FROM {t.PROJECTIONS[cls].name} x WHERE x.id = :id{k}"
            for k, cls in enumerate(shape)
        ]
        ids = [sa.bindparam(f"id{k}", type_=sa.Uuid()) for k in range(len(shape))]
        stmt = _MANY[shape] = sa.text(" UNION ALL ".join(parts)).bindparams(*ids)
    params = {f"id{k}": entity_id for k, (_, _, entity_id) in enumerate(asked)}
    for k, row in await db.tuples(stmt, params):
        i, cls, _ = asked[k]
        found[i] = cls.from_mapping(row)
    return found

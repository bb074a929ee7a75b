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


async def get(db: Reader, cls: type[R], entity_id: uuid.UUID | None) -> R | None:
    if entity_id is None:
        return None
    table = t.PROJECTIONS[cls]
    row = await db.one_or_none(sa.select(table).where(table.c.id == entity_id))
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

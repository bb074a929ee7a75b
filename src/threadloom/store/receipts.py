"""Command receipts: the stored answer to an idempotency key.

A key belongs to the token that used it: the stored key is prefixed with the token's id
(and the command type), so two tenants never share, see or block each other's keys.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, TypedDict, Unpack

import sqlalchemy as sa

from threadloom.store import tables as t
from threadloom.store.db import Reader


def scoped_key(token_id: uuid.UUID | None, command_type: str, key: str) -> str:
    """The stored form of a client's key: `<token id>/<command type>/<key>`."""
    return f"{token_id or 'system'}/{command_type}/{key}"


async def lock_key(db: Reader, key: str) -> None:
    """Serialize commands that share a key until the holder commits."""
    await db.execute(sa.select(sa.func.pg_advisory_xact_lock(sa.func.hashtextextended(key, 0))))


async def find(db: Reader, key: str) -> Mapping[str, Any] | None:
    return await db.one_or_none(sa.select(t.command_receipts).where(t.command_receipts.c.key == key))


class Receipt(TypedDict):
    """A `command_receipts` row: what a replay of the same key answers, and what it must match."""

    key: str
    command_type: str
    fingerprint: str
    token_id: uuid.UUID | None
    result: dict[str, Any]
    created_at: datetime


async def save(db: Reader, **receipt: Unpack[Receipt]) -> None:
    await db.execute(sa.insert(t.command_receipts).values(**receipt))

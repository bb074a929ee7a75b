"""API tokens: random, shown once, stored as SHA-256."""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import uuid
from datetime import datetime

import sqlalchemy as sa

from threadloom.domain.access import Principal
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import TokenScope
from threadloom.store import tables as t
from threadloom.store.db import Reader

TOKEN_PREFIX = "tl_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclasses.dataclass(frozen=True, slots=True)
class TokenInfo:
    id: uuid.UUID
    name: str
    scope: TokenScope
    project_id: uuid.UUID | None
    created_at: datetime
    revoked_at: datetime | None


async def create_token(
    db: Reader, *, name: str, scope: TokenScope, project_id: uuid.UUID | None, now: datetime
) -> tuple[TokenInfo, str]:
    """Returns the stored info and the plaintext token (never stored)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    info = TokenInfo(new_id(), name, scope, project_id, now, None)
    await db.execute(
        sa.insert(t.api_tokens).values(
            id=info.id,
            name=name,
            scope=scope.value,
            project_id=project_id,
            token_hash=hash_token(token),
            created_at=now,
        )
    )
    return info, token


async def count_tokens(db: Reader) -> int:
    return int(await db.scalar(sa.select(sa.func.count()).select_from(t.api_tokens)))


async def list_tokens(db: Reader) -> list[TokenInfo]:
    rows = await db.rows(sa.select(t.api_tokens).order_by(t.api_tokens.c.id))
    return [
        TokenInfo(r["id"], r["name"], TokenScope(r["scope"]), r["project_id"], r["created_at"], r["revoked_at"])
        for r in rows
    ]


async def revoke_token(db: Reader, token_id: uuid.UUID, now: datetime) -> bool:
    result = await db.execute(
        sa.update(t.api_tokens)
        .where(t.api_tokens.c.id == token_id, t.api_tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return bool(result.rowcount)


async def authenticate(db: Reader, token: str) -> Principal | None:
    row = await db.one_or_none(
        sa.select(t.api_tokens.c.id, t.api_tokens.c.scope, t.api_tokens.c.project_id).where(
            t.api_tokens.c.token_hash == hash_token(token), t.api_tokens.c.revoked_at.is_(None)
        )
    )
    if row is None:
        return None
    return Principal(token_id=row["id"], scope=TokenScope(row["scope"]), project_id=row["project_id"])

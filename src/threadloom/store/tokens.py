"""API tokens: random, shown once, stored as SHA-256; optionally expiring.

A token authenticates while it is neither revoked nor past its `expires_at`. Both are
judged by the database's clock, so every server process agrees on the instant a token
stops working.
"""

from __future__ import annotations

import dataclasses
import hashlib
import secrets
import uuid
from collections.abc import Collection, Mapping
from datetime import datetime
from typing import Any

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
    expires_at: datetime | None = None


def _usable() -> sa.ColumnElement[bool]:
    """Not revoked and not expired, by the database's clock."""
    tokens = t.api_tokens.c
    return sa.and_(tokens.revoked_at.is_(None), sa.or_(tokens.expires_at.is_(None), tokens.expires_at > sa.func.now()))


async def create_token(
    db: Reader,
    *,
    name: str,
    scope: TokenScope,
    project_id: uuid.UUID | None,
    now: datetime,
    expires_at: datetime | None = None,
) -> tuple[TokenInfo, str]:
    """Returns the stored info and the plaintext token (never stored)."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    info = TokenInfo(new_id(), name, scope, project_id, now, None, expires_at)
    await db.execute(
        sa.insert(t.api_tokens).values(
            id=info.id,
            name=name,
            scope=scope.value,
            project_id=project_id,
            token_hash=hash_token(token),
            created_at=now,
            expires_at=expires_at,
        )
    )
    return info, token


async def count_tokens(db: Reader) -> int:
    return int(await db.scalar(sa.select(sa.func.count()).select_from(t.api_tokens)))


def _info(r: Mapping[Any, Any]) -> TokenInfo:
    return TokenInfo(
        r["id"], r["name"], TokenScope(r["scope"]), r["project_id"], r["created_at"], r["revoked_at"], r["expires_at"]
    )


_ALL_PROJECTS = object()  # `list_tokens`' default: no filter on the project


async def list_tokens(
    db: Reader, project_id: uuid.UUID | object | None = _ALL_PROJECTS, *, include_revoked: bool = True
) -> list[TokenInfo]:
    """Tokens, oldest first: every token, or those bound to `project_id` (None: the all-projects ones)."""
    query = sa.select(t.api_tokens).order_by(t.api_tokens.c.created_at, t.api_tokens.c.id)
    if project_id is None:
        query = query.where(t.api_tokens.c.project_id.is_(None))
    elif isinstance(project_id, uuid.UUID):
        query = query.where(t.api_tokens.c.project_id == project_id)
    if not include_revoked:
        query = query.where(t.api_tokens.c.revoked_at.is_(None))
    return [_info(r) for r in await db.rows(query)]


async def get_token(db: Reader, token_id: uuid.UUID, *, lock: bool = False) -> TokenInfo | None:
    """One token by id (`lock`: FOR UPDATE, so two revocations of it are serialized)."""
    query = sa.select(t.api_tokens).where(t.api_tokens.c.id == token_id)
    row = await db.one_or_none(query.with_for_update() if lock else query)
    return None if row is None else _info(row)


async def revoke_token(db: Reader, token_id: uuid.UUID, now: datetime) -> bool:
    result = await db.execute(
        sa.update(t.api_tokens)
        .where(t.api_tokens.c.id == token_id, t.api_tokens.c.revoked_at.is_(None))
        .values(revoked_at=now)
    )
    return bool(result.rowcount)


# Built once: every HTTP request and socket authenticates, and building the select costs
# more than the lookup itself. Still one statement per request, so a revocation counts at once.
_AUTHENTICATE = sa.select(
    t.api_tokens.c.id, t.api_tokens.c.scope, t.api_tokens.c.project_id, t.api_tokens.c.name
).where(t.api_tokens.c.token_hash == sa.bindparam("token_hash"), _usable())


async def authenticate(db: Reader, token: str) -> Principal | None:
    """The principal of a usable token; None for an unknown, revoked or expired one."""
    return await authenticate_hash(db, hash_token(token))


async def authenticate_hash(db: Reader, token_hash: str) -> Principal | None:
    """`authenticate` for a token already hashed (`hash_token`)."""
    rows = await db.tuples(_AUTHENTICATE, {"token_hash": token_hash})
    if not rows:
        return None
    token_id, scope, project_id, name = rows[0]
    return Principal(token_id=token_id, scope=TokenScope(scope), project_id=project_id, token_name=name)


async def still_usable(db: Reader, token_ids: Collection[uuid.UUID]) -> set[uuid.UUID]:
    """Which of these tokens still authenticate: one statement for every open socket's token."""
    if not token_ids:
        return set()
    rows = await db.rows(sa.select(t.api_tokens.c.id).where(t.api_tokens.c.id.in_(list(token_ids)), _usable()))
    return {r["id"] for r in rows}

"""Who may list, create and revoke API tokens through the API, and what a new token may be.

The same rules as `threadloom token create|list|revoke` on the database host, with one more: over
the API the caller is a token itself, so it manages only tokens it could have been given. An admin
token bound to a project manages that project's tokens; an admin token for all projects manages
every token. A token out of the caller's reach is reported as not found (docs/security.md), so a
project's admin cannot learn that another project's tokens exist.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta
from enum import StrEnum

from threadloom.domain.access import Principal
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.labels import clean_label
from threadloom.domain.statuses import TokenScope

MAX_NAME = 200
# Ten years: longer is "never" in all but name, and keeps the instant inside what PostgreSQL stores.
MAX_EXPIRES_IN = 10 * 365 * 86400


class TokenState(StrEnum):
    ACTIVE = "active"
    EXPIRED = "expired"
    REVOKED = "revoked"


@dataclasses.dataclass(frozen=True, slots=True)
class NewToken:
    """A token to create, checked: its name, scope, project (None: all projects) and expiry."""

    name: str
    scope: TokenScope
    project_id: uuid.UUID | None
    expires_at: datetime | None


def require_manager(principal: Principal, project_id: uuid.UUID | None, field: str) -> None:
    """May `principal` manage the tokens of `project_id` (None: the all-projects tokens)?

    Another project's id is NOT_FOUND, as for every other object; a visible project without admin
    scope is FORBIDDEN; all-projects tokens need an admin token for all projects.
    """
    if project_id is None:
        if principal.scope != TokenScope.ADMIN or principal.project_id is not None:
            raise DomainError(ErrorCode.FORBIDDEN, "tokens for all projects need an admin token for all projects")
        return
    principal.require_project(project_id, TokenScope.ADMIN, field)


def new_token(
    principal: Principal,
    *,
    name: str,
    scope: TokenScope,
    project_id: uuid.UUID | None,
    expires_in: int | None,
    now: datetime,
) -> NewToken:
    """The token `principal` asked for, or the reason it may not have it (`expires_in`: seconds, None: never)."""
    require_manager(principal, project_id, "projectId")
    cleaned = clean_label(name, "name", MAX_NAME)
    if expires_in is not None and not 0 < expires_in <= MAX_EXPIRES_IN:
        raise DomainError(
            ErrorCode.INVALID_INPUT,
            f"expiresInSeconds must be 1..{MAX_EXPIRES_IN} (or absent: never)",
            "expiresInSeconds",
        )
    expires_at = None if expires_in is None else now + timedelta(seconds=expires_in)
    return NewToken(cleaned, scope, project_id, expires_at)


def visible_to(principal: Principal, token_project_id: uuid.UUID | None) -> bool:
    """Whether the token is within the caller's reach at all (else it is reported as not found)."""
    return principal.project_id is None or principal.project_id == token_project_id


def require_revocable(
    principal: Principal, token_project_id: uuid.UUID | None, revoked_at: datetime | None, *, exists: bool
) -> None:
    """Refuse revoking a token that is unknown or out of reach (NOT_FOUND), one the caller may not manage
    (FORBIDDEN), or one already revoked (TOKEN_REVOKED). An expired token may be revoked: it stays so."""
    if not exists or not visible_to(principal, token_project_id):
        raise not_found("tokenId")
    require_manager(principal, token_project_id, "tokenId")
    if revoked_at is not None:
        raise DomainError(ErrorCode.TOKEN_REVOKED, "this token is already revoked", "tokenId")


def token_state(revoked_at: datetime | None, expires_at: datetime | None, now: datetime) -> TokenState:
    if revoked_at is not None:
        return TokenState.REVOKED
    if expires_at is not None and expires_at <= now:
        return TokenState.EXPIRED
    return TokenState.ACTIVE

"""The `ApiToken` type and the `tokens` query: a project's tokens, for its admins (docs/management.md).

Not a `Node`: a token is reached only through `tokens` and the token mutations, never by `node(id)`,
so no query that a read token may ask can name one.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.errors import ApiError
from threadloom.api.types import Project
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import TokenScope
from threadloom.domain.tokens import TokenState, token_state
from threadloom.store.tokens import TokenInfo


@strawberry.type(description="An API token: who it is for and whether it still works. Never its secret.")
class ApiToken:
    id: strawberry.ID
    name: str
    scope: TokenScope
    created_at: datetime
    expires_at: datetime | None = strawberry.field(description="When it stops working; null: never.")
    revoked_at: datetime | None
    state: TokenState = strawberry.field(description="ACTIVE, EXPIRED or REVOKED, at the time of the request.")
    _project_id: strawberry.Private[uuid.UUID | None]

    @strawberry.field(description="The project it is bound to; null for a token for all projects.")
    async def project(self, info: Info) -> Project | None:
        if self._project_id is None:
            return None
        row = await info.context.load_visible(Project.table(), self._project_id)
        return None if row is None else Project.from_row(row)

    @classmethod
    def of(cls, token: TokenInfo, now: datetime) -> ApiToken:
        return cls(
            id=strawberry.ID(gid.encode("ApiToken", token.id)),
            name=token.name,
            scope=token.scope,
            created_at=token.created_at,
            expires_at=token.expires_at,
            revoked_at=token.revoked_at,
            state=token_state(token.revoked_at, token.expires_at, now),
            _project_id=token.project_id,
        )


async def tokens(info: Info, project_id: strawberry.ID | None, include_revoked: bool) -> list[ApiToken] | None:
    """The `tokens` query: null for an unknown or invisible project, FORBIDDEN below admin scope."""
    services = info.context.services
    project = None if project_id is None else gid.maybe_as(project_id, "Project")
    if project_id is not None and project is None:
        return None
    try:
        found = await services.tokens.list_tokens(info.context.principal, project, include_revoked)
    except DomainError as error:
        if error.code == ErrorCode.NOT_FOUND:
            return None
        raise ApiError(error) from None
    now = services.clock.now()
    return [ApiToken.of(token, now) for token in found]

"""Management: updateProject, archiveProject, unarchiveProject, createToken, revokeToken (admin scope).

Project commands are engine commands like the others (`payloads.mutation`); the token commands answer
with a token instead of an entity, and createToken's payload is the one place a secret is ever shown.
"""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api import enums
from threadloom.api import ids as gid
from threadloom.api.context import Context, Info
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import KeyedInput, Shape, mutation, returning
from threadloom.api.tokens import ApiToken
from threadloom.api.types import Project
from threadloom.domain.statuses import TokenScope
from threadloom.store.tokens import TokenInfo


@strawberry.type(description="The project a management mutation changed (null when it was refused).")
class ProjectPayload:
    project: Project | None
    user_errors: list[UserError]
    client_mutation_id: str | None


PROJECT = returning(ProjectPayload, "project", Project)


@strawberry.input(description="The project to change, and what changes.")
class UpdateProjectInput(KeyedInput):
    project_id: strawberry.ID
    name: str | None = strawberry.field(default=None, description="A new name; absent keeps the current one.")
    excludes: list[str] | None = strawberry.field(
        default=None,
        description="The project's own checkpoint exclude list (gitignore patterns, replacing the server's "
        "THREADLOOM_CHECKPOINT_EXCLUDES for its shadow repositories from the next capture or restore); [] "
        "clears it (the server's list again); absent keeps it. A pattern spanning lines, starting with `-`, "
        "longer than 1000 characters, or more than 200 patterns: INVALID_INPUT, nothing changed.",
    )


@strawberry.input(description="A project, by global id.")
class ProjectInput(KeyedInput):
    project_id: strawberry.ID


def _project_id(value: str) -> uuid.UUID:
    return gid.decode_as(value, "Project", "projectId")


@strawberry.input(description="The token to make: its project, name, scope and lifetime.")
class CreateTokenInput(KeyedInput):
    project_id: strawberry.ID | None = strawberry.field(
        default=None, description="Bind it to this project; absent: all projects (an all-projects admin only)."
    )
    name: str = strawberry.field(description="What it is for, shown in `tokens` (1..200 characters).")
    scope: TokenScope = strawberry.field(description="READ (queries), OPERATE (also runs), ADMIN (also management).")
    expires_in_seconds: int | None = strawberry.field(
        default=None, description="Stop working this many seconds from now (1 .. ten years); absent: never."
    )


@strawberry.type(description="The new token and, this once, its secret (both null when it was refused).")
class CreateTokenPayload:
    token: ApiToken | None
    secret: str | None = strawberry.field(
        description="The token itself, for `Authorization: Bearer`. Shown here once: only its hash is stored."
    )
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.input(description="A token, by the global id `tokens` and `createToken` show.")
class RevokeTokenInput(KeyedInput):
    token_id: strawberry.ID


@strawberry.type(description="The token revokeToken revoked (null when it was refused).")
class TokenPayload:
    token: ApiToken | None
    user_errors: list[UserError]
    client_mutation_id: str | None


async def _created(
    info: Info, made: tuple[TokenInfo, str] | None, errors: list[UserError], key: str | None
) -> CreateTokenPayload:
    now = info.context.services.clock.now()
    token = None if made is None else ApiToken.of(made[0], now)
    return CreateTokenPayload(token=token, secret=made[1] if made else None, user_errors=errors, client_mutation_id=key)


async def _revoked(info: Info, token: TokenInfo | None, errors: list[UserError], key: str | None) -> TokenPayload:
    shown = None if token is None else ApiToken.of(token, info.context.services.clock.now())
    return TokenPayload(token=shown, user_errors=errors, client_mutation_id=key)


@strawberry.type
class ProjectAdminMutation:
    @mutation(PROJECT)
    async def update_project(ctx: Context, input: UpdateProjectInput) -> uuid.UUID:
        """Rename a project or set its checkpoint exclude list (admin scope on it). The workspace root never
        changes."""
        project = _project_id(input.project_id)
        admin = ctx.services.project_admin
        return await admin.update_project(ctx.principal, project, input.name, input.excludes, input.key())

    @mutation(PROJECT)
    async def archive_project(ctx: Context, input: ProjectInput) -> uuid.UUID:
        """Archive a project (admin scope on it): it leaves `projects` (see `includeArchived`), and messages and
        new threads in it are refused with PROJECT_ARCHIVED. Runs already started finish; nothing is deleted."""
        project = _project_id(input.project_id)
        return await ctx.services.project_admin.archive_project(ctx.principal, project, input.key())

    @mutation(PROJECT)
    async def unarchive_project(ctx: Context, input: ProjectInput) -> uuid.UUID:
        """Bring an archived project back as it was (admin scope on it)."""
        project = _project_id(input.project_id)
        return await ctx.services.project_admin.unarchive_project(ctx.principal, project, input.key())

    @mutation(Shape(CreateTokenPayload, _created))
    async def create_token(ctx: Context, input: CreateTokenInput) -> tuple[TokenInfo, str]:
        """Create an API token: for a project (admin scope on it) or for all projects (an all-projects admin).
        The payload's `secret` is the only time the token is shown."""
        project = None if input.project_id is None else _project_id(input.project_id)
        input.key()
        return await ctx.services.tokens.create_token(
            ctx.principal,
            project_id=project,
            name=input.name,
            scope=enums.member(TokenScope, input.scope),
            expires_in=input.expires_in_seconds,
        )

    @mutation(Shape(TokenPayload, _revoked))
    async def revoke_token(ctx: Context, input: RevokeTokenInput) -> TokenInfo:
        """Revoke a token now (admin scope on its project): requests with it are refused, its sockets close."""
        token = gid.decode_as(input.token_id, "ApiToken", "tokenId")
        input.key()
        return await ctx.services.tokens.revoke_token(ctx.principal, token)

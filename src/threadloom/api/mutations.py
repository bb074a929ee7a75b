"""Mutations: one `input` argument, a payload with `userErrors`. Thin: decode ids, call the engine."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.errors import UserError
from threadloom.api.types import Project, Thread
from threadloom.domain.errors import DomainError, ErrorCode

T = TypeVar("T")
MAX_KEY = 200


def _key(value: str | None) -> str | None:
    if value is not None and (not value or len(value) > MAX_KEY):
        raise DomainError(
            ErrorCode.INVALID_INPUT, f"clientMutationId must be 1..{MAX_KEY} characters", "clientMutationId"
        )
    return value


async def _attempt(action: Callable[[], Awaitable[T]]) -> tuple[T | None, list[UserError]]:
    try:
        return await action(), []
    except DomainError as error:
        return None, [UserError.of(error)]


async def _load(info: Info, cls: Any, entity_id: uuid.UUID | None) -> Any:
    if entity_id is None:
        return None
    row = await info.context.load_visible(cls.table(), entity_id)
    return None if row is None else cls.from_row(row)


@strawberry.input
class CreateProjectInput:
    name: str
    workspace_root: str = strawberry.field(description="Absolute path of the folder agents work in.")
    client_mutation_id: str | None = None


@strawberry.type
class CreateProjectPayload:
    project: Project | None
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.input
class CreateThreadInput:
    project_id: strawberry.ID
    title: str | None = None
    provider_instance_id: str | None = strawberry.field(
        default=None, description="A configured provider instance; absent means the default (`scripted`)."
    )
    model: str | None = None
    runtime_mode: str = strawberry.field(
        default="full_access", description="full_access | approval_required | read_only"
    )
    client_mutation_id: str | None = None


@strawberry.type
class ThreadPayload:
    thread: Thread | None
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.input
class RenameThreadInput:
    thread_id: strawberry.ID
    title: str
    client_mutation_id: str | None = None


@strawberry.input
class ThreadInput:
    thread_id: strawberry.ID
    client_mutation_id: str | None = None


@strawberry.type
class Mutation:
    @strawberry.mutation(description="Create a project (needs an admin token for all projects).")
    async def create_project(self, info: Info, input: CreateProjectInput) -> CreateProjectPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            return await ctx.services.catalog.create_project(
                ctx.principal, name=input.name, workspace_root=input.workspace_root, key=_key(input.client_mutation_id)
            )

        project_id, errors = await _attempt(act)
        return CreateProjectPayload(
            project=await _load(info, Project, project_id),
            user_errors=errors,
            client_mutation_id=input.client_mutation_id,
        )

    @strawberry.mutation(
        description="Create a thread. No provider session or provider thread is made until the first run."
    )
    async def create_thread(self, info: Info, input: CreateThreadInput) -> ThreadPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            return await ctx.services.catalog.create_thread(
                ctx.principal,
                project_id=gid.decode_as(input.project_id, "Project", "projectId"),
                title=input.title,
                provider_instance_id=input.provider_instance_id,
                model=input.model,
                runtime_mode=input.runtime_mode,
                key=_key(input.client_mutation_id),
            )

        return await _thread_payload(info, act, input.client_mutation_id)

    @strawberry.mutation
    async def rename_thread(self, info: Info, input: RenameThreadInput) -> ThreadPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            thread_id = gid.decode_as(input.thread_id, "Thread", "threadId")
            return await ctx.services.catalog.rename_thread(
                ctx.principal, thread_id, input.title, _key(input.client_mutation_id)
            )

        return await _thread_payload(info, act, input.client_mutation_id)

    @strawberry.mutation(description="Hide a thread from default listings. Refused while a run is active.")
    async def archive_thread(self, info: Info, input: ThreadInput) -> ThreadPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            thread_id = gid.decode_as(input.thread_id, "Thread", "threadId")
            return await ctx.services.catalog.archive_thread(ctx.principal, thread_id, _key(input.client_mutation_id))

        return await _thread_payload(info, act, input.client_mutation_id)

    @strawberry.mutation
    async def unarchive_thread(self, info: Info, input: ThreadInput) -> ThreadPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            thread_id = gid.decode_as(input.thread_id, "Thread", "threadId")
            return await ctx.services.catalog.unarchive_thread(ctx.principal, thread_id, _key(input.client_mutation_id))

        return await _thread_payload(info, act, input.client_mutation_id)


async def _thread_payload(
    info: Info, act: Callable[[], Awaitable[uuid.UUID]], client_mutation_id: str | None
) -> ThreadPayload:
    thread_id, errors = await _attempt(act)
    return ThreadPayload(
        thread=await _load(info, Thread, thread_id), user_errors=errors, client_mutation_id=client_mutation_id
    )

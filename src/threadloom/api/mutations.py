"""Mutations: one `input` argument, a payload with `userErrors`. Thin: decode ids, call the engine."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.enums import AppliedDispatch
from threadloom.api.errors import UserError
from threadloom.api.types import ConversationMessage, Project, Run, Thread
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.runs import DispatchMode
from threadloom.engine.runs import Sent

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


@strawberry.input(description="How to treat a steer of the active run.")
class SteerActiveInput:
    target_run_id: strawberry.ID
    expected_attempt_id: strawberry.ID | None = None


@strawberry.input
class RestartActiveInput:
    target_run_id: strawberry.ID


@strawberry.input(one_of=True, description="Exactly one field. Absent means `auto`.")
class DispatchInput:
    auto: bool | None = strawberry.UNSET
    start_immediately: bool | None = strawberry.UNSET
    queue_after_active: bool | None = strawberry.UNSET
    steer_active: SteerActiveInput | None = strawberry.UNSET
    restart_active: RestartActiveInput | None = strawberry.UNSET


def dispatch_mode(dispatch: DispatchInput | None) -> DispatchMode:
    if dispatch is None:
        return DispatchMode.AUTO
    for name, mode in (
        ("auto", DispatchMode.AUTO),
        ("start_immediately", DispatchMode.START_IMMEDIATELY),
        ("queue_after_active", DispatchMode.QUEUE_AFTER_ACTIVE),
        ("steer_active", DispatchMode.STEER_ACTIVE),
        ("restart_active", DispatchMode.RESTART_ACTIVE),
    ):
        value = getattr(dispatch, name)
        if value is not strawberry.UNSET and value is not None and value is not False:
            return mode
    return DispatchMode.AUTO


@strawberry.input
class SendMessageInput:
    thread_id: strawberry.ID
    text: str
    dispatch: DispatchInput | None = None
    provider_instance_id: str | None = None
    model: str | None = None
    client_message_id: str | None = strawberry.field(
        default=None, description="Idempotency key: the same id on the same thread returns the same run."
    )


@strawberry.type
class SendMessagePayload:
    run: Run | None
    message: ConversationMessage | None
    applied_dispatch: AppliedDispatch | None
    user_errors: list[UserError]
    client_message_id: str | None


@strawberry.input
class ResumeQueueInput:
    thread_id: strawberry.ID
    client_mutation_id: str | None = None


@strawberry.type
class RunMutation:
    @strawberry.mutation(description="Send a user message: it starts a run now or queues it (see `dispatch`).")
    async def send_message(self, info: Info, input: SendMessageInput) -> SendMessagePayload:
        ctx = info.context

        async def act() -> Sent:
            if input.client_message_id is not None:
                _key(input.client_message_id)
            return await ctx.services.runs.send_message(
                ctx.principal,
                gid.decode_as(input.thread_id, "Thread", "threadId"),
                text=input.text,
                mode=dispatch_mode(input.dispatch),
                provider_instance_id=input.provider_instance_id,
                model=input.model,
                client_message_id=input.client_message_id,
            )

        sent, errors = await _attempt(act)
        return SendMessagePayload(
            run=await _load(info, Run, sent.run_id if sent else None),
            message=await _load(info, ConversationMessage, sent.message_id if sent else None),
            applied_dispatch=sent.applied if sent else None,
            user_errors=errors,
            client_message_id=input.client_message_id,
        )

    @strawberry.mutation(description="Release a held queue: the next queued run starts if nothing runs.")
    async def resume_queue(self, info: Info, input: ResumeQueueInput) -> ThreadPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            thread_id = gid.decode_as(input.thread_id, "Thread", "threadId")
            return await ctx.services.runs.resume_queue(ctx.principal, thread_id, _key(input.client_mutation_id))

        return await _thread_payload(info, act, input.client_mutation_id)

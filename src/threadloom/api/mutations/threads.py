"""The catalog: createProject, createThread, renameThread, archiveThread, unarchiveThread.

`createThread` and `setRuntimeMode` take the runtime mode two ways: `mode` (the RuntimeMode enum) and the older
`runtimeMode` string, kept (deprecated) so no client breaks; `mode_of` reconciles them.
"""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api import enums
from threadloom.api import ids as gid
from threadloom.api.context import Context
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import THREAD, KeyedInput, mutation, returning, thread_id
from threadloom.api.types import Project
from threadloom.api.vocab import RuntimeMode
from threadloom.domain.errors import DomainError, ErrorCode

DEFAULT_MODE = RuntimeMode.WORKSPACE_WRITE
_MODE_STRING = "Use `mode` (the RuntimeMode enum)."


@strawberry.input
class CreateProjectInput(KeyedInput):
    name: str
    workspace_root: str = strawberry.field(description="Absolute path of the folder agents work in.")


@strawberry.type
class CreateProjectPayload:
    project: Project | None
    user_errors: list[UserError]
    client_mutation_id: str | None


PROJECT = returning(CreateProjectPayload, "project", Project)


@strawberry.input
class CreateThreadInput(KeyedInput):
    project_id: strawberry.ID
    title: str | None = None
    provider_instance_id: str | None = strawberry.field(
        default=None, description="A configured provider instance; absent means the default (`scripted`)."
    )
    model: str | None = None
    mode: RuntimeMode | None = strawberry.field(
        default=None,
        description=(
            "What the thread's agent may do. Absent (and no `runtimeMode`) means WORKSPACE_WRITE: no prompts, "
            "sandboxed to the project's workspace, no network. APPROVAL_REQUIRED: every command and file change "
            "asks first. READ_ONLY: nothing is written. FULL_ACCESS: no prompts, a network; only on instances "
            "configured with allow_full_access, else RUNTIME_MODE_NOT_ALLOWED."
        ),
    )
    runtime_mode: str | None = strawberry.field(
        default=None,
        description=(
            "Older form of `mode`, as a string: workspace_write | approval_required | read_only | full_access. "
            "Given with a `mode` that names another mode: INVALID_INPUT."
        ),
        deprecation_reason=_MODE_STRING,
    )


@strawberry.input
class SwitchProviderInput(KeyedInput):
    thread_id: strawberry.ID
    provider_instance_id: str
    model: str | None = strawberry.field(default=None, description="Absent means the provider's default model.")


@strawberry.input
class SetRuntimeModeInput(KeyedInput):
    thread_id: strawberry.ID
    mode: RuntimeMode | None = strawberry.field(
        default=None,
        description="The mode of the thread's next runs (as in createThread). Needed unless `runtimeMode` is given.",
    )
    runtime_mode: str | None = strawberry.field(
        default=None,
        description=(
            "Older form of `mode`, as a string: workspace_write | approval_required | read_only | full_access. "
            "Given with a `mode` that names another mode: INVALID_INPUT."
        ),
        deprecation_reason=_MODE_STRING,
    )


def mode_of(mode: object, runtime_mode: str | None, default: RuntimeMode | None) -> str:
    """The runtime mode string an input asks for: `mode` (a member inline, its value string through a variable)
    or the older `runtimeMode`; both naming different modes is a contradiction the client must resolve, and
    neither means `default` (none for setRuntimeMode, which has nothing to keep). An unknown `runtimeMode`
    string passes through to the domain's check, which refuses it as before."""
    if mode is None:
        if runtime_mode is not None:
            return runtime_mode
        if default is None:
            raise DomainError(ErrorCode.INVALID_INPUT, "give mode (or the older runtimeMode)", "mode")
        return default.value
    asked = enums.member(RuntimeMode, mode)
    if runtime_mode is not None and runtime_mode != asked.value:
        raise DomainError(
            ErrorCode.INVALID_INPUT, f"runtimeMode: {runtime_mode!r} contradicts mode: {asked.name}", "runtimeMode"
        )
    return asked.value


@strawberry.input
class RenameThreadInput(KeyedInput):
    thread_id: strawberry.ID
    title: str


@strawberry.input
class ThreadInput(KeyedInput):
    thread_id: strawberry.ID


@strawberry.type
class ThreadMutation:
    @mutation(PROJECT)
    async def create_project(ctx: Context, input: CreateProjectInput) -> uuid.UUID:
        """Create a project (needs an admin token for all projects)."""
        return await ctx.services.catalog.create_project(
            ctx.principal, name=input.name, workspace_root=input.workspace_root, key=input.key()
        )

    @mutation(THREAD)
    async def create_thread(ctx: Context, input: CreateThreadInput) -> uuid.UUID:
        """Create a thread. No provider session or provider thread is made until the first run."""
        return await ctx.services.catalog.create_thread(
            ctx.principal,
            project_id=gid.decode_as(input.project_id, "Project", "projectId"),
            title=input.title,
            provider_instance_id=input.provider_instance_id,
            model=input.model,
            runtime_mode=mode_of(input.mode, input.runtime_mode, DEFAULT_MODE),
            key=input.key(),
        )

    @mutation(THREAD)
    async def rename_thread(ctx: Context, input: RenameThreadInput) -> uuid.UUID:
        thread = thread_id(input.thread_id)
        return await ctx.services.catalog.rename_thread(ctx.principal, thread, input.title, input.key())

    @mutation(THREAD)
    async def switch_provider(ctx: Context, input: SwitchProviderInput) -> uuid.UUID:
        """Move the thread to another provider instance: its next run goes there with a handoff of what that
        provider has not seen (a full summary the first time, only the missed runs when it returns)."""
        thread = thread_id(input.thread_id)
        instance, model = input.provider_instance_id, input.model
        return await ctx.services.catalog.switch_provider(ctx.principal, thread, instance, model, input.key())

    @mutation(THREAD)
    async def set_runtime_mode(ctx: Context, input: SetRuntimeModeInput) -> uuid.UUID:
        """Change what the thread's agent may do, from its next run on. A driver that cannot change the mode on
        a live provider thread (docs/providers.md) starts the next run on a new one, given a full summary."""
        thread = thread_id(input.thread_id)
        mode = mode_of(input.mode, input.runtime_mode, None)
        return await ctx.services.catalog.set_runtime_mode(ctx.principal, thread, mode, input.key())

    @mutation(THREAD)
    async def archive_thread(ctx: Context, input: ThreadInput) -> uuid.UUID:
        """Hide a thread from default listings. Refused while a run is active."""
        return await ctx.services.catalog.archive_thread(ctx.principal, thread_id(input.thread_id), input.key())

    @mutation(THREAD)
    async def unarchive_thread(ctx: Context, input: ThreadInput) -> uuid.UUID:
        return await ctx.services.catalog.unarchive_thread(ctx.principal, thread_id(input.thread_id), input.key())

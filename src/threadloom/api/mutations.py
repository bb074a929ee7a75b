"""Mutations: one `input` argument, a payload with `userErrors`. Thin: decode ids, call the engine."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.enums import AppliedDispatch, Decision, PlanTarget
from threadloom.api.errors import UserError
from threadloom.api.types import (
    ConversationMessage,
    ExecutionNode,
    PlanArtifact,
    Project,
    Run,
    RuntimeRequest,
    Thread,
)
from threadloom.domain.dispatch import Dispatch
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
        default="workspace_write",
        description=(
            "workspace_write (default: no prompts, sandboxed to the project's workspace, no network) | "
            "approval_required (every command and file change asks first) | read_only (nothing is written) | "
            "full_access (no prompts, network; only on instances configured with allow_full_access, "
            "else RUNTIME_MODE_NOT_ALLOWED)"
        ),
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


def dispatch_of(dispatch: DispatchInput | None) -> Dispatch:
    """The one field set in the @oneOf input, with its target ids decoded."""
    if dispatch is None:
        return Dispatch()
    steer = dispatch.steer_active
    if steer is not strawberry.UNSET and steer is not None:
        return Dispatch(
            DispatchMode.STEER_ACTIVE,
            gid.decode_as(steer.target_run_id, "Run", "dispatch.steerActive.targetRunId"),
            None
            if steer.expected_attempt_id is None
            else gid.decode_as(steer.expected_attempt_id, "RunAttempt", "dispatch.steerActive.expectedAttemptId"),
        )
    restart = dispatch.restart_active
    if restart is not strawberry.UNSET and restart is not None:
        return Dispatch(
            DispatchMode.RESTART_ACTIVE,
            gid.decode_as(restart.target_run_id, "Run", "dispatch.restartActive.targetRunId"),
        )
    for name, mode in (
        ("start_immediately", DispatchMode.START_IMMEDIATELY),
        ("queue_after_active", DispatchMode.QUEUE_AFTER_ACTIVE),
    ):
        if getattr(dispatch, name) is True:
            return Dispatch(mode)
    return Dispatch()


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
                dispatch=dispatch_of(input.dispatch),
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


@strawberry.type
class RunPayload:
    run: Run | None
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.input
class InterruptRunInput:
    run_id: strawberry.ID
    hold_queue: bool = strawberry.field(default=False, description="Also hold the queue: the Stop button.")
    client_mutation_id: str | None = None


@strawberry.input
class InterruptNodeInput:
    node_id: strawberry.ID
    hold_queue: bool = False
    client_mutation_id: str | None = None


@strawberry.type
class NodePayload:
    node: ExecutionNode | None
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.input
class StopThreadInput:
    thread_id: strawberry.ID
    client_mutation_id: str | None = None


@strawberry.input
class QueuedRunInput:
    run_id: strawberry.ID
    client_mutation_id: str | None = None


@strawberry.input
class ReorderQueuedRunInput:
    run_id: strawberry.ID
    position: int = strawberry.field(description="The new 1-based place in the queue.")
    client_mutation_id: str | None = None


@strawberry.input
class EditQueuedRunInput:
    run_id: strawberry.ID
    text: str
    client_mutation_id: str | None = None


async def _run_payload(
    info: Info, act: Callable[[], Awaitable[uuid.UUID]], client_mutation_id: str | None
) -> RunPayload:
    run_id, errors = await _attempt(act)
    return RunPayload(run=await _load(info, Run, run_id), user_errors=errors, client_mutation_id=client_mutation_id)


def _run_id(value: str) -> uuid.UUID:
    return gid.decode_as(value, "Run", "runId")


@strawberry.type
class ControlMutation:
    @strawberry.mutation(
        description="Ask the provider to interrupt a run (a queued run is cancelled). The run ends when the "
        "provider says so; with holdQueue it is the Stop button."
    )
    async def interrupt_run(self, info: Info, input: InterruptRunInput) -> RunPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            return await ctx.services.control.interrupt_run(
                ctx.principal, _run_id(input.run_id), hold_queue=input.hold_queue, key=_key(input.client_mutation_id)
            )

        return await _run_payload(info, act, input.client_mutation_id)

    @strawberry.mutation(
        description="Interrupt by node: a root turn node interrupts its run, a delegated subagent node stops its "
        "child thread; other nodes are NOT_INTERRUPTIBLE."
    )
    async def interrupt_node(self, info: Info, input: InterruptNodeInput) -> NodePayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            node = gid.decode_as(input.node_id, "ExecutionNode", "nodeId")
            return await ctx.services.control.interrupt_node(
                ctx.principal, node, hold_queue=input.hold_queue, key=_key(input.client_mutation_id)
            )

        node_id, errors = await _attempt(act)
        return NodePayload(
            node=await _load(info, ExecutionNode, node_id),
            user_errors=errors,
            client_mutation_id=input.client_mutation_id,
        )

    @strawberry.mutation(description="Stop: hold the queue, interrupt the active run, stop every delegated task.")
    async def stop_thread(self, info: Info, input: StopThreadInput) -> ThreadPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            thread_id = gid.decode_as(input.thread_id, "Thread", "threadId")
            return await ctx.services.control.stop_thread(ctx.principal, thread_id, _key(input.client_mutation_id))

        return await _thread_payload(info, act, input.client_mutation_id)

    @strawberry.mutation
    async def cancel_queued_run(self, info: Info, input: QueuedRunInput) -> RunPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            return await ctx.services.control.cancel_queued(
                ctx.principal, _run_id(input.run_id), _key(input.client_mutation_id)
            )

        return await _run_payload(info, act, input.client_mutation_id)

    @strawberry.mutation
    async def reorder_queued_run(self, info: Info, input: ReorderQueuedRunInput) -> RunPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            return await ctx.services.control.reorder_queued(
                ctx.principal, _run_id(input.run_id), input.position, _key(input.client_mutation_id)
            )

        return await _run_payload(info, act, input.client_mutation_id)

    @strawberry.mutation
    async def edit_queued_run(self, info: Info, input: EditQueuedRunInput) -> RunPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            return await ctx.services.control.edit_queued(
                ctx.principal, _run_id(input.run_id), input.text, _key(input.client_mutation_id)
            )

        return await _run_payload(info, act, input.client_mutation_id)

    @strawberry.mutation(description="The queued run's message steers the active run instead; the queued run ends.")
    async def promote_queued_run_to_steer(self, info: Info, input: QueuedRunInput) -> RunPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            return await ctx.services.control.promote_to_steer(
                ctx.principal, _run_id(input.run_id), _key(input.client_mutation_id)
            )

        return await _run_payload(info, act, input.client_mutation_id)


@strawberry.input
class DelegateTaskInput:
    thread_id: strawberry.ID = strawberry.field(description="The parent thread.")
    text: str = strawberry.field(description="The task: the child thread's first message.")
    title: str | None = None
    client_mutation_id: str | None = None


@strawberry.type
class DelegationMutation:
    @strawberry.mutation(
        description="Delegate a task to a new child thread (lineage `subagent`). Each run's result comes back to "
        "the parent as a `subagent_result` transfer and a system message; stopThread on the parent stops it too."
    )
    async def delegate_task(self, info: Info, input: DelegateTaskInput) -> ThreadPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            parent = gid.decode_as(input.thread_id, "Thread", "threadId")
            return await ctx.services.delegation.delegate(
                ctx.principal, parent, text=input.text, title=input.title, key=_key(input.client_mutation_id)
            )

        return await _thread_payload(info, act, input.client_mutation_id)


@strawberry.input
class RespondToApprovalInput:
    request_id: strawberry.ID
    decision: Decision
    client_mutation_id: str | None = None


@strawberry.input
class QuestionAnswer:
    question_id: str
    answers: list[str]


@strawberry.input
class RespondToUserInputInput:
    request_id: strawberry.ID
    answers: list[QuestionAnswer]
    client_mutation_id: str | None = None


@strawberry.type
class RuntimeRequestPayload:
    request: RuntimeRequest | None
    user_errors: list[UserError]
    client_mutation_id: str | None


async def _request_payload(
    info: Info, act: Callable[[], Awaitable[uuid.UUID]], client_mutation_id: str | None
) -> RuntimeRequestPayload:
    request_id, errors = await _attempt(act)
    return RuntimeRequestPayload(
        request=await _load(info, RuntimeRequest, request_id),
        user_errors=errors,
        client_mutation_id=client_mutation_id,
    )


@strawberry.type
class RequestMutation:
    @strawberry.mutation(description="Answer an approval. NOT_RESUMABLE when the provider's callback is gone.")
    async def respond_to_approval(self, info: Info, input: RespondToApprovalInput) -> RuntimeRequestPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            request = gid.decode_as(input.request_id, "RuntimeRequest", "requestId")
            return await ctx.services.requests.respond_to_approval(
                ctx.principal, request, Decision(input.decision), _key(input.client_mutation_id)
            )

        return await _request_payload(info, act, input.client_mutation_id)

    @strawberry.mutation(description="Answer a question: every question once, options as offered.")
    async def respond_to_user_input(self, info: Info, input: RespondToUserInputInput) -> RuntimeRequestPayload:
        ctx = info.context

        async def act() -> uuid.UUID:
            request = gid.decode_as(input.request_id, "RuntimeRequest", "requestId")
            answers: dict[str, list[str]] = {}
            for item in input.answers:
                if item.question_id in answers:
                    raise DomainError(
                        ErrorCode.INVALID_INPUT, f"question {item.question_id!r} answered twice", "answers"
                    )
                answers[item.question_id] = list(item.answers)
            return await ctx.services.requests.respond_to_user_input(
                ctx.principal, request, answers, _key(input.client_mutation_id)
            )

        return await _request_payload(info, act, input.client_mutation_id)


@strawberry.input
class ImplementPlanInput:
    plan_id: strawberry.ID
    target: PlanTarget = strawberry.field(description="NEW_RUN on the plan's thread, or a NEW_THREAD.")
    client_mutation_id: str | None = None


@strawberry.type
class ImplementPlanPayload:
    plan: PlanArtifact | None
    thread: Thread | None
    run: Run | None
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.type
class PlanMutation:
    @strawberry.mutation(
        description="Start implementing a proposed plan: a new run (queued behind an active one) "
        "or a new thread in the same project."
    )
    async def implement_plan(self, info: Info, input: ImplementPlanInput) -> ImplementPlanPayload:
        ctx = info.context

        async def act() -> tuple[uuid.UUID, uuid.UUID]:
            plan = gid.decode_as(input.plan_id, "PlanArtifact", "planId")
            return await ctx.services.plans.implement(
                ctx.principal, plan, PlanTarget(input.target), _key(input.client_mutation_id)
            )

        done, errors = await _attempt(act)
        plan_id = gid.maybe_as(input.plan_id, "PlanArtifact") if not errors else None
        return ImplementPlanPayload(
            plan=await _load(info, PlanArtifact, plan_id),
            thread=await _load(info, Thread, done[0] if done else None),
            run=await _load(info, Run, done[1] if done else None),
            user_errors=errors,
            client_mutation_id=input.client_mutation_id,
        )

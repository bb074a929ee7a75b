"""Runs: sendMessage, which starts a run now or queues it, and the `dispatch` choice it takes."""

from __future__ import annotations

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context, Info
from threadloom.api.enums import AppliedDispatch
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import Shape, key, load, mutation, thread_id
from threadloom.api.types import ConversationMessage, Run
from threadloom.domain.dispatch import Dispatch, DispatchMode
from threadloom.engine.dispatch import Sent


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
    provider_instance_id: str | None = strawberry.field(
        default=None,
        description="Another provider instance than the thread's switches the thread to it: this run and later ones "
        "go there, with a handoff of what that provider has not seen. While a run is active the message is queued.",
    )
    model: str | None = None
    fresh_context: bool = strawberry.field(
        default=False,
        description="Start a new provider thread that gets a full summary of the conversation instead of "
        "continuing the provider's own thread.",
    )
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


async def _sent(info: Info, sent: Sent | None, errors: list[UserError], client_key: str | None) -> SendMessagePayload:
    return SendMessagePayload(
        run=await load(info, Run, sent.run_id if sent else None),
        message=await load(info, ConversationMessage, sent.message_id if sent else None),
        applied_dispatch=sent.applied if sent else None,
        user_errors=errors,
        client_message_id=client_key,
    )


@strawberry.type
class RunMutation:
    @mutation(Shape(SendMessagePayload, _sent), key_field="client_message_id")
    async def send_message(ctx: Context, input: SendMessageInput) -> Sent:
        """Send a user message: it starts a run now or queues it (see `dispatch`)."""
        client_message_id = key(input.client_message_id)  # checked before the ids, as it always was
        return await ctx.services.dispatch.send_message(
            ctx.principal,
            thread_id(input.thread_id),
            text=input.text,
            dispatch=dispatch_of(input.dispatch),
            provider_instance_id=input.provider_instance_id,
            model=input.model,
            client_message_id=client_message_id,
            fresh_context=input.fresh_context,
        )

"""Webhook endpoints (admin scope on their project): createWebhookEndpoint, updateWebhookEndpoint,
deleteWebhookEndpoint, rotateWebhookSecret, redeliverWebhook (docs/webhooks.md).

Like the token commands they keep no receipt: a replayed create or rotation could not show its secret again,
so `clientMutationId` is only echoed. The create and rotate payloads are the only places a secret is shown.
"""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api import enums
from threadloom.api import ids as gid
from threadloom.api.context import Context, Info
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import KeyedInput, Shape, mutation
from threadloom.api.webhooks import WebhookDelivery, WebhookEndpoint
from threadloom.domain.webhooks import WebhookEvent
from threadloom.store.webhooks import Delivery, Endpoint

SECRET = (
    "The signing secret (`whsec_` + base64 of the key), shown here once: keep it where the receiver verifies "
    "`webhook-signature` (docs/webhooks.md)."
)


def _endpoint_id(value: str) -> uuid.UUID:
    return gid.decode_as(value, "WebhookEndpoint", "endpointId")


@strawberry.input(description="A new webhook endpoint of a project.")
class CreateWebhookEndpointInput(KeyedInput):
    project_id: strawberry.ID = strawberry.field(description="The project whose events it receives.")
    url: str = strawberry.field(
        description="Where deliveries are POSTed: https:// (http:// only to a loopback address, where the operator "
        "allows loopback targets). Private and loopback addresses are refused unless the operator allows them: "
        "WEBHOOK_URL_NOT_ALLOWED (the URL's form or scheme), WEBHOOK_TARGET_NOT_ALLOWED (its address)."
    )
    events: list[WebhookEvent] = strawberry.field(description="The events it receives (at least one).")
    description: str | None = strawberry.field(default=None, description="What it is for (at most 500 characters).")
    include_subagents: bool = strawberry.field(
        default=False,
        description="Also page for the runs of delegated tasks' threads (a subagent completing); approvals and "
        "questions there page regardless.",
    )


@strawberry.type(description="The new endpoint and, this once, its secret (both null when it was refused).")
class CreateWebhookEndpointPayload:
    endpoint: WebhookEndpoint | None = strawberry.field(description="The endpoint made.")
    secret: str | None = strawberry.field(description=SECRET)
    user_errors: list[UserError] = strawberry.field(description="Why it was refused; nothing changed then.")
    client_mutation_id: str | None = strawberry.field(description="As given.")


@strawberry.input(description="What changes on a webhook endpoint; an absent field stays as it is.")
class UpdateWebhookEndpointInput(KeyedInput):
    endpoint_id: strawberry.ID = strawberry.field(description="The endpoint.")
    url: str | None = strawberry.field(default=None, description="A new URL (the same rules as at creation).")
    events: list[WebhookEvent] | None = strawberry.field(default=None, description="A new event list (at least one).")
    description: str | None = strawberry.field(default=None, description="A new description.")
    include_subagents: bool | None = strawberry.field(default=None, description="Page for subagents' runs or not.")
    enabled: bool | None = strawberry.field(
        default=None,
        description="true: ACTIVE again (from FAILING or DISABLED; its pending deliveries go on); false: DISABLED "
        "(nothing sent or queued for it).",
    )


@strawberry.type(description="The endpoint after the change (null when it was refused).")
class WebhookEndpointPayload:
    endpoint: WebhookEndpoint | None = strawberry.field(description="The endpoint.")
    user_errors: list[UserError] = strawberry.field(description="Why it was refused; nothing changed then.")
    client_mutation_id: str | None = strawberry.field(description="As given.")


@strawberry.input(description="A webhook endpoint, by id.")
class WebhookEndpointInput(KeyedInput):
    endpoint_id: strawberry.ID = strawberry.field(description="The endpoint.")


@strawberry.type(description="The id of the endpoint deleted (null when it was refused).")
class DeleteWebhookEndpointPayload:
    deleted_endpoint_id: strawberry.ID | None = strawberry.field(description="The endpoint that is gone.")
    user_errors: list[UserError] = strawberry.field(description="Why it was refused; nothing changed then.")
    client_mutation_id: str | None = strawberry.field(description="As given.")


@strawberry.input(description="The endpoint whose secret is replaced, and how long the old one still signs.")
class RotateWebhookSecretInput(KeyedInput):
    endpoint_id: strawberry.ID = strawberry.field(description="The endpoint.")
    grace_seconds: int | None = strawberry.field(
        default=None,
        description="How long the old secret still signs beside the new one (both signatures in "
        "`webhook-signature`): 0 .. 604800 seconds; absent: 86400 (a day); 0: the old one stops at once.",
    )


@strawberry.type(description="The endpoint and, this once, its new secret (both null when it was refused).")
class RotateWebhookSecretPayload:
    endpoint: WebhookEndpoint | None = strawberry.field(description="The endpoint.")
    secret: str | None = strawberry.field(description=SECRET)
    user_errors: list[UserError] = strawberry.field(description="Why it was refused; nothing changed then.")
    client_mutation_id: str | None = strawberry.field(description="As given.")


@strawberry.input(description="A webhook delivery to send again.")
class RedeliverWebhookInput(KeyedInput):
    delivery_id: strawberry.ID = strawberry.field(description="The delivery (`webhookDeliveries`).")


@strawberry.type(description="The delivery, PENDING again (null when it was refused).")
class RedeliverWebhookPayload:
    delivery: WebhookDelivery | None = strawberry.field(description="The delivery.")
    user_errors: list[UserError] = strawberry.field(description="Why it was refused; nothing changed then.")
    client_mutation_id: str | None = strawberry.field(description="As given.")


def _shown(info: Info, endpoint: Endpoint | None) -> WebhookEndpoint | None:
    return None if endpoint is None else WebhookEndpoint.of(endpoint, info.context.services.clock.now())


async def _created(
    info: Info, made: tuple[Endpoint, str] | None, errors: list[UserError], key: str | None
) -> CreateWebhookEndpointPayload:
    endpoint, secret = made if made else (None, None)
    return CreateWebhookEndpointPayload(
        endpoint=_shown(info, endpoint), secret=secret, user_errors=errors, client_mutation_id=key
    )


async def _rotated(
    info: Info, made: tuple[Endpoint, str] | None, errors: list[UserError], key: str | None
) -> RotateWebhookSecretPayload:
    endpoint, secret = made if made else (None, None)
    return RotateWebhookSecretPayload(
        endpoint=_shown(info, endpoint), secret=secret, user_errors=errors, client_mutation_id=key
    )


async def _updated(
    info: Info, endpoint: Endpoint | None, errors: list[UserError], key: str | None
) -> WebhookEndpointPayload:
    return WebhookEndpointPayload(endpoint=_shown(info, endpoint), user_errors=errors, client_mutation_id=key)


async def _deleted(
    info: Info, endpoint_id: uuid.UUID | None, errors: list[UserError], key: str | None
) -> DeleteWebhookEndpointPayload:
    shown = None if endpoint_id is None else strawberry.ID(gid.encode("WebhookEndpoint", endpoint_id))
    return DeleteWebhookEndpointPayload(deleted_endpoint_id=shown, user_errors=errors, client_mutation_id=key)


async def _redelivered(
    info: Info, delivery: Delivery | None, errors: list[UserError], key: str | None
) -> RedeliverWebhookPayload:
    shown = None if delivery is None else WebhookDelivery.of(delivery)
    return RedeliverWebhookPayload(delivery=shown, user_errors=errors, client_mutation_id=key)


@strawberry.type
class WebhookMutation:
    @mutation(Shape(CreateWebhookEndpointPayload, _created))
    async def create_webhook_endpoint(ctx: Context, input: CreateWebhookEndpointInput) -> tuple[Endpoint, str]:
        """Make a webhook endpoint for a project (admin scope on it). Its events are delivered as Standard
        Webhooks, signed with the secret the payload shows this once."""
        project = gid.decode_as(input.project_id, "Project", "projectId")
        input.key()
        return await ctx.services.webhooks.create(
            ctx.principal,
            project_id=project,
            url=input.url,
            events=[enums.member(WebhookEvent, e) for e in input.events],
            description=input.description,
            include_subagents=input.include_subagents,
        )

    @mutation(Shape(WebhookEndpointPayload, _updated))
    async def update_webhook_endpoint(ctx: Context, input: UpdateWebhookEndpointInput) -> Endpoint:
        """Change a webhook endpoint (admin scope on its project): its URL, events, description, whether
        subagents' runs page it, or whether it is enabled."""
        endpoint = _endpoint_id(input.endpoint_id)
        input.key()
        return await ctx.services.webhooks.update(
            ctx.principal,
            endpoint,
            url=input.url,
            events=None if input.events is None else [enums.member(WebhookEvent, e) for e in input.events],
            description=input.description,
            include_subagents=input.include_subagents,
            enabled=input.enabled,
        )

    @mutation(Shape(DeleteWebhookEndpointPayload, _deleted))
    async def delete_webhook_endpoint(ctx: Context, input: WebhookEndpointInput) -> uuid.UUID:
        """Delete a webhook endpoint with its deliveries (admin scope on its project): nothing more is sent."""
        endpoint = _endpoint_id(input.endpoint_id)
        input.key()
        return await ctx.services.webhooks.delete(ctx.principal, endpoint)

    @mutation(Shape(RotateWebhookSecretPayload, _rotated))
    async def rotate_webhook_secret(ctx: Context, input: RotateWebhookSecretInput) -> tuple[Endpoint, str]:
        """Give a webhook endpoint a new signing secret (admin scope on its project), shown this once. The old
        one still signs, beside it, for `graceSeconds`."""
        endpoint = _endpoint_id(input.endpoint_id)
        input.key()
        return await ctx.services.webhooks.rotate(ctx.principal, endpoint, input.grace_seconds)

    @mutation(Shape(RedeliverWebhookPayload, _redelivered))
    async def redeliver_webhook(ctx: Context, input: RedeliverWebhookInput) -> Delivery:
        """Send a webhook delivery again now (admin scope on its project): the same `webhook-id` and body, a
        fresh retry schedule. Refused while it is being sent."""
        delivery = gid.decode_as(input.delivery_id, "WebhookDelivery", "deliveryId")
        input.key()
        return await ctx.services.webhooks.redeliver(ctx.principal, delivery)

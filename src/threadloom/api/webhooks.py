"""The webhook types and the `webhookEndpoints` and `webhookDeliveries` queries (docs/webhooks.md), for a
project's admins.

Not `Node`s, like `ApiToken`: an endpoint or a delivery is reached only through these queries and the webhook
mutations, so nothing a read token may ask names one.
"""

from __future__ import annotations

import uuid
from datetime import datetime

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.errors import ApiError
from threadloom.api.types import Project, Thread
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.webhooks import AttemptError, DeliveryStatus, EndpointStatus, WebhookEvent
from threadloom.store.webhooks import Attempt, Delivery, Endpoint

strawberry.enum(
    WebhookEvent,
    description="What a webhook endpoint subscribes to; the delivery body's `type` is its dotted form "
    "(RUN_COMPLETED: `run.completed`, APPROVAL_REQUESTED: `approval.requested` …). docs/webhooks.md lists each "
    "body.",
)
strawberry.enum(
    EndpointStatus,
    name="WebhookEndpointStatus",
    description="ACTIVE: delivering. FAILING: a delivery failed every attempt of its schedule (later ones are "
    "still tried; a 2xx makes it ACTIVE again). DISABLED: nothing is sent or queued for it, by the admin or "
    "by the server after deliveries kept failing (or a 410 Gone); `updateWebhookEndpoint(enabled: true)` "
    "turns it on again.",
)
strawberry.enum(
    DeliveryStatus,
    name="WebhookDeliveryStatus",
    description="PENDING: waiting for its time or for its thread's earlier delivery to the same endpoint. "
    "SENDING: being sent now. DELIVERED: answered with a 2xx. FAILED: every attempt of its schedule failed "
    "(`redeliverWebhook` sends it again).",
)
strawberry.enum(
    AttemptError,
    name="WebhookAttemptError",
    description="Why an attempt failed. HTTP_STATUS: answered other than 2xx (a redirect too: never followed). "
    "TIMEOUT: no answer in time. CONNECTION_FAILED: refused, reset or a TLS failure. DNS_FAILED: the host did not "
    "resolve. TARGET_NOT_ALLOWED: it resolved to an address the server's egress rules refuse. "
    "INVALID_RESPONSE: not an HTTP answer.",
)


@strawberry.type(description="A URL a project's events are delivered to, signed (Standard Webhooks). Never its secret.")
class WebhookEndpoint:
    id: strawberry.ID = strawberry.field(description="Its id, for the webhook mutations and `webhookDeliveries`.")
    url: str = strawberry.field(description="Where deliveries are POSTed.")
    events: list[WebhookEvent] = strawberry.field(description="The events it receives.")
    description: str = strawberry.field(description="What it is for, as given.")
    include_subagents: bool = strawberry.field(
        description="Whether runs on a delegated task's thread (a subagent's) page it too; approvals and "
        "questions there always do."
    )
    status: EndpointStatus = strawberry.field(description="ACTIVE, FAILING or DISABLED.")
    previous_secret_expires_at: datetime | None = strawberry.field(
        description="Until when the secret before the last rotation still signs (beside the current one); null "
        "when only the current one does."
    )
    created_at: datetime = strawberry.field(description="When it was made.")
    updated_at: datetime = strawberry.field(description="When it last changed.")
    disabled_at: datetime | None = strawberry.field(description="When it was disabled; null unless DISABLED.")
    _project_id: strawberry.Private[uuid.UUID]

    @strawberry.field(description="The project whose events it receives.")
    async def project(self, info: Info) -> Project | None:
        row = await info.context.load_visible(Project.table(), self._project_id)
        return None if row is None else Project.from_row(row)

    @classmethod
    def of(cls, endpoint: Endpoint, now: datetime) -> WebhookEndpoint:
        expires = endpoint.previous_secret_expires_at
        return cls(
            id=strawberry.ID(gid.encode("WebhookEndpoint", endpoint.id)),
            url=endpoint.url,
            events=list(endpoint.events),
            description=endpoint.description,
            include_subagents=endpoint.include_subagents,
            status=endpoint.status,
            previous_secret_expires_at=expires if endpoint.previous_secret and expires and expires > now else None,
            created_at=endpoint.created_at,
            updated_at=endpoint.updated_at,
            disabled_at=endpoint.disabled_at,
            _project_id=endpoint.project_id,
        )


@strawberry.type(description="One try of a webhook delivery.")
class WebhookAttempt:
    number: int = strawberry.field(description="1 for the first try of the delivery, counting redeliveries on.")
    started_at: datetime = strawberry.field(description="When it was sent.")
    status_code: int | None = strawberry.field(description="The receiver's HTTP status; null when none came.")
    latency_ms: int = strawberry.field(description="Milliseconds from sending to the answer's status (or the error).")
    error: AttemptError | None = strawberry.field(description="Why it failed; null for a 2xx.")
    message: str | None = strawberry.field(description="The failure in words (for people, not for matching).")

    @classmethod
    def of(cls, attempt: Attempt) -> WebhookAttempt:
        return cls(
            number=attempt.number,
            started_at=attempt.started_at,
            status_code=attempt.status_code,
            latency_ms=attempt.latency_ms,
            error=None if attempt.error is None else AttemptError(attempt.error),
            message=attempt.message,
        )


@strawberry.type(description="One event on its way to one endpoint, and every attempt to deliver it.")
class WebhookDelivery:
    id: strawberry.ID = strawberry.field(description="Its id, for `redeliverWebhook`.")
    webhook_id: str = strawberry.field(
        description="The `webhook-id` header: the same on every attempt and redelivery (the receiver's "
        "idempotency key), and for every endpoint the event went to."
    )
    event: WebhookEvent = strawberry.field(description="The event it carries.")
    status: DeliveryStatus = strawberry.field(description="PENDING, SENDING, DELIVERED or FAILED.")
    sequence: int = strawberry.field(description="The event's sequence in its thread (deliveries go in this order).")
    body: str = strawberry.field(description="The JSON body, exactly as signed and sent.")
    next_attempt_at: datetime | None = strawberry.field(description="When it is tried next; null unless PENDING.")
    created_at: datetime = strawberry.field(description="When its event was written.")
    completed_at: datetime | None = strawberry.field(description="When it was DELIVERED or FAILED.")
    attempts: list[WebhookAttempt] = strawberry.field(description="Every attempt, oldest first.")
    cursor: str = strawberry.field(description="Pass as `before` for the deliveries older than this one.")
    _thread_id: strawberry.Private[uuid.UUID]

    @strawberry.field(description="The thread whose event it is.")
    async def thread(self, info: Info) -> Thread | None:
        row = await info.context.load_visible(Thread.table(), self._thread_id)
        return None if row is None else Thread.from_row(row)

    @classmethod
    def of(cls, delivery: Delivery) -> WebhookDelivery:
        return cls(
            id=strawberry.ID(gid.encode("WebhookDelivery", delivery.id)),
            webhook_id=delivery.message_id,
            event=WebhookEvent(delivery.event_type),
            status=delivery.status,
            sequence=delivery.sequence,
            body=delivery.body,
            next_attempt_at=delivery.available_at if delivery.status == DeliveryStatus.PENDING else None,
            created_at=delivery.created_at,
            completed_at=delivery.completed_at,
            attempts=[WebhookAttempt.of(a) for a in delivery.tries],
            cursor=str(delivery.position),
            _thread_id=delivery.thread_id,
        )


def _refused(error: DomainError) -> None:
    """NOT_FOUND reads as null (nothing tells another project's ids apart); other refusals are errors."""
    if error.code != ErrorCode.NOT_FOUND:
        raise ApiError(error) from None


async def webhook_endpoints(info: Info, project_id: strawberry.ID) -> list[WebhookEndpoint] | None:
    project = gid.maybe_as(project_id, "Project")
    if project is None:
        return None
    services = info.context.services
    try:
        found = await services.webhooks.endpoints(info.context.principal, project)
    except DomainError as error:
        _refused(error)
        return None
    now = services.clock.now()
    return [WebhookEndpoint.of(e, now) for e in found]


async def webhook_deliveries(
    info: Info, endpoint_id: strawberry.ID, status: DeliveryStatus | None, first: int, before: str | None
) -> list[WebhookDelivery] | None:
    endpoint = gid.maybe_as(endpoint_id, "WebhookEndpoint")
    if endpoint is None:
        return None
    if before is not None and not (before.isascii() and before.isdigit() and len(before) <= 18):
        raise ApiError(DomainError(ErrorCode.INVALID_CURSOR, "before: a `cursor` of a delivery", "before"))
    try:
        found = await info.context.services.webhooks.deliveries(
            info.context.principal, endpoint, status, first, None if before is None else int(before)
        )
    except DomainError as error:
        _refused(error)
        return None
    return [WebhookDelivery.of(d) for d in found]

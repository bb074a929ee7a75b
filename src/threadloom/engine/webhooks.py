"""Webhooks in the engine (docs/webhooks.md): a project admin's endpoint commands, and the sender that delivers
what `log.append` wrote.

Endpoint commands run as transactions of their own, like the token commands: a replayed create could not show
its secret again. The sender claims due deliveries (`store.webhooks.claim`), posts each with a fresh timestamp
and signature and the same `webhook-id`, records the attempt, and schedules the next one (the policy's schedule,
with jitter) or ends the delivery; an endpoint's health follows (`domain.webhooks.after_attempt`). Disabling an
endpoint writes an activity on the thread whose delivery failed last, in the same transaction.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
import uuid
from datetime import datetime, timedelta

from threadloom import metrics
from threadloom.aio import cancel_all
from threadloom.domain import webhook_egress as egress
from threadloom.domain import webhook_signing as signing
from threadloom.domain import webhooks as rules
from threadloom.domain.access import Principal
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Outcome
from threadloom.domain.entities import AppThread
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.ids import global_id, new_id
from threadloom.domain.statuses import TokenScope
from threadloom.domain.webhooks import DeliveryStatus, EndpointStatus, WebhookEvent, WebhookPolicy
from threadloom.engine import webhook_http
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.store import threads as thread_store
from threadloom.store import webhooks as store
from threadloom.store.db import Reader
from threadloom.store.webhooks import Delivery, Endpoint

log = logging.getLogger("threadloom.webhooks")

ENDPOINT = "endpointId"
MAX_PAGE = 100


class WebhookAdmin:
    """createWebhookEndpoint, updateWebhookEndpoint, deleteWebhookEndpoint, rotateWebhookSecret,
    redeliverWebhook and the two queries: admin scope on the endpoint's project, NOT_FOUND for another project's."""

    def __init__(self, pipeline: Pipeline, policy: WebhookPolicy) -> None:
        self.pipeline = pipeline
        self.policy = policy

    async def _visible(self, db: Reader, principal: Principal, endpoint_id: uuid.UUID, *, lock: bool) -> Endpoint:
        found = await store.get_endpoint(db, endpoint_id, lock=lock)
        if found is None:
            raise not_found(ENDPOINT)
        principal.require_project(found.project_id, TokenScope.ADMIN, ENDPOINT)
        return found

    async def create(
        self,
        principal: Principal,
        *,
        project_id: uuid.UUID,
        url: str,
        events: list[WebhookEvent],
        description: str | None,
        include_subagents: bool,
    ) -> tuple[Endpoint, str]:
        """The new endpoint and its secret (shown this once)."""
        principal.require_project(project_id, TokenScope.ADMIN, "projectId")
        target = egress.parse(url, self.policy)
        wanted = rules.check_events(events)
        text = rules.check_description(description)
        now = self.pipeline.clock.now()
        secret = signing.new_secret()
        async with self.pipeline.db.transaction() as db:
            if await thread_store.get_project(db, project_id) is None:
                raise not_found("projectId")
            if await store.count_endpoints(db, project_id) >= rules.MAX_ENDPOINTS_PER_PROJECT:
                raise DomainError(
                    ErrorCode.INVALID_INPUT,
                    f"a project has at most {rules.MAX_ENDPOINTS_PER_PROJECT} webhook endpoints",
                    "projectId",
                )
            endpoint = await store.insert_endpoint(
                db,
                {
                    "id": new_id(),
                    "project_id": project_id,
                    "url": target.url,
                    "events": [e.value for e in wanted],
                    "description": text,
                    "include_subagents": include_subagents,
                    "status": EndpointStatus.ACTIVE.value,
                    "secret": secret,
                    "created_at": now,
                    "updated_at": now,
                },
            )
        return endpoint, secret

    async def update(
        self,
        principal: Principal,
        endpoint_id: uuid.UUID,
        *,
        url: str | None,
        events: list[WebhookEvent] | None,
        description: str | None,
        include_subagents: bool | None,
        enabled: bool | None,
    ) -> Endpoint:
        """The fields given change. `enabled: true` makes a FAILING or DISABLED endpoint ACTIVE again (its pending
        deliveries go on); `enabled: false` disables it."""
        now = self.pipeline.clock.now()
        values: dict[str, object] = {"updated_at": now}
        if url is not None:
            values["url"] = egress.parse(url, self.policy).url
        if events is not None:
            values["events"] = [e.value for e in rules.check_events(events)]
        if description is not None:
            values["description"] = rules.check_description(description)
        if include_subagents is not None:
            values["include_subagents"] = include_subagents
        if enabled is True:
            values.update(status=EndpointStatus.ACTIVE.value, exhausted_in_a_row=0, disabled_at=None)
        elif enabled is False:
            values.update(status=EndpointStatus.DISABLED.value, disabled_at=now)
        async with self.pipeline.db.transaction() as db:
            await self._visible(db, principal, endpoint_id, lock=True)
            return await store.update_endpoint(db, endpoint_id, values)

    async def delete(self, principal: Principal, endpoint_id: uuid.UUID) -> uuid.UUID:
        """Gone with its deliveries and their attempts: nothing more is sent to it."""
        async with self.pipeline.db.transaction() as db:
            await self._visible(db, principal, endpoint_id, lock=True)
            await store.delete_endpoint(db, endpoint_id)
        return endpoint_id

    async def rotate(
        self, principal: Principal, endpoint_id: uuid.UUID, grace_seconds: int | None
    ) -> tuple[Endpoint, str]:
        """A new secret (shown this once); the one before it still signs for `grace_seconds` (0: not at all)."""
        grace = rules.check_grace(grace_seconds)
        now = self.pipeline.clock.now()
        secret = signing.new_secret()
        async with self.pipeline.db.transaction() as db:
            old = await self._visible(db, principal, endpoint_id, lock=True)
            values: dict[str, object] = {"secret": secret, "updated_at": now}
            values["previous_secret"] = old.secret if grace else None
            values["previous_secret_expires_at"] = now + timedelta(seconds=grace) if grace else None
            return await store.update_endpoint(db, endpoint_id, values), secret

    async def redeliver(self, principal: Principal, delivery_id: uuid.UUID) -> Delivery:
        """Send a delivery again from now, with the same `webhook-id` and body and a fresh schedule."""
        now = self.pipeline.clock.now()
        async with self.pipeline.db.transaction() as db:
            found = await store.get_delivery(db, delivery_id, lock=True)
            if found is None:
                raise not_found("deliveryId")
            endpoint = await store.get_endpoint(db, found.endpoint_id)
            if endpoint is None or not principal.sees(endpoint.project_id):
                raise not_found("deliveryId")
            principal.require(TokenScope.ADMIN)
            if found.status == DeliveryStatus.SENDING:
                raise DomainError(ErrorCode.INVALID_INPUT, "this delivery is being sent now", "deliveryId")
            await store.redeliver(db, delivery_id, now)
            updated = await store.get_delivery(db, delivery_id)
        assert updated is not None
        return updated

    async def endpoints(self, principal: Principal, project_id: uuid.UUID) -> list[Endpoint]:
        principal.require_project(project_id, TokenScope.ADMIN, "projectId")
        async with self.pipeline.db.read() as db:
            if await thread_store.get_project(db, project_id) is None:
                raise not_found("projectId")
            return await store.list_endpoints(db, project_id)

    async def deliveries(
        self,
        principal: Principal,
        endpoint_id: uuid.UUID,
        status: DeliveryStatus | None,
        first: int,
        before: int | None,
    ) -> list[Delivery]:
        if not 1 <= first <= MAX_PAGE:
            raise DomainError(ErrorCode.PAGE_SIZE_EXCEEDED, f"first: 1..{MAX_PAGE}", "first")
        async with self.pipeline.db.read() as db:
            await self._visible(db, principal, endpoint_id, lock=False)
            return await store.list_deliveries(db, endpoint_id, status, first, before)


class WebhookSender:
    """Delivers due webhooks, up to `concurrency` at once in this process; every process runs one."""

    POLL_S = 1.0  # at most this long between looks (another process's writes, a retry falling due)

    def __init__(self, pipeline: Pipeline, worker_id: uuid.UUID, policy: WebhookPolicy, concurrency: int = 8) -> None:
        self.pipeline = pipeline
        self.worker_id = worker_id
        self.policy = policy
        self.concurrency = concurrency
        self._woken = asyncio.Event()
        self._inflight: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        self._random = random.Random()

    def wake(self) -> None:
        self._woken.set()

    def start(self) -> None:
        self._loop_task = asyncio.create_task(self._loop(), name="webhooks")

    async def stop(self) -> None:
        """Stop sending: an attempt cut short stays `sending` and is sent again (same id) by a live worker."""
        tasks = [*self._inflight, *([self._loop_task] if self._loop_task else [])]
        await cancel_all(tasks)
        self._inflight.clear()
        self._loop_task = None

    async def _loop(self) -> None:
        while True:
            self._woken.clear()
            wait = self.POLL_S
            try:
                free = self.concurrency - len(self._inflight)
                claimed: list[uuid.UUID] = []
                if free > 0:
                    now = self.pipeline.clock.now()
                    async with self.pipeline.db.statements() as db:  # one statement: its own transaction
                        claimed = await store.claim(db, self.worker_id, now, free)
                for delivery_id in claimed:
                    task = asyncio.create_task(self._deliver(delivery_id), name=f"webhook-{delivery_id}")
                    self._inflight.add(task)
                    task.add_done_callback(self._done)
                if claimed and len(claimed) == free:
                    continue  # more may be due: claim again once a slot frees (a done task wakes the loop)
                async with self.pipeline.db.statements() as db:
                    due = await store.next_due(db)
                if due is not None:
                    wait = min(wait, max(0.0, (due - self.pipeline.clock.now()).total_seconds()))
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("webhook loop error")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), wait)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._woken.set()  # a slot is free, and the thread's next delivery may be unblocked

    async def _deliver(self, delivery_id: uuid.UUID) -> None:
        try:
            async with self.pipeline.db.read() as db:
                delivery = await store.get_delivery(db, delivery_id)
                endpoint = None if delivery is None else await store.get_endpoint(db, delivery.endpoint_id)
            if delivery is None or endpoint is None:
                return  # the endpoint was deleted meanwhile
            started = self.pipeline.clock.now()
            clock = time.monotonic()
            answer = await self._post(endpoint, delivery, started)
            latency = round((time.monotonic() - clock) * 1000)  # not int(): a timeout's timer may fire a hair early
            metrics.WEBHOOK_ATTEMPTS.labels("delivered" if answer.error is None else answer.error.value).inc()
            await self._record(delivery, answer, started, latency)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("webhook delivery %s failed to be recorded; it is tried again", delivery_id)
            with contextlib.suppress(Exception):
                later = self.pipeline.clock.now() + timedelta(seconds=self.POLL_S * 5)
                async with self.pipeline.db.transaction() as db:
                    await store.settle(db, delivery_id, DeliveryStatus.PENDING, later, retry_at=later)

    async def _post(self, endpoint: Endpoint, delivery: Delivery, now: datetime) -> webhook_http.Answer:
        try:
            target = egress.parse(endpoint.url, self.policy)  # the rules may have changed since it was made
        except DomainError as refused:
            return webhook_http.Answer(None, rules.AttemptError.TARGET_NOT_ALLOWED, refused.message)
        body = delivery.body.encode()
        timestamp = int(now.timestamp())
        headers = {
            "webhook-id": delivery.message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": signing.signature_header(
                endpoint.signing_secrets(now), delivery.message_id, timestamp, body
            ),
        }
        return await webhook_http.post(target, body, headers, self.policy)

    async def _record(self, delivery: Delivery, answer: webhook_http.Answer, started: datetime, latency: int) -> None:
        """The attempt, the delivery's next state and the endpoint's health, in one transaction; under the
        thread's lock (a command writing the activity) when the endpoint may be disabled by it."""
        now = self.pipeline.clock.now()
        delivered = answer.error is None
        retry = None if delivered else rules.retry_delay(self.policy, delivery.attempts, self._random.random())
        exhausted = not delivered and retry is None
        maybe_disabled = exhausted or answer.status_code == rules.GONE

        async def write(db: Reader) -> rules.Health | None:
            await store.record_attempt(
                db,
                delivery.id,
                started_at=started,
                status_code=answer.status_code,
                latency_ms=latency,
                error=None if answer.error is None else answer.error.value,
                message=answer.message,
            )
            if delivered:
                await store.settle(db, delivery.id, DeliveryStatus.DELIVERED, now)
            elif retry is None:
                await store.settle(db, delivery.id, DeliveryStatus.FAILED, now)
            else:
                await store.settle(
                    db, delivery.id, DeliveryStatus.PENDING, now, retry_at=now + timedelta(seconds=retry)
                )
            endpoint = await store.get_endpoint(db, delivery.endpoint_id, lock=True)
            if endpoint is None:
                return None
            health = rules.after_attempt(
                endpoint.health, self.policy, delivered=delivered, exhausted=exhausted, status_code=answer.status_code
            )
            if health != endpoint.health:
                await store.set_health(db, endpoint.id, health, now)
            return health if health.disabled and not endpoint.health.disabled else None

        if not maybe_disabled:
            async with self.pipeline.db.transaction() as db:
                await write(db)
            return

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            disabled = await write(db)
            if disabled is None:
                return Outcome()
            endpoint = await store.get_endpoint(db, delivery.endpoint_id)
            url = endpoint.url if endpoint else ""
            why = (
                "the receiver answered 410 Gone"
                if answer.status_code == rules.GONE
                else f"{disabled.exhausted_in_a_row} deliveries in a row failed every attempt"
            )
            change = activity(
                thread.id,
                ActivityKind.WEBHOOK_ENDPOINT_DISABLED,
                f"webhook endpoint {url} disabled: {why}",
                now,
                new_id,
                payload={"endpointId": global_id("WebhookEndpoint", delivery.endpoint_id), "url": url, "reason": why},
            )
            return Outcome([change], result={"disabled": True})

        try:
            done = await self.pipeline.execute(
                Command(command_type="webhook.attempt", thread_id=delivery.thread_id, decide=decide)
            )
        except DomainError:  # its thread is gone: the attempt is still recorded, without an activity
            async with self.pipeline.db.transaction() as db:
                done = {"disabled": await write(db) is not None}
        if done.get("disabled"):
            metrics.WEBHOOK_ENDPOINTS_DISABLED.inc()

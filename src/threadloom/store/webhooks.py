"""Webhook endpoints, deliveries and attempts (docs/webhooks.md). Deliveries are written with their events
(`log.append`); here they are claimed, recorded and listed.

A claim takes due deliveries with `FOR UPDATE SKIP LOCKED`, and never one while an earlier delivery of the same
thread to the same endpoint is still pending or being sent: in order per thread. A delivery `sending` whose
worker is gone (its advisory lock vanished with its process) is claimed again, with the same `webhook-id`.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa

from threadloom.domain.webhooks import DeliveryStatus, EndpointStatus, Health, WebhookEvent
from threadloom.store import tables as t
from threadloom.store.db import Reader
from threadloom.store.workers import alive_sql

E = t.webhook_endpoints
D = t.webhook_deliveries
A = t.webhook_attempts


@dataclasses.dataclass(frozen=True, slots=True)
class Endpoint:
    id: uuid.UUID
    project_id: uuid.UUID
    url: str
    events: tuple[WebhookEvent, ...]
    description: str
    include_subagents: bool
    status: EndpointStatus
    exhausted_in_a_row: int
    secret: str
    previous_secret: str | None
    previous_secret_expires_at: datetime | None
    created_at: datetime
    updated_at: datetime
    disabled_at: datetime | None

    @classmethod
    def of(cls, row: Any) -> Endpoint:
        values = dict(row)
        values["events"] = tuple(WebhookEvent(v) for v in values["events"] if v in WebhookEvent._value2member_map_)
        values["status"] = EndpointStatus(values["status"])
        return cls(**values)

    @property
    def health(self) -> Health:
        return Health(self.status, self.exhausted_in_a_row)

    def signing_secrets(self, now: datetime) -> list[str]:
        """The secrets that sign now: the current one, and the one before it during its grace period."""
        expires = self.previous_secret_expires_at
        if self.previous_secret is not None and expires is not None and expires > now:
            return [self.secret, self.previous_secret]
        return [self.secret]


@dataclasses.dataclass(frozen=True, slots=True)
class Attempt:
    number: int
    started_at: datetime
    status_code: int | None
    latency_ms: int
    error: str | None
    message: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Delivery:
    id: uuid.UUID
    position: int
    endpoint_id: uuid.UUID
    project_id: uuid.UUID
    thread_id: uuid.UUID
    sequence: int
    message_id: str
    event_type: str
    body: str
    status: DeliveryStatus
    attempts: int
    available_at: datetime
    created_at: datetime
    completed_at: datetime | None
    tries: tuple[Attempt, ...] = ()

    @classmethod
    def of(cls, row: Any, tries: Sequence[Attempt] = ()) -> Delivery:
        values = {f.name: row[f.name] for f in dataclasses.fields(cls) if f.name != "tries"}
        values["status"] = DeliveryStatus(values["status"])
        return cls(**values, tries=tuple(tries))


_ENDPOINT_COLUMNS = [c for c in E.c]
_DELIVERY_COLUMNS = [c for c in D.c if c.name != "lease_owner"]


# ---- endpoints ----------------------------------------------------------------------------------------------


async def insert_endpoint(db: Reader, values: dict[str, Any]) -> Endpoint:
    row = await db.one_or_none(sa.insert(E).values(**values).returning(*_ENDPOINT_COLUMNS))
    assert row is not None
    return Endpoint.of(row)


async def get_endpoint(db: Reader, endpoint_id: uuid.UUID, *, lock: bool = False) -> Endpoint | None:
    stmt = sa.select(*_ENDPOINT_COLUMNS).where(E.c.id == endpoint_id)
    row = await db.one_or_none(stmt.with_for_update() if lock else stmt)
    return None if row is None else Endpoint.of(row)


async def count_endpoints(db: Reader, project_id: uuid.UUID) -> int:
    return int(await db.scalar(sa.select(sa.func.count()).select_from(E).where(E.c.project_id == project_id)) or 0)


async def list_endpoints(db: Reader, project_id: uuid.UUID) -> list[Endpoint]:
    rows = await db.rows(
        sa.select(*_ENDPOINT_COLUMNS).where(E.c.project_id == project_id).order_by(E.c.created_at, E.c.id)
    )
    return [Endpoint.of(r) for r in rows]


async def update_endpoint(db: Reader, endpoint_id: uuid.UUID, values: dict[str, Any]) -> Endpoint:
    row = await db.one_or_none(sa.update(E).where(E.c.id == endpoint_id).values(**values).returning(*_ENDPOINT_COLUMNS))
    assert row is not None
    return Endpoint.of(row)


async def delete_endpoint(db: Reader, endpoint_id: uuid.UUID) -> None:
    await db.execute(sa.delete(E).where(E.c.id == endpoint_id))  # its deliveries and attempts go with it


async def set_health(db: Reader, endpoint_id: uuid.UUID, health: Health, now: datetime) -> None:
    values: dict[str, Any] = {"status": health.status.value, "exhausted_in_a_row": health.exhausted_in_a_row}
    if health.disabled:
        values.update(disabled_at=now, updated_at=now)
    await db.execute(sa.update(E).where(E.c.id == endpoint_id).values(**values))


# ---- deliveries ---------------------------------------------------------------------------------------------

_CLAIM = sa.text(
    """
    WITH next AS (
      SELECT d.id FROM webhook_deliveries d JOIN webhook_endpoints e ON e.id = d.endpoint_id
      WHERE e.status <> 'disabled'
        AND ((d.status = 'pending' AND d.available_at <= :now)
             OR (d.status = 'sending' AND NOT EXISTS (
                   SELECT 1 FROM workers w WHERE w.id = d.lease_owner AND """
    + alive_sql("w")
    + """)))
        AND NOT EXISTS (SELECT 1 FROM webhook_deliveries p
                        WHERE p.endpoint_id = d.endpoint_id AND p.thread_id = d.thread_id
                          AND p.status IN ('pending', 'sending') AND p.sequence < d.sequence)
      ORDER BY d.available_at, d.position
      LIMIT :limit
      FOR UPDATE OF d SKIP LOCKED
    )
    UPDATE webhook_deliveries AS d SET status = 'sending', lease_owner = :me, attempts = d.attempts + 1
    FROM next WHERE d.id = next.id
    RETURNING d.id
    """
)


async def claim(db: Reader, worker_id: uuid.UUID, now: datetime, limit: int) -> list[uuid.UUID]:
    """Up to `limit` deliveries due now, marked `sending` by this worker (one statement)."""
    rows = await db.rows(_CLAIM, {"now": now, "me": worker_id, "limit": limit})
    return [r["id"] for r in rows]


async def get_delivery(db: Reader, delivery_id: uuid.UUID, *, lock: bool = False) -> Delivery | None:
    stmt = sa.select(*_DELIVERY_COLUMNS).where(D.c.id == delivery_id)
    row = await db.one_or_none(stmt.with_for_update() if lock else stmt)
    return None if row is None else Delivery.of(row)


async def next_due(db: Reader) -> datetime | None:
    """When the earliest pending delivery of an endpoint that is not disabled falls due."""
    stmt = (
        sa.select(sa.func.min(D.c.available_at))
        .select_from(D.join(E, E.c.id == D.c.endpoint_id))
        .where(D.c.status == DeliveryStatus.PENDING.value, E.c.status != EndpointStatus.DISABLED.value)
    )
    found = await db.scalar(stmt)
    return found if isinstance(found, datetime) else None


async def record_attempt(
    db: Reader,
    delivery_id: uuid.UUID,
    *,
    started_at: datetime,
    status_code: int | None,
    latency_ms: int,
    error: str | None,
    message: str | None,
) -> int:
    """Store one attempt; its number counts every attempt of the delivery, redeliveries included."""
    number = await db.scalar(sa.select(sa.func.count() + 1).select_from(A).where(A.c.delivery_id == delivery_id))
    await db.execute(
        sa.insert(A).values(
            delivery_id=delivery_id,
            number=int(number or 1),
            started_at=started_at,
            status_code=status_code,
            latency_ms=latency_ms,
            error=error,
            message=message,
        )
    )
    return int(number or 1)


async def settle(
    db: Reader, delivery_id: uuid.UUID, status: DeliveryStatus, now: datetime, *, retry_at: datetime | None = None
) -> None:
    """After an attempt: delivered or failed for good (completed now), or pending again from `retry_at`."""
    values: dict[str, Any] = {"status": status.value, "lease_owner": None}
    if status == DeliveryStatus.PENDING:
        assert retry_at is not None
        values["available_at"] = retry_at
    else:
        values["completed_at"] = now
    await db.execute(sa.update(D).where(D.c.id == delivery_id).values(**values))


async def redeliver(db: Reader, delivery_id: uuid.UUID, now: datetime) -> None:
    """Send it again from now with a fresh schedule (its attempts stay listed; the `webhook-id` stays)."""
    await db.execute(
        sa.update(D)
        .where(D.c.id == delivery_id)
        .values(status=DeliveryStatus.PENDING.value, attempts=0, available_at=now, completed_at=None, lease_owner=None)
    )


async def list_deliveries(
    db: Reader, endpoint_id: uuid.UUID, status: DeliveryStatus | None, first: int, before: int | None
) -> list[Delivery]:
    """An endpoint's deliveries, newest first (`before`: a position from an earlier page), each with every
    attempt, oldest first (two statements)."""
    stmt = sa.select(*_DELIVERY_COLUMNS).where(D.c.endpoint_id == endpoint_id)
    if status is not None:
        stmt = stmt.where(D.c.status == status.value)
    if before is not None:
        stmt = stmt.where(D.c.position < before)
    rows = await db.rows(stmt.order_by(D.c.position.desc()).limit(first))
    if not rows:
        return []
    tries: dict[uuid.UUID, list[Attempt]] = {}
    found = await db.rows(
        sa.select(A).where(A.c.delivery_id.in_([r["id"] for r in rows])).order_by(A.c.delivery_id, A.c.number)
    )
    for a in found:
        tries.setdefault(a["delivery_id"], []).append(
            Attempt(a["number"], a["started_at"], a["status_code"], a["latency_ms"], a["error"], a["message"])
        )
    return [Delivery.of(r, tries.get(r["id"], ())) for r in rows]

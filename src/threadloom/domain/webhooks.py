"""Webhooks (docs/webhooks.md): which changes page a receiver, the body each sends, the retry schedule and an
endpoint's health.

Pure. A command's changes go through `hooks_of`; the store writes the rows it returns in the same statement as
the command's events (`store.log.append`), one delivery per subscribed endpoint, so a committed event always
has its deliveries and a rolled-back one never does. The engine sends them (`engine.webhooks`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

import orjson

from threadloom.domain.activities import ActivityKind
from threadloom.domain.changes import Change
from threadloom.domain.entities import Activity, AppThread, Run, RuntimeRequest
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import global_id
from threadloom.domain.interruption import STOP_HOLD_REASON
from threadloom.domain.statuses import RuntimeRequestStatus


class WebhookEvent(StrEnum):
    """What an endpoint can subscribe to; the value is the body's `type`. A new event is one line here and its
    trigger below."""

    RUN_COMPLETED = "run.completed"
    RUN_FAILED = "run.failed"
    RUN_INTERRUPTED = "run.interrupted"
    APPROVAL_REQUESTED = "approval.requested"
    QUESTION_ASKED = "question.asked"
    REQUEST_EXPIRED = "request.expired"
    THREAD_STOPPED = "thread.stopped"
    ROLLBACK_COMPLETED = "rollback.completed"
    FORK_CREATED = "fork.created"
    BUDGET_EXCEEDED = "budget.exceeded"


class EndpointStatus(StrEnum):
    """ACTIVE: delivering. FAILING: a delivery used up its retries (later ones are still tried). DISABLED: nothing
    is sent or queued for it until `updateWebhookEndpoint(enabled: true)`."""

    ACTIVE = "active"
    FAILING = "failing"
    DISABLED = "disabled"


class DeliveryStatus(StrEnum):
    PENDING = "pending"  # waiting for its time, or for the thread's earlier delivery to this endpoint
    SENDING = "sending"  # a worker is sending it now
    DELIVERED = "delivered"  # a 2xx answer
    FAILED = "failed"  # every attempt of its schedule failed (redeliverWebhook sends it again)


class AttemptError(StrEnum):
    """Why an attempt failed, stable for clients (`WebhookAttempt.error`)."""

    HTTP_STATUS = "http_status"  # an answer other than 2xx (a redirect too: never followed)
    TIMEOUT = "timeout"  # no answer within the timeout
    CONNECTION_FAILED = "connection_failed"  # refused, reset, TLS failure
    DNS_FAILED = "dns_failed"  # the host did not resolve
    TARGET_NOT_ALLOWED = "target_not_allowed"  # the host resolved to an address the egress rules refuse
    INVALID_RESPONSE = "invalid_response"  # not an HTTP answer


# Subscribing to these on a subagent's thread needs `includeSubagents`: a delegated task finishing is the
# parent's business, not a person's. A subagent asking for an approval or a question still pages.
RUN_EVENTS = frozenset({WebhookEvent.RUN_COMPLETED, WebhookEvent.RUN_FAILED, WebhookEvent.RUN_INTERRUPTED})

_BY_ACTIVITY: dict[str, WebhookEvent] = {
    ActivityKind.RUN_COMPLETED: WebhookEvent.RUN_COMPLETED,
    ActivityKind.RUN_FAILED: WebhookEvent.RUN_FAILED,
    ActivityKind.RUN_INTERRUPTED: WebhookEvent.RUN_INTERRUPTED,
    ActivityKind.APPROVAL_REQUESTED: WebhookEvent.APPROVAL_REQUESTED,
    ActivityKind.QUESTION_ASKED: WebhookEvent.QUESTION_ASKED,
    ActivityKind.ROLLBACK_COMPLETED: WebhookEvent.ROLLBACK_COMPLETED,
    ActivityKind.LINEAGE_FORKED: WebhookEvent.FORK_CREATED,
    ActivityKind.BUDGET_EXCEEDED: WebhookEvent.BUDGET_EXCEEDED,
}

_BUDGET_FIELDS = ("window", "action", "maxCostUsd", "maxTokens", "spentCostUsd", "spentTokens")

MAX_BODY_BYTES = 64 * 1024  # a body over this drops its request's prompt (`truncated: true`)
MESSAGE_PREFIX = "msg_"


@dataclasses.dataclass(frozen=True, slots=True)
class Hook:
    """One event to deliver: `offset` is its change's place in the command (the store adds the thread's
    sequence before it), `message_id` the `webhook-id` every endpoint and every retry gets."""

    offset: int
    event: WebhookEvent
    message_id: str
    body: str

    def row(self) -> dict[str, Any]:
        return {
            "offset": self.offset,
            "event_type": self.event.value,
            "message_id": self.message_id,
            "body": self.body,
            "run_event": self.event in RUN_EVENTS,
        }


def message_id(value: uuid.UUID) -> str:
    return MESSAGE_PREFIX + value.hex


def _gid(type_name: str, value: uuid.UUID | None) -> str | None:
    return None if value is None else global_id(type_name, value)


def _run(run: Run | None, run_id: uuid.UUID | None) -> dict[str, Any] | None:
    if run is None:
        return None if run_id is None else {"id": global_id("Run", run_id)}
    return {
        "id": global_id("Run", run.id),
        "ordinal": run.ordinal,
        "status": run.status.name,
        "statusReason": run.status_reason,
        "failureCode": None if run.failure_code is None else run.failure_code.name,
    }


def _request(request: RuntimeRequest) -> dict[str, Any]:
    payload = request.payload if isinstance(request.payload, dict) else {}
    prompt = {k: payload[k] for k in ("command", "reason", "cwd", "questions") if k in payload}
    return {
        "id": global_id("RuntimeRequest", request.id),
        "kind": request.kind.name,
        "status": request.status.name,
        "prompt": prompt,
        "notResumableReason": request.not_resumable_reason,
    }


def _event_of(change: Change) -> WebhookEvent | None:
    entity = change.entity
    if isinstance(entity, Activity):
        if entity.kind == ActivityKind.QUEUE_HELD and entity.summary == STOP_HOLD_REASON:
            return WebhookEvent.THREAD_STOPPED
        return _BY_ACTIVITY.get(entity.kind)
    if isinstance(entity, RuntimeRequest) and entity.status == RuntimeRequestStatus.EXPIRED:
        return WebhookEvent.REQUEST_EXPIRED
    return None


def _data(event: WebhookEvent, change: Change, latest: Mapping[uuid.UUID, Any]) -> dict[str, Any]:
    """What a receiver needs to act without asking: the objects' global ids and their state in this commit."""
    entity = change.entity
    thread_id: uuid.UUID = entity.thread_id  # type: ignore[attr-defined]
    data: dict[str, Any] = {"threadId": global_id("Thread", thread_id)}
    if isinstance(entity, RuntimeRequest):
        data["runId"] = global_id("Run", entity.run_id)
        data["request"] = _request(entity)
        return data
    assert isinstance(entity, Activity)
    data["summary"] = entity.summary
    run_id = entity.run_id
    found = latest.get(run_id) if run_id is not None else None
    data["run"] = _run(found if isinstance(found, Run) else None, run_id)
    payload = entity.payload if isinstance(entity.payload, dict) else {}
    if event in (WebhookEvent.APPROVAL_REQUESTED, WebhookEvent.QUESTION_ASKED):
        request_id = payload.get("requestId")
        request = latest.get(uuid.UUID(request_id)) if isinstance(request_id, str) else None
        if isinstance(request, RuntimeRequest):
            data["request"] = _request(request)
        data["nodeId"] = _gid("ExecutionNode", entity.node_id)
    elif event == WebhookEvent.FORK_CREATED:
        source = payload.get("sourceThreadId")
        data["sourceThreadId"] = global_id("Thread", uuid.UUID(source)) if isinstance(source, str) else None
        data["runOrdinal"] = payload.get("runOrdinal")
    elif event == WebhookEvent.ROLLBACK_COMPLETED:
        found_runs = payload.get("runs")
        runs = found_runs if isinstance(found_runs, list) else []
        data["rolledBackRuns"] = [
            {"id": global_id("Run", uuid.UUID(r["id"])), "ordinal": r.get("ordinal")}
            for r in runs
            if isinstance(r, dict) and isinstance(r.get("id"), str)
        ]
    elif event == WebhookEvent.BUDGET_EXCEEDED:
        budget_id = payload.get("budgetId")
        data["budget"] = {
            "id": global_id("Budget", uuid.UUID(budget_id)) if isinstance(budget_id, str) else None,
            **{k: payload.get(k) for k in _BUDGET_FIELDS},
        }
        request_id = payload.get("requestId")  # ASK: the BUDGET request a person answers
        data["requestId"] = global_id("RuntimeRequest", uuid.UUID(request_id)) if isinstance(request_id, str) else None
    elif event == WebhookEvent.THREAD_STOPPED:
        thread = latest.get(thread_id)
        data["queueHeld"] = thread.queue_held if isinstance(thread, AppThread) else True
    return data


def body(event: WebhookEvent, occurred_at: datetime, project_id: uuid.UUID | None, data: dict[str, Any]) -> str:
    """The body, compact JSON, as the Standard Webhooks payload: `type`, `timestamp`, `data`. Over
    `MAX_BODY_BYTES` the request's prompt is left out and `truncated` says so."""
    full = {"projectId": _gid("Project", project_id), **data}
    document = {"type": event.value, "timestamp": occurred_at.isoformat(), "data": full}
    text = orjson.dumps(document).decode()
    if len(text.encode()) > MAX_BODY_BYTES and isinstance(full.get("request"), dict):
        full["request"] = {**full["request"], "prompt": None}
        full["truncated"] = True
        text = orjson.dumps(document).decode()
    return text


def hooks_of(
    changes: Sequence[Change], project_id: uuid.UUID | None, now: datetime, new_id: Callable[[], uuid.UUID]
) -> list[Hook]:
    """The webhook events of one command's changes, each at its change's offset (1, 2, ...). Asked of every
    command, so a command without one costs a pass over its changes and nothing else."""
    found = [(offset, change, event) for offset, change in enumerate(changes, start=1) if (event := _event_of(change))]
    if not found:
        return []
    latest: dict[uuid.UUID, Any] = {change.entity.id: change.entity for change in changes}
    return [
        Hook(offset, event, message_id(new_id()), body(event, now, project_id, _data(event, change, latest)))
        for offset, change, event in found
    ]


# ---- retries and endpoint health ---------------------------------------------------------------------------

# The Standard Webhooks schedule: after the first attempt, 5 s, 5 min, 30 min, 2 h, 5 h, 10 h, 14 h, 20 h, 24 h
# (about three days in all).
DEFAULT_SCHEDULE: tuple[float, ...] = (5, 300, 1800, 7200, 18000, 36000, 50400, 72000, 86400)
SCHEDULE_ENV = "THREADLOOM_WEBHOOK_RETRY_SCHEDULE"
TIMEOUT_ENV = "THREADLOOM_WEBHOOK_TIMEOUT_SECONDS"
LOOPBACK_ENV = "THREADLOOM_WEBHOOK_ALLOW_LOOPBACK"
PRIVATE_ENV = "THREADLOOM_WEBHOOK_ALLOW_PRIVATE"
DISABLE_ENV = "THREADLOOM_WEBHOOK_DISABLE_AFTER"
JITTER = 0.1  # each delay is drawn within ±10% of the schedule's value


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclasses.dataclass(frozen=True, slots=True)
class WebhookPolicy:
    """The operator's settings (docs/webhooks.md, "Settings")."""

    schedule: tuple[float, ...] = DEFAULT_SCHEDULE  # the delays before the 2nd, 3rd, ... attempt
    timeout_s: float = 10.0  # for one attempt: connect, send, the answer's status line
    allow_loopback: bool = False  # http:// and https:// to 127.0.0.0/8, ::1, localhost
    allow_private: bool = False  # https:// to private networks (10/8, 172.16/12, 192.168/16, fc00::/7, 100.64/10)
    disable_after: int = 5  # deliveries in a row that used up their schedule before the endpoint is disabled

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> WebhookPolicy:
        """The settings the environment gives; a malformed value is a ValueError naming its variable (the server
        does not start on it)."""
        values: dict[str, Any] = {
            "allow_loopback": _flag(env.get(LOOPBACK_ENV)),
            "allow_private": _flag(env.get(PRIVATE_ENV)),
        }
        raw = (env.get(SCHEDULE_ENV) or "").strip()
        if raw:
            try:
                schedule = tuple(float(part) for part in raw.split(","))
            except ValueError:
                raise ValueError(f"{SCHEDULE_ENV}: comma-separated seconds, got {raw!r}") from None
            if not schedule or any(not 0 <= s <= 7 * 86400 for s in schedule) or len(schedule) > 50:
                raise ValueError(f"{SCHEDULE_ENV}: 1..50 delays of 0..604800 seconds, got {raw!r}")
            values["schedule"] = schedule
        timeout = (env.get(TIMEOUT_ENV) or "").strip()
        if timeout:
            try:
                values["timeout_s"] = float(timeout)
            except ValueError:
                raise ValueError(f"{TIMEOUT_ENV}: seconds, got {timeout!r}") from None
            if not 0 < values["timeout_s"] <= 300:
                raise ValueError(f"{TIMEOUT_ENV}: 0..300 seconds, got {timeout!r}")
        disable = (env.get(DISABLE_ENV) or "").strip()
        if disable:
            if not disable.isdigit() or int(disable) < 1:
                raise ValueError(f"{DISABLE_ENV}: a count of at least 1, got {disable!r}")
            values["disable_after"] = int(disable)
        return cls(**values)


def retry_delay(policy: WebhookPolicy, attempts: int, draw: float) -> float | None:
    """Seconds before the next attempt after `attempts` failed ones (`draw` in [0, 1) gives the jitter); None
    when the schedule is used up."""
    if attempts > len(policy.schedule):
        return None
    base = policy.schedule[attempts - 1]
    return max(0.0, base * (1 + JITTER * (2 * draw - 1)))


@dataclasses.dataclass(frozen=True, slots=True)
class Health:
    status: EndpointStatus
    exhausted_in_a_row: int

    @property
    def disabled(self) -> bool:
        return self.status == EndpointStatus.DISABLED


GONE = 410  # the receiver says it wants nothing more (Standard Webhooks): disabled at once


def after_attempt(
    health: Health, policy: WebhookPolicy, *, delivered: bool, exhausted: bool, status_code: int | None
) -> Health:
    """An endpoint's health after one attempt: a 2xx makes it ACTIVE again; a delivery that used up its schedule
    makes it FAILING, and DISABLED after `disable_after` such deliveries in a row; a 410 disables it at once."""
    if health.disabled:
        return health
    if delivered:
        return Health(EndpointStatus.ACTIVE, 0)
    if status_code == GONE:
        return Health(EndpointStatus.DISABLED, health.exhausted_in_a_row)
    if not exhausted:
        return health
    count = health.exhausted_in_a_row + 1
    return Health(EndpointStatus.DISABLED if count >= policy.disable_after else EndpointStatus.FAILING, count)


# ---- endpoint input --------------------------------------------------------------------------------------------

MAX_DESCRIPTION = 500
MAX_ENDPOINTS_PER_PROJECT = 20
DEFAULT_GRACE_S = 24 * 3600
MAX_GRACE_S = 7 * 24 * 3600


def check_events(events: Sequence[WebhookEvent]) -> tuple[WebhookEvent, ...]:
    if not events:
        raise DomainError(ErrorCode.INVALID_INPUT, "events: name at least one event", "events")
    return tuple(dict.fromkeys(events))


def check_description(description: str | None) -> str:
    text = (description or "").strip()
    if len(text) > MAX_DESCRIPTION:
        raise DomainError(ErrorCode.INVALID_INPUT, f"description: at most {MAX_DESCRIPTION} characters", "description")
    return text


def check_grace(seconds: int | None) -> int:
    value = DEFAULT_GRACE_S if seconds is None else seconds
    if not 0 <= value <= MAX_GRACE_S:
        raise DomainError(ErrorCode.INVALID_INPUT, f"graceSeconds: 0..{MAX_GRACE_S}", "graceSeconds")
    return value

"""The writer lease: one holder drives a thread at a time, everyone may watch (docs/leases.md).

A holder is a (token, device) pair: the token that asked and the device the request named (the
`Threadloom-Device` header, or `deviceId` in a socket's `connection_init`). While a lease is live, every
client command on the thread from anyone else — another token, the same token from another device, or a
request naming no device — is refused with WRITER_LEASE_HELD, naming the holder's device and token name.
The rule sits beside `rollback_ops.refuse_while_rolling_back` and is applied by the same guard in the
pipeline, so every thread mutation, present and future, is covered without its own check. The server's own
steps (a turn's events, a queue draining) are never refused: the lease limits clients, not the agent.

Pure: the lease is four fields of the thread, written by `acquire`, `renew` and `release` as a new state of
the thread (an event in its log, so `threadEvents` tells every client, the old holder included, who holds it).
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime, timedelta

from threadloom.domain.access import Principal
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, EventVerb, NewId
from threadloom.domain.entities import AppThread
from threadloom.domain.errors import DomainError, ErrorCode

MIN_TTL_SECONDS = 1
MAX_TTL_SECONDS = 3600
MAX_DEVICE_ID = 128

# What anyone may still do to a leased thread. Stop is the safety valve: a runaway agent (spending, writing
# files, looping) must be stoppable from any device even when the holder's laptop is shut, and a Stop adds
# nothing to the conversation — it only ends work. The lease commands apply their own rule (below).
ALLOWED_FROM_ANYONE = frozenset({"stopThread", "acquireThreadLease", "renewThreadLease", "releaseThreadLease"})


@dataclasses.dataclass(frozen=True, slots=True)
class Holder:
    """Who holds a live lease: what the API shows (never a secret) and the token it compares."""

    token_id: uuid.UUID
    token_name: str
    device_id: str
    expires_at: datetime

    def describe(self) -> str:
        return f"device {self.device_id!r} (token {self.token_name!r})"


def clean_device_id(raw: str | None, field: str = "deviceId") -> str | None:
    """A device name as given (trimmed); None for none. Printable, 1..128 characters."""
    if raw is None:
        return None
    device = raw.strip()
    if not device or len(device) > MAX_DEVICE_ID or not device.isprintable():
        raise DomainError(ErrorCode.INVALID_INPUT, f"a device id is 1..{MAX_DEVICE_ID} printable characters", field)
    return device


def holder(thread: AppThread, now: datetime) -> Holder | None:
    """The thread's live lease; None when it has none, or it was released or ran out."""
    if (
        thread.lease_token_id is None
        or thread.lease_device_id is None
        or thread.lease_expires_at is None
        or thread.lease_expires_at <= now
    ):
        return None
    return Holder(thread.lease_token_id, thread.lease_token_name or "", thread.lease_device_id, thread.lease_expires_at)


def holds(lease: Holder, principal: Principal) -> bool:
    return lease.token_id == principal.token_id and lease.device_id == principal.device_id


def _held(lease: Holder) -> DomainError:
    return DomainError(
        ErrorCode.WRITER_LEASE_HELD,
        f"this thread is driven by {lease.describe()} until {lease.expires_at.isoformat()}; "
        "watching is open to all, writing needs the lease (acquireThreadLease with takeover: true moves it)",
        "threadId",
    )


def refuse_other_writer(thread: AppThread, principal: Principal, command_type: str, now: datetime) -> None:
    """A client's command on a thread whose live lease another holder has is refused, unless it is a Stop
    or a lease command. A thread with no live lease takes any command, as before leases existed."""
    if command_type in ALLOWED_FROM_ANYONE:
        return
    lease = holder(thread, now)
    if lease is not None and not holds(lease, principal):
        raise _held(lease)


def _ttl(ttl_seconds: int) -> timedelta:
    if not MIN_TTL_SECONDS <= ttl_seconds <= MAX_TTL_SECONDS:
        raise DomainError(
            ErrorCode.INVALID_INPUT, f"ttlSeconds must be {MIN_TTL_SECONDS}..{MAX_TTL_SECONDS}", "ttlSeconds"
        )
    return timedelta(seconds=ttl_seconds)


def _device(principal: Principal) -> str:
    if principal.device_id is None:
        raise DomainError(
            ErrorCode.INVALID_INPUT,
            "a lease needs a device: send the Threadloom-Device header, or deviceId in connection_init or the input",
            "deviceId",
        )
    return principal.device_id


def _leased(thread: AppThread, principal: Principal, device: str, expires_at: datetime) -> AppThread:
    # updated_at is left alone: the lease is not a change of the conversation (lists ordered by it stay put).
    return thread.evolve(
        lease_token_id=principal.token_id,
        lease_token_name=principal.token_name,
        lease_device_id=device,
        lease_expires_at=expires_at,
    )


def _who(lease: Holder | None) -> dict[str, str] | None:
    return None if lease is None else {"deviceId": lease.device_id, "tokenName": lease.token_name}


def acquire(
    thread: AppThread, principal: Principal, ttl_seconds: int, takeover: bool, now: datetime, new_id: NewId
) -> list[Change]:
    """Take the lease (or extend one already held). Another holder's live lease is WRITER_LEASE_HELD unless
    `takeover`, which moves it and records `lease.taken_over` naming the old holder, so its streams tell it."""
    ttl, device = _ttl(ttl_seconds), _device(principal)
    lease = holder(thread, now)
    updated = Change.of(EventVerb.LEASED, _leased(thread, principal, device, now + ttl))
    if lease is not None and holds(lease, principal):
        return [updated]
    if lease is not None and not takeover:
        raise _held(lease)
    mine = {"deviceId": device, "tokenName": principal.token_name}
    if lease is not None:
        summary = f"{device} took over the thread from {lease.device_id}"
        kind, payload = ActivityKind.LEASE_TAKEN_OVER, {"holder": mine, "previous": _who(lease)}
    else:
        summary = f"{device} is driving the thread"
        kind, payload = ActivityKind.LEASE_ACQUIRED, {"holder": mine, "previous": None}
    return [updated, activity(thread.id, kind, summary, now, new_id, payload=payload)]


def renew(thread: AppThread, principal: Principal, ttl_seconds: int, now: datetime) -> list[Change]:
    """Extend the caller's own live lease by `ttl_seconds` from now; one that ran out, was released or was
    taken over is LEASE_NOT_HELD (acquire again)."""
    ttl, device = _ttl(ttl_seconds), _device(principal)
    lease = holder(thread, now)
    if lease is None or not holds(lease, principal):
        raise DomainError(
            ErrorCode.LEASE_NOT_HELD,
            "this device does not hold the thread's lease"
            + ("" if lease is None else f" ({lease.describe()} does)")
            + "; acquireThreadLease to take it",
            "threadId",
        )
    return [Change.of(EventVerb.LEASED, _leased(thread, principal, device, now + ttl))]


def release(thread: AppThread, principal: Principal, now: datetime, new_id: NewId) -> list[Change]:
    """Give the lease up. Releasing a thread no one holds changes nothing; another holder's lease is
    WRITER_LEASE_HELD (take it over first)."""
    _device(principal)
    lease = holder(thread, now)
    if lease is None:
        return []
    if not holds(lease, principal):
        raise _held(lease)
    released = thread.evolve(lease_token_id=None, lease_token_name=None, lease_device_id=None, lease_expires_at=None)
    summary = f"{lease.device_id} stopped driving the thread"
    payload = {"holder": None, "previous": _who(lease)}
    return [
        Change.of(EventVerb.LEASED, released),
        activity(thread.id, ActivityKind.LEASE_RELEASED, summary, now, new_id, payload=payload),
    ]

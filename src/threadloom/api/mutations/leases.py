"""The writer lease: acquireThreadLease, renewThreadLease, releaseThreadLease (docs/leases.md).

The holder is the request's token and device: the device comes from the `Threadloom-Device` header or the
socket's `connection_init` `deviceId`, or from the input's `deviceId` when the request named none.
"""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api.context import Context
from threadloom.api.mutations.payloads import THREAD, KeyedInput, mutation, thread_id
from threadloom.engine.leases import naming_device

DEFAULT_TTL = 60
_DEVICE = (
    "The device to hold the lease for; absent: the request's own (`Threadloom-Device` header, `deviceId` in "
    "connection_init). Naming another device than the request's is INVALID_INPUT."
)
_TTL = "How long the lease lasts from now unless renewed, in seconds (1..3600)."


@strawberry.input(description="Take a thread's writer lease (or extend your own).")
class AcquireThreadLeaseInput(KeyedInput):
    thread_id: strawberry.ID = strawberry.field(description="The thread to drive.")
    device_id: str | None = strawberry.field(default=None, description=_DEVICE)
    ttl_seconds: int = strawberry.field(default=DEFAULT_TTL, description=_TTL)
    takeover: bool = strawberry.field(
        default=False,
        description="Move a lease another holder has to you; its holder is told by a `lease.taken_over` activity "
        "on the thread's streams. False: such a lease is WRITER_LEASE_HELD.",
    )


@strawberry.input(description="Extend the lease you hold.")
class RenewThreadLeaseInput(KeyedInput):
    thread_id: strawberry.ID = strawberry.field(description="The thread whose lease you hold.")
    device_id: str | None = strawberry.field(default=None, description=_DEVICE)
    ttl_seconds: int = strawberry.field(default=DEFAULT_TTL, description=_TTL)


@strawberry.input(description="Give up the lease you hold.")
class ReleaseThreadLeaseInput(KeyedInput):
    thread_id: strawberry.ID = strawberry.field(description="The thread whose lease you hold.")
    device_id: str | None = strawberry.field(default=None, description=_DEVICE)


@strawberry.type
class LeaseMutation:
    @mutation(THREAD)
    async def acquire_thread_lease(ctx: Context, input: AcquireThreadLeaseInput) -> uuid.UUID:
        """Become the thread's one writer for `ttlSeconds`: while the lease is live, every write to the thread from
        another token or device is refused with WRITER_LEASE_HELD (stopThread excepted). Another holder's live
        lease is WRITER_LEASE_HELD unless `takeover`."""
        thread = thread_id(input.thread_id)
        principal = naming_device(ctx.principal, input.device_id)
        return await ctx.services.leases.acquire(principal, thread, input.ttl_seconds, input.takeover, input.key())

    @mutation(THREAD)
    async def renew_thread_lease(ctx: Context, input: RenewThreadLeaseInput) -> uuid.UUID:
        """Extend your live lease to `ttlSeconds` from now. A lease that ran out, was released or was taken over is
        LEASE_NOT_HELD: acquire it again."""
        thread = thread_id(input.thread_id)
        principal = naming_device(ctx.principal, input.device_id)
        return await ctx.services.leases.renew(principal, thread, input.ttl_seconds, input.key())

    @mutation(THREAD)
    async def release_thread_lease(ctx: Context, input: ReleaseThreadLeaseInput) -> uuid.UUID:
        """Give up your lease: the thread takes writes from anyone again. Releasing a thread no one holds changes
        nothing; another holder's lease is WRITER_LEASE_HELD."""
        thread = thread_id(input.thread_id)
        principal = naming_device(ctx.principal, input.device_id)
        return await ctx.services.leases.release(principal, thread, input.key())

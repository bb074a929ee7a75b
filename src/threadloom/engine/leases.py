"""acquireThreadLease, renewThreadLease, releaseThreadLease: the writer lease's commands (domain/leases.py).

Each is a command on the thread under its lock, like any other, so a lease taken and a message sent by
another device at the same moment are ordered: one of them sees the other. The rule that refuses other
writers is not here: the pipeline applies it to every client command (`pipeline.Pipeline.execute`).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from datetime import datetime

from threadloom.domain import leases
from threadloom.domain.access import Principal
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import AppThread
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import TokenScope
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.store.db import Reader


def naming_device(principal: Principal, device_id: str | None) -> Principal:
    """The holder a lease command speaks for: the request's device, or the input's `deviceId` when the
    request named none. Both, naming different devices, is a contradiction the client must resolve."""
    device = leases.clean_device_id(device_id)
    if device is None:
        return principal
    if principal.device_id is not None and principal.device_id != device:
        raise DomainError(
            ErrorCode.INVALID_INPUT,
            f"deviceId {device!r} contradicts this request's device {principal.device_id!r}",
            "deviceId",
        )
    return dataclasses.replace(principal, device_id=device)


class Leases:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def _on_thread(
        self,
        principal: Principal,
        command_type: str,
        thread_id: uuid.UUID,
        key: str | None,
        data: dict[str, object],
        rule: Callable[[AppThread, datetime], list[Change]],
    ) -> uuid.UUID:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            return Outcome(rule(thread, now), result={"threadId": str(thread.id)})

        data = {"threadId": str(thread_id), "deviceId": principal.device_id, **data}
        command = Command(
            command_type=command_type, principal=principal, key=key, input=data, decide=decide, thread_id=thread_id
        )
        await self.pipeline.execute(command)
        return thread_id

    async def acquire(
        self, principal: Principal, thread_id: uuid.UUID, ttl_seconds: int, takeover: bool, key: str | None
    ) -> uuid.UUID:
        return await self._on_thread(
            principal,
            "acquireThreadLease",
            thread_id,
            key,
            {"ttlSeconds": ttl_seconds, "takeover": takeover},
            lambda thread, now: leases.acquire(thread, principal, ttl_seconds, takeover, now, new_id),
        )

    async def renew(self, principal: Principal, thread_id: uuid.UUID, ttl_seconds: int, key: str | None) -> uuid.UUID:
        return await self._on_thread(
            principal,
            "renewThreadLease",
            thread_id,
            key,
            {"ttlSeconds": ttl_seconds},
            lambda thread, now: leases.renew(thread, principal, ttl_seconds, now),
        )

    async def release(self, principal: Principal, thread_id: uuid.UUID, key: str | None) -> uuid.UUID:
        return await self._on_thread(
            principal,
            "releaseThreadLease",
            thread_id,
            key,
            {},
            lambda thread, now: leases.release(thread, principal, now, new_id),
        )

"""The command pipeline.

A command: take the idempotency key's lock and look for a receipt; take the thread's
row lock; ask `domain/` what to do; commit events + projections + receipt + effects in
one transaction; then wake subscribers. A duplicate key returns the stored result and
writes nothing; a refused command raises `DomainError` and writes nothing.

Keys are per token (`receipts.scoped_key`), and a stored answer is returned only after
the same access check the command itself makes: a key never tells one tenant anything
about another's commands.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from threadloom.domain.access import Principal
from threadloom.domain.changes import Outcome
from threadloom.domain.entities import AppThread
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.statuses import TokenScope
from threadloom.engine.clock import Clock
from threadloom.store import log, outbox, receipts
from threadloom.store import threads as thread_store
from threadloom.store.db import Database, Reader, StatementCounter

Decide = Callable[[Reader, AppThread | None], Awaitable[Outcome]]


@dataclasses.dataclass(frozen=True, slots=True)
class Command:
    command_type: str
    principal: Principal | None
    key: str | None
    input: dict[str, Any]
    decide: Decide
    thread_id: uuid.UUID | None = None  # the row to lock; None for thread-less commands

    @property
    def target_field(self) -> str:
        """The input field naming the command's object: the first `…Id` of its input."""
        return next((name for name in self.input if name.endswith("Id")), "threadId")


@dataclasses.dataclass(frozen=True, slots=True)
class Committed:
    thread_id: uuid.UUID | None
    project_id: uuid.UUID | None
    sequences: list[int]
    effects: int


CommitListener = Callable[[Committed], Awaitable[None]]


def fingerprint(command_type: str, data: dict[str, Any]) -> str:
    return hashlib.sha256(command_type.encode() + orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


class Pipeline:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self.listeners: list[CommitListener] = []

    async def execute(self, command: Command, counter: StatementCounter | None = None) -> dict[str, Any]:
        """Run a command; returns its result dict (stored or new)."""
        now = self.clock.now()
        principal = command.principal
        token_id = principal.token_id if principal else None
        key = receipts.scoped_key(token_id, command.command_type, command.key) if command.key else None
        print_ = fingerprint(command.command_type, command.input)
        async with self.db.transaction(counter) as db:
            if key is not None:
                await receipts.lock_key(db, key)
                stored = await receipts.find(db, key)
                if stored is not None:
                    await self._authorize_replay(db, command, stored)
                    if stored["fingerprint"] != print_:
                        raise DomainError(
                            ErrorCode.IDEMPOTENCY_KEY_REUSED,
                            "this clientMutationId was used for a different request",
                            "clientMutationId",
                        )
                    return dict(stored["result"])
            thread: AppThread | None = None
            if command.thread_id is not None:
                thread = await thread_store.lock(db, command.thread_id)
                if thread is None:
                    raise not_found(command.target_field)
            outcome = await command.decide(db, thread)
            project_id = outcome.project_id or (thread.project_id if thread else None)
            result = outcome.result
            sequences = await log.append(db, outcome.changes, project_id=project_id, command_id=key, now=now)
            thread_id = command.thread_id or next(
                (log.thread_of(c.entity) for c in outcome.changes if log.thread_of(c.entity)), None
            )
            if outcome.effects:
                await outbox.enqueue(db, thread_id, outcome.effects, command_id=key, now=now)
            if key is not None:
                await receipts.save(
                    db,
                    key=key,
                    command_type=command.command_type,
                    fingerprint=print_,
                    token_id=token_id,
                    result=orjson.loads(orjson.dumps(result)),
                    now=now,
                )
        committed = Committed(thread_id, project_id, sequences, len(outcome.effects))
        for listener in self.listeners:
            await listener(committed)
        return result

    async def _authorize_replay(self, db: Reader, command: Command, stored: Any) -> None:
        """A stored answer goes only to whom the command itself would answer.

        The key is already the token's own; this also re-checks that the token still sees
        the command's thread (exactly the refusal the command would give: NOT_FOUND).
        """
        principal = command.principal
        if principal is None:
            return
        if stored["token_id"] != principal.token_id:
            raise not_found(command.target_field)
        if command.thread_id is not None:
            thread = await thread_store.get_thread(db, command.thread_id)
            if thread is None:
                raise not_found(command.target_field)
            principal.require_project(thread.project_id, TokenScope.OPERATE, command.target_field)

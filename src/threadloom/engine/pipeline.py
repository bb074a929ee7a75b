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
from typing import Any, Generic, TypeVar, overload

import orjson

from threadloom.domain import webhooks
from threadloom.domain.access import Principal, is_server
from threadloom.domain.changes import Outcome, Valued
from threadloom.domain.entities import AppThread, UsageRecord
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.ids import new_id
from threadloom.domain.leases import refuse_other_writer
from threadloom.domain.rollback_ops import refuse_while_rolling_back
from threadloom.domain.statuses import TokenScope
from threadloom.engine.clock import Clock
from threadloom.faults import hold_point
from threadloom.store import log, outbox, receipts
from threadloom.store import threads as thread_store
from threadloom.store.db import Database, Reader, StatementCounter

T = TypeVar("T")
OutcomeT = TypeVar("OutcomeT", bound=Outcome)
Decide = Callable[[Reader, AppThread], Awaitable[Outcome]]  # decides under the locked thread
DecideGlobal = Callable[[Reader], Awaitable[Outcome]]  # decides without a thread (creates one, or none)


def _target_field(data: dict[str, Any]) -> str:
    """The input field naming a command's object: the first `…Id` of its input."""
    return next((name for name in data if name.endswith("Id")), "threadId")


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _Asked:
    """Who asks and how to answer again: `principal` and `key` are None for the server's own commands
    (no access check, no receipt); `input` is what the receipt's fingerprint covers."""

    command_type: str
    principal: Principal | None = None
    key: str | None = None
    input: dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def target_field(self) -> str:
        return _target_field(self.input)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Command(_Asked):
    """A command on one thread, run under that thread's lock."""

    thread_id: uuid.UUID
    decide: Decide

    @classmethod
    def naming(
        cls, field: str, target_id: uuid.UUID, data: dict[str, Any], *, thread_id: uuid.UUID, **asked: Any
    ) -> Command:
        """A client's command on one object of a thread: its input names the object first (`field`,
        so `target_field` finds it), then `data`; `asked` is the rest (type, principal, key, decide)."""
        return cls(input={field: str(target_id), **data}, thread_id=thread_id, **asked)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class GlobalCommand(_Asked):
    """A command that locks no thread: it creates a project or a thread, or records a session."""

    decide: DecideGlobal


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Step(Generic[T]):
    """The server's own step on one thread whose decision hands a typed value back to the caller
    (`Valued`): no principal, no key, so never a stored answer to replay."""

    command_type: str
    thread_id: uuid.UUID
    decide: Callable[[Reader, AppThread], Awaitable[Valued[T]]]
    # Decisions written first, in order, in the same transaction: `decide` sees what they wrote. One
    # commit instead of several (a turn's last events and its run's end; a provider thread and its turn).
    before: tuple[Decide, ...] = ()


AnyCommand = Command | GlobalCommand


@dataclasses.dataclass(frozen=True, slots=True)
class Committed:
    thread_id: uuid.UUID | None
    project_id: uuid.UUID | None
    sequences: list[int]
    effects: int
    hooks: int = 0  # webhook deliveries written (one per webhook event and subscribed endpoint): wakes the sender
    # The model calls the transaction recorded (docs/usage.md): counted for /metrics after the commit, and
    # where a listener learns that usage arrived.
    usage: tuple[UsageRecord, ...] = ()


@dataclasses.dataclass(slots=True)
class _Earlier:
    """What a step's `before` decisions wrote in its transaction, for its listeners."""

    sequences: list[int] = dataclasses.field(default_factory=list)
    effects: int = 0
    hooks: int = 0
    usage: list[UsageRecord] = dataclasses.field(default_factory=list)


CommitListener = Callable[[Committed], Awaitable[None]]


def _usage_of(outcome: Outcome) -> list[UsageRecord]:
    return [c.entity for c in outcome.changes if isinstance(c.entity, UsageRecord)]


def fingerprint(command_type: str, data: dict[str, Any]) -> str:
    return hashlib.sha256(command_type.encode() + orjson.dumps(data, option=orjson.OPT_SORT_KEYS)).hexdigest()


class Pipeline:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self.listeners: list[CommitListener] = []

    @overload
    async def execute(
        self, command: Command | GlobalCommand, counter: StatementCounter | None = None
    ) -> dict[str, Any]: ...

    @overload
    async def execute(self, command: Step[T], counter: StatementCounter | None = None) -> T: ...

    async def execute(
        self, command: Command | GlobalCommand | Step[T], counter: StatementCounter | None = None
    ) -> dict[str, Any] | T:
        """Run a command; a `Step` answers its decision's value, any other command its result
        dict (stored or new)."""
        if isinstance(command, Step):
            step = command
            earlier = _Earlier()

            async def decide_step(db: Reader) -> Valued[T]:
                if not step.before:
                    return await self._on_thread(db, step.thread_id, "threadId", step.decide)

                async def chained(db: Reader, thread: AppThread) -> Valued[T]:
                    for before in step.before:
                        thread = await self._write_before(db, thread, await before(db, thread), earlier)
                    if earlier.sequences:  # tests: the thread's row is locked and written once, still open
                        await hold_point("step-before-written")
                    return await step.decide(db, thread)

                return await self._on_thread(db, step.thread_id, "threadId", chained)

            done = await self._commit(step.command_type, None, None, {}, decide_step, counter, step.thread_id, earlier)
            if isinstance(done, dict):  # a step has no key, so never a stored answer
                raise RuntimeError(f"{step.command_type}: a step has no stored answer")
            return done.value
        decide: DecideGlobal
        if isinstance(command, Command):
            on_thread = command

            async def guarded(db: Reader, thread: AppThread) -> Outcome:
                principal = on_thread.principal
                # A client's command: not while a rollback is under way, nor from another lease holder; neither
                # told to strangers. The server's own commands (a budget's stop) are not a client's.
                if principal is not None and not is_server(principal):
                    if not principal.sees(thread.project_id):
                        raise not_found(on_thread.target_field)
                    refuse_while_rolling_back(thread, on_thread.command_type)
                    refuse_other_writer(thread, principal, on_thread.command_type, self.clock.now())
                return await on_thread.decide(db, thread)

            async def decide_on_thread(db: Reader) -> Outcome:
                return await self._on_thread(db, on_thread.thread_id, on_thread.target_field, guarded)

            decide, thread_id = decide_on_thread, on_thread.thread_id
        else:
            decide, thread_id = command.decide, None
        done_ = await self._commit(
            command.command_type, command.principal, command.key, command.input, decide, counter, thread_id
        )
        return done_ if isinstance(done_, dict) else done_.result

    async def _on_thread(
        self, db: Reader, thread_id: uuid.UUID, field: str, decide: Callable[[Reader, AppThread], Awaitable[OutcomeT]]
    ) -> OutcomeT:
        """Lock the thread's row (commands on one thread run one at a time) and decide under it."""
        thread = await thread_store.lock(db, thread_id)
        if thread is None:
            raise not_found(field)
        outcome = await decide(db, thread)
        outcome.project_id = outcome.project_id or thread.project_id
        return outcome

    async def _commit(
        self,
        command_type: str,
        principal: Principal | None,
        client_key: str | None,
        data: dict[str, Any],
        decide: Callable[[Reader], Awaitable[OutcomeT]],
        counter: StatementCounter | None,
        thread_id: uuid.UUID | None,
        earlier: _Earlier | None = None,
    ) -> OutcomeT | dict[str, Any]:
        """The one transaction of every command: the outcome, or a stored result on a replay.
        `thread_id` is the locked thread: the replay's access check and the effects' and listeners' thread."""
        now = self.clock.now()
        token_id = principal.token_id if principal else None
        key = receipts.scoped_key(token_id, command_type, client_key) if client_key else None
        print_ = fingerprint(command_type, data)
        field = _target_field(data)
        async with self.db.transaction(counter) as db:
            if key is not None:
                await receipts.lock_key(db, key)
                stored = await receipts.find(db, key)
                if stored is not None:
                    await self._authorize_replay(db, principal, thread_id, field, stored)
                    if stored["fingerprint"] != print_:
                        raise DomainError(
                            ErrorCode.IDEMPOTENCY_KEY_REUSED,
                            "this clientMutationId was used for a different request",
                            "clientMutationId",
                        )
                    return dict(stored["result"])
            outcome = await decide(db)
            project_id = outcome.project_id
            result = outcome.result
            thread_id = thread_id or next(
                (log.thread_of(c.entity) for c in outcome.changes if log.thread_of(c.entity)), None
            )
            rows = outbox.rows(thread_id, outcome.effects, command_id=key, now=now)  # in the same statement
            hooks = webhooks.hooks_of(outcome.changes, project_id, now, new_id)
            appended = await log.append(
                db,
                outcome.changes,
                project_id=project_id,
                command_id=key,
                now=now,
                effects=rows,
                hooks=[h.row() for h in hooks],
            )
            sequences = appended.sequences
            if key is not None:
                await receipts.save(
                    db,
                    key=key,
                    command_type=command_type,
                    fingerprint=print_,
                    token_id=token_id,
                    result=orjson.loads(orjson.dumps(result)),
                    created_at=now,
                )
        if earlier is not None:
            sequences = [*earlier.sequences, *sequences]
        effects = len(outcome.effects) + (earlier.effects if earlier is not None else 0)
        hooked = appended.deliveries + (earlier.hooks if earlier is not None else 0)
        usage = (*(earlier.usage if earlier is not None else ()), *_usage_of(outcome))
        committed = Committed(thread_id, project_id, sequences, effects, hooked, usage)
        for listener in self.listeners:
            await listener(committed)
        return outcome

    async def _write_before(self, db: Reader, thread: AppThread, outcome: Outcome, earlier: _Earlier) -> AppThread:
        """Write a `Step.before` decision's events and effects; the thread as the next decision must see it."""
        now = self.clock.now()
        project_id = outcome.project_id or thread.project_id
        rows = outbox.rows(thread.id, outcome.effects, command_id=None, now=now)
        hooks = webhooks.hooks_of(outcome.changes, project_id, now, new_id)
        appended = await log.append(
            db,
            outcome.changes,
            project_id=project_id,
            command_id=None,
            now=now,
            effects=rows,
            hooks=[h.row() for h in hooks],
        )
        earlier.sequences += appended.sequences
        earlier.effects += len(outcome.effects)
        earlier.hooks += appended.deliveries
        earlier.usage += _usage_of(outcome)
        if any(isinstance(c.entity, AppThread) for c in outcome.changes):
            thread = await thread_store.get_thread(db, thread.id) or thread
        return thread

    async def _authorize_replay(
        self, db: Reader, principal: Principal | None, thread_id: uuid.UUID | None, field: str, stored: Any
    ) -> None:
        """A stored answer goes only to whom the command itself would answer.

        The key is already the token's own; this also re-checks that the token still sees
        the command's thread (exactly the refusal the command would give: NOT_FOUND).
        """
        if principal is None:
            return
        if stored["token_id"] != principal.token_id:
            raise not_found(field)
        if thread_id is not None:
            thread = await thread_store.get_thread(db, thread_id)
            if thread is None:
                raise not_found(field)
            principal.require_project(thread.project_id, TokenScope.OPERATE, field)

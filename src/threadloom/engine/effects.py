"""The outbox worker (docs/architecture.md): claims effects with `FOR UPDATE SKIP LOCKED` and a lease,
runs one effect at a time per thread in order, retries with capped exponential backoff.

Transactions: an effect that succeeded is marked done by the same statement as its loop's next
claim (one commit per effect, not two), run on its own outside a transaction; a claim that finds
nothing and has nothing to mark done changes nothing: an idle or needlessly woken loop costs a
read, never a write. Of the idle loops one polls; the others wait to be woken, so a turn's engine
work does not compete with their reads. The polling loop sleeps until the next pending effect falls
due (a retry's backoff, a delayed effect), and at most `IDLE_POLL` for effects another server wrote:
it claims about once a second, not five times (the other loops' 5 s backstops aside)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import timedelta
from typing import Any, TypeVar

from threadloom import metrics, tracing
from threadloom.aio import cancel_all
from threadloom.domain.effects import EffectData
from threadloom.engine.clock import Clock
from threadloom.store import outbox
from threadloom.store.db import Database

log = logging.getLogger("threadloom.effects")
Handler = Callable[[dict[str, Any]], Awaitable[None]]  # a stored payload in, decoded by `register`
E = TypeVar("E", bound=EffectData)

LEASE = timedelta(minutes=5)
BASE_BACKOFF = 0.2
MAX_BACKOFF = 30.0
MAX_ATTEMPTS = 8
IDLE_POLL = 1.0  # the polling idle loop looks at least this often (effects another server wrote)
IDLE_BACKSTOP = 5.0  # the other idle loops wait for a wake-up, or this long


def backoff(attempts: int) -> float:
    return float(min(MAX_BACKOFF, BASE_BACKOFF * 2 ** max(0, attempts - 1)))


class EffectWorker:
    def __init__(self, db: Database, clock: Clock, worker_id: uuid.UUID, concurrency: int = 4) -> None:
        self.db = db
        self.clock = clock
        self.worker_id = worker_id
        self.concurrency = concurrency
        self.handlers: dict[str, Handler] = {}
        self._idle: list[asyncio.Event] = []  # the idle loops' wake-ups, the latest idle last
        self._polling = False  # an idle loop is polling (the others' claims would find the same)
        self._tasks: list[asyncio.Task[None]] = []

    def wake(self) -> None:
        """Wake one idle loop (it claims, and wakes another if it found something and more was due): a
        commit with one effect costs one claim that finds it, not one claim per loop."""
        if self._idle:
            self._idle.pop().set()

    def register(self, kind: type[E], handler: Callable[[E], Awaitable[None]]) -> None:
        """`handler` runs every effect of `kind`, given the decoded effect (never the raw payload)."""

        async def decoded(payload: dict[str, Any]) -> None:
            await handler(kind.decode(payload))

        self.handlers[kind.KIND] = decoded

    def start(self) -> None:
        """One loop claims at once; the others start idle, woken when a claim finds more due. All claiming
        at the start opened a database session each (a pool grows to what is checked out at once) for claims
        that, on most starts, find nothing."""
        self._tasks = [asyncio.create_task(self._loop(i), name=f"effects-{i}") for i in range(self.concurrency)]

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        self._tasks = []

    async def _loop(self, index: int) -> None:
        done: int | None = None  # this loop's last effect, succeeded, marked done with the next claim
        ran = index == 0
        # A loop that starts idle never polls first, and their backstops are spread so they do not all claim
        # at one moment (each at once would need a session of its own).
        backstop: float | None = IDLE_BACKSTOP * (1 + index / self.concurrency) if index else None
        while True:
            if not ran:
                await self._idle_wait(backstop)
                backstop = None
            try:
                effect = await self._claim(done)
                done = None
                ran = effect is not None
                if effect is not None:
                    done = await self._run(effect)
            except asyncio.CancelledError:
                if done is not None:  # stopping: record it on the way out, or it would run again
                    with contextlib.suppress(Exception):
                        await asyncio.shield(self._claim(done, claim=False))
                raise
            except Exception:
                log.exception("effect loop error")
                ran = False

    async def _idle_wait(self, backstop: float | None) -> None:
        """Wait to be woken. One idle loop polls: it also claims when the next effect falls due (at most
        `IDLE_POLL` later); the others claim after `backstop`, or `IDLE_BACKSTOP`."""
        woken = asyncio.Event()
        self._idle.append(woken)
        polling = backstop is None and not self._polling
        self._polling = self._polling or polling
        try:
            wait = await self._until_due() if polling else backstop or IDLE_BACKSTOP
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(woken.wait(), wait)
        finally:
            if polling:
                self._polling = False
            if not woken.is_set():
                self._idle.remove(woken)

    async def _until_due(self) -> float:
        """How long the polling loop sleeps: until the next pending effect falls due, at most `IDLE_POLL`."""
        now = self.clock.now()
        try:
            async with self.db.statements() as db:
                due = await outbox.next_due(db, now)
        except Exception:
            log.exception("effect loop error")
            return IDLE_POLL
        return IDLE_POLL if due is None else min(IDLE_POLL, max(0.0, (due - now).total_seconds()))

    async def run_one(self) -> bool:
        """Claim one effect, run it and record its end (a transaction of its own); False if none was due."""
        effect = await self._claim(None)
        if effect is None:
            return False
        done = await self._run(effect)
        if done is not None:
            await self._claim(done, claim=False)
        return True

    async def _claim(self, done: int | None, *, claim: bool = True) -> Mapping[str, Any] | None:
        """Mark `done` done and claim the next effect, in one statement outside a transaction (no BEGIN
        and COMMIT round trips: a turn's start waits for it); one that changes nothing writes nothing."""
        now = self.clock.now()
        async with self.db.statements() as db:
            if claim:
                return await outbox.claim(db, self.worker_id, now, now + LEASE, done=done)
            if done is not None:
                await outbox.finish(db, done, now)
        return None

    async def _run(self, effect: Mapping[str, Any]) -> int | None:
        """Run a claimed effect: its id when it succeeded (to be marked done), None when its failure or
        retry is already recorded."""
        if effect.get("more", True):
            self.wake()  # more is due, maybe for other threads: another loop claims it meanwhile
        kind = effect["kind"]
        handler = self.handlers.get(kind)
        payload = dict(effect["payload"])
        parent = payload.pop(tracing.CARRIER_KEY, None)  # the trace of the command that enqueued it
        try:
            if handler is None:
                raise LookupError(f"no handler for effect kind {kind!r}")
            with tracing.span(f"effect {kind}", {"threadloom.effect.id": effect["id"]}, parent):
                await handler(payload)
        except asyncio.CancelledError:
            raise
        except Exception as error:
            metrics.EFFECTS.labels(kind, "failed").inc()
            log.exception("effect %s (%s) failed", effect["id"], kind)
            async with self.db.transaction() as db:
                if effect["attempts"] >= MAX_ATTEMPTS:
                    await outbox.finish(db, effect["id"], self.clock.now(), status="failed", error=repr(error))
                else:
                    later = self.clock.now() + timedelta(seconds=backoff(effect["attempts"]))
                    await outbox.retry_later(db, effect["id"], repr(error), later)
            return None
        metrics.EFFECTS.labels(kind, "done").inc()
        return int(effect["id"])

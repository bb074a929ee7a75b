"""Startup and periodic recovery: work left behind by a worker that is gone.

Orphaned effects (running, owner dead) are requeued when replay-safe and cancelled
otherwise; then every active run is checked with `domain.recovery.recover_run`: it
goes on, gets its turn start requeued (the provider never saw it), or is lost. A lost run
whose attempt recorded nothing irreversible gets a `PROVIDER_RECOVERY` attempt on its
resumed provider thread while its instance's recovery policy allows (`after_loss`, by
default twice in a row); others fail with `provider_lost` (they may have run: nothing is
executed twice). The periodic pass also reaps idle provider runtimes
(`SessionManager.reap_idle`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable

from threadloom.domain import retries as retry_rules
from threadloom.domain.changes import Outcome, Valued
from threadloom.domain.effects import StartTurn
from threadloom.domain.entities import AppThread, ProviderSession, ProviderThread, Run, RunAttempt
from threadloom.domain.ids import new_id
from threadloom.domain.recovery import RecoveryAction, after_loss, recover_run
from threadloom.domain.retries import DEFAULT_RECOVERY, RetryPolicy
from threadloom.domain.statuses import RunStatus
from threadloom.engine.pipeline import Command, Pipeline, Step
from threadloom.engine.runs import RunEngine
from threadloom.store import entities, outbox, runs
from threadloom.store import workers as worker_store
from threadloom.store.db import Reader

log = logging.getLogger("threadloom.recovery")
INTERVAL = 1.0


class Recovery:
    def __init__(
        self,
        pipeline: Pipeline,
        run_engine: RunEngine,
        worker_id: uuid.UUID,
        policies: dict[str, RetryPolicy] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.runs = run_engine
        self.worker_id = worker_id
        self.policies = policies or {}  # per instance: new attempts for a lost run (else DEFAULT_RECOVERY)
        self.interval = INTERVAL  # seconds between periodic passes
        # rollbacks abandoned by a lost process (engine.rollback.Rollbacks.resume_abandoned), set once built
        self.resume_rollbacks: Callable[[], Awaitable[None]] | None = None
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop(), name="recovery")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _loop(self) -> None:
        """The periodic passes, the first one `interval` after the start: `Services.start` has just made one."""
        while True:
            await asyncio.sleep(self.interval)
            try:
                await self.recover()
                await self.runs.sessions.reap_idle()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("recovery pass failed")

    async def recover(self) -> None:
        await self._orphaned_effects()
        if self.resume_rollbacks is not None:
            await self.resume_rollbacks()  # a thread left ROLLING_BACK by a lost process
        async with self.pipeline.db.read() as db:
            active = await runs.active_runs(db)
        for run in active:
            await self._check(run)

    async def _orphaned_effects(self) -> None:
        now = self.pipeline.clock.now()
        async with self.pipeline.db.transaction() as db:
            for effect in await outbox.orphaned(db):
                if effect["replay_safe"]:
                    await outbox.retry_later(db, effect["id"], "worker lost; replaying", now)
                else:
                    await outbox.finish(db, effect["id"], now, status="cancelled", error="worker lost")
                log.warning("recovered effect %s (%s) of a lost worker", effect["id"], effect["kind"])

    async def _owner_alive(self, db: Reader, attempt: RunAttempt) -> bool | None:
        pt = await entities.get(db, ProviderThread, attempt.provider_thread_id)
        session = await entities.get(db, ProviderSession, pt.session_id if pt else None)
        if session is None or session.owner is None:
            return None
        owner = uuid.UUID(session.owner)
        if owner == self.worker_id:
            return True
        return owner in await worker_store.alive(db, [owner])

    async def _decide(self, db: Reader, run: Run) -> RecoveryAction:
        """Effects are read first: a start moves effect pending → claimed → turn recorded → effect
        done, so later reads can only see a start further along, never a stale "no start"."""
        starts = [e for e in await outbox.pending_for_run(db, run.id) if e["kind"] == StartTurn.KIND]
        attempt = await entities.get(db, RunAttempt, run.active_attempt_id)
        if attempt is None:
            return RecoveryAction.NONE
        return recover_run(
            run.status,
            start_pending=any(e["status"] == "pending" for e in starts),
            start_claimed=any(e["status"] == "running" for e in starts),
            turn_recorded=attempt.provider_turn_id is not None,
            owner_alive=await self._owner_alive(db, attempt),
        )

    async def _check(self, run: Run) -> None:
        """A first look without the lock; the decision that acts is taken again under it."""
        async with self.pipeline.db.read() as db:
            current = await entities.get(db, Run, run.id)
            action = RecoveryAction.NONE if current is None else await self._decide(db, current)
        if action == RecoveryAction.FAIL:
            if await self._retry_lost(run):
                log.warning("run %s lost its provider runtime; a new attempt resumes it", run.id)
                return

            async def still_lost(db: Reader, locked: Run) -> bool:
                return await self._decide(db, locked) == RecoveryAction.FAIL

            if await self.runs.finish(run.id, RunStatus.FAILED, "provider_lost", guard=still_lost):
                log.warning("run %s lost its provider runtime; failed it", run.id)
        elif action == RecoveryAction.REQUEUE_START:
            await self._requeue_start(run)

    async def _retry_lost(self, run: Run) -> bool:
        """A `PROVIDER_RECOVERY` attempt for a lost run, decided again under the lock (`after_loss`)."""
        policy = self.policies.get(run.provider_instance_id, DEFAULT_RECOVERY)
        if policy.retries <= 0:
            return False
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Valued[bool]:
            current = await entities.get(db, Run, run.id)
            if current is None or current.active_attempt_id is None:
                return Outcome().carrying(False)
            if await self._decide(db, current) != RecoveryAction.FAIL:
                return Outcome().carrying(False)
            attempts = await runs.attempts_of(db, current.id)
            nodes = await runs.nodes_of_attempt(db, current.active_attempt_id)
            if after_loss(policy, attempts, nodes) != RecoveryAction.RETRY:
                return Outcome().carrying(False)
            graph = await runs.run_graph(db, thread, current)
            text = await runs.run_input(db, current)
            why = "the server that held the turn is gone"
            outcome = retry_rules.retry(graph, attempts, text, why, policy, now, new_id, lost="provider_lost")
            await self.runs.route(db, thread, outcome)
            return outcome.carrying(True)

        return await self.pipeline.execute(Step(command_type="run.recover", thread_id=run.thread_id, decide=decide))

    async def _requeue_start(self, run: Run) -> None:
        async def decide(db: Reader, thread: AppThread) -> Outcome:
            current = await entities.get(db, Run, run.id)
            if current is None or current.status != RunStatus.PREPARING:
                return Outcome()
            if await self._decide(db, current) != RecoveryAction.REQUEUE_START:
                return Outcome()
            log.warning("requeueing the turn start of run %s (the provider never saw it)", run.id)
            start = StartTurn(run_id=run.id, attempt_id=current.active_attempt_id, thread_id=run.thread_id)
            return Outcome(effects=[start.envelope()])

        await self.pipeline.execute(Command(command_type="recovery.requeue", decide=decide, thread_id=run.thread_id))

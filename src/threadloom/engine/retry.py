"""retryRun: a person's new attempt (`RETRY`) of a failed run, under its thread's lock.

The rules (what may be retried, the attempt, its activity) are `domain.retries.manual_retry`; this module
reads what they need and runs the command. The attempt's turn starts through the outbox like any other
(`provider-turn.start`), on the run's provider thread, resumed in a new agent process where none holds it.
"""

from __future__ import annotations

import uuid

from threadloom.domain import retries as rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Outcome
from threadloom.domain.entities import AppThread, ExecutionNode, Run, RunAttempt
from threadloom.domain.ids import new_id
from threadloom.engine.pipeline import Pipeline
from threadloom.engine.project_admin import Gate
from threadloom.engine.runs import RunEngine
from threadloom.store import entities, runs
from threadloom.store.db import Reader


class RunRetries:
    def __init__(self, pipeline: Pipeline, run_engine: RunEngine, gate: Gate | None = None) -> None:
        self.pipeline = pipeline
        self.runs = run_engine
        self.gate = gate  # refuses a retry in an archived project or a missing workspace (engine.project_admin)

    async def retry_run(self, principal: Principal, run_id: uuid.UUID, key: str | None) -> uuid.UUID:
        """The run, active again on a `RETRY` attempt; a refusal (`DomainError`) changes nothing."""
        now = self.pipeline.clock.now()
        if self.gate is not None:
            await self.gate(principal, await self.runs.thread_of(run_id))

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            attempts = await runs.attempts_of(db, run.id)
            if attempts:
                last = max(attempts, key=lambda a: a.attempt_ordinal)
            else:
                last = await entities.require(db, RunAttempt, run.active_attempt_id)
            root = await entities.get(db, ExecutionNode, last.root_node_id)
            others = await runs.started_after(db, run)
            text = await runs.run_input(db, run)
            return rules.manual_retry(thread, run, last, root.title if root else None, others, now, new_id, text)

        await self.runs.execute_on_run(principal, "retryRun", run_id, key, {}, decide)
        return run_id

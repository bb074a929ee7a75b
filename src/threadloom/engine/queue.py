"""The queue in the engine: resumeQueue and the commands on queued runs (cancel, reorder, edit, promote
to a steer of the active run). Rules live in `domain.queue` (and `domain.dispatch` for the steer)."""

from __future__ import annotations

import uuid
from typing import Any

from threadloom.domain import dispatch as dispatch_rules
from threadloom.domain import queue as rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import AppThread, ConversationMessage, ExecutionNode, Run, RunAttempt
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.engine.pipeline import Pipeline
from threadloom.engine.project_admin import Gate
from threadloom.engine.runs import RunEngine
from threadloom.store import entities, runs
from threadloom.store.db import Reader


class QueueCommands:
    def __init__(self, pipeline: Pipeline, run_engine: RunEngine, gate: Gate | None = None) -> None:
        self.pipeline = pipeline
        self.runs = run_engine
        self.gate = gate  # refuses resuming in an archived project or a missing workspace (engine.project_admin)

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    async def resume_queue(self, principal: Principal, thread_id: uuid.UUID, key: str | None) -> uuid.UUID:
        now = self.now
        if self.gate is not None:
            await self.gate(principal, thread_id)

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            return rules.resume_queue(await runs.thread_state(db, thread), now, new_id)

        return await self.runs.execute_on_thread(principal, "resumeQueue", thread_id, key, decide)

    async def cancel_queued(self, principal: Principal, run_id: uuid.UUID, key: str | None) -> uuid.UUID:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            attempt = await entities.require(db, RunAttempt, run.active_attempt_id)
            root = await entities.require(db, ExecutionNode, attempt.root_node_id)
            return rules.cancel(thread, await runs.queue(db, thread.id), run, attempt, root, now, new_id)

        await self.runs.execute_on_run(principal, "cancelQueuedRun", run_id, key, {}, decide)
        return run_id

    async def reorder_queued(
        self, principal: Principal, run_id: uuid.UUID, position: int, key: str | None
    ) -> uuid.UUID:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            return rules.reorder(thread, await runs.queue(db, thread.id), run, position, now, new_id)

        await self.runs.execute_on_run(principal, "reorderQueuedRun", run_id, key, {"position": position}, decide)
        return run_id

    async def edit_queued(self, principal: Principal, run_id: uuid.UUID, text: str, key: str | None) -> uuid.UUID:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            message = await entities.require(db, ConversationMessage, run.user_message_id)
            return rules.edit(thread, run, message, text, now, new_id)

        await self.runs.execute_on_run(principal, "editQueuedRun", run_id, key, {"text": text}, decide)
        return run_id

    async def promote_to_steer(self, principal: Principal, run_id: uuid.UUID, key: str | None) -> uuid.UUID:
        """The queued run's message steers the active run instead (its own run is cancelled)."""
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            rules.require_queued(run)
            state = await runs.thread_state(db, thread)
            if state.active is None:
                raise DomainError(ErrorCode.RUN_NOT_ACTIVE, "no run is active to steer", "runId")
            ability = self.runs.ability(thread.provider_instance_id)
            if not (ability.native or ability.restart):
                raise DomainError(ErrorCode.NOT_STEERABLE, "this provider can neither steer nor restart", "runId")
            attempt = await entities.require(db, RunAttempt, run.active_attempt_id)
            root = await entities.require(db, ExecutionNode, attempt.root_node_id)
            message = await entities.require(db, ConversationMessage, run.user_message_id)
            cancelled = rules.cancel(
                thread, state.queue, run, attempt, root, now, new_id, reason="promoted to a steer of the active run"
            )
            active = state.active
            if ability.native:
                steered = dispatch_rules.steer(thread, active, message.text, None, now, new_id)
            else:
                graph = await runs.run_graph(db, thread, active)
                steered = dispatch_rules.restart(
                    thread,
                    active,
                    graph.attempt,
                    graph.root,
                    graph.open_children,
                    await runs.run_input(db, active),
                    message.text,
                    None,
                    now,
                    new_id,
                    pending_requests=graph.pending_requests,
                )
            # The cancelled run keeps its message; the steer carries the same text in a message of its own.
            changes: list[Change] = [*cancelled.changes, *steered.changes]
            return Outcome(changes, steered.effects, result={"runId": str(active.id)})

        await self.runs.execute_on_run(principal, "promoteQueuedRunToSteer", run_id, key, {}, decide)
        return run_id

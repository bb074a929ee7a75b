"""Changing course while an agent works: the steer and interrupt effects, interruptRun,
stopThread, and the queue commands (cancel, reorder, edit, promote to a steer).

Rules live in `domain.steering`, `domain.interruption` and `domain.queue`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadloom.domain import dispatch as dispatch_rules
from threadloom.domain import interruption, steering
from threadloom.domain import queue as queue_rules
from threadloom.domain import runs as rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Change, Effect, Outcome
from threadloom.domain.entities import AppThread, ConversationMessage, ExecutionNode, Run, RunAttempt
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import ProviderSessionStatus, RunStatus, TokenScope
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.runs import RunEngine
from threadloom.engine.sessions import SessionManager
from threadloom.providers.contract import ProviderError
from threadloom.store import entities, runs
from threadloom.store import tables as t
from threadloom.store.db import Reader

TURN_ID_WAIT = 30.0  # how long an interrupt or steer waits for a turn start in flight to name its turn
log = logging.getLogger("threadloom.control")
Decide = Callable[[Reader, AppThread, Run], Awaitable[Outcome]]


class Control:
    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionManager,
        run_engine: RunEngine,
        policies: dict[str, interruption.UnsupportedPolicy],
    ) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.runs = run_engine
        self.policies = policies

    async def _on_run(
        self,
        principal: Principal,
        command_type: str,
        run_id: uuid.UUID,
        key: str | None,
        data: dict[str, Any],
        decide: Decide,
    ) -> uuid.UUID:
        await self._execute_on_run(principal, command_type, run_id, key, data, decide)
        return run_id

    async def _execute_on_run(
        self,
        principal: Principal,
        command_type: str,
        run_id: uuid.UUID,
        key: str | None,
        data: dict[str, Any],
        decide: Decide,
    ) -> dict[str, Any]:
        """A command on a run under its thread's lock; the command's result (stored or new)."""
        thread_id = await self._thread_of(run_id)

        async def locked(db: Reader, thread: AppThread | None) -> Outcome:
            assert thread is not None
            principal.require_project(thread.project_id, TokenScope.OPERATE, "runId")
            run = await entities.get(db, Run, run_id)
            if run is None:
                raise not_found("runId")
            outcome = await decide(db, thread, run)
            await self.runs.route(db, thread, outcome)
            return outcome

        return await self.pipeline.execute(
            Command(command_type, principal, key, {"runId": str(run_id), **data}, locked, thread_id)
        )

    async def _thread_of(self, run_id: uuid.UUID) -> uuid.UUID:
        async with self.pipeline.db.read() as db:
            run = await entities.get(db, Run, run_id)
        if run is None:
            raise not_found("runId")
        return run.thread_id

    # ---- interruption and Stop ------------------------------------------------------------

    async def interrupt_run(
        self, principal: Principal, run_id: uuid.UUID, *, hold_queue: bool, key: str | None
    ) -> uuid.UUID:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            if hold_queue:  # the Stop button: the same path as stopThread
                outcome = await self._stop(db, thread, run, now=now, cascade=True)
                outcome.result = {"runId": str(run.id), **outcome.result}
                return outcome
            return await self._interrupt(db, thread, run, hold_queue=False, now=now)

        result = await self._execute_on_run(principal, "interruptRun", run_id, key, {"holdQueue": hold_queue}, decide)
        if result.get("interruptUnsupported"):
            raise interruption.unsupported_error()  # after the refusal was recorded
        return run_id

    async def _stop(self, db: Reader, thread: AppThread, run: Run | None, *, now: Any, cascade: bool) -> Outcome:
        """Stop, the one path of stopThread, interruptRun(holdQueue) and the cascade: hold the queue,
        interrupt `run` (the active one for stopThread), and with `cascade` stop the thread's delegated
        tasks after commit, deepest first. A provider that cannot interrupt leaves the run going, on record."""
        if run is not None:
            outcome = await self._interrupt(db, thread, run, hold_queue=True, now=now)
        else:
            outcome = Outcome(interruption.hold(thread, now, new_id))
        if cascade:
            outcome.effects.append(Effect(interruption.STOP_TASKS_EFFECT, {"threadId": str(thread.id)}))
        return outcome

    async def _interrupt(self, db: Reader, thread: AppThread, run: Run, *, hold_queue: bool, now: Any) -> Outcome:
        attempt = await entities.get(db, RunAttempt, run.active_attempt_id)
        instance = run.provider_instance_id
        driver = self.sessions.drivers.get(instance)
        plan = interruption.plan_interrupt(
            run,
            turn_recorded=attempt is not None and attempt.provider_turn_id is not None,
            supports_interrupt=bool(driver and driver.capabilities().supports_interrupt),
            policy=self.policies.get(instance, interruption.UnsupportedPolicy.REJECT),
        )
        hold = interruption.STOP_HOLD_REASON if hold_queue else None
        if plan == interruption.Plan.UNSUPPORTED:
            outcome = interruption.unsupported(thread, run, now, new_id)
            if hold:
                outcome.changes += interruption.hold(thread, now, new_id)
            return outcome
        if plan == interruption.Plan.CANCEL_QUEUED:
            assert attempt is not None
            root = await entities.require(db, ExecutionNode, attempt.root_node_id)
            outcome = queue_rules.cancel(
                thread,
                await runs.queue(db, thread.id),
                run,
                attempt,
                root,
                now,
                new_id,
                reason="interrupted before it started",
            )
            if hold:
                outcome.changes += interruption.hold(thread, now, new_id)
            return outcome
        if plan == interruption.Plan.ASK_PROVIDER:
            outcome = interruption.requested(thread, run, now, new_id)
            if hold:
                outcome.changes += interruption.hold(thread, now, new_id)
            return outcome
        graph = await runs.run_graph(db, thread, run)
        if plan == interruption.Plan.END_NOW:
            return rules.finish_run(
                graph, RunStatus.INTERRUPTED, "interrupted before the provider started", now, new_id, hold_reason=hold
            )
        outcome = rules.finish_run(
            graph,
            RunStatus.INTERRUPTED,
            "interrupt unsupported: provider session stopped",
            now,
            new_id,
            hold_reason=hold,
        )
        # Only the interrupted turn's work ends; the project's runtime goes on for other threads' turns.
        stop = {"instance": instance, "projectId": str(thread.project_id), "attemptId": str(run.active_attempt_id)}
        outcome.effects.append(Effect(interruption.STOP_SESSION_EFFECT, stop))
        return outcome

    async def interrupt_node(
        self, principal: Principal, node_id: uuid.UUID, *, hold_queue: bool, key: str | None
    ) -> uuid.UUID:
        """A root turn node interrupts its run; a delegated subagent node stops its child thread."""
        async with self.pipeline.db.read() as db:
            node = await entities.get(db, ExecutionNode, node_id)
            thread = await entities.get(db, AppThread, node.thread_id if node else None)
        if node is None or thread is None or not principal.sees(thread.project_id):
            raise not_found("nodeId")
        if node.counts_for_run:
            await self.interrupt_run(principal, node.run_id, hold_queue=hold_queue, key=key)
            return node_id
        if node.child_thread_id is not None:
            await self.stop_thread(principal, node.child_thread_id, key)
            return node_id
        raise DomainError(
            ErrorCode.NOT_INTERRUPTIBLE,
            f"a {node.kind} node cannot be interrupted on its own; interrupt its run",
            "nodeId",
        )

    async def stop_thread(
        self, principal: Principal, thread_id: uuid.UUID, key: str | None, *, cascade: bool = True
    ) -> uuid.UUID:
        """Stop: hold the queue, interrupt the active run, then stop every delegated task (after commit)."""
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            assert thread is not None
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            active = await entities.get(db, Run, thread.active_run_id)
            outcome = await self._stop(db, thread, active, now=now, cascade=cascade)
            outcome.result = {"threadId": str(thread.id)}
            await self.runs.route(db, thread, outcome)
            return outcome

        command_type = "stopThread" if cascade else "thread.stop"
        await self.pipeline.execute(
            Command(command_type, principal, key, {"threadId": str(thread_id)}, decide, thread_id)
        )
        return thread_id

    # ---- effects ----------------------------------------------------------------------------

    async def interrupt_effect(self, payload: dict[str, Any]) -> None:
        """Ask the provider to interrupt; its terminal event (through the ingestor) ends the run."""
        found = self.sessions.binding_of_attempt(uuid.UUID(payload["attemptId"]))
        if found is None:
            return  # the turn already ended (or never started here)
        session, binding = found
        native_turn = await binding.wait_turn(TURN_ID_WAIT)  # a start still in flight names it shortly
        if native_turn is None or session.bindings.get(binding.native_thread) is not binding:
            return
        try:
            await session.runtime.interrupt_turn(binding.native_thread, native_turn)
        except ProviderError as error:
            log.warning("interrupt of %s refused: %s", binding.native_turn, error)

    async def steer_effect(self, payload: dict[str, Any]) -> None:
        """Steer the live turn; if it has ended meanwhile, the message becomes a new run."""
        run_id, message_id = uuid.UUID(payload["runId"]), uuid.UUID(payload["messageId"])
        async with self.pipeline.db.read() as db:
            message = await entities.require(db, ConversationMessage, message_id)
        found = self.sessions.binding_of_attempt(uuid.UUID(payload["attemptId"]))
        native_turn = None if found is None else await found[1].wait_turn(TURN_ID_WAIT)
        if found is not None and native_turn is not None and found[0].bindings.get(found[1].native_thread) is found[1]:
            session, binding = found
            try:
                await session.runtime.steer_turn(binding.native_thread, native_turn, message.text)
                return
            except ProviderError as error:
                log.info("steer of run %s refused (%s); it becomes a new run", run_id, error)
        await self._late_steer(run_id, message)

    async def _late_steer(self, run_id: uuid.UUID, message: ConversationMessage) -> None:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            assert thread is not None
            state = await runs.thread_state(db, thread)
            applied = dispatch_rules.choose(
                dispatch_rules.Dispatch(rules.DispatchMode.QUEUE_AFTER_ACTIVE),
                state,
                dispatch_rules.SteerAbility(False, False),
            )
            outcome = rules.new_run(
                state,
                applied=applied,
                text=message.text,
                provider_instance_id=thread.provider_instance_id,
                model=None,
                client_message_id=message.client_message_id,
                now=now,
                new_id=new_id,
                message_id=message.id,
            )
            outcome.changes.append(
                rules.activity(
                    thread.id,
                    "steer.became_run",
                    "the steered turn had ended; the message became a new run",
                    now,
                    new_id,
                    run_id=run_id,
                )
            )
            await self.runs.route(db, thread, outcome)
            return outcome

        await self.pipeline.execute(Command("steer.late", None, None, {}, decide, message.thread_id))

    async def stop_session_effect(self, payload: dict[str, Any]) -> None:
        """The provider cannot interrupt: end the interrupted turn (its run already ended) by ending its
        runtime, but never another thread's turn: the runtime is retired (new work opens a fresh one)
        and closes once the turns still bound to it have ended, at once if there are none."""
        if payload.get("attemptId") is not None:
            found = self.sessions.binding_of_attempt(uuid.UUID(payload["attemptId"]))
            if found is None:
                return  # the turn already ended
            session, binding = found
            session.unbind(binding.native_thread)  # its late events are dropped: the run has ended
            self.sessions.retire(session, "stopped to interrupt a turn")
            return
        project = payload.get("projectId")  # effects queued before turns were named: the whole runtime
        for session in self.sessions.sessions_of(
            str(payload["instance"]), uuid.UUID(project) if project is not None else None
        ):
            session.stopping = True
            await session.runtime.close()
            await self.sessions.mark(session, ProviderSessionStatus.STOPPED, "stopped to interrupt a turn")

    async def stop_tasks_effect(self, payload: dict[str, Any]) -> None:
        """Stop every delegated task under the thread, deepest first: a task's own tasks stop before it,
        so no task is left running under one that has already stopped."""
        for child in await self._tasks_of(uuid.UUID(payload["threadId"])):
            await self._stop_tree(child)

    async def _stop_tree(self, thread_id: uuid.UUID) -> None:
        for child in await self._tasks_of(thread_id):
            await self._stop_tree(child)
        await self.stop_thread(SYSTEM, thread_id, None, cascade=False)  # the internal thread.stop

    async def _tasks_of(self, parent: uuid.UUID) -> list[uuid.UUID]:
        async with self.pipeline.db.read() as db:
            children = await entities.where(
                db,
                AppThread,
                t.threads.c.parent_thread_id == parent,
                t.threads.c.lineage_relationship == "subagent",
                order_by=[t.threads.c.id],
            )
        return [child.id for child in children]

    # ---- the queue -----------------------------------------------------------------------------

    async def cancel_queued(self, principal: Principal, run_id: uuid.UUID, key: str | None) -> uuid.UUID:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            attempt = await entities.require(db, RunAttempt, run.active_attempt_id)
            root = await entities.require(db, ExecutionNode, attempt.root_node_id)
            return queue_rules.cancel(thread, await runs.queue(db, thread.id), run, attempt, root, now, new_id)

        return await self._on_run(principal, "cancelQueuedRun", run_id, key, {}, decide)

    async def reorder_queued(
        self, principal: Principal, run_id: uuid.UUID, position: int, key: str | None
    ) -> uuid.UUID:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            return queue_rules.reorder(thread, await runs.queue(db, thread.id), run, position, now, new_id)

        return await self._on_run(principal, "reorderQueuedRun", run_id, key, {"position": position}, decide)

    async def edit_queued(self, principal: Principal, run_id: uuid.UUID, text: str, key: str | None) -> uuid.UUID:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            message = await entities.require(db, ConversationMessage, run.user_message_id)
            return queue_rules.edit(thread, run, message, text, now, new_id)

        return await self._on_run(principal, "editQueuedRun", run_id, key, {"text": text}, decide)

    async def promote_to_steer(self, principal: Principal, run_id: uuid.UUID, key: str | None) -> uuid.UUID:
        """The queued run's message steers the active run instead (its own run is cancelled)."""
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread, run: Run) -> Outcome:
            queue_rules.require_queued(run)
            state = await runs.thread_state(db, thread)
            if state.active is None:
                raise DomainError(ErrorCode.RUN_NOT_ACTIVE, "no run is active to steer", "runId")
            ability = self.runs.ability(thread.provider_instance_id)
            if not (ability.native or ability.restart):
                raise DomainError(ErrorCode.NOT_STEERABLE, "this provider can neither steer nor restart", "runId")
            attempt = await entities.require(db, RunAttempt, run.active_attempt_id)
            root = await entities.require(db, ExecutionNode, attempt.root_node_id)
            message = await entities.require(db, ConversationMessage, run.user_message_id)
            cancelled = queue_rules.cancel(
                thread, state.queue, run, attempt, root, now, new_id, reason="promoted to a steer of the active run"
            )
            active = state.active
            if ability.native:
                steered = steering.steer(thread, active, message.text, None, now, new_id)
            else:
                graph = await runs.run_graph(db, thread, active)
                steered = steering.restart(
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

        await self._on_run(principal, "promoteQueuedRunToSteer", run_id, key, {}, decide)
        return run_id


SYSTEM = Principal(uuid.UUID(int=1), TokenScope.ADMIN, None)

"""Interruption and Stop in the engine: interruptRun, interruptNode, stopThread, and their effects (ask the
provider to interrupt, stop a runtime that cannot, stop a thread's delegated tasks deepest first).
Rules live in `domain.interruption`."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from threadloom.domain import budgets as budget_rules
from threadloom.domain import delegation, interruption, subagents
from threadloom.domain import queue as queue_rules
from threadloom.domain import runs as rules
from threadloom.domain.access import SERVER, Principal
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Outcome
from threadloom.domain.effects import InterruptTurn, StopSession, StopTasks
from threadloom.domain.entities import AppThread, ExecutionNode, ProviderTurn, Run, RunAttempt
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import NodeKind, ProviderSessionStatus, ProviderTurnStatus, RunStatus, TokenScope
from threadloom.engine import node_rollback
from threadloom.engine.delegation import owed_results
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.runs import RunEngine
from threadloom.engine.sessions import SessionManager
from threadloom.providers.contract import ProviderError
from threadloom.store import entities, runs
from threadloom.store import tables as t
from threadloom.store.db import Reader

TURN_ID_WAIT = 30.0  # how long an interrupt waits for a turn start in flight to name its turn
log = logging.getLogger("threadloom.interruption")


class Interruption:
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

        result = await self.runs.execute_on_run(
            principal, "interruptRun", run_id, key, {"holdQueue": hold_queue}, decide
        )
        if result.get("interruptUnsupported"):
            raise interruption.unsupported_error()  # after the refusal was recorded
        return run_id

    async def _stop(
        self,
        db: Reader,
        thread: AppThread,
        run: Run | None,
        *,
        now: Any,
        cascade: bool,
        reason: str = interruption.STOP_HOLD_REASON,
    ) -> Outcome:
        """Stop, the one path of stopThread, interruptRun(holdQueue), the cascade and a budget's stop: hold the
        queue (with `reason`), interrupt `run` (the active one for stopThread), drop the wakes its delegated
        tasks still owe, and with `cascade` stop those tasks after commit, deepest first. A provider that
        cannot interrupt leaves the run going, on record."""
        if run is not None:
            outcome = await self._interrupt(db, thread, run, hold_queue=True, now=now, reason=reason)
        else:
            outcome = Outcome(interruption.hold(thread, now, new_id, reason))
        if cascade:
            told = None if reason == interruption.STOP_HOLD_REASON else reason
            outcome.effects.append(StopTasks(thread_id=thread.id, reason=told).envelope())
        outcome.changes += delegation.drop_wakes(await owed_results(db, thread.id), now)  # nothing restarts it
        return outcome

    async def _interrupt(
        self,
        db: Reader,
        thread: AppThread,
        run: Run,
        *,
        hold_queue: bool,
        now: Any,
        reason: str = interruption.STOP_HOLD_REASON,
    ) -> Outcome:
        attempt = await entities.get(db, RunAttempt, run.active_attempt_id)
        instance = run.provider_instance_id
        driver = self.sessions.drivers.get(instance)
        plan = interruption.plan_interrupt(
            run,
            turn_recorded=attempt is not None and attempt.provider_turn_id is not None,
            supports_interrupt=bool(driver and driver.capabilities().supports_interrupt),
            policy=self.policies.get(instance, interruption.UnsupportedPolicy.REJECT),
        )
        hold = reason if hold_queue else None
        if plan == interruption.Plan.UNSUPPORTED:
            outcome = interruption.unsupported(thread, run, now, new_id)
            if hold:
                outcome.changes += interruption.hold(thread, now, new_id, hold)
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
                outcome.changes += interruption.hold(thread, now, new_id, hold)
            return outcome
        if plan == interruption.Plan.ASK_PROVIDER:
            outcome = interruption.requested(thread, run, now, new_id)
            if hold:
                outcome.changes += interruption.hold(thread, now, new_id, hold)
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
        stop = StopSession(instance=instance, project_id=thread.project_id, attempt_id=run.active_attempt_id)
        outcome.effects.append(stop.envelope())
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
        if node.kind == NodeKind.SUBAGENT:
            await self._interrupt_subagent(principal, node, key)
            return node_id
        raise DomainError(
            ErrorCode.NOT_INTERRUPTIBLE,
            f"a {node.kind} node cannot be interrupted on its own; interrupt its run",
            "nodeId",
        )

    async def _interrupt_subagent(self, principal: Principal, node: ExecutionNode, key: str | None) -> None:
        """A provider subagent with a turn of its own (`domain.subagents`): the provider interrupts that turn
        alone, after the request is recorded; its end (through the ingestor) ends the node, and the parent's
        run goes on. One living in its parent's turn (Claude Code's Task) cannot be interrupted alone."""
        async with self.pipeline.db.read() as db:
            owned = await node_rollback.owned_thread(db, node.id)
            turns = (
                await entities.where(db, ProviderTurn, t.provider_turns.c.provider_thread_id == owned.id)
                if owned
                else []
            )
        running = [turn for turn in turns if turn.status == ProviderTurnStatus.RUNNING and turn.native_turn_ref]
        if owned is None or owned.native_thread_ref is None:
            why = "this subagent runs inside its parent's provider turn (it has no turn of its own); interrupt its run"
            raise DomainError(ErrorCode.NOT_INTERRUPTIBLE, why, "nodeId")
        if not subagents.interruptible(node, owned) or not running:
            raise DomainError(ErrorCode.NOT_INTERRUPTIBLE, f"the subagent is not running ({node.status})", "nodeId")
        driver = self.sessions.drivers.get(owned.provider_instance_id)
        if driver is None or not driver.capabilities().supports_interrupt:
            raise interruption.unsupported_error()
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "nodeId")
            summary = f"interrupt requested for subagent {node.title or ''}".strip()
            payload = {"providerThreadId": str(owned.id), "nativeTurnRef": running[0].native_turn_ref}
            kind = ActivityKind.RUN_INTERRUPT_REQUESTED
            note = activity(thread.id, kind, summary, now, new_id, run_id=node.run_id, node_id=node.id, payload=payload)
            return Outcome([note], result={"nodeId": str(node.id)})

        asked = {"command_type": "interruptNode", "principal": principal, "key": key, "decide": decide}
        await self.pipeline.execute(Command.naming("nodeId", node.id, {}, thread_id=node.thread_id, **asked))
        found = self.sessions.binding_of_attempt(node.attempt_id) if node.attempt_id else None
        if found is None:
            return  # the parent's turn has ended meanwhile: so has the subagent's
        session, _ = found
        try:
            await session.runtime.interrupt_turn(owned.native_thread_ref, str(running[0].native_turn_ref))
        except ProviderError as error:
            log.warning("interrupt of subagent turn %s refused: %s", running[0].native_turn_ref, error)

    async def stop_thread(
        self,
        principal: Principal,
        thread_id: uuid.UUID,
        key: str | None,
        *,
        cascade: bool = True,
        reason: str = interruption.STOP_HOLD_REASON,
    ) -> uuid.UUID:
        """Stop: hold the queue, interrupt the active run, then stop every delegated task (after commit)."""
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            active = await entities.get(db, Run, thread.active_run_id)
            return await self._stop(db, thread, active, now=now, cascade=cascade, reason=reason)

        command_type = "stopThread" if cascade else "thread.stop"
        return await self.runs.execute_on_thread(principal, command_type, thread_id, key, decide)

    # ---- effects ----------------------------------------------------------------------------

    async def interrupt_effect(self, effect: InterruptTurn) -> None:
        """Ask the provider to interrupt; its terminal event (through the ingestor) ends the run."""
        found = self.sessions.binding_of_attempt(effect.attempt_id)
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

    async def stop_session_effect(self, effect: StopSession) -> None:
        """The provider cannot interrupt: end the interrupted turn (its run already ended) by ending its
        runtime, but never another thread's turn: the runtime is retired (new work opens a fresh one)
        and closes once the turns still bound to it have ended, at once if there are none."""
        if effect.attempt_id is not None:
            found = self.sessions.binding_of_attempt(effect.attempt_id)
            if found is None:
                return  # the turn already ended
            session, binding = found
            session.unbind(binding.native_thread)  # its late events are dropped: the run has ended
            self.sessions.retire(session, "stopped to interrupt a turn")
            return
        # Effects queued before turns were named: the whole runtime.
        for session in self.sessions.sessions_of(effect.instance, effect.project_id):
            session.stopping = True
            await session.runtime.close()
            await self.sessions.mark(session, ProviderSessionStatus.STOPPED, "stopped to interrupt a turn")

    async def stop_tasks_effect(self, effect: StopTasks) -> None:
        """Stop every delegated task under the thread, deepest first: a task's own tasks stop before it,
        so no task is left running under one that has already stopped."""
        reason = effect.reason or interruption.STOP_HOLD_REASON
        for child in await self._tasks_of(effect.thread_id):
            await self._stop_tree(child, reason)

    async def _stop_tree(self, thread_id: uuid.UUID, reason: str) -> None:
        for child in await self._tasks_of(thread_id):
            await self._stop_tree(child, reason)
        await self.stop_thread(SERVER, thread_id, None, cascade=False, reason=reason)  # the internal thread.stop

    async def stop_for_budget(self, thread_id: uuid.UUID, found: budget_rules.Breach, trigger: Run | None) -> None:
        """A budget's STOP (or a declined ASK): the Stop path on the budget's thread, held BUDGET_EXCEEDED,
        its tasks stopped deepest first, with a `budget.exceeded` activity. Once stopped so, a later report of
        the same tree writes nothing more."""
        now = self.pipeline.clock.now()
        reason = budget_rules.HOLD_REASON

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            active = await entities.get(db, Run, thread.active_run_id)
            settled = active is None or active.interrupt_requested_at is not None
            if thread.queue_held and thread.queue_hold_reason == reason and settled:
                return Outcome()
            outcome = await self._stop(db, thread, active, now=now, cascade=True, reason=reason)
            outcome.changes.append(budget_rules.exceeded(thread.id, found, trigger, now, new_id))
            return outcome

        await self.runs.execute_on_thread(SERVER, "budget.stop", thread_id, None, decide)

    async def _tasks_of(self, parent: uuid.UUID) -> list[uuid.UUID]:
        async with self.pipeline.db.read() as db:
            children = await entities.in_order(
                db, AppThread, t.threads.c.parent_thread_id == parent, t.threads.c.lineage_relationship == "subagent"
            )
        return [child.id for child in children]


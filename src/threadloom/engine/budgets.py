"""Budgets in the engine: setBudget and clearBudget, the check before every turn the engine starts
(`gate`) and after every model call recorded (`after_usage`), and what a breach does: STOP (the Stop path,
held BUDGET_EXCEEDED) or ASK (a BUDGET request; declined, as STOP). Rules live in `domain.budgets`."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from threadloom.domain import budgets as rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Outcome
from threadloom.domain.effects import StartTurn
from threadloom.domain.entities import AppThread, Budget, ExecutionNode, Run, RunAttempt, RuntimeRequest
from threadloom.domain.errors import not_found
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import (
    AttemptStatus,
    BudgetAction,
    BudgetWindow,
    RunStatus,
    TokenScope,
)
from threadloom.domain.usage import Totals
from threadloom.engine.interruption import Interruption
from threadloom.engine.pipeline import Command, GlobalCommand, Pipeline
from threadloom.engine.runs import RunEngine
from threadloom.store import budgets as store
from threadloom.store import entities
from threadloom.store import projects as project_store
from threadloom.store import tables as t
from threadloom.store import usage as ledger
from threadloom.store.db import Reader

# (provider instance, model or None) → can a call's cost be known (reported by the agent, or priced)?
KnowsCost = Callable[[str, str | None], bool]


@dataclasses.dataclass(frozen=True, slots=True)
class _Found:
    """A budget past its limit for a run: the breach, the thread its STOP stops, and whether the run already
    has a question pending about it."""

    breach: rules.Breach
    target: uuid.UUID
    pending: bool


class Budgets:
    def __init__(
        self, pipeline: Pipeline, run_engine: RunEngine, interruption: Interruption, knows_cost: KnowsCost
    ) -> None:
        self.pipeline = pipeline
        self.runs = run_engine
        self.interruption = interruption
        self.knows_cost = knows_cost

    # ---- commands ---------------------------------------------------------------------------

    async def set_budget(
        self,
        principal: Principal,
        *,
        project_id: uuid.UUID | None,
        thread_id: uuid.UUID | None,
        asked: rules.Limits,
        key: str | None,
    ) -> uuid.UUID:
        """A project budget needs admin scope, a thread budget operate (it limits work the operator starts)."""
        now = self.pipeline.clock.now()
        data: dict[str, Any] = {
            "window": asked.window.value,
            "action": asked.action.value,
            "maxCostNanoUsd": asked.max_cost_nano_usd,
            "maxTokens": asked.max_tokens,
        }
        if thread_id is not None:

            async def on_thread(db: Reader, thread: AppThread) -> Outcome:
                principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
                if asked.max_cost_nano_usd is not None:
                    rules.unknown_cost({thread.provider_instance_id: self._known(thread)})
                existing = await store.of_scope(db, thread.project_id, thread.id, asked.window)
                change = rules.set_budget(existing, thread.project_id, thread.id, asked, now, new_id)
                return Outcome([change], result={"budgetId": str(change.entity.id)})

            command = Command.naming(
                "threadId",
                thread_id,
                data,
                thread_id=thread_id,
                command_type="setBudget",
                principal=principal,
                key=key,
                decide=on_thread,
            )
            return uuid.UUID((await self.pipeline.execute(command))["budgetId"])
        assert project_id is not None
        principal.require_project(project_id, TokenScope.ADMIN, "projectId")

        async def on_project(db: Reader) -> Outcome:
            project = await project_store.lock_project(db, project_id)
            if project is None:
                raise not_found("projectId")
            if asked.max_cost_nano_usd is not None:
                threads = await entities.where(
                    db, AppThread, t.threads.c.project_id == project_id, t.threads.c.archived_at.is_(None)
                )
                known: dict[str, bool] = {}
                for thread in threads:
                    known[thread.provider_instance_id] = known.get(thread.provider_instance_id, True) and self._known(
                        thread
                    )
                rules.unknown_cost(known)
            existing = await store.of_scope(db, project_id, None, asked.window)
            change = rules.set_budget(existing, project_id, None, asked, now, new_id)
            return Outcome([change], result={"budgetId": str(change.entity.id)}, project_id=project_id)

        global_command = GlobalCommand(
            command_type="setBudget",
            principal=principal,
            key=key,
            input={"projectId": str(project_id), **data},
            decide=on_project,
        )
        return uuid.UUID((await self.pipeline.execute(global_command))["budgetId"])

    async def clear_budget(self, principal: Principal, budget_id: uuid.UUID, key: str | None) -> uuid.UUID:
        async with self.pipeline.db.read() as db:
            found = await entities.get(db, Budget, budget_id)
        if found is None or not principal.sees(found.project_id):
            raise not_found("budgetId")
        now = self.pipeline.clock.now()
        if found.thread_id is not None:

            async def on_thread(db: Reader, thread: AppThread) -> Outcome:
                principal.require_project(thread.project_id, TokenScope.OPERATE, "budgetId")
                budget = await entities.require(db, Budget, budget_id)
                return Outcome([rules.clear(budget, now)], result={"budgetId": str(budget_id)})

            command = Command.naming(
                "budgetId",
                budget_id,
                {},
                thread_id=found.thread_id,
                command_type="clearBudget",
                principal=principal,
                key=key,
                decide=on_thread,
            )
            await self.pipeline.execute(command)
            return budget_id
        principal.require_project(found.project_id, TokenScope.ADMIN, "budgetId")

        async def on_project(db: Reader) -> Outcome:
            await project_store.lock_project(db, found.project_id)
            budget = await entities.require(db, Budget, budget_id)
            return Outcome([rules.clear(budget, now)], result={"budgetId": str(budget_id)}, project_id=found.project_id)

        global_command = GlobalCommand(
            command_type="clearBudget",
            principal=principal,
            key=key,
            input={"budgetId": str(budget_id)},
            decide=on_project,
        )
        await self.pipeline.execute(global_command)
        return budget_id

    def _known(self, thread: AppThread) -> bool:
        return self.knows_cost(thread.provider_instance_id, thread.model)

    # ---- the checks -------------------------------------------------------------------------

    async def gate(self, run_id: uuid.UUID, thread_id: uuid.UUID) -> bool:
        """Before a run's turn is sent: True when it may start. Past a budget, STOP stops the tree (this run
        ends before the provider had it) and ASK holds the turn behind a BUDGET request until it is answered."""
        if not await self._any(thread_id):
            return True
        async with self.pipeline.db.read() as db:
            thread = await entities.get(db, AppThread, thread_id)
            run = await entities.get(db, Run, run_id)
            if thread is None or run is None or run.status != RunStatus.PREPARING:
                return True  # not waiting for its turn: the turn's own preparing decides
            found = await self._breach(db, thread, run)
        if found is None:
            return True
        await self._act(found, run)
        return False

    async def after_usage(self, thread_id: uuid.UUID, run_id: uuid.UUID) -> None:
        """After a model call was recorded: past a budget, STOP interrupts the tree at once (the call that
        crossed it is the overshoot) and ASK asks, once per run and budget. A run whose turn ended with that
        call is asked nothing (its next turn is), but a STOP still holds the queue and stops the tasks."""
        if not await self._any(thread_id):
            return
        async with self.pipeline.db.read() as db:
            thread = await entities.get(db, AppThread, thread_id)
            run = await entities.get(db, Run, run_id)
            if thread is None or run is None:
                return
            found = await self._breach(db, thread, run)
        live = run.status in (RunStatus.RUNNING, RunStatus.WAITING)
        if found is not None and (live or found.breach.budget.action == BudgetAction.STOP):
            await self._act(found, run)

    async def _any(self, thread_id: uuid.UUID) -> bool:
        """Whether the thread's project has any budget at all (one statement, no transaction): most have none."""
        async with self.pipeline.db.statements() as db:
            return await store.any_active(db, thread_id)

    async def _act(self, found: _Found, run: Run) -> None:
        if found.pending:
            return  # asked already: the answer decides
        if found.breach.budget.action == BudgetAction.ASK:
            await self._ask(run, found.breach)
        else:
            await self.interruption.stop_for_budget(found.target, found.breach, run)

    async def _ask(self, run: Run, found: rules.Breach) -> None:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            current = await entities.require(db, Run, run.id)
            _, pending = store.answered_for(await store.budget_requests(db, run.id))
            if found.budget.id in pending or current.status not in (
                RunStatus.PREPARING,
                RunStatus.RUNNING,
                RunStatus.WAITING,
            ):
                return Outcome()
            attempt = await entities.require(db, RunAttempt, current.active_attempt_id)
            root = await entities.require(db, ExecutionNode, attempt.root_node_id)
            return rules.ask(current, root, found, now, new_id)

        await self.pipeline.execute(
            Command(
                command_type="budget.ask", principal=None, key=None, input={}, decide=decide, thread_id=run.thread_id
            )
        )

    async def _breach(self, db: Reader, thread: AppThread, run: Run) -> _Found | None:
        """The first budget this run's spending is past (project budgets, then the chain's thread budgets)."""
        levels = await store.chain(db, thread, run.id)
        budgets = await store.active(db, thread.project_id, [level.thread_id for level in levels])
        if not budgets:
            return None
        granted, pending = store.answered_for(await store.budget_requests(db, run.id))
        now = self.pipeline.clock.now()
        top = levels[-1]
        for budget in budgets:
            if budget.id in granted:
                continue
            level = top if budget.thread_id is None else next(lv for lv in levels if lv.thread_id == budget.thread_id)
            spent = await self._spent(db, budget, level, now)
            found = rules.breach(budget, spent)
            if found is not None:
                return _Found(found, level.thread_id, budget.id in pending)
        return None

    async def _spent(self, db: Reader, budget: Budget, level: store.Level, now: Any) -> Totals:
        if budget.time_window == BudgetWindow.RUN:
            # A task delegated while its parent ran nothing counts against no run of the parent.
            return Totals() if level.run_id is None else await ledger.totals(db, run_id=level.run_id)
        since = rules.since(budget.time_window, now)
        if budget.thread_id is None:
            return await ledger.totals(db, project_id=budget.project_id, since=since)
        return await ledger.totals(db, thread_id=budget.thread_id, since=since)

    # ---- answers to a BUDGET request --------------------------------------------------------

    async def answer(
        self,
        db: Reader,
        thread: AppThread,
        run: Run,
        request: RuntimeRequest,
        node: ExecutionNode,
        others: int,
        response: dict[str, Any],
        accepted: bool,
        summary: str,
        now: Any,
    ) -> Outcome:
        """Record the answer; approved, a turn the gate held is sent now (declined: `declined` after commit)."""
        outcome = rules.answered(run, request, node, others, accepted, response, summary, now, new_id)
        attempt = await entities.get(db, RunAttempt, run.active_attempt_id)
        held = run.status == RunStatus.PREPARING and attempt is not None and attempt.status == AttemptStatus.PENDING
        if accepted and held and others == 0:
            start = StartTurn(run_id=run.id, attempt_id=run.active_attempt_id, thread_id=run.thread_id)
            outcome.effects.append(start.envelope())
        return outcome

    async def declined(self, request_id: uuid.UUID) -> None:
        """A declined BUDGET request: as STOP, on the budget's thread (the tree's root for a project's)."""
        async with self.pipeline.db.read() as db:
            request = await entities.get(db, RuntimeRequest, request_id)
            budget = await entities.get(db, Budget, rules.budget_of(request) if request else None)
            run = await entities.get(db, Run, request.run_id if request else None)
            thread = await entities.get(db, AppThread, run.thread_id if run else None)
            if request is None or budget is None or run is None or thread is None:
                return
            levels = await store.chain(db, thread, run.id)
            level = (
                levels[-1]
                if budget.thread_id is None
                else next((lv for lv in levels if lv.thread_id == budget.thread_id), levels[-1])
            )
            spent = await self._spent(db, budget, level, self.pipeline.clock.now())
        await self.interruption.stop_for_budget(level.thread_id, rules.Breach(budget, spent), run)

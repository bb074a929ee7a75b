"""implementPlan: a proposed plan starts a new run on its thread, or a new thread (rules in `domain.plans`).

On its own thread, the plan is marked implemented in the same transaction that creates the run
implementing it, so a refused send (an archived thread, say) leaves the plan as it was.
"""

from __future__ import annotations

import uuid

from threadloom.domain import dispatch as dispatch_rules
from threadloom.domain import plans as rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Outcome
from threadloom.domain.entities import AppThread, PlanArtifact
from threadloom.domain.errors import not_found
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import PlanStatus, TokenScope
from threadloom.engine.catalog import Catalog
from threadloom.engine.dispatch import Dispatcher
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.runs import RunEngine
from threadloom.store import entities, runs
from threadloom.store.db import Reader


class Plans:
    def __init__(self, pipeline: Pipeline, catalog: Catalog, run_engine: RunEngine, dispatcher: Dispatcher) -> None:
        self.pipeline = pipeline
        self.catalog = catalog
        self.runs = run_engine
        self.dispatch = dispatcher

    async def implement(
        self, principal: Principal, plan_id: uuid.UUID, target: rules.PlanTarget, key: str | None
    ) -> tuple[uuid.UUID, uuid.UUID]:
        """Returns (thread id, run id) of the work that implements the plan."""
        async with self.pipeline.db.read() as db:
            plan = await entities.get(db, PlanArtifact, plan_id)
            thread = await entities.get(db, AppThread, plan.thread_id if plan else None)
        if plan is None or thread is None or not principal.sees(thread.project_id):
            raise not_found("planId")
        data = {"planId": str(plan_id), "target": target.value}
        if target == rules.PlanTarget.NEW_RUN:
            return await self._as_new_run(principal, plan_id, thread.id, key, data)
        return await self._as_new_thread(principal, plan, thread, key, data)

    async def _as_new_run(
        self, principal: Principal, plan_id: uuid.UUID, thread_id: uuid.UUID, key: str | None, data: dict[str, str]
    ) -> tuple[uuid.UUID, uuid.UUID]:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, locked: AppThread) -> Outcome:
            principal.require_project(locked.project_id, TokenScope.OPERATE, "planId")
            current = await entities.require(db, PlanArtifact, plan_id)
            implemented = rules.implement(current, now)
            state = await runs.thread_state(db, locked)
            applied = dispatch_rules.choose(
                dispatch_rules.Dispatch(dispatch_rules.DispatchMode.QUEUE_AFTER_ACTIVE),
                state,
                self.runs.ability(locked.provider_instance_id),
            )
            outcome = dispatch_rules.new_run(
                state,
                applied=applied,
                text=rules.implementation_input(current),
                provider_instance_id=locked.provider_instance_id,
                model=None,
                client_message_id=None,
                now=now,
                new_id=new_id,
            )
            outcome.changes.insert(0, implemented)
            await self.runs.route(db, locked, outcome)
            outcome.result = {"planId": str(plan_id), "threadId": str(locked.id), "runId": outcome.result["runId"]}
            return outcome

        result = await self.pipeline.execute(
            Command(
                command_type="implementPlan",
                principal=principal,
                key=key,
                input=data,
                decide=decide,
                thread_id=thread_id,
            )
        )
        return uuid.UUID(result["threadId"]), uuid.UUID(result["runId"])

    async def _as_new_thread(
        self, principal: Principal, plan: PlanArtifact, thread: AppThread, key: str | None, data: dict[str, str]
    ) -> tuple[uuid.UUID, uuid.UUID]:
        """A new thread's log is written by commands of its own, so this takes three: create the thread,
        send it the plan, and only then mark the plan implemented. A refusal on the way (the instance no
        longer allows the thread's runtime mode, the project is gone) leaves the plan as it was. Each
        step has a key derived from the plan, so a retried or interrupted request finishes the same work
        instead of making a second thread."""
        now = self.pipeline.clock.now()
        if key is None or plan.status != PlanStatus.IMPLEMENTED:  # a keyed retry gets its stored answer below
            rules.implement(plan, now)  # refuse an unfinished or implemented plan before writing anything
        sub_key = f"implementPlan:{plan.id}/work"  # every attempt at this plan converges on one thread and run
        target_thread = await self.catalog.create_thread(
            principal,
            project_id=thread.project_id,
            title=f"Implement: {(plan.text or '').strip()[:60]}",
            provider_instance_id=thread.provider_instance_id,
            model=thread.model,
            runtime_mode=thread.runtime_mode,
            key=sub_key,
        )
        sent = await self.dispatch.send_message(
            principal,
            target_thread,
            text=rules.implementation_input(plan),
            dispatch=dispatch_rules.Dispatch(dispatch_rules.DispatchMode.QUEUE_AFTER_ACTIVE),
            provider_instance_id=None,
            model=None,
            client_message_id=sub_key,
        )

        async def mark(db: Reader, locked: AppThread) -> Outcome:
            principal.require_project(locked.project_id, TokenScope.OPERATE, "planId")
            current = await entities.require(db, PlanArtifact, plan.id)
            return Outcome([rules.implement(current, now)], result={"planId": str(plan.id)})

        await self.pipeline.execute(
            Command(
                command_type="implementPlan", principal=principal, key=key, input=data, decide=mark, thread_id=thread.id
            )
        )
        return target_thread, sent.run_id

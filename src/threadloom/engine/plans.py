"""implementPlan: a proposed plan starts a new run on its thread, or a new thread (rules in `domain.plans`)."""

from __future__ import annotations

import uuid

from threadloom.domain import plans as rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Outcome
from threadloom.domain.dispatch import Dispatch
from threadloom.domain.entities import AppThread, PlanArtifact
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.runs import DispatchMode
from threadloom.domain.statuses import TokenScope
from threadloom.engine.catalog import Catalog
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.runs import RunEngine
from threadloom.store import entities
from threadloom.store.db import Reader


class Plans:
    def __init__(self, pipeline: Pipeline, catalog: Catalog, run_engine: RunEngine) -> None:
        self.pipeline = pipeline
        self.catalog = catalog
        self.runs = run_engine

    async def implement(
        self, principal: Principal, plan_id: uuid.UUID, target: rules.PlanTarget, key: str | None
    ) -> tuple[uuid.UUID, uuid.UUID]:
        """Returns (thread id, run id) of the work that implements the plan."""
        async with self.pipeline.db.read() as db:
            plan = await entities.get(db, PlanArtifact, plan_id)
            thread = await entities.get(db, AppThread, plan.thread_id if plan else None)
        if plan is None or thread is None or not principal.sees(thread.project_id):
            raise DomainError(ErrorCode.NOT_FOUND, "no such plan", "planId")
        now = self.pipeline.clock.now()

        async def mark(db: Reader, locked: AppThread | None) -> Outcome:
            assert locked is not None
            principal.require_project(locked.project_id, TokenScope.OPERATE, "planId")
            current = await entities.require(db, PlanArtifact, plan_id)
            return Outcome([rules.implement(current, now)], result={"planId": str(plan_id)})

        await self.pipeline.execute(
            Command("implementPlan", principal, key, {"planId": str(plan_id), "target": target.value}, mark, thread.id)
        )
        text = rules.implementation_input(plan)
        sub_key = None if key is None else f"{key}/work"
        target_thread = thread.id
        if target == rules.PlanTarget.NEW_THREAD:
            target_thread = await self.catalog.create_thread(
                principal,
                project_id=thread.project_id,
                title=f"Implement: {(plan.text or '').strip()[:60]}",
                provider_instance_id=thread.provider_instance_id,
                model=thread.model,
                runtime_mode=thread.runtime_mode,
                key=sub_key,
            )
        sent = await self.runs.send_message(
            principal,
            target_thread,
            text=text,
            dispatch=Dispatch(DispatchMode.QUEUE_AFTER_ACTIVE),
            provider_instance_id=None,
            model=None,
            client_message_id=sub_key,
        )
        return target_thread, sent.run_id

"""Plans: implementPlan, in a new run on the plan's thread or in a new thread."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context, Info
from threadloom.api.enums import PlanTarget, member
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import KeyedInput, Shape, load, mutation
from threadloom.api.types import PlanArtifact, Run, Thread


@strawberry.input
class ImplementPlanInput(KeyedInput):
    plan_id: strawberry.ID
    target: PlanTarget = strawberry.field(description="NEW_RUN on the plan's thread, or a NEW_THREAD.")


@strawberry.type
class ImplementPlanPayload:
    plan: PlanArtifact | None
    thread: Thread | None
    run: Run | None
    user_errors: list[UserError]
    client_mutation_id: str | None


Implemented = tuple[uuid.UUID, uuid.UUID, uuid.UUID]
"""(plan, thread, run)."""


async def _implemented(
    info: Info, done: Implemented | None, errors: list[UserError], client_key: str | None
) -> ImplementPlanPayload:
    plan, thread, run = done or (None, None, None)
    return ImplementPlanPayload(
        plan=await load(info, PlanArtifact, plan),
        thread=await load(info, Thread, thread),
        run=await load(info, Run, run),
        user_errors=errors,
        client_mutation_id=client_key,
    )


@strawberry.type
class PlanMutation:
    @mutation(Shape(ImplementPlanPayload, _implemented))
    async def implement_plan(ctx: Context, input: ImplementPlanInput) -> Implemented:
        """Start implementing a proposed plan: a new run (queued behind an active one) or a new thread in the same
        project."""
        plan = gid.decode_as(input.plan_id, "PlanArtifact", "planId")
        target = member(PlanTarget, input.target)
        thread, run = await ctx.services.plans.implement(ctx.principal, plan, target, input.key())
        return plan, thread, run

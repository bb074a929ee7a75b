"""Budgets: setBudget and clearBudget (docs/usage.md, "Budgets"). A project's budget needs an admin token,
a thread's an operate token (it limits work that token can start anyway)."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context
from threadloom.api.enums import member
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import KeyedInput, mutation, returning, thread_id
from threadloom.api.types import Budget
from threadloom.domain import budgets as rules
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import BudgetAction, BudgetWindow


@strawberry.input(description="A budget: its scope (a project or a thread, exactly one), limits, window and action.")
class SetBudgetInput(KeyedInput):
    project_id: strawberry.ID | None = strawberry.field(
        default=None, description="Limit every thread of this project (admin scope)."
    )
    thread_id: strawberry.ID | None = strawberry.field(
        default=None, description="Limit this thread with its delegated tasks (operate scope)."
    )
    max_cost_usd: float | None = strawberry.field(
        default=None,
        description="The limit in USD. Refused with BUDGET_COST_UNKNOWN where a thread's provider instance reports "
        "no cost and has no price for its model (it would never fire).",
    )
    max_tokens: int | None = strawberry.field(default=None, description="The limit in tokens (input and output).")
    window: BudgetWindow = strawberry.field(
        description="What it counts: one RUN, the UTC DAY or MONTH so far, or TOTAL. One budget per scope and "
        "window: setting it again changes it."
    )
    action: BudgetAction = strawberry.field(description="What passing it does: STOP or ASK.")


@strawberry.input(description="The budget to clear.")
class ClearBudgetInput(KeyedInput):
    budget_id: strawberry.ID


@strawberry.type(description="The budget a mutation set or cleared (null when it was refused).")
class BudgetPayload:
    budget: Budget | None
    user_errors: list[UserError]
    client_mutation_id: str | None


BUDGET = returning(BudgetPayload, "budget", Budget)


@strawberry.type
class BudgetMutation:
    @mutation(BUDGET)
    async def set_budget(ctx: Context, input: SetBudgetInput) -> uuid.UUID:
        """Set (or change) a budget of a project or a thread. Checked before every turn the engine starts and
        after every model call recorded; the call that crosses it is spent (overshoot: one model call)."""
        if (input.project_id is None) == (input.thread_id is None):
            raise DomainError(ErrorCode.INVALID_INPUT, "give exactly one of projectId and threadId", "projectId")
        project = None if input.project_id is None else gid.decode_as(input.project_id, "Project", "projectId")
        thread = None if input.thread_id is None else thread_id(input.thread_id)
        asked = rules.limits(
            member(BudgetWindow, input.window), member(BudgetAction, input.action), input.max_cost_usd, input.max_tokens
        )
        return await ctx.services.budgets.set_budget(
            ctx.principal, project_id=project, thread_id=thread, asked=asked, key=input.key()
        )

    @mutation(BUDGET)
    async def clear_budget(ctx: Context, input: ClearBudgetInput) -> uuid.UUID:
        """Clear a budget: it is checked no more (it stays readable by id, `clearedAt` set)."""
        budget = gid.decode_as(input.budget_id, "Budget", "budgetId")
        return await ctx.services.budgets.clear_budget(ctx.principal, budget, input.key())

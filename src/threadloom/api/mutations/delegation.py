"""Delegation: delegateTask, a task run in a new child thread."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api.context import Context
from threadloom.api.mutations.payloads import THREAD, KeyedInput, mutation, thread_id


@strawberry.input
class DelegateTaskInput(KeyedInput):
    thread_id: strawberry.ID = strawberry.field(description="The parent thread.")
    text: str = strawberry.field(description="The task: the child thread's first message.")
    title: str | None = None


@strawberry.type
class DelegationMutation:
    @mutation(THREAD)
    async def delegate_task(ctx: Context, input: DelegateTaskInput) -> uuid.UUID:
        """Delegate a task to a new child thread (lineage `subagent`). Each run's result comes back to the parent as a
        `subagent_result` transfer and a system message; stopThread on the parent stops it too."""
        parent = thread_id(input.thread_id)
        return await ctx.services.delegation.delegate(
            ctx.principal, parent, text=input.text, title=input.title, key=input.key()
        )

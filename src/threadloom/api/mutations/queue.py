"""Queue management: cancelQueuedRun, reorderQueuedRun, editQueuedRun, promoteQueuedRunToSteer, resumeQueue."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api.context import Context
from threadloom.api.mutations.payloads import RUN, THREAD, KeyedInput, mutation, run_id, thread_id


@strawberry.input
class QueuedRunInput(KeyedInput):
    run_id: strawberry.ID


@strawberry.input
class ReorderQueuedRunInput(KeyedInput):
    run_id: strawberry.ID
    position: int = strawberry.field(description="The new 1-based place in the queue.")


@strawberry.input
class EditQueuedRunInput(KeyedInput):
    run_id: strawberry.ID
    text: str


@strawberry.input
class ResumeQueueInput(KeyedInput):
    thread_id: strawberry.ID


@strawberry.type
class QueueMutation:
    @mutation(RUN)
    async def cancel_queued_run(ctx: Context, input: QueuedRunInput) -> uuid.UUID:
        return await ctx.services.queue.cancel_queued(ctx.principal, run_id(input.run_id), input.key())

    @mutation(RUN)
    async def reorder_queued_run(ctx: Context, input: ReorderQueuedRunInput) -> uuid.UUID:
        return await ctx.services.queue.reorder_queued(ctx.principal, run_id(input.run_id), input.position, input.key())

    @mutation(RUN)
    async def edit_queued_run(ctx: Context, input: EditQueuedRunInput) -> uuid.UUID:
        return await ctx.services.queue.edit_queued(ctx.principal, run_id(input.run_id), input.text, input.key())

    @mutation(RUN)
    async def promote_queued_run_to_steer(ctx: Context, input: QueuedRunInput) -> uuid.UUID:
        """The queued run's message steers the active run instead; the queued run ends."""
        return await ctx.services.queue.promote_to_steer(ctx.principal, run_id(input.run_id), input.key())

    @mutation(THREAD)
    async def resume_queue(ctx: Context, input: ResumeQueueInput) -> uuid.UUID:
        """Release a held queue: the next queued run starts if nothing runs."""
        return await ctx.services.queue.resume_queue(ctx.principal, thread_id(input.thread_id), input.key())

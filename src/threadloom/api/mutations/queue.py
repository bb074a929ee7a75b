"""Queue management: cancelQueuedRun, reorderQueuedRun, editQueuedRun, promoteQueuedRunToSteer, resumeQueue."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api.context import Context
from threadloom.api.mutations.payloads import RUN, THREAD, key, mutation, run_id, thread_id


@strawberry.input
class QueuedRunInput:
    run_id: strawberry.ID
    client_mutation_id: str | None = None


@strawberry.input
class ReorderQueuedRunInput:
    run_id: strawberry.ID
    position: int = strawberry.field(description="The new 1-based place in the queue.")
    client_mutation_id: str | None = None


@strawberry.input
class EditQueuedRunInput:
    run_id: strawberry.ID
    text: str
    client_mutation_id: str | None = None


@strawberry.input
class ResumeQueueInput:
    thread_id: strawberry.ID
    client_mutation_id: str | None = None


@strawberry.type
class QueueMutation:
    @mutation(RUN)
    async def cancel_queued_run(ctx: Context, input: QueuedRunInput) -> uuid.UUID:
        return await ctx.services.queue.cancel_queued(
            ctx.principal, run_id(input.run_id), key(input.client_mutation_id)
        )

    @mutation(RUN)
    async def reorder_queued_run(ctx: Context, input: ReorderQueuedRunInput) -> uuid.UUID:
        run = run_id(input.run_id)
        return await ctx.services.queue.reorder_queued(
            ctx.principal, run, input.position, key(input.client_mutation_id)
        )

    @mutation(RUN)
    async def edit_queued_run(ctx: Context, input: EditQueuedRunInput) -> uuid.UUID:
        run = run_id(input.run_id)
        return await ctx.services.queue.edit_queued(ctx.principal, run, input.text, key(input.client_mutation_id))

    @mutation(RUN, description="The queued run's message steers the active run instead; the queued run ends.")
    async def promote_queued_run_to_steer(ctx: Context, input: QueuedRunInput) -> uuid.UUID:
        run = run_id(input.run_id)
        return await ctx.services.queue.promote_to_steer(ctx.principal, run, key(input.client_mutation_id))

    @mutation(THREAD, description="Release a held queue: the next queued run starts if nothing runs.")
    async def resume_queue(ctx: Context, input: ResumeQueueInput) -> uuid.UUID:
        thread = thread_id(input.thread_id)
        return await ctx.services.queue.resume_queue(ctx.principal, thread, key(input.client_mutation_id))

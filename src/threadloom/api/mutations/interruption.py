"""Interruption and Stop: interruptRun, interruptNode, stopThread."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import RUN, THREAD, key, mutation, returning, run_id, thread_id
from threadloom.api.types import ExecutionNode


@strawberry.input
class InterruptRunInput:
    run_id: strawberry.ID
    hold_queue: bool = strawberry.field(default=False, description="Also hold the queue: the Stop button.")
    client_mutation_id: str | None = None


@strawberry.input
class InterruptNodeInput:
    node_id: strawberry.ID
    hold_queue: bool = False
    client_mutation_id: str | None = None


@strawberry.type
class NodePayload:
    node: ExecutionNode | None
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.input
class StopThreadInput:
    thread_id: strawberry.ID
    client_mutation_id: str | None = None


@strawberry.type
class InterruptionMutation:
    @mutation(
        RUN,
        description="Ask the provider to interrupt a run (a queued run is cancelled). The run ends when the "
        "provider says so; with holdQueue it is the Stop button.",
    )
    async def interrupt_run(ctx: Context, input: InterruptRunInput) -> uuid.UUID:
        run = run_id(input.run_id)
        return await ctx.services.interruption.interrupt_run(
            ctx.principal, run, hold_queue=input.hold_queue, key=key(input.client_mutation_id)
        )

    @mutation(
        returning(NodePayload, "node", ExecutionNode),
        description="Interrupt by node: a root turn node interrupts its run, a delegated subagent node stops its "
        "child thread; other nodes are NOT_INTERRUPTIBLE.",
    )
    async def interrupt_node(ctx: Context, input: InterruptNodeInput) -> uuid.UUID:
        node = gid.decode_as(input.node_id, "ExecutionNode", "nodeId")
        return await ctx.services.interruption.interrupt_node(
            ctx.principal, node, hold_queue=input.hold_queue, key=key(input.client_mutation_id)
        )

    @mutation(THREAD, description="Stop: hold the queue, interrupt the active run, stop every delegated task.")
    async def stop_thread(ctx: Context, input: StopThreadInput) -> uuid.UUID:
        thread = thread_id(input.thread_id)
        return await ctx.services.interruption.stop_thread(ctx.principal, thread, key(input.client_mutation_id))

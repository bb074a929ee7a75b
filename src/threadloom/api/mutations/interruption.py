"""Interruption and Stop: interruptRun, interruptNode, stopThread."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import RUN, THREAD, KeyedInput, mutation, returning, run_id, thread_id
from threadloom.api.types import ExecutionNode


@strawberry.input
class InterruptRunInput(KeyedInput):
    run_id: strawberry.ID
    hold_queue: bool = strawberry.field(default=False, description="Also hold the queue: the Stop button.")


@strawberry.input
class InterruptNodeInput(KeyedInput):
    node_id: strawberry.ID
    hold_queue: bool = False


@strawberry.type
class NodePayload:
    node: ExecutionNode | None
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.input
class StopThreadInput(KeyedInput):
    thread_id: strawberry.ID


@strawberry.type
class InterruptionMutation:
    @mutation(RUN)
    async def interrupt_run(ctx: Context, input: InterruptRunInput) -> uuid.UUID:
        """Ask the provider to interrupt a run (a queued run is cancelled). The run ends when the provider says so; with
        holdQueue it is the Stop button."""
        run = run_id(input.run_id)
        return await ctx.services.interruption.interrupt_run(
            ctx.principal, run, hold_queue=input.hold_queue, key=input.key()
        )

    @mutation(returning(NodePayload, "node", ExecutionNode))
    async def interrupt_node(ctx: Context, input: InterruptNodeInput) -> uuid.UUID:
        """Interrupt by node: a root turn node interrupts its run, a delegated subagent node stops its child thread,
        a provider subagent with a turn of its own (Codex collab agent, scripted `@subagent`) has the provider
        interrupt that turn alone while its parent's run goes on; other nodes (a Claude Task) are NOT_INTERRUPTIBLE."""
        node = gid.decode_as(input.node_id, "ExecutionNode", "nodeId")
        return await ctx.services.interruption.interrupt_node(
            ctx.principal, node, hold_queue=input.hold_queue, key=input.key()
        )

    @mutation(THREAD)
    async def stop_thread(ctx: Context, input: StopThreadInput) -> uuid.UUID:
        """Stop: hold the queue, interrupt the active run, stop every delegated task."""
        return await ctx.services.interruption.stop_thread(ctx.principal, thread_id(input.thread_id), input.key())

"""Forks: forkThread and mergeBack (the engine's `engine.forks`)."""

from __future__ import annotations

import uuid
from typing import TypeVar

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context, Info
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import KeyedInput, Shape, load, mutation
from threadloom.api.types import ContextTransfer, Thread
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.engine.forks import Source


@strawberry.input
class ProviderThreadPointInput:
    id: strawberry.ID = strawberry.field(description="A provider thread of a thread you can operate.")
    turn_id: strawberry.ID | None = strawberry.field(
        default=None, description="One of its provider turns; absent means its latest turn."
    )


@strawberry.input(one_of=True, description="Exactly one field: the stable point the fork continues from.")
class ForkSourceInput:
    run: strawberry.ID | None = strawberry.field(
        default=strawberry.UNSET,
        description="A completed run, or an interrupted or failed run with a ready checkpoint.",
    )
    node: strawberry.ID | None = strawberry.field(
        default=strawberry.UNSET,
        description="A run's root node (its run), or a completed subagent node (its child thread's latest stable run).",
    )
    provider_thread: ProviderThreadPointInput | None = strawberry.UNSET
    checkpoint: strawberry.ID | None = strawberry.field(
        default=strawberry.UNSET, description="A ready checkpoint: the conversation up to its run."
    )


@strawberry.input
class ForkThreadInput(KeyedInput):
    source: ForkSourceInput
    title: str | None = strawberry.field(default=None, description="Absent means `Fork of <source title>`.")
    own_workspace: bool = strawberry.field(
        default=False,
        description="Work in a folder of its own holding the fork point's files, instead of sharing the project's "
        "workspace. The folder is kept by the server under its data dir (`<data dir>/workspaces/<project id>/forks/"
        "<fork id>`; `Thread.workspacePath` reads `forks/<fork id>`), outside every project's workspace, so no "
        "other thread's agent can reach or replace it.",
    )


@strawberry.type
class ForkThreadPayload:
    thread: Thread | None = strawberry.field(description="The fork: no provider thread until its first run.")
    transfer: ContextTransfer | None = strawberry.field(description="The FORK transfer, PENDING until the first run.")
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.input
class MergeBackInput(KeyedInput):
    fork_thread_id: strawberry.ID = strawberry.field(description="The fork whose work goes back to its source thread.")


@strawberry.type
class MergeBackPayload:
    thread: Thread | None = strawberry.field(description="The source thread: its next run receives the delta.")
    transfer: ContextTransfer | None = strawberry.field(
        description="The MERGE_BACK transfer, PENDING until the source's next run consumes it."
    )
    user_errors: list[UserError]
    client_mutation_id: str | None


P = TypeVar("P", ForkThreadPayload, MergeBackPayload)


def _thread_and_transfer(payload: type[P], *, by_transfer: bool) -> Shape[uuid.UUID, P]:
    """The payload naming a thread and a transfer from the id the command returned: the fork (its FORK
    transfer) or the MERGE_BACK transfer (its target thread)."""

    async def build(info: Info, found: uuid.UUID | None, errors: list[UserError], client_key: str | None) -> P:
        if by_transfer:
            transfer = await load(info, ContextTransfer, found)
            thread = None if transfer is None else await load(info, Thread, transfer.rec.thread_id)
        else:
            thread = await load(info, Thread, found)
            transfer = None if thread is None else await load(info, ContextTransfer, thread.rec.forked_from_transfer_id)
        return payload(thread=thread, transfer=transfer, user_errors=errors, client_mutation_id=client_key)

    return Shape(payload, build)


FORK = _thread_and_transfer(ForkThreadPayload, by_transfer=False)
MERGE = _thread_and_transfer(MergeBackPayload, by_transfer=True)


def source_of(source: ForkSourceInput) -> Source:
    """The one field set, its id decoded as the type it names."""
    if isinstance(source.run, str):
        return Source("run", gid.decode_as(source.run, "Run", "source.run"))
    if isinstance(source.node, str):
        return Source("node", gid.decode_as(source.node, "ExecutionNode", "source.node"))
    if isinstance(source.checkpoint, str):
        return Source("checkpoint", gid.decode_as(source.checkpoint, "Checkpoint", "source.checkpoint"))
    point = source.provider_thread
    if isinstance(point, ProviderThreadPointInput):
        pt = gid.decode_as(point.id, "ProviderThread", "source.providerThread.id")
        turn = (
            None
            if point.turn_id is None
            else gid.decode_as(point.turn_id, "ProviderTurn", "source.providerThread.turnId")
        )
        return Source("provider_thread", pt, turn)
    raise DomainError(ErrorCode.INVALID_INPUT, "name one source: run, node, providerThread or checkpoint", "source")


@strawberry.type
class ForkMutation:
    @mutation(FORK)
    async def fork_thread(ctx: Context, input: ForkThreadInput) -> uuid.UUID:
        """Fork a thread from a stable point into a new thread (lineage `FORK`). Nothing starts and no provider
        state is made: the fork's first message resolves its transfer, natively when that run's provider is the
        source's and can fork there, otherwise with a handoff from the log (lower fidelity)."""
        source = source_of(input.source)
        title = input.title
        forks = ctx.services.forks
        return await forks.fork(ctx.principal, source, title=title, own_workspace=input.own_workspace, key=input.key())

    @mutation(MERGE)
    async def merge_back(ctx: Context, input: MergeBackInput) -> uuid.UUID:
        """Bring a fork's work back to its source thread: a MERGE_BACK transfer over the fork's runs since it was
        forked (or last merged) up to its latest stable run. The source's next run receives the delta — decisions,
        files changed, commands, conclusions, open requests — as a handoff with its message."""
        fork = gid.decode_as(input.fork_thread_id, "Thread", "forkThreadId")
        return await ctx.services.forks.merge_back(ctx.principal, fork, key=input.key())

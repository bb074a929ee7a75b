"""Forks: forkThread and mergeBack (the engine's `engine.forks`)."""

from __future__ import annotations

import uuid
from typing import TypeVar

import strawberry

from threadloom.api import enums
from threadloom.api import ids as gid
from threadloom.api.context import Context, Info
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import KeyedInput, Shape, load, mutation
from threadloom.api.types import ContextTransfer, Thread
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.forks import Workspace
from threadloom.engine.forks import Source

strawberry.enum(
    Workspace,
    name="ForkWorkspace",
    description="Where a fork's agent works. OWN: a folder of its own, holding the fork point's files (made from "
    "the fork point's checkpoint before forkThread answers); nothing the source or any other thread does later "
    "reaches it, and nothing the fork does reaches them. SHARED: the source's folder (the project's workspace), "
    "as it is now: the fork sees what the source wrote after the fork point, and the two write the same files.",
)


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
        description="A run's root node (its run); a completed delegated task's node (its child thread's latest "
        "stable run); a completed provider subagent's node that owns a provider thread (its own conversation and "
        "the files it left).",
    )
    provider_thread: ProviderThreadPointInput | None = strawberry.UNSET
    checkpoint: strawberry.ID | None = strawberry.field(
        default=strawberry.UNSET, description="A ready checkpoint: the conversation up to its run."
    )


@strawberry.input
class ForkThreadInput(KeyedInput):
    source: ForkSourceInput
    title: str | None = strawberry.field(default=None, description="Absent means `Fork of <source title>`.")
    workspace: Workspace = strawberry.field(
        default=Workspace.OWN,
        description="OWN (the default): the fork works in a folder of its own holding the fork point's files, kept "
        "by the server under its data dir (`<data dir>/workspaces/<project id>/forks/<fork id>`; "
        "`Thread.workspacePath` reads `forks/<fork id>`), outside every project's workspace, so no other thread's "
        "agent can reach or replace it; refused with CHECKPOINT_MISSING when the fork point has no ready checkpoint. "
        "SHARED, an explicit choice: the fork works in the source's folder, the project's workspace, with the files "
        "as they are now (refused with INVALID_INPUT when the source has a folder of its own).",
    )
    own_workspace: bool | None = strawberry.field(
        default=None,
        description="Older form of `workspace`: true is OWN, false is SHARED; absent, `workspace` decides. "
        "true with `workspace: SHARED` is INVALID_INPUT.",
        deprecation_reason="Use `workspace: OWN | SHARED`.",
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


def workspace_of(input: ForkThreadInput) -> tuple[Workspace, str]:
    """The workspace asked for, and the input field that asked (a refusal names it)."""
    asked = enums.member(Workspace, input.workspace)
    if input.own_workspace is None:
        return asked, "workspace"
    if input.own_workspace and asked == Workspace.SHARED:
        raise DomainError(ErrorCode.INVALID_INPUT, "ownWorkspace: true contradicts workspace: SHARED", "ownWorkspace")
    return (Workspace.OWN if input.own_workspace else Workspace.SHARED), "ownWorkspace"


@strawberry.type
class ForkMutation:
    @mutation(FORK)
    async def fork_thread(ctx: Context, input: ForkThreadInput) -> uuid.UUID:
        """Fork a thread from a stable point into a new thread (lineage `FORK`). Nothing starts and no provider
        state is made: the fork's first message resolves its transfer, natively when that run's provider is the
        source's and can fork there, otherwise with a handoff from the log (lower fidelity). What the fork
        receives is fixed now — that handoff is built from the log as it is now, and by default the fork gets a
        folder of its own with the fork point's files — so later rollbacks, switches or forks of the source
        change nothing the fork sees."""
        source = source_of(input.source)
        workspace, field = workspace_of(input)
        forks = ctx.services.forks
        return await forks.fork(
            ctx.principal, source, title=input.title, workspace=workspace, key=input.key(), workspace_field=field
        )

    @mutation(MERGE)
    async def merge_back(ctx: Context, input: MergeBackInput) -> uuid.UUID:
        """Bring a fork's work back to its source thread: a MERGE_BACK transfer over the fork's runs since it was
        forked (or last merged) up to its latest stable run. The source's next run receives the delta — decisions,
        files changed, commands, conclusions, open requests — as a handoff with its message."""
        fork = gid.decode_as(input.fork_thread_id, "Thread", "forkThreadId")
        return await ctx.services.forks.merge_back(ctx.principal, fork, key=input.key())

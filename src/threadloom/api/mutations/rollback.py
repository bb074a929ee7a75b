"""Rollback: rollbackToRun, rollbackNode, undoRollback (the engine's `engine.rollback`)."""

from __future__ import annotations

import uuid
from typing import Any

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context, Info
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import KeyedInput, Shape, load, mutation, thread_id
from threadloom.api.types import Checkpoint, ExecutionNode, Run, Thread
from threadloom.domain.subagents import ConversationRollback

NodeConversation = strawberry.enum(
    ConversationRollback,
    name="NodeConversationRollback",
    description="What rollbackNode did to the subagent's own conversation (docs/rollback.md, \"Subagent nodes\").",
)


@strawberry.input
class RollbackToRunInput(KeyedInput):
    thread_id: strawberry.ID
    run_ordinal: int = strawberry.field(description="The run to go back to; 0 is before the first run.")
    restore_files: bool = strawberry.field(
        default=True, description="Also make the workspace equal to that run's checkpoint."
    )


@strawberry.input
class RollbackNodeInput(KeyedInput):
    node_id: strawberry.ID
    checkpoint_id: strawberry.ID = strawberry.field(description="A checkpoint of the node's own (child) scope.")


@strawberry.input
class UndoRollbackInput(KeyedInput):
    thread_id: strawberry.ID


@strawberry.type
class RollbackToRunPayload:
    thread: Thread | None
    rolled_back_runs: list[Run]
    pre_rollback_ref: str | None = strawberry.field(
        description="The hidden ref of the workspace as it was before the rollback (undoRollback restores it)."
    )
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.type
class RollbackNodePayload:
    node: ExecutionNode | None
    checkpoint: Checkpoint | None
    dirtied_parent_workspace: bool | None = strawberry.field(
        description="True when the node shares its parent's workspace, so the parent's files changed too."
    )
    conversation: NodeConversation | None = strawberry.field(  # type: ignore[valid-type]
        description="ROLLED_BACK: the subagent's own provider thread lost its turns after the checkpoint; "
        "UNCHANGED: none of them is after it; NOT_SUPPORTED: it has no conversation of its own (a Claude Task "
        "lives in its parent's session) or its provider cannot roll back — only the files went back."
    )
    conversation_reason: str | None = strawberry.field(description="Why the conversation is as it is, in words.")
    pre_rollback_ref: str | None
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.type
class UndoRollbackPayload:
    thread: Thread | None
    user_errors: list[UserError]
    client_mutation_id: str | None


async def _to_run(
    info: Info, done: dict[str, Any] | None, errors: list[UserError], client_key: str | None
) -> RollbackToRunPayload:
    done = done or {}
    runs = [await load(info, Run, uuid.UUID(r)) for r in done.get("rolledBackRunIds", [])]
    thread = await load(info, Thread, _uuid(done.get("threadId")))
    fields = {"thread": thread, "rolled_back_runs": [r for r in runs if r is not None]}
    return RollbackToRunPayload(**fields, **_rolled_back(done, errors, client_key))


async def _node(
    info: Info, done: dict[str, Any] | None, errors: list[UserError], client_key: str | None
) -> RollbackNodePayload:
    done = done or {}
    node = await load(info, ExecutionNode, _uuid(done.get("nodeId")))
    checkpoint = await load(info, Checkpoint, _uuid(done.get("checkpointId")))
    dirtied = done.get("dirtiedParentWorkspace")
    said = done.get("conversation")
    return RollbackNodePayload(
        node=node,
        checkpoint=checkpoint,
        dirtied_parent_workspace=dirtied,
        conversation=ConversationRollback(said) if said else None,
        conversation_reason=done.get("conversationReason"),
        **_rolled_back(done, errors, client_key),
    )


def _rolled_back(done: dict[str, Any], errors: list[UserError], client_key: str | None) -> dict[str, Any]:
    """What both rollback payloads end with: the pre-rollback ref (for undo), the errors, the client's key."""
    return {"pre_rollback_ref": done.get("preRollbackRef"), "user_errors": errors, "client_mutation_id": client_key}


async def _undone(
    info: Info, done: dict[str, Any] | None, errors: list[UserError], client_key: str | None
) -> UndoRollbackPayload:
    thread = await load(info, Thread, _uuid((done or {}).get("threadId")))
    return UndoRollbackPayload(thread=thread, user_errors=errors, client_mutation_id=client_key)


def _uuid(value: Any) -> uuid.UUID | None:
    return uuid.UUID(str(value)) if value else None


@strawberry.type
class RollbackMutation:
    @mutation(Shape(RollbackToRunPayload, _to_run))
    async def rollback_to_run(ctx: Context, input: RollbackToRunInput) -> dict[str, Any]:
        """Bring the thread back to right after run `runOrdinal`: the provider conversation loses the later
        runs, the files are that run's checkpoint, later runs become ROLLED_BACK — all of it or none of it.
        Refused while a run is active."""
        target = thread_id(input.thread_id)
        return await ctx.services.rollback.rollback_to_run(
            ctx.principal, target, input.run_ordinal, input.restore_files, input.key()
        )

    @mutation(Shape(RollbackNodePayload, _node))
    async def rollback_node(ctx: Context, input: RollbackNodeInput) -> dict[str, Any]:
        """Restore the files of a subagent's scope to one of its checkpoints, and its own conversation where
        its provider can (`conversation` says which); the parent's runs stay."""
        node = gid.decode_as(input.node_id, "ExecutionNode", "nodeId")
        checkpoint = gid.decode_as(input.checkpoint_id, "Checkpoint", "checkpointId")
        return await ctx.services.rollback.rollback_node(ctx.principal, node, checkpoint, input.key())

    @mutation(Shape(UndoRollbackPayload, _undone))
    async def undo_rollback(ctx: Context, input: UndoRollbackInput) -> dict[str, Any]:
        """Take back the thread's last rollback (files, conversation, run statuses) if no run started since."""
        return await ctx.services.rollback.undo_rollback(ctx.principal, thread_id(input.thread_id), input.key())

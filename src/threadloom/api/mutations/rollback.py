"""Rollback: rollbackToRun, rollbackNode, undoRollback (the engine's `engine.rollback`)."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import strawberry

from threadloom.api import enums
from threadloom.api import ids as gid
from threadloom.api.context import Context, Info
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import KeyedInput, Shape, load, mutation, thread_id
from threadloom.api.types import Checkpoint, ExecutionNode, ProviderThread, Run, Thread
from threadloom.domain.subagents import ConversationRollback
from threadloom.domain.workspace_rollback import ConflictPolicy

NodeConversation = strawberry.enum(
    ConversationRollback,
    name="NodeConversationRollback",
    description='What rollbackNode did to the subagent\'s own conversation (docs/rollback.md, "Subagent nodes").',
)


strawberry.enum(
    ConflictPolicy,
    name="RollbackConflictPolicy",
    description="What a rollback does with a path someone else changed since the runs it undoes: REFUSE "
    "(WORKSPACE_CONFLICT, naming each path and who changed it) or OVERWRITE (put it back anyway).",
)


@strawberry.input
class RollbackToRunInput(KeyedInput):
    thread_id: strawberry.ID
    run_ordinal: int = strawberry.field(description="The run to go back to; 0 is before the first run.")
    restore_files: bool = strawberry.field(
        default=True,
        description="Also put back the files the undone runs changed, as that run's checkpoint has them.",
    )
    dry_run: bool = strawberry.field(
        default=False, description="Only return the plan (`preview`) and its `previewToken`; change nothing."
    )
    preview_token: str | None = strawberry.field(
        default=None,
        description="A dry run's token: the rollback is refused with STALE_PREVIEW if its plan changed since.",
    )
    on_conflict: ConflictPolicy = strawberry.field(
        default=ConflictPolicy.REFUSE,
        description="REFUSE (WORKSPACE_CONFLICT) or OVERWRITE a path someone else changed since the undone runs.",
    )


@strawberry.type(description="A path a rollback would put back that someone else changed since.")
class RollbackConflict:
    path: str = strawberry.field(description="The workspace-relative path.")
    thread: Thread | None = strawberry.field(description="The thread whose run changed it; null: no run did.")
    run: Run | None = strawberry.field(description="That run, when it is known.")


@strawberry.type(description="What a provider thread's conversation goes through in a rollback.")
class RollbackProviderStep:
    provider_thread_id: strawberry.ID = strawberry.field(description="The provider thread's global id.")
    provider_thread: ProviderThread | None = strawberry.field(
        description="The provider thread whose conversation it is (null only if the token may not see it)."
    )
    strategy: str = strawberry.field(
        description="native_rollback, native_fork, replace, discard or unchanged (docs/rollback.md)."
    )


@strawberry.type(description="What a rollback will do, as a dry run shows it.")
class RollbackPreview:
    rolled_back_run_ordinals: list[int] = strawberry.field(description="The runs that would become ROLLED_BACK.")
    restore_paths: list[str] = strawberry.field(description="Paths written back as the target run has them.")
    delete_paths: list[str] = strawberry.field(description="Paths the target run has not: removed.")
    conflicts: list[RollbackConflict] = strawberry.field(
        description="Paths someone else changed since: the call is refused unless `onConflict: OVERWRITE`."
    )
    provider_steps: list[RollbackProviderStep] = strawberry.field(
        description="What each provider thread's conversation goes through."
    )
    preview_token: str = strawberry.field(description="Pass it to the real call to refuse a changed plan.")


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
    preview: RollbackPreview | None = strawberry.field(description="The plan, for a dry run (`dryRun: true`).")
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
    preview = await _preview(info, done["preview"]) if done.get("preview") else None
    fields = {"thread": thread, "rolled_back_runs": [r for r in runs if r is not None], "preview": preview}
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


async def _preview(info: Info, preview: dict[str, Any]) -> RollbackPreview:
    plan = preview["plan"]
    files = plan.get("files") or {}
    conflicts = [
        RollbackConflict(
            path=c["path"],
            thread=await load(info, Thread, _uuid(c.get("threadId"))),
            run=await load(info, Run, _uuid(c.get("runId"))),
        )
        for c in files.get("conflicts") or []
    ]
    listed = plan.get("providerSteps") or []
    ids = [uuid.UUID(s["providerThreadId"]) for s in listed]
    found = await asyncio.gather(*(load(info, ProviderThread, i) for i in ids))  # one batch for all
    steps = [
        RollbackProviderStep(
            provider_thread_id=strawberry.ID(gid.encode("ProviderThread", i)),
            provider_thread=pt,
            strategy=s["strategy"],
        )
        for s, i, pt in zip(listed, ids, found, strict=True)
    ]
    return RollbackPreview(
        rolled_back_run_ordinals=list(plan.get("rolledBackRunOrdinals") or []),
        restore_paths=list(files.get("restore") or []),
        delete_paths=list(files.get("delete") or []),
        conflicts=conflicts,
        provider_steps=steps,
        preview_token=preview["previewToken"],
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
        runs, the paths those runs changed are put back as that run's checkpoint has them (other paths, and
        other threads' work in the same workspace, are left alone), later runs become ROLLED_BACK — all of it
        or none of it. Refused while a run is active (THREAD_BUSY), while another thread's run is active in
        the same workspace (WORKSPACE_BUSY), when someone else changed one of those paths since
        (WORKSPACE_CONFLICT, unless `onConflict: OVERWRITE`), and with a `previewToken` whose plan changed
        (STALE_PREVIEW). `dryRun: true` returns the plan (`preview`) and changes nothing."""
        target = thread_id(input.thread_id)
        return await ctx.services.rollback.rollback_to_run(
            ctx.principal,
            target,
            input.run_ordinal,
            input.restore_files,
            input.key(),
            dry_run=input.dry_run,
            preview_token=input.preview_token,
            overwrite=_overwrite(input.on_conflict),
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


def _overwrite(policy: Any) -> bool:
    return enums.member(ConflictPolicy, policy) == ConflictPolicy.OVERWRITE

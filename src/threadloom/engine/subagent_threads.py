"""A subagent's own provider thread, recorded as its events arrive (rules in `domain.subagents`).

When a subagent item names the native thread it spawned (Codex collab agents, the scripted `@subagent`), its
node gets a ProviderThread of its own (`owner_node_id`) and the subagent's turn a ProviderTurn on it; the
turn's end settles both. Called by `engine.provider_events` inside the ingest batch, so they are written
with the node itself.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadloom.domain import forks, subagents
from threadloom.domain.changes import EventVerb
from threadloom.domain.entities import AppThread, ExecutionNode, ProviderThread, ProviderTurn, Run
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import CheckpointStatus, ProviderThreadStatus, ProviderTurnStatus
from threadloom.engine.sessions import TurnBinding
from threadloom.store import entities, rollback_facts
from threadloom.store import forks as fork_store
from threadloom.store import tables as t
from threadloom.store.db import Reader

if TYPE_CHECKING:
    from threadloom.engine.provider_events import Batch


async def spawned(b: Batch, binding: TurnBinding, node: ExecutionNode, detail: dict[str, Any], now: Any) -> None:
    """The subagent item started: if it names a native thread of its own, the node owns it."""
    native = subagents.receiver_thread(detail)
    if native is None or node.attempt_id is None:
        return
    run = await b.get(Run, binding.run_id)
    parent_turn = await b.get(ProviderTurn, binding.provider_turn_id)
    parent = await b.get(ProviderThread, parent_turn.provider_thread_id if parent_turn else None)
    instance = parent.provider_instance_id if parent is not None else run.provider_instance_id
    pt = subagents.owned_thread(node, instance, native, parent.session_id if parent else None, now, new_id)
    b.put(EventVerb.CREATED, pt, node_id=node.id)
    turn = subagents.subagent_turn(pt, node, subagents.child_turn_ref(detail), 1, now, new_id)
    b.put(EventVerb.CREATED, turn, node_id=node.id)
    # The node is that turn, as a root node is its attempt's: ExecutionNode.providerTurn reads this column.
    b.put(EventVerb.UPDATED, node.evolve(provider_turn_id=turn.id), node_id=node.id)


async def ended(b: Batch, node: ExecutionNode, native_turn: str, status: str, now: Any) -> None:
    """The subagent's turn ended: its provider turn takes the status, its provider thread goes idle."""
    pt = await _owned(b, node)
    if pt is None:
        return
    turns = [x for x in b.cache.values() if isinstance(x, ProviderTurn) and x.provider_thread_id == pt.id]
    turns = turns or await entities.where(b.db, ProviderTurn, t.provider_turns.c.provider_thread_id == pt.id)
    for turn in turns:
        if turn.native_turn_ref == native_turn and turn.status == ProviderTurnStatus.RUNNING:
            ended_as = subagents.TURN_END.get(status, ProviderTurnStatus.FAILED)
            b.put(EventVerb.UPDATED, turn.evolve(status=ended_as, completed_at=now), node_id=node.id)
    if pt.status == ProviderThreadStatus.ACTIVE:
        b.put(EventVerb.UPDATED, pt.evolve(status=ProviderThreadStatus.IDLE, updated_at=now), node_id=node.id)


async def _owned(b: Batch, node: ExecutionNode) -> ProviderThread | None:
    for entity in b.cache.values():  # made earlier in this batch
        if isinstance(entity, ProviderThread) and entity.owner_node_id == node.id:
            return entity
    found = await entities.where(b.db, ProviderThread, t.provider_threads.c.owner_node_id == node.id)
    return found[0] if found else None


async def fork_point(db: Reader, thread: AppThread, node: ExecutionNode, field: str) -> forks.ForkPoint:
    """A completed subagent node that owns a provider thread: the fork takes that conversation (the provider
    forks the subagent's own thread at its last turn) and the files the subagent left (its scope's last ready
    checkpoint). A portable fork gets the parent thread's context up to the node's run instead."""
    if not subagents.forkable(node):
        raise forks.unstable(f"a {node.status.value} subagent node", None, field)
    owners = await entities.where(db, ProviderThread, t.provider_threads.c.owner_node_id == node.id)
    owned = owners[0] if owners else None
    if owned is None or owned.native_thread_ref is None:
        why = "this subagent has no conversation of its own (it lives in its parent's provider session): fork its run"
        raise DomainError(ErrorCode.INVALID_INPUT, why, field)
    turns = await entities.where(db, ProviderTurn, t.provider_turns.c.provider_thread_id == owned.id)
    held = subagents.held(turns)
    if not held:
        raise forks.unstable("a subagent whose conversation was rolled back to nothing", None, field)
    last = held[-1]
    ends = [c for c, scope in await rollback_facts.checkpoints_of(db, thread.id) if scope.node_id == node.id]
    ready = [c for c in ends if c.status == CheckpointStatus.READY]
    checkpoint = max(ready, key=lambda c: c.ordinal, default=None)
    runs = await fork_store.runs_with_checkpoints(db, thread.id)
    run, run_checkpoint = next(((r, c) for r, c in runs if r.id == node.run_id), (None, None))
    if run is None:
        raise DomainError(ErrorCode.NOT_FOUND, "not found", field)
    ordinal = run.ordinal if forks.is_stable(run, run_checkpoint) else run.ordinal - 1
    return forks.ForkPoint(
        source_thread_id=thread.id,
        run_ordinal=ordinal,
        run_id=run.id,
        provider_thread_id=owned.id,
        provider_instance_id=owned.provider_instance_id,
        native_thread_ref=owned.native_thread_ref,
        native_turn_ref=last.native_turn_ref,
        checkpoint_id=checkpoint.id if checkpoint is not None else None,
        workspace_path=thread.workspace_path,
    )

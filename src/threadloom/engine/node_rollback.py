"""rollbackNode's conversation step: a subagent that owns a provider thread gets its conversation rolled back
with its files, where the provider can (rules in `domain.subagents`).

The provider reverts the subagent's own native thread; then, where it can show what it holds (`thread/read`:
Codex and the scripted agent), the snapshot is read back and reconciled with the turns on record: a kept turn
it lost or a dropped turn it still holds fails the rollback (ProviderError `reconcile`), so the log never
says something the provider does not hold. The payload's `conversation` says what happened:
ROLLED_BACK, UNCHANGED (nothing after the checkpoint) or NOT_SUPPORTED (no conversation of its own, or a
provider that cannot roll back) — never a silent skip.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from threadloom.domain import subagents
from threadloom.domain.changes import Change
from threadloom.domain.entities import AppThread, Checkpoint, ExecutionNode, Project, ProviderThread, ProviderTurn
from threadloom.domain.statuses import ProviderTurnStatus
from threadloom.engine.sessions import SessionManager
from threadloom.providers.contract import Capabilities, ProviderError, ProviderRuntime, ThreadSettings
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader


@dataclasses.dataclass(frozen=True, slots=True)
class NodeConversation:
    """What the conversation step did: changes to write, and what the payload and result say."""

    plan: subagents.ConversationPlan
    changes: list[Change]
    reconciled: bool | None = None  # True: the provider's snapshot matched the record; None: not readable

    @property
    def payload(self) -> dict[str, Any]:
        pt = self.plan.provider_thread
        return {
            "conversation": self.plan.result.value,
            "conversationReason": self.plan.reason,
            "providerThreadId": str(pt.id) if pt else None,
            "droppedTurns": [t.native_turn_ref for t in self.plan.dropped],
            "reconciled": self.reconciled,
        }


async def owned_thread(db: Reader, node_id: Any) -> ProviderThread | None:
    found = await entities.where(db, ProviderThread, t.provider_threads.c.owner_node_id == node_id)
    return found[0] if found else None


async def roll_back(
    db: Reader,
    sessions: SessionManager,
    thread: AppThread,
    project: Project,
    node: ExecutionNode,
    checkpoint: Checkpoint,
    cwd: Path,
    now: Any,
) -> NodeConversation:
    """The subagent's conversation back to `checkpoint` (one of its node's), as far as its provider can."""
    owned = await owned_thread(db, node.id)
    turns: list[ProviderTurn] = []
    caps = Capabilities()
    if owned is not None:
        turns = await entities.where(db, ProviderTurn, t.provider_turns.c.provider_thread_id == owned.id)
        driver = sessions.drivers.get(owned.provider_instance_id)
        caps = driver.capabilities() if driver is not None else caps
    can_rollback = caps.can_rollback_thread and caps.can_rollback_subagent_thread
    plan = subagents.plan_conversation(node, owned, turns, checkpoint.ordinal, can_rollback)
    if plan.result != subagents.ConversationRollback.ROLLED_BACK:
        return NodeConversation(plan, [])
    assert owned is not None and owned.native_thread_ref is not None and plan.before_turn_ref is not None
    settings = ThreadSettings(cwd=str(cwd), runtime_mode=thread.runtime_mode, model=thread.model)
    async with sessions.using(owned.provider_instance_id, project.id) as session:
        runtime = session.runtime
        ref = owned.native_thread_ref
        if ref not in session.loaded:
            await runtime.resume_thread(ref, settings)
            session.loaded.add(ref)
        await runtime.rollback_thread(ref, plan.before_turn_ref)
        reconciled = await read_back(runtime, caps, ref, plan.kept, plan.dropped)
    changes = [
        Change.updated(turn.evolve(status=ProviderTurnStatus.ROLLED_BACK, completed_at=turn.completed_at or now))
        for turn in plan.dropped
    ]
    return NodeConversation(plan, changes, reconciled)


async def read_back(
    runtime: ProviderRuntime,
    caps: Capabilities,
    native_thread: str,
    kept: tuple[ProviderTurn, ...] | list[ProviderTurn],
    dropped: tuple[ProviderTurn, ...] | list[ProviderTurn],
) -> bool | None:
    """After a revert: the provider's own snapshot of the thread, reconciled with the record (None when the
    provider cannot show one). A disagreement raises ProviderError `reconcile` naming each turn."""
    if not caps.can_read_thread_snapshot:
        return None
    held = subagents.snapshot_turns(await runtime.read_thread_snapshot(native_thread))
    if held is None:
        return None
    problems = subagents.reconcile([t.native_turn_ref for t in kept], [t.native_turn_ref for t in dropped], held)
    if problems:
        raise ProviderError("reconcile", "; ".join(problems))
    return True

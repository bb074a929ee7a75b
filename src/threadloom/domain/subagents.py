"""Provider subagents as first-class nodes: a subagent with a native conversation of its own owns a provider
thread on its node, so its conversation can be rolled back (rollbackNode), forked and interrupted by node.

Which subagents have one, per provider (docs/providers.md, "Subagents"):
- Codex collab agents and the scripted agent's `@subagent` spawn a native thread of their own; the subagent item
  names it (`receiverThreadIds`). It becomes a ProviderThread with `owner_node_id` = the subagent's node, and
  the subagent's turn a ProviderTurn on it. The app thread's own provider threads (switching, handoffs, the run
  rollback plan) never include it (`owner_node_id IS NULL` there).
- Claude Code's Task subagents live inside the parent's session (their messages carry `parent_tool_use_id`):
  there is no conversation of their own to roll back or fork, and the API says so (`NOT_SUPPORTED`).

Pure rules only; the engine (`engine.node_rollback`, `engine.ingest`) does the I/O.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from threadloom.domain.changes import NewId
from threadloom.domain.entities import ExecutionNode, ProviderThread, ProviderTurn
from threadloom.domain.statuses import NodeKind, NodeStatus, ProviderThreadStatus, ProviderTurnStatus


class ConversationRollback(enum.StrEnum):
    """What rollbackNode did to the subagent's conversation (the payload's `conversation`)."""

    ROLLED_BACK = "ROLLED_BACK"  # the provider dropped the subagent's turns after the checkpoint
    UNCHANGED = "UNCHANGED"  # it has a conversation of its own, and nothing in it is after the checkpoint
    NOT_SUPPORTED = "NOT_SUPPORTED"  # no conversation of its own, or a provider that cannot roll it back


def receiver_thread(detail: dict[str, Any] | None) -> str | None:
    """The native thread a subagent item spawned (Codex `receiverThreadIds`, the scripted agent the same),
    None when the provider gives it none (Claude's Task, a Codex `wait`/`sendInput` on an earlier agent)."""
    if not isinstance(detail, dict):
        return None
    if detail.get("tool") not in (None, "spawnAgent"):
        return None  # a collab call on an agent spawned earlier: that agent's thread is owned already
    receivers = detail.get("receiverThreadIds")
    if isinstance(receivers, list) and len(receivers) == 1 and isinstance(receivers[0], str) and receivers[0]:
        return receivers[0]
    return None


def child_turn_ref(detail: dict[str, Any] | None) -> str | None:
    value = detail.get("childTurnId") if isinstance(detail, dict) else None
    return str(value) if value else None


def owned_thread(
    node: ExecutionNode,
    instance_id: str,
    native_thread: str,
    session_id: uuid.UUID | None,
    now: datetime,
    new_id: NewId,
) -> ProviderThread:
    """The provider thread a subagent node owns: on the node's app thread, active while the subagent runs."""
    return ProviderThread(
        id=new_id(),
        thread_id=node.thread_id,
        provider_instance_id=instance_id,
        owner_node_id=node.id,
        native_thread_ref=native_thread,
        status=ProviderThreadStatus.ACTIVE,
        session_id=session_id,
        created_at=now,
        updated_at=now,
    )


def subagent_turn(
    pt: ProviderThread, node: ExecutionNode, native_turn: str | None, ordinal: int, now: datetime, new_id: NewId
) -> ProviderTurn:
    """The subagent's turn on its own provider thread (its attempt is the parent's)."""
    assert node.attempt_id is not None
    return ProviderTurn(
        id=new_id(),
        thread_id=pt.thread_id,
        provider_thread_id=pt.id,
        run_attempt_id=node.attempt_id,
        node_id=node.id,
        native_turn_ref=native_turn,
        ordinal=ordinal,
        status=ProviderTurnStatus.RUNNING,
        created_at=now,
    )


TURN_END = {
    "completed": ProviderTurnStatus.COMPLETED,
    "failed": ProviderTurnStatus.FAILED,
    "interrupted": ProviderTurnStatus.INTERRUPTED,
}


def held(turns: Iterable[ProviderTurn]) -> list[ProviderTurn]:
    """The turns the provider still holds, by ordinal: a rolled-back turn is kept on record, not held."""
    return sorted((t for t in turns if t.status != ProviderTurnStatus.ROLLED_BACK), key=lambda t: t.ordinal)


@dataclasses.dataclass(frozen=True, slots=True)
class ConversationPlan:
    """What rollbackNode does to the subagent's conversation."""

    result: ConversationRollback
    reason: str
    provider_thread: ProviderThread | None = None
    before_turn_ref: str | None = None  # the first turn the provider drops (native_rollback)
    dropped: tuple[ProviderTurn, ...] = ()
    kept: tuple[ProviderTurn, ...] = ()


def plan_conversation(
    node: ExecutionNode,
    owned: ProviderThread | None,
    turns: Sequence[ProviderTurn],
    checkpoint_ordinal: int,
    can_rollback: bool,
) -> ConversationPlan:
    """The conversation step of rollbackNode to the node's checkpoint `checkpoint_ordinal` (0: as the subagent
    found the workspace, before its turn; 1: as it left it). Turns are the owned thread's recorded turns."""
    if owned is None:
        if node.child_thread_id is not None:
            why = "a delegated task's conversation is its own thread's: roll that thread back with rollbackToRun"
        else:
            why = "this subagent has no conversation of its own (it lives in its parent's provider session)"
        return ConversationPlan(ConversationRollback.NOT_SUPPORTED, why)
    live = held(turns)
    # checkpoint 0 is before the subagent's first turn; a later checkpoint is after all of its turns so far
    dropped = tuple(live) if checkpoint_ordinal == 0 else ()
    kept = tuple(t for t in live if t not in dropped)
    if not dropped:
        return ConversationPlan(
            ConversationRollback.UNCHANGED, "nothing in its conversation is after that checkpoint", owned, kept=kept
        )
    if not can_rollback:
        why = "its provider cannot roll a conversation back; only the files were restored"
        return ConversationPlan(ConversationRollback.NOT_SUPPORTED, why, owned, kept=tuple(live))
    first = dropped[0].native_turn_ref
    if first is None:
        why = "its turn never reached the provider"
        return ConversationPlan(ConversationRollback.UNCHANGED, why, owned, kept=tuple(live))
    return ConversationPlan(
        ConversationRollback.ROLLED_BACK,
        "the provider dropped its turns after that checkpoint",
        owned,
        first,
        dropped,
        kept,
    )


def reconcile(kept: Iterable[str | None], dropped: Iterable[str | None], holds: Iterable[str]) -> list[str]:
    """What disagrees between the record and the provider's own snapshot after a revert: a kept turn it no
    longer holds, or a dropped turn it still holds. Empty: they agree."""
    have = set(holds)
    problems = [f"the provider lost kept turn {ref}" for ref in kept if ref is not None and ref not in have]
    problems += [f"the provider still holds dropped turn {ref}" for ref in dropped if ref is not None and ref in have]
    return problems


def snapshot_turns(snapshot: dict[str, Any]) -> list[str] | None:
    """The turn ids of a provider thread snapshot (`thread/read`: Codex with `includeTurns`, the scripted
    agent always); None when the snapshot lists none (the provider does not say)."""
    turns = snapshot.get("turns")
    if not isinstance(turns, list):
        return None
    return [str(t["id"]) for t in turns if isinstance(t, dict) and t.get("id")]


def forkable(node: ExecutionNode) -> bool:
    """A subagent node is a stable fork point once it completed."""
    return node.kind == NodeKind.SUBAGENT and node.status == NodeStatus.COMPLETED


def interruptible(node: ExecutionNode, owned: ProviderThread | None) -> bool:
    """A subagent runs a turn of its own that the provider can interrupt alone."""
    return node.kind == NodeKind.SUBAGENT and node.status == NodeStatus.RUNNING and owned is not None

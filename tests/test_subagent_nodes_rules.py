"""The pure rules of subagent nodes (`domain.subagents`): which conversation step rollbackNode plans, and what
a provider snapshot must agree with after a revert."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from threadloom.domain import subagents
from threadloom.domain.entities import ExecutionNode, ProviderThread, ProviderTurn
from threadloom.domain.statuses import NodeKind, NodeStatus, ProviderThreadStatus, ProviderTurnStatus

NOW = datetime(2026, 12, 2, tzinfo=UTC)
C = subagents.ConversationRollback


def _node(child_thread: bool = False) -> ExecutionNode:
    return ExecutionNode(
        id=uuid.uuid4(),
        thread_id=uuid.uuid4(),
        run_id=uuid.uuid4(),
        attempt_id=uuid.uuid4(),
        kind=NodeKind.SUBAGENT,
        status=NodeStatus.COMPLETED,
        child_thread_id=uuid.uuid4() if child_thread else None,
        created_at=NOW,
        updated_at=NOW,
    )


def _pt(node: ExecutionNode) -> ProviderThread:
    return subagents.owned_thread(node, "scripted", "native-1", None, NOW, uuid.uuid4).evolve(
        status=ProviderThreadStatus.IDLE
    )


def _turn(
    pt: ProviderThread, ref: str | None, status: ProviderTurnStatus = ProviderTurnStatus.COMPLETED
) -> ProviderTurn:
    node = _node()
    return subagents.subagent_turn(pt, node, ref, 1, NOW, uuid.uuid4).evolve(status=status)


@pytest.mark.parametrize(
    ("owned", "turns", "ordinal", "can_rollback", "expected", "before"),
    [
        (False, [], 0, True, C.NOT_SUPPORTED, None),  # a Claude Task: no conversation of its own
        (True, ["t1"], 1, True, C.UNCHANGED, None),  # its end checkpoint: nothing after it
        (True, ["t1"], 0, True, C.ROLLED_BACK, "t1"),  # its start checkpoint: its turn goes
        (True, ["t1"], 0, False, C.NOT_SUPPORTED, None),  # a provider that cannot roll back
        (True, [None], 0, True, C.UNCHANGED, None),  # its turn never reached the provider
        (True, [], 0, True, C.UNCHANGED, None),  # no turn on record
    ],
)
def test_the_conversation_step_of_rollbackNode(
    owned: bool, turns: list[str | None], ordinal: int, can_rollback: bool, expected: C, before: str | None
) -> None:
    node = _node()
    pt = _pt(node) if owned else None
    recorded = [_turn(pt, ref) for ref in turns] if pt else []
    plan = subagents.plan_conversation(node, pt, recorded, ordinal, can_rollback)
    assert plan.result == expected and plan.before_turn_ref == before and plan.reason


def test_a_turn_already_rolled_back_is_not_dropped_again() -> None:
    node = _node()
    pt = _pt(node)
    plan = subagents.plan_conversation(node, pt, [_turn(pt, "t1", ProviderTurnStatus.ROLLED_BACK)], 0, True)
    assert plan.result == C.UNCHANGED


def test_a_delegated_task_node_points_at_its_child_thread() -> None:
    plan = subagents.plan_conversation(_node(child_thread=True), None, [], 0, True)
    assert plan.result == C.NOT_SUPPORTED and "rollbackToRun" in plan.reason


@pytest.mark.parametrize(
    ("kept", "dropped", "holds", "problems"),
    [
        (["a"], ["b"], ["a"], []),
        (["a"], ["b"], ["a", "b"], ["the provider still holds dropped turn b"]),
        (["a", "b"], [], ["a"], ["the provider lost kept turn b"]),
        ([None], [None], [], []),  # turns that never reached the provider are not compared
    ],
)
def test_reconcile_names_lost_kept_and_still_held_dropped_turns(
    kept: list[str | None], dropped: list[str | None], holds: list[str], problems: list[str]
) -> None:
    assert subagents.reconcile(kept, dropped, holds) == problems


@pytest.mark.parametrize(
    ("detail", "native"),
    [
        ({"tool": "spawnAgent", "receiverThreadIds": ["th-1"]}, "th-1"),
        ({"receiverThreadIds": ["th-1"]}, "th-1"),
        ({"tool": "wait", "receiverThreadIds": ["th-1"]}, None),  # an agent spawned earlier: owned already
        ({"tool": "spawnAgent", "receiverThreadIds": []}, None),
        ({"subagent_type": "general-purpose"}, None),  # Claude's Task
        (None, None),
    ],
)
def test_the_thread_a_subagent_item_spawned(detail: dict[str, object] | None, native: str | None) -> None:
    assert subagents.receiver_thread(detail) == native

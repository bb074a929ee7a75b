"""What an agent's turn produces, built from its normalized events: execution nodes for its items
(messages, tool calls, file changes, plans, reasoning, subagents), the assistant's streaming messages and
the plans it writes. Pure: `engine/ingest.py` reads the current entities, calls these and writes the result.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, TypedDict

from threadloom.domain.changes import NewId
from threadloom.domain.entities import ConversationMessage, ExecutionNode, PlanArtifact
from threadloom.domain.statuses import MessageRole, NodeKind, NodeStatus, PlanKind, PlanStatus

MAX_OUTPUT = 64 * 1024  # a tool's output kept on its node: the last 64 KiB

NODE_KIND: dict[str, NodeKind] = {
    "assistant_message": NodeKind.ASSISTANT_MESSAGE,
    "tool_call": NodeKind.TOOL_CALL,
    "file_change": NodeKind.TOOL_CALL,
    "plan": NodeKind.PLAN,
    "reasoning": NodeKind.REASONING,
    "subagent": NodeKind.SUBAGENT,
    "other": NodeKind.SYSTEM,
}
ITEM_STATUS: dict[str, NodeStatus] = {
    "completed": NodeStatus.COMPLETED,
    "failed": NodeStatus.FAILED,
    "declined": NodeStatus.CANCELLED,
    "interrupted": NodeStatus.INTERRUPTED,
}


class Turn(Protocol):
    """Where a turn's output belongs (the engine's turn binding has these)."""

    @property
    def thread_id(self) -> uuid.UUID: ...
    @property
    def run_id(self) -> uuid.UUID: ...
    @property
    def attempt_id(self) -> uuid.UUID: ...
    @property
    def root_node_id(self) -> uuid.UUID: ...


class _Produced(TypedDict):
    """The fields every entity a turn produces starts with: a new id, the turn's thread and run, made now."""

    id: uuid.UUID
    thread_id: uuid.UUID
    run_id: uuid.UUID
    created_at: datetime
    updated_at: datetime


def _produced(turn: Turn, now: datetime, new_id: NewId) -> _Produced:
    return _Produced(id=new_id(), thread_id=turn.thread_id, run_id=turn.run_id, created_at=now, updated_at=now)


def item_node(
    turn: Turn,
    parent_node_id: uuid.UUID,
    kind: str,
    title: str | None,
    detail: Mapping[str, Any] | None,
    now: datetime,
    new_id: NewId,
) -> ExecutionNode:
    """A running node for an item the agent started, under the turn (or subagent turn) it belongs to."""
    return ExecutionNode(
        **_produced(turn, now, new_id),
        attempt_id=turn.attempt_id,
        parent_node_id=parent_node_id,
        root_node_id=turn.root_node_id,
        kind=NODE_KIND[kind],
        status=NodeStatus.RUNNING,
        title=title,
        detail=dict(detail) if detail else None,
    )


def streaming_message(turn: Turn, node_id: uuid.UUID, now: datetime, new_id: NewId) -> ConversationMessage:
    """The assistant's message of an item, empty and streaming until the item completes."""
    return ConversationMessage(
        **_produced(turn, now, new_id),
        node_id=node_id,
        role=MessageRole.ASSISTANT,
        text="",
        streaming=True,
    )


def question_as_message(turn: Turn, payload: Mapping[str, Any], now: datetime, new_id: NewId) -> ConversationMessage:
    """Without structured questions a question is shown as a plain message (its options as a list)."""
    questions = payload.get("questions") or []
    text = "\n".join(
        str(q.get("question")) + "".join(f"\n- {o.get('label')}" for o in q.get("options") or []) for q in questions
    )
    return ConversationMessage(**_produced(turn, now, new_id), role=MessageRole.ASSISTANT, text=text)


def proposed_plan(turn: Turn, node_id: uuid.UUID, now: datetime, new_id: NewId) -> PlanArtifact:
    """A plan item: its text streams in like a message's."""
    return _plan(turn, node_id, PlanKind.PROPOSED_PLAN, now, new_id, text="")


def todo_items(raw: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    return [{"step": str(i.get("step")), "status": str(i.get("status"))} for i in raw]


def todo_list(
    turn: Turn, node_id: uuid.UUID, items: list[dict[str, str]], now: datetime, new_id: NewId
) -> PlanArtifact:
    """The agent's todo list of a turn (one per turn node; later updates replace its items)."""
    return _plan(turn, node_id, PlanKind.TODO_LIST, now, new_id, items=items)


def _plan(
    turn: Turn,
    node_id: uuid.UUID,
    kind: PlanKind,
    now: datetime,
    new_id: NewId,
    *,
    text: str | None = None,
    items: list[dict[str, str]] | None = None,
) -> PlanArtifact:
    return PlanArtifact(
        **_produced(turn, now, new_id),
        node_id=node_id,
        kind=kind,
        text=text,
        items=items,
        status=PlanStatus.ACTIVE,
    )


def with_output(node: ExecutionNode, delta: str, now: datetime) -> ExecutionNode:
    """A tool's output grows on its node, keeping the last `MAX_OUTPUT` characters."""
    detail = dict(node.detail or {})
    detail["output"] = (str(detail.get("output", "")) + delta)[-MAX_OUTPUT:]
    return node.evolve(detail=detail, updated_at=now)


def completed_item(node: ExecutionNode, status: str, detail: Mapping[str, Any], now: datetime) -> ExecutionNode:
    """The item's final state: its detail merged in (an aggregated output kept only if none streamed)."""
    merged = {**(node.detail or {}), **{k: v for k, v in detail.items() if k != "aggregatedOutput"}}
    if "aggregatedOutput" in detail and "output" not in merged:
        merged["output"] = str(detail["aggregatedOutput"])[-MAX_OUTPUT:]
    return node.evolve(status=ITEM_STATUS[status], detail=merged or None, updated_at=now, completed_at=now)

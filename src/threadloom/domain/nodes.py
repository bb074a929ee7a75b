"""Execution nodes as they open: one constructor for every kind of node in a run's graph.

A node always hangs in one attempt of one run, under that attempt's root node; what the node is for
(a turn, a runtime request, a subagent) differs only in its kind, status, title and what it links to.
`open_node` writes the position and the timestamps once, so each lifecycle states only what is its own.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Any, TypedDict, Unpack

from threadloom.domain.entities import ExecutionNode, Run
from threadloom.domain.items import Turn
from threadloom.domain.statuses import NodeKind, NodeStatus


@dataclasses.dataclass(frozen=True, slots=True)
class Place:
    """An attempt of a run as the place its nodes hang in (what `items.Turn` describes)."""

    thread_id: uuid.UUID
    run_id: uuid.UUID
    attempt_id: uuid.UUID
    root_node_id: uuid.UUID

    @classmethod
    def of(cls, run: Run) -> Place | None:
        """The run's current attempt; None for a run that has none (never started a graph)."""
        if run.active_attempt_id is None or run.root_node_id is None:
            return None
        return cls(run.thread_id, run.id, run.active_attempt_id, run.root_node_id)


class NodeFields(TypedDict, total=False):
    """What a node may say beyond its place, kind and status."""

    counts_for_run: bool
    runtime_request_id: uuid.UUID
    child_thread_id: uuid.UUID
    title: str | None
    detail: Any


def open_node(
    turn: Turn,
    parent_node_id: uuid.UUID | None,
    node_id: uuid.UUID,
    kind: NodeKind,
    status: NodeStatus,
    now: datetime,
    **fields: Unpack[NodeFields],
) -> ExecutionNode:
    """A new node of `kind` in the turn's attempt, under `parent_node_id` (None: the turn's root node itself)."""
    return ExecutionNode(
        id=node_id,
        parent_node_id=parent_node_id,
        thread_id=turn.thread_id,
        run_id=turn.run_id,
        attempt_id=turn.attempt_id,
        root_node_id=turn.root_node_id,
        kind=kind,
        status=status,
        created_at=now,
        updated_at=now,
        **fields,
    )

"""App-owned delegated tasks (subagents as child threads).

A delegated task is a child AppThread with lineage `subagent` under its parent, started
with the task as its first run. When a run of the child ends, its result reaches the
parent as a `subagent_result` ContextTransfer, a system message carrying the child's final
answer (the completion delivery), and the parent's subagent node completes. Nothing here
starts a parent run: a stopped parent stays stopped.
"""

from __future__ import annotations

import uuid
from datetime import datetime

from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.entities import AppThread, ContextTransfer, ConversationMessage, ExecutionNode, Run
from threadloom.domain.nodes import Place, open_node
from threadloom.domain.statuses import (
    LineageRelationship,
    MessageRole,
    NodeKind,
    NodeStatus,
    RunStatus,
    TransferStatus,
    TransferType,
)
from threadloom.domain.threads import descendant_thread


def child_thread(parent: AppThread, child_id: uuid.UUID, title: str, now: datetime) -> AppThread:
    return descendant_thread(parent, child_id, title, LineageRelationship.SUBAGENT, now)


def spawn_transfer(parent: AppThread, child: AppThread, text: str, now: datetime, new_id: NewId) -> Change:
    transfer = ContextTransfer(
        id=new_id(),
        type=TransferType.SUBAGENT_SPAWN,
        source_thread_id=parent.id,
        thread_id=child.id,
        source_point={"task": text},
        status=TransferStatus.CONSUMED,
        created_at=now,
        updated_at=now,
    )
    return Change.created(transfer)


def parent_node(parent: AppThread, active: Run | None, child: AppThread, now: datetime, new_id: NewId) -> Outcome:
    """On the parent: a subagent node under its active run (if any) and an activity."""
    changes: list[Change] = []
    node_id = None
    place = None if active is None else Place.of(active)
    if place is not None:
        node = open_node(
            place,
            place.root_node_id,
            new_id(),
            NodeKind.SUBAGENT,
            NodeStatus.RUNNING,
            now,
            child_thread_id=child.id,
            title=child.title,
        )
        node_id = node.id
        changes.append(Change.created(node))
    changes.append(
        activity(
            parent.id,
            ActivityKind.SUBAGENT_STARTED,
            f"delegated: {child.title}",
            now,
            new_id,
            run_id=active.id if active else None,
            node_id=node_id,
            payload={"childThreadId": str(child.id)},
        )
    )
    return Outcome(changes)


def deliver(
    parent: AppThread,
    child: AppThread,
    run: Run,
    answer: str,
    node: ExecutionNode | None,
    now: datetime,
    new_id: NewId,
) -> Outcome:
    transfer = ContextTransfer(
        id=new_id(),
        type=TransferType.SUBAGENT_RESULT,
        source_thread_id=child.id,
        thread_id=parent.id,
        source_point={"runId": str(run.id), "status": run.status.value, "answer": answer},
        status=TransferStatus.RESOLVED_PORTABLE,
        resolution_strategy="final_answer",
        resolution_fidelity="summary",
        created_at=now,
        updated_at=now,
    )
    summary = f"Subagent thread {child.title!r} run {run.ordinal} {run.status.value}"
    message = ConversationMessage(
        id=new_id(),
        thread_id=parent.id,
        run_id=node.run_id if node else None,
        node_id=node.id if node else None,
        role=MessageRole.SYSTEM,
        text=f"{summary}:\n{answer}" if answer else summary,
        created_at=now,
        updated_at=now,
    )
    changes = [Change.created(transfer), Change.created(message)]
    if node is not None and node.status in (NodeStatus.RUNNING, NodeStatus.PENDING, NodeStatus.WAITING):
        ended = NodeStatus.COMPLETED if run.status == RunStatus.COMPLETED else NodeStatus.FAILED
        if run.status == RunStatus.INTERRUPTED:
            ended = NodeStatus.INTERRUPTED
        changes.append(Change.updated(node.evolve(status=ended, updated_at=now, completed_at=now)))
    changes.append(
        activity(
            parent.id,
            ActivityKind.SUBAGENT_COMPLETED,
            summary,
            now,
            new_id,
            run_id=node.run_id if node else None,
            node_id=node.id if node else None,
            payload={"childThreadId": str(child.id), "transferId": str(transfer.id)},
        )
    )
    return Outcome(changes)

"""rollbackNode's checks and record: what is refused before anything is touched, and what the log says once
the subagent's files (and, where its provider can, its own conversation) are back at its checkpoint.

The steps between run in `engine.rollback` as for any rollback operation: recorded first with the thread
ROLLING_BACK, the files and the conversation outside any transaction, each step recorded as it completes.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Any

from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import AppThread, Checkpoint, CheckpointScope, ExecutionNode, ProviderTurn
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import (
    ACTIVE_RUN_STATUSES,
    CheckpointScopeKind,
    CheckpointStatus,
    ProviderTurnStatus,
)
from threadloom.engine.pipeline import Pipeline
from threadloom.store import entities
from threadloom.store import rollback_facts as facts
from threadloom.store.db import Reader


@dataclasses.dataclass(frozen=True, slots=True)
class Done:
    """What the steps did, for the record: the operation, the pre-rollback capture, each step's status, what
    the conversation step said and the subagent's provider turns it dropped."""

    operation_id: uuid.UUID
    pre_ref: str | None
    pre_commit: str | None
    steps: list[dict[str, str]]
    conversation: dict[str, Any]
    dropped_turn_ids: list[str]


async def checked(
    db: Reader, thread: AppThread, node_id: uuid.UUID, checkpoint_id: uuid.UUID
) -> tuple[ExecutionNode, Checkpoint, CheckpointScope]:
    """The node, its checkpoint and that checkpoint's scope, or the refusal (nothing is touched yet)."""
    node = await entities.get(db, ExecutionNode, node_id)
    checkpoint = await entities.get(db, Checkpoint, checkpoint_id)
    if node is None or node.thread_id != thread.id:
        raise not_found("nodeId")
    if checkpoint is None or checkpoint.thread_id != thread.id:
        raise not_found("checkpointId")
    scopes = {s.id: s for s in await facts.scopes_of(db, thread.id)}
    scope = scopes.get(checkpoint.scope_id)
    if scope is None or scope.kind == CheckpointScopeKind.ROOT_RUN or scope.node_id != node_id:
        raise DomainError(ErrorCode.INVALID_INPUT, "checkpointId is not a checkpoint of this node", "checkpointId")
    if checkpoint.status != CheckpointStatus.READY or not checkpoint.ref:
        raise DomainError(ErrorCode.CHECKPOINT_MISSING, "that checkpoint cannot be restored", "checkpointId")
    runs = await facts.runs_of(db, thread.id)
    if any(run.status in ACTIVE_RUN_STATUSES for run in runs):
        raise DomainError(ErrorCode.THREAD_BUSY, "a run is active; interrupt it or wait first", "nodeId")
    return node, checkpoint, scope


async def recorded(
    db: Reader,
    thread: AppThread,
    node_id: uuid.UUID | None,
    checkpoint_id: uuid.UUID | None,
    done: Done,
    now: datetime,
) -> Outcome:
    """The log once the steps are done: the dropped provider turns ROLLED_BACK, later checkpoints of the scope
    (and every checkpoint of the scopes under it) STALE, and `rollback.completed` on the node."""
    node = await entities.require(db, ExecutionNode, node_id)
    checkpoint = await entities.require(db, Checkpoint, checkpoint_id)
    scopes = {s.id: s for s in await facts.scopes_of(db, thread.id)}
    changes: list[Change] = []
    for turn_id in done.dropped_turn_ids:
        turn = await entities.get(db, ProviderTurn, uuid.UUID(turn_id))
        if turn is not None and turn.status != ProviderTurnStatus.ROLLED_BACK:
            changes.append(
                Change.updated(
                    turn.evolve(status=ProviderTurnStatus.ROLLED_BACK, completed_at=turn.completed_at or now)
                )
            )
    descendants = _descendants(checkpoint.scope_id, scopes)
    checkpoints = [c for c, _ in await facts.checkpoints_of(db, thread.id)]
    later = [c for c in checkpoints if c.scope_id == checkpoint.scope_id and c.ordinal > checkpoint.ordinal]
    stale = [
        c
        for c in [*later, *(c for c in checkpoints if c.scope_id in descendants)]
        if c.status != CheckpointStatus.STALE
    ]
    changes += [Change.updated(c.evolve(status=CheckpointStatus.STALE)) for c in stale]
    dirtied = True  # a subagent works in its parent's workspace (a delegated task's thread shares the project's)
    payload = {
        "operationId": str(done.operation_id),
        "nodeId": str(node.id),
        "checkpointId": str(checkpoint.id),
        "preRollback": {"ref": done.pre_ref, "commit": done.pre_commit},
        "staleCheckpoints": [{"id": str(c.id), "status": c.status.value} for c in stale],
        "dirtiedParentWorkspace": dirtied,
        "steps": done.steps,
        **done.conversation,
    }
    summary = f"restored the files of {node.title or 'a subagent'} to its checkpoint"
    changes.append(
        activity(
            thread.id,
            ActivityKind.ROLLBACK_COMPLETED,
            summary,
            now,
            new_id,
            run_id=node.run_id,
            node_id=node.id,
            payload=payload,
        )
    )
    changes.append(Change.updated(thread))
    return Outcome(changes, result=_result(thread.id, payload))


def _result(thread_id: uuid.UUID, payload: dict[str, Any]) -> dict[str, Any]:
    skip = {"operationId", "preRollback", "staleCheckpoints", "steps"}
    ref = (payload.get("preRollback") or {}).get("ref")
    return {"threadId": str(thread_id), "preRollbackRef": ref, **{k: v for k, v in payload.items() if k not in skip}}


async def answer_of(pipeline: Pipeline, thread_id: uuid.UUID, operation_id: str) -> dict[str, Any]:
    """A repeated call's answer: the node rollback's outcome as recorded."""
    async with pipeline.db.read() as db:
        records = await facts.activities_of_operation(db, thread_id, operation_id)
    for done in records:
        payload = facts.payload(done)
        if done.kind == ActivityKind.ROLLBACK_FAILED:
            raise DomainError(ErrorCode.ROLLBACK_FAILED, str(payload.get("error") or "the node rollback failed"))
        if done.kind == ActivityKind.ROLLBACK_COMPLETED:
            return _result(thread_id, payload)
    raise DomainError(ErrorCode.THREAD_ROLLING_BACK, "that node rollback is still under way", "nodeId")


def _descendants(scope_id: uuid.UUID, scopes: dict[uuid.UUID, CheckpointScope]) -> set[uuid.UUID]:
    found: set[uuid.UUID] = set()
    frontier = {scope_id}
    while frontier:
        frontier = {s.id for s in scopes.values() if s.parent_scope_id in frontier and s.id not in found}
        found |= frontier
    return found

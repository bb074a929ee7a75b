"""What a rollback operation writes to the log when it is over: completed (rollbackToRun's and undoRollback's
records; rollbackNode's is in engine.node_rollback_steps) or failed. Decisions only: no file or agent here."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from threadloom.domain import delegation
from threadloom.domain import handoff_rollback as handoff_rules
from threadloom.domain import rollback as plan_rules
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import (
    Activity,
    AppThread,
    Checkpoint,
    ContextHandoff,
    ProviderThread,
    Run,
)
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import (
    CheckpointStatus,
    HandoffStatus,
    ProviderThreadStatus,
    RunStatus,
)
from threadloom.engine.rollback_operation import (
    Operation,
    StepFailed,
    last_ran,
    to_undo_fork,
)
from threadloom.store import entities
from threadloom.store import rollback_facts as facts
from threadloom.store.db import Reader


def recorded(
    thread: AppThread,
    op: Operation,
    plan: plan_rules.RollbackPlan,
    runs: list[Run],
    checkpoints: list[Checkpoint],
    now: datetime,
    rebridge: ContextHandoff | None = None,
    dropped: tuple[ContextHandoff, ...] = (),
) -> Outcome:
    """The log of a completed rollbackToRun: runs ROLLED_BACK, checkpoints STALE, provider threads switched
    (or retired), pending handoffs that told of an undone run `dropped` (`domain.handoff_rollback`), a
    kept-runs handoff for the one staying active, and `rollback.completed` with every step."""
    changes: list[Change] = []
    rolled = [run for run in runs if run.ordinal in plan.rolled_back_run_ordinals]
    for run in rolled:
        changes.append(
            Change.updated(run.evolve(status=RunStatus.ROLLED_BACK, status_reason=f"rolled back to run {op.target}"))
        )
    stale = [c for c in checkpoints if c.id in plan.stale_checkpoint_ids]
    for checkpoint in stale:
        changes.append(Change.updated(checkpoint.evolve(status=CheckpointStatus.STALE)))
    active = thread.active_provider_thread_id
    for step in op.providers:
        if step.replacement is None:
            continue
        changes.append(Change.updated(step.provider_thread.evolve(status=ProviderThreadStatus.CLOSED, updated_at=now)))
        changes.append(Change.created(step.replacement))
        if step.handoff is not None:
            changes.append(Change.created(step.handoff))
        active = step.replacement.id
    if active != thread.active_provider_thread_id:
        changes.append(Change.updated(thread.evolve(active_provider_thread_id=active, updated_at=now)))
    changes += [Change.updated(pt.evolve(status=ProviderThreadStatus.CLOSED, updated_at=now)) for pt in op.stale]
    changes += handoff_rules.dropped(dropped)
    if rebridge is not None:
        changes.append(Change.created(rebridge))
    target = next((r for r in runs if r.ordinal == op.target), None)
    record = {
        "operationId": str(op.id),
        "targetOrdinal": op.target,
        "targetRunId": str(target.id) if target else None,
        "steps": op.step_list(),
        "preRollback": {"ref": op.pre_ref, "commit": op.pre_commit},
        "filePaths": op.file_paths,
        "previousActiveProviderThreadId": str(thread.active_provider_thread_id)
        if thread.active_provider_thread_id
        else None,
        "providerThreads": [
            {
                "id": str(s.provider_thread.id),
                "strategy": s.strategy.value,
                "replacementId": str(s.replacement.id) if s.replacement else None,
                "undoNativeRef": s.undo_native_ref,
                "handoffId": str(s.handoff.id) if s.handoff else None,
            }
            for s in op.providers
        ],
        "rebridgeHandoffId": str(rebridge.id) if rebridge else None,
        "droppedHandoffIds": [str(h.id) for h in dropped],
        "staleProviderThreads": [{"id": str(pt.id), "providerInstanceId": pt.provider_instance_id} for pt in op.stale],
        "runs": [{"id": str(r.id), "ordinal": r.ordinal, "status": r.status.value} for r in rolled],
        "staleCheckpoints": [{"id": str(c.id), "status": c.status.value} for c in stale],
    }
    summary = f"rolled back to run {op.target}" + (
        f" ({len(rolled)} run{'s' if len(rolled) != 1 else ''} undone)" if rolled else ""
    )
    changes.append(
        activity(
            thread.id,
            ActivityKind.ROLLBACK_COMPLETED,
            summary,
            now,
            new_id,
            run_id=target.id if target else None,
            node_id=target.root_node_id if target else None,
            payload=record,
        )
    )
    return Outcome(
        changes,
        result={
            "threadId": str(thread.id),
            "operationId": str(op.id),
            "rolledBackRunIds": [str(r.id) for r in rolled],
            "preRollbackRef": op.pre_ref,
        },
    )


# ---- undoing a failed rollback -----------------------------------------------------------------------


async def undo_recorded(db: Reader, thread: AppThread, record: dict[str, Any], now: datetime) -> Outcome:
    """The log of an undoRollback: what the rollback changed, taken back (refused when it cannot be)."""
    changes: list[Change] = []
    active = thread.active_provider_thread_id
    moved: dict[uuid.UUID, uuid.UUID] = {}  # provider thread → the undo fork that takes its place
    for entry in record.get("providerThreads") or []:
        original = await entities.get(db, ProviderThread, uuid.UUID(entry["id"]))
        if original is None:
            continue
        if entry.get("replacementId"):
            replacement = await entities.get(db, ProviderThread, uuid.UUID(entry["replacementId"]))
            if replacement is not None:
                changes.append(Change.updated(replacement.evolve(status=ProviderThreadStatus.CLOSED, updated_at=now)))
            changes.append(Change.updated(original.evolve(status=ProviderThreadStatus.IDLE, updated_at=now)))
            active = original.id
        elif entry.get("undoNativeRef"):
            # the undo fork holds the runs the rollback undid: its context starts after the last of them
            first = max([0, *(int(r["ordinal"]) for r in record.get("runs") or [])]) + 1
            back, swapped = to_undo_fork(original, str(entry["undoNativeRef"]), first, now)
            changes += swapped
            moved[original.id] = back.id
            active = back.id
        else:
            raise DomainError(
                ErrorCode.ROLLBACK_NOT_UNDOABLE,
                "the provider rolled the conversation back in place and kept no copy of it",
                "threadId",
            )
    if active != thread.active_provider_thread_id:
        changes.append(Change.updated(thread.evolve(active_provider_thread_id=active, updated_at=now)))
    for entry in record.get("staleProviderThreads") or []:  # retired for holding undone runs: those are back
        retired = await entities.get(db, ProviderThread, uuid.UUID(entry["id"]))
        if retired is not None and retired.status == ProviderThreadStatus.CLOSED:
            changes.append(Change.updated(retired.evolve(status=ProviderThreadStatus.IDLE, updated_at=now)))
    for entry in record.get("runs") or []:
        run = await entities.get(db, Run, uuid.UUID(entry["id"]))
        if run is not None and run.status == RunStatus.ROLLED_BACK:
            changes.append(Change.updated(run.evolve(status=RunStatus(entry["status"]), status_reason=None)))
    for entry in record.get("staleCheckpoints") or []:
        checkpoint = await entities.get(db, Checkpoint, uuid.UUID(entry["id"]))
        if checkpoint is not None and checkpoint.status == CheckpointStatus.STALE:
            changes.append(Change.updated(checkpoint.evolve(status=CheckpointStatus(entry["status"]))))
    handed = await _handoffs_undone(db, record, moved) + await _results_told(db, thread, record, active, now)
    changes += handed
    summary = f"undid the rollback to run {record.get('targetOrdinal')}"
    payload: dict[str, Any] = {"operationId": record.get("operationId")}
    restored = [str(c.entity.id) for c in handed if getattr(c.entity, "status", None) == HandoffStatus.PENDING]
    given_up = [str(c.entity.id) for c in handed if getattr(c.entity, "status", None) == HandoffStatus.FAILED]
    if restored or given_up:
        payload |= {"restoredHandoffIds": restored, "droppedHandoffIds": given_up}
    target = await entities.get(db, Run, uuid.UUID(record["targetRunId"])) if record.get("targetRunId") else None
    changes.append(
        activity(
            thread.id,
            ActivityKind.ROLLBACK_UNDONE,
            summary,
            now,
            new_id,
            run_id=target.id if target else None,
            node_id=target.root_node_id if target else None,
            payload=payload,
        )
    )
    return Outcome(changes, result={"threadId": str(thread.id)})


async def _handoffs_undone(db: Reader, record: dict[str, Any], moved: dict[uuid.UUID, uuid.UUID]) -> list[Change]:
    """The handoffs as they were before the rollback (`domain.handoff_rollback.undone`)."""
    dropped = await facts.handoffs_by_id(db, [uuid.UUID(i) for i in record.get("droppedHandoffIds") or []])
    rebridge_id = record.get("rebridgeHandoffId")
    rebridge = await entities.get(db, ContextHandoff, uuid.UUID(rebridge_id)) if rebridge_id else None
    pending = [h for pt in moved for h in await facts.pending_handoffs(db, pt)]
    return handoff_rules.undone(dropped, rebridge, pending, moved)


async def _results_told(
    db: Reader, thread: AppThread, record: dict[str, Any], active: uuid.UUID | None, now: datetime
) -> list[Change]:
    """The results that arrived while the rollback stood, for tasks the runs it brings back had delegated: now
    handed to the agent (`domain.delegation.told_after_undo`)."""
    if active is None:
        return []
    runs = [uuid.UUID(entry["id"]) for entry in record.get("runs") or []]
    told: list[Change] = []
    for result in await facts.untold_results_asked_by(db, thread.id, runs):
        child = await entities.get(db, AppThread, result.source_thread_id)
        run_id = (result.source_point or {}).get("runId")
        run = await entities.get(db, Run, uuid.UUID(str(run_id))) if run_id else None
        if child is not None and run is not None:
            told.append(Change.created(delegation.told_after_undo(result, child.title, run, active, now, new_id)))
    return told


# ---- rollbackNode -------------------------------------------------------------------------------------


async def failed(db: Reader, thread: AppThread, op: Operation, failure: StepFailed, now: datetime) -> Outcome:
    """The log of a failed operation: the thread no longer ROLLING_BACK, a provider thread rolled back in place
    moved to its undo fork, the record saying so, and `rollback.failed` with each step's status."""
    changes: list[Change] = []
    after = thread.evolve(rollback_operation_id=None, updated_at=now)
    for step in op.providers:
        if not (step.rolled_back and step.undo_native_ref):
            continue
        current = await entities.get(db, ProviderThread, step.provider_thread.id)
        if current is None:
            continue
        # the fork holds every run so far
        back, swapped = to_undo_fork(current, step.undo_native_ref, await last_ran(db, thread.id) + 1, now)
        changes += swapped
        # what was waiting for the in-place-rolled-back conversation goes to the fork that replaces it
        changes += handoff_rules.moved_to_fork(await facts.pending_handoffs(db, current.id), {current.id: back.id})
        if after.active_provider_thread_id == current.id:
            after = after.evolve(active_provider_thread_id=back.id, updated_at=now)
    if after != thread:
        changes.append(Change.updated(after))
    if op.record_activity is not None:
        current_record = await entities.get(db, Activity, op.record_activity.id)
        if current_record is not None:
            changes.append(Change.updated(current_record.evolve(payload=op.record())))
    record = {
        "operationId": str(op.id),
        "targetOrdinal": op.target,
        "failedStep": failure.step,
        "error": failure.message,
        "steps": op.step_list(),
        "undoErrors": op.undo_errors,
    }
    what = {"undo": "undoing the rollback", "rollback": f"rollback to run {op.target}"}.get(op.kind)
    what = what if op.target >= 0 or op.kind == "undo" else "node rollback"
    summary = f"{what} failed at {failure.step}; nothing changed"
    if op.undo_errors:
        summary = f"{what} failed at {failure.step}: {'; '.join(op.undo_errors)}"
    changes.append(activity(thread.id, ActivityKind.ROLLBACK_FAILED, summary, now, new_id, payload=record))
    return Outcome(changes)

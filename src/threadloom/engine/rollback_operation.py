"""A rollback operation's state: its steps and their statuses, what each provider step made, the record kept
in its `rollback.started` activity (what a process that finds it abandoned needs), and the small helpers every
step shares (a step's failure, the test-only failure hook, the move to an undo fork)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import uuid
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from threadloom.checkpoints.repo import ShadowRepo
from threadloom.domain import rollback as plan_rules
from threadloom.domain import rollback_ops as ops
from threadloom.domain.changes import Change
from threadloom.domain.entities import (
    Activity,
    Checkpoint,
    CheckpointScope,
    ContextHandoff,
    ProviderThread,
)
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.rollback_ops import StepStatus
from threadloom.domain.statuses import (
    CheckpointScopeKind,
    ProviderThreadStatus,
)
from threadloom.engine import node_rollback_steps as node_steps
from threadloom.store import rollback_facts as facts
from threadloom.store.db import Reader

FAIL_STEP_ENV = "THREADLOOM_TEST_FAIL_ROLLBACK_STEP"
STEPS = ("capture", "provider", "files", "record")


class StepFailed(Exception):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step
        self.message = message


def injected(step: str) -> None:
    """The test-only failure hook: the named step fails as if its I/O had."""
    wanted = os.environ.get(FAIL_STEP_ENV)
    if wanted and wanted == step:
        raise StepFailed(step, f"{step} failed (injected by {FAIL_STEP_ENV})")


@dataclasses.dataclass(slots=True)
class ProviderStep:
    """What the provider step did to one provider thread, and how to take it back."""

    provider_thread: ProviderThread
    strategy: plan_rules.Strategy
    replacement: ProviderThread | None = None  # the new active provider thread (fork, replace, discard)
    undo_native_ref: str | None = None  # native rollback: a full fork holding the conversation as it was
    rolled_back: bool = False  # native rollback done in place
    handoff: ContextHandoff | None = None
    planned: plan_rules.ProviderThreadRollback | None = None
    status: str = StepStatus.PENDING

    def record(self) -> dict[str, Any]:
        """What a process that finds the operation abandoned needs to carry it on or take it back."""
        return {
            "providerThreadId": str(self.provider_thread.id),
            "strategy": self.strategy.value,
            "status": str(self.status),
            "planned": ops.provider_record(self.planned) if self.planned else None,
            "replacement": self.replacement.to_payload() if self.replacement else None,
            "undoNativeRef": self.undo_native_ref,
            "rolledBack": self.rolled_back,
            "handoff": self.handoff.to_payload() if self.handoff else None,
        }


@dataclasses.dataclass(slots=True)
class Operation:
    """One rollback's progress: each step's status, what it changed, what an undo needs."""

    id: uuid.UUID
    target: int
    thread_id: uuid.UUID
    project_id: uuid.UUID | None = None
    steps: dict[str, str] = dataclasses.field(default_factory=lambda: {s: "pending" for s in STEPS})
    repo: ShadowRepo | None = None
    pre_ref: str | None = None
    pre_commit: str | None = None
    files_restored: bool = False
    providers: list[ProviderStep] = dataclasses.field(default_factory=list)
    stale: tuple[ProviderThread, ...] = ()  # other provider threads that saw an undone run: retired
    failure: StepFailed | None = None
    undo_errors: list[str] = dataclasses.field(default_factory=list)
    # the durable record (rollbackToRun): the plan, the `rollback.started` activity holding the record, and
    # the process carrying it out
    plan: plan_rules.RollbackPlan | None = None
    kind: str = "rollback"  # "rollback" (rollbackToRun) or "undo" (undoRollback)
    undo_of: dict[str, Any] | None = None  # undo: the rollback.completed record it takes back
    restore_ref: str | None = None
    restore_commit: str | None = None  # undo: the files go back to the pre-rollback capture
    file_paths: list[str] | None = None  # the paths put back (and taken back on failure); None: the whole tree
    node_id: uuid.UUID | None = None  # node: the subagent's node, its checkpoint, and what its conversation did
    checkpoint_id: uuid.UUID | None = None
    node_result: dict[str, Any] | None = None
    node_dropped: list[str] = dataclasses.field(default_factory=list)
    record_activity: Activity | None = None
    worker_id: uuid.UUID | None = None
    outcome: str = "running"

    def step_list(self) -> list[dict[str, str]]:
        return [{"step": name, "status": status} for name, status in self.steps.items()]

    def summary(self) -> node_steps.Done:
        """What a node rollback's record needs from the steps."""
        return node_steps.Done(
            self.id, self.pre_ref, self.pre_commit, self.step_list(), self.node_result or {}, list(self.node_dropped)
        )

    def record(self) -> dict[str, Any]:
        return {
            "operationId": str(self.id),
            "kind": self.kind,
            "status": self.outcome,
            "workerId": str(self.worker_id) if self.worker_id else None,
            "targetOrdinal": self.target,
            "plan": ops.plan_record(self.plan) if self.plan else None,
            "undoOf": self.undo_of,
            "restoreRef": self.restore_ref,
            "restoreCommit": self.restore_commit,
            "filePaths": self.file_paths,
            "nodeId": str(self.node_id) if self.node_id else None,
            "checkpointId": str(self.checkpoint_id) if self.checkpoint_id else None,
            "nodeConversation": self.node_result,
            "droppedTurnIds": self.node_dropped,
            "steps": dict(self.steps),
            "preRollback": {"ref": self.pre_ref, "commit": self.pre_commit},
            "providerSteps": [step.record() for step in self.providers],
            "staleProviderThreadIds": [str(pt.id) for pt in self.stale],
        }


def refused(error: plan_rules.RollbackRefused) -> DomainError:
    return DomainError(ErrorCode(error.code.value), error.message, error.field)


async def last_ran(db: Reader, thread_id: uuid.UUID) -> int:
    """The ordinal of the thread's last run that reached the provider (0: none)."""
    ran = [run.ordinal for run in await facts.runs_of(db, thread_id) if run.status in plan_rules.RAN]
    return max(ran, default=0)


def checkpoint_fact(
    checkpoint: Checkpoint, scope: CheckpointScope, ordinal_of: dict[uuid.UUID, int]
) -> plan_rules.CheckpointFact:
    root = scope.kind == CheckpointScopeKind.ROOT_RUN
    if root:
        run_ordinal = checkpoint.ordinal
    else:
        run_id = checkpoint.run_id or scope.run_id
        run_ordinal = ordinal_of.get(run_id, 0) if run_id else 0
    return plan_rules.CheckpointFact(checkpoint.id, run_ordinal, checkpoint.status, root)


@contextlib.contextmanager
def step_of(op: Operation, name: str, *caught: type[BaseException]) -> Iterator[None]:
    """One step of a rollback: the test hook first, then the body; a failure marks the step failed and
    becomes the operation's failure (what the undo and the error message report)."""
    failures: tuple[type[BaseException], ...] = (StepFailed, *caught)
    try:
        injected(name)
        yield
    except failures as error:
        op.steps[name] = "failed"
        op.failure = as_failure(name, error)
        if op.failure is error:
            raise
        raise op.failure from error
    op.steps[name] = "done"


def to_undo_fork(
    current: ProviderThread, undo_native_ref: str, first_run_ordinal: int, now: datetime
) -> tuple[ProviderThread, list[Change]]:
    """An in-place provider rollback is taken back by moving to the fork made of the conversation before it
    (`undo_native_ref`): `current` closes, the fork (holding runs from `first_run_ordinal` on) is created idle."""
    back = current.evolve(
        id=new_id(),
        native_thread_ref=undo_native_ref,
        forked_from_provider_thread_id=current.id,
        first_run_ordinal=first_run_ordinal,
        status=ProviderThreadStatus.IDLE,
        created_at=now,
        updated_at=now,
    )
    return back, [
        Change.updated(current.evolve(status=ProviderThreadStatus.CLOSED, updated_at=now)),
        Change.created(back),
    ]


def as_failure(step: str, error: BaseException) -> StepFailed:
    if isinstance(error, StepFailed):
        return error
    message = getattr(error, "message", None) or str(error)
    return StepFailed(step, message)


def failure_message(op: Operation, failure: StepFailed) -> str:
    text = f"the rollback failed at its {failure.step} step ({failure.message})"
    if op.undo_errors:
        return f"{text}; and could not be fully undone: {'; '.join(op.undo_errors)}"
    return f"{text}; files and conversation are as they were"

"""Carrying a rollback operation out: its steps outside any transaction and the thread's lock, each recorded
as it completes (capture, provider, files, a node's conversation), then its outcome; a failed step takes back
what was done. The operation was planned and recorded by its command (engine.rollback); after a crash, the
next process carries it on from its record (engine.rollback_recovery)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from threadloom.checkpoints.errors import CheckpointError
from threadloom.checkpoints.refs import REF_PREFIX, check_ref
from threadloom.checkpoints.repo import ShadowRepo
from threadloom.domain import handoff_rollback as handoff_rules
from threadloom.domain import rollback as plan_rules
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import (
    Activity,
    AppThread,
    Checkpoint,
    ExecutionNode,
    Project,
    Run,
)
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.rollback_ops import StepStatus
from threadloom.domain.threads import index_key
from threadloom.engine import node_rollback
from threadloom.engine import node_rollback_steps as node_steps
from threadloom.engine import rollback_record as record
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.rollback_operation import (
    Operation,
    ProviderStep,
    StepFailed,
    as_failure,
    failure_message,
    injected,
    step_of,
)
from threadloom.engine.rollback_provider import ProviderSteps
from threadloom.engine.sessions import SessionManager
from threadloom.faults import crash_point
from threadloom.providers.contract import ProviderError
from threadloom.store import entities
from threadloom.store import rollback_facts as facts
from threadloom.store.db import Reader


class Runner:
    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionManager,
        repo_of: Callable[[uuid.UUID, Path, str | None], ShadowRepo],
        workspace_of: Callable[[AppThread, Project], Path],
        providers: ProviderSteps,
        worker_id: uuid.UUID | None,
    ) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.repo_of = repo_of  # the project's shadow repository, with its exclude list (engine.checkpoints)
        self.workspace_of = workspace_of  # the thread's folder (a fork's own is under the data dir)
        self.providers = providers
        self.worker_id = worker_id  # this process: the owner recorded with each operation it carries out
        self.running: set[uuid.UUID] = set()  # operations this process is carrying out right now

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    def repo(self, project: Project, thread: AppThread) -> ShadowRepo:
        return self.repo_of(project.id, self.workspace_of(thread, project), index_key(thread))

    # ---- rollbackToRun ------------------------------------------------------------------------------------

    def start_record(self, thread: AppThread, op: Operation, summary: str, target: Run | None) -> Outcome:
        """The operation's record (`rollback.started`, kept up to date as its steps complete) and the thread
        marked ROLLING_BACK; the command's result names the operation."""
        started = activity(
            thread.id,
            ActivityKind.ROLLBACK_STARTED,
            summary,
            self.now,
            new_id,
            run_id=target.id if target else None,
            node_id=target.root_node_id if target else None,
            payload=op.record(),
        )
        marked = thread.evolve(rollback_operation_id=op.id, updated_at=self.now)
        result = {"threadId": str(thread.id), "operationId": str(op.id), "recordId": str(started.entity.id)}
        return Outcome([started, Change.updated(marked)], result=result)

    async def carry_on(self, op: Operation) -> dict[str, Any]:
        """The steps, outside any transaction and the thread's lock, each recorded as it completes; then the
        outcome. A failed step takes back what was done (`_undo`) and records the failure."""
        try:
            await self._run_steps(op)
            return await self._finish(op)
        except DomainError:
            raise
        except Exception as error:
            failure = op.failure or StepFailed("record", f"recording the rollback failed: {error}")
            await self.undo(op)
            await self.record_failure(op, failure)
            if isinstance(error, StepFailed | CheckpointError | ProviderError | OSError) or op.failure:
                raise DomainError(ErrorCode.ROLLBACK_FAILED, failure_message(op, failure)) from error
            raise

    async def _run_steps(self, op: Operation) -> None:
        async with self.pipeline.db.read() as db:
            thread = await entities.require(db, AppThread, op.thread_id)
            project = await entities.require(db, Project, thread.project_id)
        if op.restore_ref is not None or op.restore_commit is not None:
            op.repo = self.repo(project, thread)
        if op.repo is not None and op.steps["capture"] != StepStatus.DONE:
            with step_of(op, "capture", CheckpointError, OSError):
                op.pre_ref = check_ref(f"{REF_PREFIX}{thread.id}/rollback/{op.id}")
                found = await op.repo.resolve(op.pre_ref)  # made before a crash: the workspace was not touched yet
                message = {"undo": "before undoing a rollback", "node": "before node rollback"}.get(
                    op.kind, f"before rollback to run {op.target}"
                )
                op.pre_commit = found or (await op.repo.capture(op.pre_ref, message)).commit
            await self.progress(op, "captured")

        # provider (an in-place rollback that cannot be undone waits until the files are restored)
        steps = op.providers
        early = [
            s for s in steps if not (s.strategy == plan_rules.Strategy.NATIVE_ROLLBACK and not self.providers.forks(s))
        ]
        late = [s for s in steps if s not in early]
        await self._provider_step(thread, project, op, early, final=not late)
        # files
        if op.repo is not None and op.steps["files"] != StepStatus.DONE:
            op.steps["files"] = StepStatus.RUNNING
            op.files_restored = True  # from here on, an undo restores the pre-rollback capture
            await self.progress(op)
            with step_of(op, "files", CheckpointError, OSError):
                commit = op.restore_commit or (await op.repo.resolve(op.restore_ref) if op.restore_ref else None)
                if commit is None:
                    raise StepFailed("files", f"the checkpoint of run {op.target} has no commit any more")
                await op.repo.restore(commit, op.file_paths)
            await self.progress(op, "files")
        if late:
            await self._provider_step(thread, project, op, late, final=True)
        if op.kind == "node":
            await self._node_conversation(op, thread, project)
        with step_of(op, "record"):
            pass  # only the test hook: `_finish` commits the outcome

    async def progress(self, op: Operation, point: str | None = None) -> None:
        """Record the operation as it stands (one small transaction on the thread); then the test-only crash
        point named `point`, if one was asked for."""
        record = op.record()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            current = await entities.get(db, Activity, op.record_activity.id if op.record_activity else None)
            if current is None:
                return Outcome()
            return Outcome([Change.updated(current.evolve(payload=record))])

        await self.pipeline.execute(Command(command_type="rollback.progress", decide=decide, thread_id=op.thread_id))
        if point is not None:
            crash_point(f"rollback-{point}")

    async def _finish(self, op: Operation) -> dict[str, Any]:
        """Record the outcome, the thread no longer ROLLING_BACK: for a rollback, runs rolled back,
        checkpoints stale, provider threads switched or retired and `rollback.completed`; for an undo, all of
        that taken back and `rollback.undone`."""

        op.outcome = "completed"

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            cleared = thread.evolve(rollback_operation_id=None, updated_at=self.now)
            if op.kind == "undo":
                assert op.undo_of is not None
                outcome = await record.undo_recorded(db, cleared, op.undo_of, self.now)
            elif op.kind == "node":
                outcome = await node_steps.recorded(db, cleared, op.node_id, op.checkpoint_id, op.summary(), self.now)
            else:
                assert op.plan is not None
                runs = await facts.runs_of(db, thread.id)
                checkpoints = [c for c, _ in await facts.checkpoints_of(db, thread.id)]
                # pending handoffs telling of an undone run are dropped here, in the record's transaction, and
                # so are the results of tasks an undone run delegated (the agent will not hold the request)
                pending = await facts.pending_own_handoffs(db, thread.id)
                undone = set(op.plan.rolled_back_run_ordinals)
                asked = await facts.pending_results_asked_by(db, thread.id, [r.id for r in runs if r.ordinal in undone])
                dropped = (*handoff_rules.outdated(pending, undone), *asked)
                rebridge = await self.providers.rebridge(db, thread, op, op.plan, runs, [h.id for h in dropped])
                outcome = record.recorded(cleared, op, op.plan, runs, checkpoints, self.now, rebridge, dropped)
            if not any(isinstance(c.entity, AppThread) for c in outcome.changes):
                outcome.changes.append(Change.updated(cleared))
            current = await entities.get(db, Activity, op.record_activity.id if op.record_activity else None)
            if current is not None:
                outcome.changes.append(Change.updated(current.evolve(payload=op.record())))
            return outcome

        finish = Command(command_type="rollback.record", decide=decide, thread_id=op.thread_id)
        return await self.pipeline.execute(finish)

    async def _provider_step(
        self, thread: AppThread, project: Project, op: Operation, steps: list[ProviderStep], final: bool
    ) -> None:
        try:
            if any(s.status != StepStatus.DONE for s in steps):
                injected("provider")
            for step in steps:
                if step.status == StepStatus.DONE:
                    continue  # done before a crash: recorded with what it made
                step.status = StepStatus.RUNNING
                await self.progress(op)
                await self.providers.roll_back(thread, project, op, step, self.progress)
                step.status = StepStatus.DONE
                await self.progress(op, "provider")
        except (StepFailed, ProviderError, DomainError, OSError) as error:
            op.steps["provider"] = StepStatus.FAILED
            op.failure = as_failure("provider", error)
            raise op.failure from error
        if final:
            op.steps["provider"] = StepStatus.DONE if op.providers else StepStatus.SKIPPED

    async def undo(self, op: Operation) -> None:
        """Take back what the failed rollback did, newest first; what cannot be taken back is reported."""
        if op.files_restored and op.repo is not None and op.pre_commit is not None:
            try:
                await op.repo.restore(op.pre_commit, op.file_paths)
                op.steps["files"] = "undone"
            except (CheckpointError, OSError) as error:
                op.undo_errors.append(f"files could not be put back: {error}")
        lost = [s for s in op.providers if s.rolled_back and s.undo_native_ref is None]
        if lost:
            op.undo_errors.append("the provider conversation was rolled back in place and cannot be restored")
        elif any(s.status != StepStatus.PENDING for s in op.providers):
            # new provider threads never became active; an in-place rollback is replaced by its undo fork
            op.steps["provider"] = StepStatus.UNDONE

    async def record_failure(self, op: Operation, failure: StepFailed) -> None:
        """Record the failed operation (engine.rollback_record.failed); the thread is no longer ROLLING_BACK."""
        op.outcome = "failed"
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            return await record.failed(db, thread, op, failure, now)

        await self.pipeline.execute(Command(command_type="rollback.failed", decide=decide, thread_id=op.thread_id))

    async def _node_conversation(self, op: Operation, thread: AppThread, project: Project) -> None:
        """The subagent's own conversation back to the checkpoint (engine.node_rollback), after its files."""
        if op.steps["provider"] == StepStatus.DONE:
            return
        op.steps["provider"] = StepStatus.RUNNING
        await self.progress(op)
        with step_of(op, "provider", ProviderError):
            async with self.pipeline.db.read() as db:
                node = await entities.require(db, ExecutionNode, op.node_id)
                checkpoint = await entities.require(db, Checkpoint, op.checkpoint_id)
                cwd = self.workspace_of(thread, project)
                conversation = await node_rollback.roll_back(
                    db, self.sessions, thread, project, node, checkpoint, cwd, self.now
                )
            op.node_result = conversation.payload
            op.node_dropped = [str(turn.id) for turn in conversation.plan.dropped]
        await self.progress(op, "provider")

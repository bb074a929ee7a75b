"""rollbackToRun, undoRollback and rollbackNode: files and conversation go back together, or not at all.

Each is one operation in three phases, so that no file or agent is touched inside a database transaction
and a crash anywhere leaves something the next process can finish:

1. **the command** (this module): checked and planned under the thread's row lock (`domain.rollback.
   plan_rollback`; a refusal changes nothing), then recorded: a `rollback.started` activity holding the plan
   and each step's status, and the thread marked ROLLING_BACK (a client's command that could interfere is
   refused meanwhile, `domain.rollback_ops`);
2. **the steps** (engine.rollback_runner), outside any transaction and lock, each recorded as it completes:
   *capture* the workspace (the pre-rollback checkpoint, ref `refs/threadloom/<thread>/rollback/<operation>`);
   *provider*, per provider thread as planned (engine.rollback_provider: a native rollback preceded by its
   *undo fork* when the provider can fork, a native fork, or a replacement given the app's context); *files*,
   the target's checkpoint restored; for rollbackNode, the subagent's own conversation;
3. **the record** (engine.rollback_record): runs after the target `ROLLED_BACK`, their checkpoints `STALE`,
   provider threads switched (and every other one that saw an undone run retired), `rollback.completed`, and
   the thread no longer ROLLING_BACK.

A failed step takes back what was done, newest first (files from the pre-rollback capture; an in-place
provider rollback replaced by its undo fork; new provider threads never become active) and records
`rollback.failed`; the caller gets `ROLLBACK_FAILED`. A native rollback without an undo fork cannot be taken
back, so it runs last, after the files. A process killed mid-operation leaves the record; the recovery pass
of the next one carries the operation on or takes it back (engine.rollback_recovery).

`THREADLOOM_TEST_FAIL_ROLLBACK_STEP` (capture | provider | files | record) makes that step fail and
`THREADLOOM_TEST_CRASH_AT` kills the process at a named point (src/threadloom/faults.py); both are read only
when set, for tests, and are documented as test-only.
"""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from threadloom.checkpoints.errors import CheckpointError
from threadloom.checkpoints.repo import ShadowRepo
from threadloom.domain import rollback as plan_rules
from threadloom.domain import workspace_rollback as ws
from threadloom.domain.access import Principal
from threadloom.domain.activities import ActivityKind
from threadloom.domain.changes import Outcome
from threadloom.domain.entities import (
    AppThread,
    ExecutionNode,
    Project,
    Run,
)
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.ids import new_id
from threadloom.domain.rollback_ops import StepStatus
from threadloom.domain.statuses import (
    TokenScope,
)
from threadloom.engine import node_rollback_steps as node_steps
from threadloom.engine import rollback_files
from threadloom.engine import rollback_record as record_of
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.rollback_operation import Operation, ProviderStep, checkpoint_fact, refused
from threadloom.engine.rollback_provider import ProviderSteps, stale_provider_threads
from threadloom.engine.rollback_recovery import AbandonedRollbacks
from threadloom.engine.rollback_runner import Runner
from threadloom.engine.sessions import SessionManager
from threadloom.faults import crash_point, hold_point
from threadloom.store import entities
from threadloom.store import rollback_facts as facts
from threadloom.store.db import Reader

PLAN_TRIES = 3  # a rollback planned again when runs changed while its files were read


class Rollbacks:
    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionManager,
        repo_of: Callable[[uuid.UUID, Path, str | None], ShadowRepo],
        workspace_of: Callable[[AppThread, Project], Path],
        ensure_workspace: Callable[[uuid.UUID], Awaitable[None]],
        worker_id: uuid.UUID | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.ensure_workspace = ensure_workspace  # makes a fork's own folder if it is not there yet
        self.providers = ProviderSteps(pipeline, sessions, workspace_of)
        self.runner = Runner(pipeline, sessions, repo_of, workspace_of, self.providers, worker_id)
        self.abandoned = AbandonedRollbacks(self.runner)

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    async def resume_abandoned(self) -> None:
        """Carry on (or take back) each rollback whose process is gone (engine.rollback_recovery)."""
        await self.abandoned.resume_abandoned()

    async def rollback_to_run(
        self,
        principal: Principal,
        thread_id: uuid.UUID,
        ordinal: int,
        restore_files: bool,
        key: str | None,
        *,
        dry_run: bool = False,
        preview_token: str | None = None,
        overwrite: bool = False,
    ) -> dict[str, Any]:
        """Carry out the rollback; its result names the thread, the rolled-back runs and the pre-rollback ref.

        The files are planned first (outside any transaction: `engine.rollback_files`), and a dry run stops
        there with the plan and its token. Then the plan is committed with the thread marked ROLLING_BACK
        (`_begin`); the steps run outside any transaction, each recorded as it completes, and the outcome is
        recorded last."""
        await self._own_workspace(principal, thread_id)
        for attempt in range(PLAN_TRIES):
            preview, files = await self._preview(principal, thread_id, ordinal, restore_files)
            if dry_run:
                return {"threadId": str(thread_id), "preview": preview}
            ws.refuse_stale(preview_token, preview["plan"])
            if files is not None:
                ws.refuse_busy(files.busy)
                ws.refuse_conflicts(files.plan, overwrite)
            await hold_point("rollback-planned")
            try:
                begun = await self._recorded(principal, thread_id, ordinal, restore_files, key, preview, files)
                break
            except DomainError as error:
                # The runs changed between the file plan (read outside the lock) and the record (a queued run
                # started and ended): with a caller's token that is STALE_PREVIEW; without one, plan again.
                if error.code != ErrorCode.STALE_PREVIEW or preview_token is not None or attempt == PLAN_TRIES - 1:
                    raise
        op = await self.abandoned.started(thread_id, begun)
        if op is None:  # the same key again: the first call's operation
            return await self._answer_of(thread_id, str(begun.get("operationId")))
        crash_point("rollback-begun")
        await hold_point("rollback-begun")
        return await self._carry_out(op)

    async def _recorded(
        self,
        principal: Principal,
        thread_id: uuid.UUID,
        ordinal: int,
        restore_files: bool,
        key: str | None,
        preview: dict[str, Any],
        files: rollback_files.Files | None,
    ) -> dict[str, Any]:
        """The command recording the operation, refused with STALE_PREVIEW if the plan under the lock is not
        the one the files were planned for."""
        paths = list(files.plan.paths) if files is not None else None
        expected = preview["plan"]

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            return await self._begin(db, thread, ordinal, restore_files, paths, expected)

        data = {"threadId": str(thread_id), "runOrdinal": ordinal, "restoreFiles": restore_files}
        command = Command(
            command_type="rollbackToRun", principal=principal, key=key, input=data, decide=decide, thread_id=thread_id
        )
        return await self.pipeline.execute(command)

    async def _preview(
        self, principal: Principal, thread_id: uuid.UUID, ordinal: int, restore_files: bool
    ) -> tuple[dict[str, Any], rollback_files.Files | None]:
        """The plan as it stands (runs, provider steps, files and their conflicts) and its token; refusals of
        the plan itself (busy, unknown run, no checkpoint) come from here too, before anything is recorded."""
        async with self.pipeline.db.read() as db:
            thread = await entities.get(db, AppThread, thread_id)
            if thread is None:
                raise not_found("threadId")
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            project = await entities.require(db, Project, thread.project_id)
            plan, steps, _, _ = await self._planned(db, thread, ordinal, restore_files)
        files = None
        if restore_files:
            try:
                files = await rollback_files.read_plan(
                    self.pipeline.db, thread, project, ordinal, self.runner.repo_of, self.runner.workspace_of
                )
            except (CheckpointError, OSError) as error:  # e.g. the workspace kept changing while it was read
                message = f"the workspace could not be read to plan the rollback ({error}); nothing changed"
                raise DomainError(ErrorCode.ROLLBACK_FAILED, message) from error
        planned = _preview_plan(plan, steps, files)
        return {"plan": planned, "previewToken": ws.preview_token(planned)}, files

    async def _carry_out(self, op: Operation) -> dict[str, Any]:
        self.runner.running.add(op.id)
        try:
            return await self.runner.carry_on(op)
        finally:
            self.runner.running.discard(op.id)

    async def _answer_of(self, thread_id: uuid.UUID, operation_id: str) -> dict[str, Any]:
        """A repeated call's answer: the operation's outcome as recorded (still under way: its plan)."""
        async with self.pipeline.db.read() as db:
            records = await facts.activities_of_operation(db, thread_id, operation_id)
        for done in records:
            payload = facts.payload(done)
            if done.kind == ActivityKind.ROLLBACK_FAILED:
                raise DomainError(ErrorCode.ROLLBACK_FAILED, str(payload.get("error") or "the rollback failed"))
            if done.kind == ActivityKind.ROLLBACK_COMPLETED:
                runs = payload.get("runs") or []
                ref = (payload.get("preRollback") or {}).get("ref")
                return {
                    "threadId": str(thread_id),
                    "operationId": operation_id,
                    "rolledBackRunIds": [r["id"] for r in runs],
                    "preRollbackRef": ref,
                }
        return {"threadId": str(thread_id), "operationId": operation_id, "rolledBackRunIds": [], "preRollbackRef": None}

    async def _own_workspace(self, principal: Principal, thread_id: uuid.UUID) -> None:
        """A fork with a folder of its own that is not there yet (made by an older release inside the
        project's workspace, never used since) gets it first: the rollback captures and restores there."""
        async with self.pipeline.db.read() as db:
            thread = await entities.get(db, AppThread, thread_id)
        if thread is None or not thread.workspace_path:
            return  # refused or carried out by the command itself
        principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
        try:
            await self.ensure_workspace(thread_id)
        except (CheckpointError, OSError) as error:
            raise DomainError(ErrorCode.ROLLBACK_FAILED, f"the fork's workspace could not be made: {error}") from error

    async def _planned(
        self, db: Reader, thread: AppThread, ordinal: int, restore_files: bool
    ) -> tuple[plan_rules.RollbackPlan, list[ProviderStep], list[Run], list[Any]]:
        """The plan (`domain.rollback.plan_rollback`) and the provider steps, from the thread's records."""
        runs = await facts.runs_of(db, thread.id)
        turns = await facts.root_turns(db, thread.id)
        pts = {pt.id: pt for pt in await facts.provider_threads_of(db, thread.id)}
        checkpoints = await facts.checkpoints_of(db, thread.id)
        ordinal_of = {run.id: run.ordinal for run in runs}
        try:
            plan = plan_rules.plan_rollback(
                [
                    plan_rules.RunFact(
                        run.ordinal,
                        run.status,
                        tuple(
                            plan_rules.TurnFact(turn.provider_thread_id, turn.ordinal, turn.native_turn_ref)
                            for run_id, turn in turns
                            if run_id == run.id
                        ),
                        run.started_at,
                    )
                    for run in runs
                ],
                ordinal,
                {pt.id: self.providers.fact(pt) for pt in pts.values()},
                [checkpoint_fact(c, scope, ordinal_of) for c, scope in checkpoints],
                restore_files=restore_files,
            )
        except plan_rules.RollbackRefused as error:
            raise refused(error) from None
        return plan, self.providers.steps(plan, thread, pts), runs, checkpoints

    async def _begin(
        self,
        db: Reader,
        thread: AppThread,
        ordinal: int,
        restore_files: bool,
        paths: list[str] | None,
        expected: dict[str, Any] | None,
    ) -> Outcome:
        """Plan the rollback and record it, with the thread marked ROLLING_BACK: no file or agent is touched
        in this transaction, and a refusal changes nothing. With `expected` (a preview's plan), a plan that
        is not the same any more is refused with STALE_PREVIEW."""
        op = Operation(new_id(), ordinal, thread.id, thread.project_id, worker_id=self.runner.worker_id)
        plan, steps, runs, checkpoints = await self._planned(db, thread, ordinal, restore_files)
        if expected is not None:  # the files were checked against the token before; the records are checked here
            now = _db_plan(plan, steps)
            ws.refuse_stale(ws.preview_token({k: expected.get(k) for k in now}), now)
        op.file_paths = paths
        op.stale = await stale_provider_threads(db, thread, plan, steps)
        op.plan, op.providers = plan, steps
        if plan.restore_checkpoint_id is not None:
            op.restore_ref = next(c.ref for c, _ in checkpoints if c.id == plan.restore_checkpoint_id)
        else:
            op.steps["capture"] = op.steps["files"] = StepStatus.SKIPPED
        target = next((r for r in runs if r.ordinal == op.target), None)
        undone = len(plan.rolled_back_run_ordinals)
        summary = f"rolling back to run {op.target}" + (f" ({undone} run{'s' * (undone != 1)} to undo)" * bool(undone))
        return self.runner.start_record(thread, op, summary, target)

    async def undo_rollback(self, principal: Principal, thread_id: uuid.UUID, key: str | None) -> dict[str, Any]:
        """Go forward again: the thread's last rollback is taken back if no run was started since. Carried out
        like a rollback: checked and recorded first (ROLLING_BACK), the files put back outside any transaction,
        then the log."""

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            last = await facts.last_activity(
                db, thread.id, [ActivityKind.ROLLBACK_COMPLETED.value, ActivityKind.ROLLBACK_UNDONE.value]
            )
            if last is None or last.kind != ActivityKind.ROLLBACK_COMPLETED:
                raise DomainError(ErrorCode.ROLLBACK_NOT_UNDOABLE, "this thread has no rollback to undo", "threadId")
            record = facts.payload(last)
            runs = await facts.runs_of(db, thread.id)
            later = [r for r in runs if r.requested_at > last.created_at]
            if later:
                raise DomainError(
                    ErrorCode.ROLLBACK_NOT_UNDOABLE,
                    f"run {later[0].ordinal} was started after the rollback; roll back to it instead",
                    "threadId",
                )
            await record_of.undo_recorded(db, thread, record, self.now)  # refuses what cannot be undone
            target = int(record.get("targetOrdinal") or 0)
            op = Operation(new_id(), target, thread.id, thread.project_id, worker_id=self.runner.worker_id)
            op.kind, op.undo_of = "undo", record
            op.restore_commit = (record.get("preRollback") or {}).get("commit")
            op.file_paths = record.get("filePaths")  # only what the rollback put back goes back again
            if op.restore_commit is None:
                op.steps["capture"] = op.steps["files"] = StepStatus.SKIPPED
            op.steps["provider"] = StepStatus.SKIPPED
            return self.runner.start_record(thread, op, f"undoing the rollback to run {target}", None)

        command = Command(
            command_type="undoRollback",
            principal=principal,
            key=key,
            input={"threadId": str(thread_id)},
            decide=decide,
            thread_id=thread_id,
        )
        begun = await self.pipeline.execute(command)
        op = await self.abandoned.started(thread_id, begun)
        if op is not None:  # else the same key again: its operation answered, or still under way
            await self._carry_out(op)
        return {"threadId": str(thread_id)}

    async def rollback_node(
        self, principal: Principal, node_id: uuid.UUID, checkpoint_id: uuid.UUID, key: str | None
    ) -> dict[str, Any]:
        """Restore a child scope's checkpoint, and the subagent's own conversation where its provider can; the
        parent's runs and conversation stay as they are. Carried out like rollbackToRun: checked and recorded
        first (ROLLING_BACK), the files and the conversation outside any transaction, then the log."""
        async with self.pipeline.db.read() as db:
            node = await entities.get(db, ExecutionNode, node_id)
        if node is None:
            raise not_found("nodeId")

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "nodeId")
            found, checkpoint, _ = await node_steps.checked(db, thread, node_id, checkpoint_id)
            op = Operation(new_id(), -1, thread.id, thread.project_id, worker_id=self.runner.worker_id)
            op.kind, op.node_id, op.checkpoint_id, op.restore_ref = "node", node_id, checkpoint_id, checkpoint.ref
            return self.runner.start_record(thread, op, f"rolling back {found.title or 'a subagent'}", None)

        asked = {"command_type": "rollbackNode", "principal": principal, "key": key, "decide": decide}
        data = {"checkpointId": str(checkpoint_id)}
        command = Command.naming("nodeId", node_id, data, thread_id=node.thread_id, **asked)
        begun = await self.pipeline.execute(command)
        op = await self.abandoned.started(node.thread_id, begun)
        if op is None:  # the same key again: the first call's operation
            return await node_steps.answer_of(self.pipeline, node.thread_id, str(begun.get("operationId")))
        return await self._carry_out(op)


def _db_plan(plan: plan_rules.RollbackPlan, steps: list[ProviderStep]) -> dict[str, Any]:
    """The part of a preview read from the thread's records: the runs undone and each provider step."""
    return {
        "targetOrdinal": plan.target_ordinal,
        "rolledBackRunOrdinals": list(plan.rolled_back_run_ordinals),
        "providerSteps": [{"providerThreadId": str(s.provider_thread.id), "strategy": s.strategy.value} for s in steps],
    }


def _preview_plan(
    plan: plan_rules.RollbackPlan, steps: list[ProviderStep], files: rollback_files.Files | None
) -> dict[str, Any]:
    """What a dry run shows and its token covers: the runs, the provider steps and the file plan."""
    return {**_db_plan(plan, steps), "files": files.plan.record() if files is not None else None}

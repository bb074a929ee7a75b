"""rollbackToRun, rollbackNode and undoRollback: files and conversation go back together, or not at all.

A rollback is one command on the thread, run under the thread's row lock from plan to record, so no message,
queue change or other rollback can interleave with it (they wait for it, then see its result). Its steps:

1. **plan** (`domain.rollback.plan_rollback`): a refusal changes nothing;
2. **capture** the workspace as it is now (the pre-rollback checkpoint, ref
   `refs/threadloom/<thread>/rollback/<operation>`), so files can be put back;
3. **provider**: per provider thread, as planned. A native rollback is preceded by a full native fork when
   the provider can fork (the *undo fork*: it holds the conversation as it was); a native fork, a replacement
   and a discard leave the old provider thread untouched and make a new one active;
4. **files**: restore the target's root checkpoint;
5. **record**: runs after the target become `ROLLED_BACK`, their checkpoints `STALE`, provider threads are
   switched, and a `rollback.completed` activity records every step and what an undo needs.

If a step fails, the steps already done are undone in reverse (files restored from the pre-rollback capture;
a natively rolled-back provider thread replaced by its undo fork; new provider threads simply never become
active), the transaction is rolled back, a `rollback.failed` activity records each step's status, and the
caller gets `ROLLBACK_FAILED`. A native rollback without an undo fork cannot be undone, so it runs last,
after the files.

A replacement provider thread for a target after run 0 needs the app's context up to the target: a
`ContextHandoff` (ROLLBACK_CONTEXT text) is written for it and delivered with the next run's first turn.
Every runtime takes a handoff with `start_turn` (the provider contract), so this works on every provider:
Codex and Claude get this synthetic restart from context wherever their native rollback cannot reach.

`THREADLOOM_TEST_FAIL_ROLLBACK_STEP` (capture | provider | files | record) makes that step fail; it is read
only when set, for tests of the undo path, and is documented as test-only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import Awaitable, Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from threadloom.checkpoints.errors import CheckpointError
from threadloom.checkpoints.refs import REF_PREFIX, check_ref
from threadloom.checkpoints.repo import ShadowRepo
from threadloom.domain import lineage, switching
from threadloom.domain import rollback as plan_rules
from threadloom.domain import rollback_ops as ops
from threadloom.domain.access import Principal
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, Outcome, Valued
from threadloom.domain.entities import (
    Activity,
    AppThread,
    Checkpoint,
    CheckpointScope,
    ContextHandoff,
    ContextTransfer,
    ExecutionNode,
    Project,
    ProviderThread,
    Run,
)
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.handoffs import (
    NOT_IN_CONVERSATION,
    HandoffKind,
    Selection,
    build_handoff,
    pending_handoff,
)
from threadloom.domain.ids import new_id
from threadloom.domain.rollback_ops import StepStatus
from threadloom.domain.statuses import (
    CheckpointScopeKind,
    CheckpointStatus,
    HandoffStatus,
    ProviderThreadStatus,
    RunStatus,
    TokenScope,
)
from threadloom.domain.threads import index_key, new_provider_thread
from threadloom.engine import node_rollback
from threadloom.engine import node_rollback_steps as node_steps
from threadloom.engine.pipeline import Command, Pipeline, Step
from threadloom.engine.sessions import SessionManager
from threadloom.faults import crash_point, hold_point
from threadloom.providers.contract import ProviderError, ThreadSettings
from threadloom.store import entities, handoff_facts
from threadloom.store import rollback_facts as facts
from threadloom.store import switching as switch_facts
from threadloom.store import workers as worker_store
from threadloom.store.db import Reader

log = logging.getLogger("threadloom.rollback")
FAIL_STEP_ENV = "THREADLOOM_TEST_FAIL_ROLLBACK_STEP"
STEPS = ("capture", "provider", "files", "record")


class _StepFailed(Exception):
    def __init__(self, step: str, message: str) -> None:
        super().__init__(message)
        self.step = step
        self.message = message


def _injected(step: str) -> None:
    """The test-only failure hook: the named step fails as if its I/O had."""
    wanted = os.environ.get(FAIL_STEP_ENV)
    if wanted and wanted == step:
        raise _StepFailed(step, f"{step} failed (injected by {FAIL_STEP_ENV})")


async def handoff_delivered(pipeline: Pipeline, handoff: ContextHandoff, run_id: uuid.UUID) -> None:
    """Record that the handoff went out with `run_id`'s first turn."""

    async def decide(db: Reader, thread: AppThread) -> Outcome:
        current = await entities.get(db, ContextHandoff, handoff.id)
        if current is None or current.status != HandoffStatus.PENDING:
            return Outcome()
        delivered = Change.updated(current.evolve(status=HandoffStatus.DELIVERED, target_run_id=run_id))
        run = await entities.get(db, Run, run_id)
        if run is None:
            return Outcome([delivered])
        transfer = await entities.get(db, ContextTransfer, current.transfer_id) if current.transfer_id else None
        kind = transfer.type if transfer is not None else None
        return Outcome([delivered, lineage.handoff_delivered(current, run, kind, pipeline.clock.now(), new_id)])

    await pipeline.execute(Command(command_type="handoff.delivered", decide=decide, thread_id=handoff.thread_id))


@dataclasses.dataclass(slots=True)
class _ProviderStep:
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
class _Operation:
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
    providers: list[_ProviderStep] = dataclasses.field(default_factory=list)
    stale: tuple[ProviderThread, ...] = ()  # other provider threads that saw an undone run: retired
    rebridge: ContextHandoff | None = None  # kept runs the active provider thread lost with an undone turn
    failure: _StepFailed | None = None
    undo_errors: list[str] = dataclasses.field(default_factory=list)
    # the durable record (rollbackToRun): the plan, the `rollback.started` activity holding the record, and
    # the process carrying it out
    plan: plan_rules.RollbackPlan | None = None
    kind: str = "rollback"  # "rollback" (rollbackToRun) or "undo" (undoRollback)
    undo_of: dict[str, Any] | None = None  # undo: the rollback.completed record it takes back
    restore_ref: str | None = None
    restore_commit: str | None = None  # undo: the files go back to the pre-rollback capture
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
            "nodeId": str(self.node_id) if self.node_id else None,
            "checkpointId": str(self.checkpoint_id) if self.checkpoint_id else None,
            "nodeConversation": self.node_result,
            "droppedTurnIds": self.node_dropped,
            "steps": dict(self.steps),
            "preRollback": {"ref": self.pre_ref, "commit": self.pre_commit},
            "providerSteps": [step.record() for step in self.providers],
            "staleProviderThreadIds": [str(pt.id) for pt in self.stale],
        }


def _refused(error: plan_rules.RollbackRefused) -> DomainError:
    return DomainError(ErrorCode(error.code.value), error.message, error.field)


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
        self.worker_id = worker_id  # this process: the owner recorded with each rollback it carries out
        self._running: set[uuid.UUID] = set()  # rollbacks this process is carrying out right now
        self.sessions = sessions
        self.repo_of = repo_of  # the project's shadow repository, with its exclude list (engine.checkpoints)
        self.workspace_of = workspace_of  # the thread's folder (a fork's own is under the data dir)
        self.ensure_workspace = ensure_workspace  # makes a fork's own folder if it is not there yet

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    def _repo(self, project: Project, thread: AppThread) -> ShadowRepo:
        return self.repo_of(project.id, self.workspace_of(thread, project), index_key(thread))

    # ---- rollbackToRun ------------------------------------------------------------------------------------

    async def rollback_to_run(
        self, principal: Principal, thread_id: uuid.UUID, ordinal: int, restore_files: bool, key: str | None
    ) -> dict[str, Any]:
        """Carry out the rollback; its result names the thread, the rolled-back runs and the pre-rollback ref.

        The plan is committed first with the thread marked ROLLING_BACK (`_begin`); the steps then run outside
        any transaction, each recorded as it completes (`_carry_on`), and the outcome is recorded last."""
        op = _Operation(new_id(), ordinal, thread_id, worker_id=self.worker_id)
        await self._own_workspace(principal, thread_id)

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            op.project_id = thread.project_id
            return await self._begin(db, thread, op, restore_files)

        data = {"threadId": str(thread_id), "runOrdinal": ordinal, "restoreFiles": restore_files}
        command = Command(
            command_type="rollbackToRun", principal=principal, key=key, input=data, decide=decide, thread_id=thread_id
        )
        begun = await self.pipeline.execute(command)
        if begun.get("operationId") != str(op.id):  # the same key again: the first call's operation
            return await self._answer_of(thread_id, str(begun.get("operationId")))
        self._running.add(op.id)
        try:
            crash_point("rollback-begun")
            await hold_point("rollback-begun")
            return await self._carry_on(op)
        finally:
            self._running.discard(op.id)

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

    async def resume_abandoned(self) -> None:
        """Carry on (or take back, `rollback_ops.resume_action`) each rollback whose process is gone: a
        server killed in the middle of one leaves the thread ROLLING_BACK until the next start does this."""
        async with self.pipeline.db.read() as db:
            records = await facts.rollbacks_under_way(db)
            owners = [uuid.UUID(o) for r in records if (o := facts.payload(r).get("workerId"))]
            alive = await worker_store.alive(db, owners)
        me = self.worker_id or uuid.UUID(int=0)
        for record in records:
            payload = facts.payload(record)
            if uuid.UUID(payload["operationId"]) in self._running or not ops.abandoned([payload], alive, me):
                continue
            op = await self._adopt(record)
            if op is None:
                continue
            self._running.add(op.id)
            try:
                if ops.resume_action(payload.get("providerSteps") or []) == ops.Resume.COMPENSATE:
                    await self._compensate(op)
                else:
                    await self._carry_on(op)
                log.warning("rollback %s of thread %s, abandoned by its process, is over", op.id, op.thread_id)
            except DomainError as error:
                log.warning("rollback %s of thread %s was taken back: %s", op.id, op.thread_id, error.message)
            finally:
                self._running.discard(op.id)

    async def _adopt(self, record: Activity) -> _Operation | None:
        """Make this process the operation's owner (under the thread's lock, if it is still abandoned) and
        rebuild it from its record."""
        me = self.worker_id

        async def decide(db: Reader, thread: AppThread) -> Valued[_Operation | None]:
            current = await entities.get(db, Activity, record.id)
            payload = facts.payload(current) if current is not None else {}
            if current is None or str(thread.rollback_operation_id) != payload.get("operationId"):
                return Valued(value=None)  # over, or taken by another process meanwhile
            owner = payload.get("workerId")
            if owner and owner != str(me) and await worker_store.alive(db, [uuid.UUID(owner)]):
                return Valued(value=None)
            op = await self._rebuilt(db, thread, current, payload)
            op.worker_id = me
            return Valued([Change.updated(current.evolve(payload=op.record()))], value=op)

        adopt = Step(command_type="rollback.adopt", thread_id=record.thread_id, decide=decide)
        return await self.pipeline.execute(adopt)

    async def _rebuilt(self, db: Reader, thread: AppThread, record: Activity, payload: dict[str, Any]) -> _Operation:
        op = _Operation(uuid.UUID(payload["operationId"]), int(payload["targetOrdinal"]), thread.id)
        op.project_id, op.record_activity = thread.project_id, record
        op.kind = str(payload.get("kind") or "rollback")
        op.plan = ops.plan_from(payload["plan"]) if payload.get("plan") else None
        op.undo_of = payload.get("undoOf")
        op.restore_ref, op.restore_commit = payload.get("restoreRef"), payload.get("restoreCommit")
        op.node_id = uuid.UUID(payload["nodeId"]) if payload.get("nodeId") else None
        op.checkpoint_id = uuid.UUID(payload["checkpointId"]) if payload.get("checkpointId") else None
        op.node_result = payload.get("nodeConversation")
        op.node_dropped = list(payload.get("droppedTurnIds") or [])
        op.steps.update({k: StepStatus(v) for k, v in (payload.get("steps") or {}).items()})
        pre = payload.get("preRollback") or {}
        op.pre_ref, op.pre_commit = pre.get("ref"), pre.get("commit")
        op.files_restored = ops.files_touched(op.steps)
        for entry in payload.get("providerSteps") or []:
            pt = await entities.require(db, ProviderThread, uuid.UUID(entry["providerThreadId"]))
            op.providers.append(
                _ProviderStep(
                    pt,
                    plan_rules.Strategy(entry["strategy"]),
                    replacement=ProviderThread.from_mapping(entry["replacement"]) if entry.get("replacement") else None,
                    undo_native_ref=entry.get("undoNativeRef"),
                    rolled_back=bool(entry.get("rolledBack")),
                    handoff=ContextHandoff.from_mapping(entry["handoff"]) if entry.get("handoff") else None,
                    planned=ops.provider_from(entry["planned"]) if entry.get("planned") else None,
                    status=StepStatus(entry.get("status") or StepStatus.PENDING),
                )
            )
        stale = [uuid.UUID(i) for i in payload.get("staleProviderThreadIds") or []]
        op.stale = tuple([await entities.require(db, ProviderThread, i) for i in stale])
        if op.restore_ref is not None or op.restore_commit is not None:
            project = await entities.require(db, Project, thread.project_id)
            op.repo = self._repo(project, thread)
        return op

    async def _compensate(self, op: _Operation) -> None:
        """Take back an operation whose in-place provider rollback is in doubt: its undo fork holds the
        conversation as it was, and the files go back to the pre-rollback capture if they were touched."""
        for step in op.providers:
            if step.status == StepStatus.RUNNING and step.undo_native_ref:
                step.rolled_back = True  # or not: either way the undo fork is the conversation before it
        failure = _StepFailed("provider", "the server stopped during the provider step")
        op.steps["provider"] = StepStatus.FAILED
        await self._undo(op)
        await self._record_failure(op, failure)

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

    async def _begin(self, db: Reader, thread: AppThread, op: _Operation, restore_files: bool) -> Outcome:
        """Plan the rollback and record it, with the thread marked ROLLING_BACK: no file or agent is touched
        in this transaction, and a refusal changes nothing."""
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
                    )
                    for run in runs
                ],
                op.target,
                {pt.id: self._provider_fact(pt) for pt in pts.values()},
                [_checkpoint_fact(c, scope, ordinal_of) for c, scope in checkpoints],
                restore_files=restore_files,
            )
        except plan_rules.RollbackRefused as refused:
            raise _refused(refused) from None
        steps = self._provider_steps(plan, thread, pts)
        op.stale = await _stale_provider_threads(db, thread, plan, steps)
        op.plan, op.providers = plan, steps
        if plan.restore_checkpoint_id is not None:
            op.restore_ref = next(c.ref for c, _ in checkpoints if c.id == plan.restore_checkpoint_id)
        else:
            op.steps["capture"] = op.steps["files"] = StepStatus.SKIPPED
        target = next((r for r in runs if r.ordinal == op.target), None)
        undone = len(plan.rolled_back_run_ordinals)
        summary = f"rolling back to run {op.target}" + (f" ({undone} run{'s' * (undone != 1)} to undo)" * bool(undone))
        return self._recorded_start(thread, op, summary, target)

    def _recorded_start(self, thread: AppThread, op: _Operation, summary: str, target: Run | None) -> Outcome:
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
        assert isinstance(started.entity, Activity)
        op.record_activity = started.entity
        marked = thread.evolve(rollback_operation_id=op.id, updated_at=self.now)
        result = {"threadId": str(thread.id), "operationId": str(op.id)}
        return Outcome([started, Change.updated(marked)], result=result)

    async def _carry_on(self, op: _Operation) -> dict[str, Any]:
        """The steps, outside any transaction and the thread's lock, each recorded as it completes; then the
        outcome. A failed step takes back what was done (`_undo`) and records the failure."""
        try:
            await self._run_steps(op)
            return await self._finish(op)
        except DomainError:
            raise
        except Exception as error:
            failure = op.failure or _StepFailed("record", f"recording the rollback failed: {error}")
            await self._undo(op)
            await self._record_failure(op, failure)
            if isinstance(error, _StepFailed | CheckpointError | ProviderError | OSError) or op.failure:
                raise DomainError(ErrorCode.ROLLBACK_FAILED, _failure_message(op, failure)) from error
            raise

    async def _run_steps(self, op: _Operation) -> None:
        async with self.pipeline.db.read() as db:
            thread = await entities.require(db, AppThread, op.thread_id)
            project = await entities.require(db, Project, thread.project_id)
        if op.restore_ref is not None or op.restore_commit is not None:
            op.repo = self._repo(project, thread)
        if op.repo is not None and op.steps["capture"] != StepStatus.DONE:
            with _step(op, "capture", CheckpointError, OSError):
                op.pre_ref = check_ref(f"{REF_PREFIX}{thread.id}/rollback/{op.id}")
                found = await op.repo.resolve(op.pre_ref)  # made before a crash: the workspace was not touched yet
                message = {"undo": "before undoing a rollback", "node": "before node rollback"}.get(
                    op.kind, f"before rollback to run {op.target}"
                )
                op.pre_commit = found or (await op.repo.capture(op.pre_ref, message)).commit
            await self._progress(op, "captured")

        # provider (an in-place rollback that cannot be undone waits until the files are restored)
        steps = op.providers
        early = [s for s in steps if not (s.strategy == plan_rules.Strategy.NATIVE_ROLLBACK and not self._forks(s))]
        late = [s for s in steps if s not in early]
        await self._provider_step(thread, project, op, early, final=not late)
        # files
        if op.repo is not None and op.steps["files"] != StepStatus.DONE:
            op.steps["files"] = StepStatus.RUNNING
            op.files_restored = True  # from here on, an undo restores the pre-rollback capture
            await self._progress(op)
            with _step(op, "files", CheckpointError, OSError):
                commit = op.restore_commit or (await op.repo.resolve(op.restore_ref) if op.restore_ref else None)
                if commit is None:
                    raise _StepFailed("files", f"the checkpoint of run {op.target} has no commit any more")
                await op.repo.restore(commit)
            await self._progress(op, "files")
        if late:
            await self._provider_step(thread, project, op, late, final=True)
        if op.kind == "node":
            await self._node_conversation(op, thread, project)
        with _step(op, "record"):
            pass  # only the test hook: `_finish` commits the outcome

    async def _progress(self, op: _Operation, point: str | None = None) -> None:
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

    async def _finish(self, op: _Operation) -> dict[str, Any]:
        """Record the outcome, the thread no longer ROLLING_BACK: for a rollback, runs rolled back,
        checkpoints stale, provider threads switched or retired and `rollback.completed`; for an undo, all of
        that taken back and `rollback.undone`."""

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            op.outcome = "completed"
            cleared = thread.evolve(rollback_operation_id=None, updated_at=self.now)
            if op.kind == "undo":
                assert op.undo_of is not None
                outcome = await self._undo_recorded(db, cleared, op.undo_of)
            elif op.kind == "node":
                outcome = await node_steps.recorded(db, cleared, op.node_id, op.checkpoint_id, op.summary(), self.now)
            else:
                assert op.plan is not None
                runs = await facts.runs_of(db, thread.id)
                checkpoints = [c for c, _ in await facts.checkpoints_of(db, thread.id)]
                op.rebridge = await self._rebridge(db, thread, op, op.plan, runs)
                outcome = self._recorded(cleared, op, op.plan, runs, checkpoints)
            if not any(isinstance(c.entity, AppThread) for c in outcome.changes):
                outcome.changes.append(Change.updated(cleared))
            current = await entities.get(db, Activity, op.record_activity.id if op.record_activity else None)
            if current is not None:
                outcome.changes.append(Change.updated(current.evolve(payload=op.record())))
            return outcome

        finish = Command(command_type="rollback.record", decide=decide, thread_id=op.thread_id)
        return await self.pipeline.execute(finish)

    async def _rebridge(
        self, db: Reader, thread: AppThread, op: _Operation, plan: plan_rules.RollbackPlan, runs: list[Run]
    ) -> ContextHandoff | None:
        """A handoff for kept runs the provider thread that stays active no longer holds: an undone run's
        first turn may have carried a handoff telling of earlier runs (a return after a switch), and rolling
        that turn back, natively or by forking before it, drops them too. None when it lost nothing."""
        replaced = next((s for s in op.providers if s.replacement is not None), None)
        if replaced is not None and replaced.strategy != plan_rules.Strategy.NATIVE_FORK:
            return None  # a replacement is given the whole context up to the target (or starts empty)
        assert replaced is None or replaced.replacement is not None
        pt_id = (
            replaced.replacement.id
            if replaced is not None and replaced.replacement
            else thread.active_provider_thread_id
        )
        if pt_id is None:
            return None
        histories = (await switch_facts.histories(db, thread.id)).undoing(plan.rolled_back_run_ordinals)
        if replaced is not None and replaced.replacement is not None:
            histories = histories.with_thread(switching.History(replaced.replacement))
        kept = [r.ordinal for r in runs if r.status not in NOT_IN_CONVERSATION and r.ordinal <= op.target]
        missed = plan_rules.lost_runs(kept, switching.seen_runs(pt_id, histories))
        if not missed:
            return None
        facts_of = await handoff_facts.read_run_facts(db, thread.id, missed)
        built = build_handoff(HandoffKind.DELTA_SINCE_TARGET_LAST_SEEN, facts_of, Selection.of(missed))
        came_from = sorted({r.provider_thread_id for r in facts_of if r.provider_thread_id is not None}, key=str)
        return pending_handoff(built, thread.id, came_from, pt_id, self.now, new_id)

    def _provider_fact(self, pt: ProviderThread) -> plan_rules.ProviderThreadFact:
        caps = self._caps(pt.provider_instance_id)
        base = None if pt.first_run_ordinal is None else pt.first_run_ordinal - 1
        return plan_rules.ProviderThreadFact(
            pt.id,
            can_rollback=bool(caps and caps.can_rollback_thread),
            can_fork_from_turn=bool(caps and caps.can_fork_from_turn),
            base_ordinal=base,
        )

    def _caps(self, instance: str) -> Any:
        driver = self.sessions.drivers.get(instance)
        return None if driver is None else driver.capabilities()

    def _forks(self, step: _ProviderStep) -> bool:
        caps = self._caps(step.provider_thread.provider_instance_id)
        return bool(caps and caps.can_fork_thread)

    def _provider_steps(
        self, plan: plan_rules.RollbackPlan, thread: AppThread, pts: dict[uuid.UUID, ProviderThread]
    ) -> list[_ProviderStep]:
        """The provider work on the thread's active provider thread. Retired provider threads (an earlier
        rollback's or replacement's) are never resumed, so their conversations are left as they are. An active
        provider thread the plan does not name but whose starting context covers runs after the target (a fork
        made by an earlier rollback) is discarded too."""
        active = pts.get(thread.active_provider_thread_id) if thread.active_provider_thread_id else None
        if active is None:
            return []
        planned = next((p for p in plan.provider_threads if p.provider_thread_id == active.id), None)
        if planned is None:
            base = None if active.first_run_ordinal is None else active.first_run_ordinal - 1
            covers_later = active.native_thread_ref is not None and (base is None or base > plan.target_ordinal)
            if not covers_later or not plan.rolled_back_run_ordinals:
                return []
            return [_ProviderStep(active, plan_rules.Strategy.DISCARD)]
        if planned.strategy == plan_rules.Strategy.UNCHANGED:
            return []
        return [_ProviderStep(active, planned.strategy, planned=planned)]

    async def _provider_step(
        self, thread: AppThread, project: Project, op: _Operation, steps: list[_ProviderStep], final: bool
    ) -> None:
        try:
            if any(s.status != StepStatus.DONE for s in steps):
                _injected("provider")
            for step in steps:
                if step.status == StepStatus.DONE:
                    continue  # done before a crash: recorded with what it made
                step.status = StepStatus.RUNNING
                await self._progress(op)
                await self._roll_back_provider(thread, project, op, step)
                step.status = StepStatus.DONE
                await self._progress(op, "provider")
        except (_StepFailed, ProviderError, DomainError, OSError) as error:
            op.steps["provider"] = StepStatus.FAILED
            op.failure = _as_failure("provider", error)
            raise op.failure from error
        if final:
            op.steps["provider"] = StepStatus.DONE if op.providers else StepStatus.SKIPPED

    async def _roll_back_provider(
        self, thread: AppThread, project: Project, op: _Operation, step: _ProviderStep
    ) -> None:
        pt = step.provider_thread
        now = self.now
        fresh = new_provider_thread(thread, pt.provider_instance_id, now, new_id, first_run_ordinal=op.target + 1)
        if step.strategy in (plan_rules.Strategy.REPLACE, plan_rules.Strategy.DISCARD):
            step.replacement = fresh
            if op.target > 0:
                async with self.pipeline.db.read() as db:
                    runs = await handoff_facts.read_run_facts(db, thread.id, range(1, op.target + 1))
                built = build_handoff(HandoffKind.ROLLBACK_CONTEXT, runs, Selection.up_to(op.target))
                step.handoff = pending_handoff(built, thread.id, [pt.id], fresh.id, now, new_id)
            return
        if pt.native_thread_ref is None:
            return
        planned = step.planned
        if planned is None:
            raise _StepFailed("provider", "no plan for this provider thread")
        cwd = str(self.workspace_of(thread, project))
        settings = ThreadSettings(cwd=cwd, runtime_mode=thread.runtime_mode, model=thread.model)
        async with self.sessions.using(pt.provider_instance_id, project.id) as session:
            runtime = session.runtime
            ref = pt.native_thread_ref
            if ref not in session.loaded:
                await runtime.resume_thread(ref, settings)
                session.loaded.add(ref)
            if step.strategy == plan_rules.Strategy.NATIVE_FORK:
                forked = await runtime.fork_thread(ref, planned.fork_at_turn_ref)
                session.loaded.add(forked)
                step.replacement = dataclasses.replace(
                    fresh,
                    native_thread_ref=forked,
                    forked_from_provider_thread_id=pt.id,
                    status=ProviderThreadStatus.IDLE,
                    session_id=session.session_id,
                )
            elif step.strategy == plan_rules.Strategy.NATIVE_ROLLBACK:
                if self._forks(step):
                    step.undo_native_ref = await runtime.fork_thread(ref, None)
                    session.loaded.add(step.undo_native_ref)
                    await self._progress(op, "forked")  # recorded first: after a crash, the undo fork takes it back
                if planned.before_turn_ref is None:
                    raise _StepFailed("provider", "no native turn to roll back to")
                await runtime.rollback_thread(ref, planned.before_turn_ref)
                step.rolled_back = True

    def _recorded(
        self,
        thread: AppThread,
        op: _Operation,
        plan: plan_rules.RollbackPlan,
        runs: list[Run],
        checkpoints: list[Checkpoint],
    ) -> Outcome:
        now = self.now
        changes: list[Change] = []
        rolled = [run for run in runs if run.ordinal in plan.rolled_back_run_ordinals]
        for run in rolled:
            changes.append(
                Change.updated(
                    run.evolve(status=RunStatus.ROLLED_BACK, status_reason=f"rolled back to run {op.target}")
                )
            )
        stale = [c for c in checkpoints if c.id in plan.stale_checkpoint_ids]
        for checkpoint in stale:
            changes.append(Change.updated(checkpoint.evolve(status=CheckpointStatus.STALE)))
        active = thread.active_provider_thread_id
        for step in op.providers:
            if step.replacement is None:
                continue
            changes.append(
                Change.updated(step.provider_thread.evolve(status=ProviderThreadStatus.CLOSED, updated_at=now))
            )
            changes.append(Change.created(step.replacement))
            if step.handoff is not None:
                changes.append(Change.created(step.handoff))
            active = step.replacement.id
        if active != thread.active_provider_thread_id:
            changes.append(Change.updated(thread.evolve(active_provider_thread_id=active, updated_at=now)))
        changes += [Change.updated(pt.evolve(status=ProviderThreadStatus.CLOSED, updated_at=now)) for pt in op.stale]
        if op.rebridge is not None:
            changes.append(Change.created(op.rebridge))
        target = next((r for r in runs if r.ordinal == op.target), None)
        record = {
            "operationId": str(op.id),
            "targetOrdinal": op.target,
            "targetRunId": str(target.id) if target else None,
            "steps": op.step_list(),
            "preRollback": {"ref": op.pre_ref, "commit": op.pre_commit},
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
            "rebridgeHandoffId": str(op.rebridge.id) if op.rebridge else None,
            "staleProviderThreads": [
                {"id": str(pt.id), "providerInstanceId": pt.provider_instance_id} for pt in op.stale
            ],
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

    async def _undo(self, op: _Operation) -> None:
        """Take back what the failed rollback did, newest first; what cannot be taken back is reported."""
        if op.files_restored and op.repo is not None and op.pre_commit is not None:
            try:
                await op.repo.restore(op.pre_commit)
                op.steps["files"] = "undone"
            except (CheckpointError, OSError) as error:
                op.undo_errors.append(f"files could not be put back: {error}")
        lost = [s for s in op.providers if s.rolled_back and s.undo_native_ref is None]
        if lost:
            op.undo_errors.append("the provider conversation was rolled back in place and cannot be restored")
        elif any(s.status != StepStatus.PENDING for s in op.providers):
            # new provider threads never became active; an in-place rollback is replaced by its undo fork
            op.steps["provider"] = StepStatus.UNDONE

    async def _record_failure(self, op: _Operation, failure: _StepFailed) -> None:
        """Record the failed operation, and switch to the undo fork of a provider thread rolled back in place."""
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            changes: list[Change] = []
            after = thread.evolve(rollback_operation_id=None, updated_at=now) if op.plan is not None else thread
            for step in op.providers:
                if not (step.rolled_back and step.undo_native_ref):
                    continue
                current = await entities.get(db, ProviderThread, step.provider_thread.id)
                if current is None:
                    continue
                # the fork holds every run so far
                back, swapped = _to_undo_fork(current, step.undo_native_ref, await _last_ran(db, thread.id) + 1, now)
                changes += swapped
                if after.active_provider_thread_id == current.id:
                    after = after.evolve(active_provider_thread_id=back.id, updated_at=now)
            if after != thread:
                changes.append(Change.updated(after))
            if op.plan is not None:
                op.outcome = "failed"
                current_record = await entities.get(db, Activity, op.record_activity.id if op.record_activity else None)
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

        await self.pipeline.execute(Command(command_type="rollback.failed", decide=decide, thread_id=op.thread_id))

    # ---- undoRollback -------------------------------------------------------------------------------------

    async def undo_rollback(self, principal: Principal, thread_id: uuid.UUID, key: str | None) -> dict[str, Any]:
        """Go forward again: the thread's last rollback is taken back if no run was started since. Carried out
        like a rollback: checked and recorded first (ROLLING_BACK), the files put back outside any transaction,
        then the log."""
        op = _Operation(new_id(), -1, thread_id, worker_id=self.worker_id, kind="undo")

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
            await self._undo_recorded(db, thread, record)  # refuses what cannot be taken back; writes nothing
            op.undo_of, op.target = record, int(record.get("targetOrdinal") or 0)
            op.restore_commit = (record.get("preRollback") or {}).get("commit")
            if op.restore_commit is None:
                op.steps["capture"] = op.steps["files"] = StepStatus.SKIPPED
            op.steps["provider"] = StepStatus.SKIPPED
            return self._recorded_start(thread, op, f"undoing the rollback to run {op.target}", None)

        command = Command(
            command_type="undoRollback",
            principal=principal,
            key=key,
            input={"threadId": str(thread_id)},
            decide=decide,
            thread_id=thread_id,
        )
        begun = await self.pipeline.execute(command)
        if begun.get("operationId") != str(op.id):
            return {"threadId": str(thread_id)}  # the same key again: its operation answered, or still under way
        self._running.add(op.id)
        try:
            await self._carry_on(op)
        finally:
            self._running.discard(op.id)
        return {"threadId": str(thread_id)}

    async def _undo_recorded(self, db: Reader, thread: AppThread, record: dict[str, Any]) -> Outcome:
        now = self.now
        changes: list[Change] = []
        active = thread.active_provider_thread_id
        for entry in record.get("providerThreads") or []:
            original = await entities.get(db, ProviderThread, uuid.UUID(entry["id"]))
            if original is None:
                continue
            if entry.get("replacementId"):
                replacement = await entities.get(db, ProviderThread, uuid.UUID(entry["replacementId"]))
                if replacement is not None:
                    changes.append(
                        Change.updated(replacement.evolve(status=ProviderThreadStatus.CLOSED, updated_at=now))
                    )
                changes.append(Change.updated(original.evolve(status=ProviderThreadStatus.IDLE, updated_at=now)))
                active = original.id
            elif entry.get("undoNativeRef"):
                # the undo fork holds the runs the rollback undid: its context starts after the last of them
                first = max([0, *(int(r["ordinal"]) for r in record.get("runs") or [])]) + 1
                back, swapped = _to_undo_fork(original, str(entry["undoNativeRef"]), first, now)
                changes += swapped
                active = back.id
            else:
                raise DomainError(
                    ErrorCode.ROLLBACK_NOT_UNDOABLE,
                    "the provider rolled the conversation back in place and kept no copy of it",
                    "threadId",
                )
        if active != thread.active_provider_thread_id:
            changes.append(Change.updated(thread.evolve(active_provider_thread_id=active, updated_at=now)))
        for entry in record.get("runs") or []:
            run = await entities.get(db, Run, uuid.UUID(entry["id"]))
            if run is not None and run.status == RunStatus.ROLLED_BACK:
                changes.append(Change.updated(run.evolve(status=RunStatus(entry["status"]), status_reason=None)))
        for entry in record.get("staleCheckpoints") or []:
            checkpoint = await entities.get(db, Checkpoint, uuid.UUID(entry["id"]))
            if checkpoint is not None and checkpoint.status == CheckpointStatus.STALE:
                changes.append(Change.updated(checkpoint.evolve(status=CheckpointStatus(entry["status"]))))
        summary = f"undid the rollback to run {record.get('targetOrdinal')}"
        payload = {"operationId": record.get("operationId")}
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

    # ---- rollbackNode -------------------------------------------------------------------------------------

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
        op = _Operation(new_id(), -1, node.thread_id, worker_id=self.worker_id, kind="node")
        op.node_id, op.checkpoint_id = node_id, checkpoint_id

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "nodeId")
            found, checkpoint, _ = await node_steps.checked(db, thread, node_id, checkpoint_id)
            op.restore_ref = checkpoint.ref
            return self._recorded_start(thread, op, f"rolling back {found.title or 'a subagent'}", None)

        asked = {"command_type": "rollbackNode", "principal": principal, "key": key, "decide": decide}
        data = {"checkpointId": str(checkpoint_id)}
        command = Command.naming("nodeId", node_id, data, thread_id=node.thread_id, **asked)
        begun = await self.pipeline.execute(command)
        if begun.get("operationId") != str(op.id):  # the same key again: the first call's operation
            return await node_steps.answer_of(self.pipeline, node.thread_id, str(begun.get("operationId")))
        self._running.add(op.id)
        try:
            return await self._carry_on(op)
        finally:
            self._running.discard(op.id)

    async def _node_conversation(self, op: _Operation, thread: AppThread, project: Project) -> None:
        """The subagent's own conversation back to the checkpoint (engine.node_rollback), after its files."""
        if op.steps["provider"] == StepStatus.DONE:
            return
        op.steps["provider"] = StepStatus.RUNNING
        await self._progress(op)
        with _step(op, "provider", ProviderError):
            async with self.pipeline.db.read() as db:
                node = await entities.require(db, ExecutionNode, op.node_id)
                checkpoint = await entities.require(db, Checkpoint, op.checkpoint_id)
                cwd = self.workspace_of(thread, project)
                conversation = await node_rollback.roll_back(
                    db, self.sessions, thread, project, node, checkpoint, cwd, self.now
                )
            op.node_result = conversation.payload
            op.node_dropped = [str(turn.id) for turn in conversation.plan.dropped]
        await self._progress(op, "provider")


async def _last_ran(db: Reader, thread_id: uuid.UUID) -> int:
    """The ordinal of the thread's last run that reached the provider (0: none)."""
    ran = [run.ordinal for run in await facts.runs_of(db, thread_id) if run.status in plan_rules.RAN]
    return max(ran, default=0)


def _checkpoint_fact(
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
def _step(op: _Operation, name: str, *caught: type[BaseException]) -> Iterator[None]:
    """One step of a rollback: the test hook first, then the body; a failure marks the step failed and
    becomes the operation's failure (what the undo and the error message report)."""
    failures: tuple[type[BaseException], ...] = (_StepFailed, *caught)
    try:
        _injected(name)
        yield
    except failures as error:
        op.steps[name] = "failed"
        op.failure = _as_failure(name, error)
        if op.failure is error:
            raise
        raise op.failure from error
    op.steps[name] = "done"


async def _stale_provider_threads(
    db: Reader, thread: AppThread, plan: plan_rules.RollbackPlan, steps: list[_ProviderStep]
) -> tuple[ProviderThread, ...]:
    """The open provider threads besides the active one that saw a run this rollback undoes
    (`domain.rollback.stale_provider_threads`)."""
    if not plan.rolled_back_run_ordinals:
        return ()
    histories = await switch_facts.histories(db, thread.id)
    done = (ProviderThreadStatus.CLOSED, ProviderThreadStatus.ERROR)
    seen = {
        pt: switching.seen_runs(pt, histories)
        for pt, h in histories.threads.items()
        if h.provider_thread.status not in done
    }
    handled = [s.provider_thread.id for s in steps]
    if thread.active_provider_thread_id is not None:
        handled.append(thread.active_provider_thread_id)
    stale = plan_rules.stale_provider_threads(seen, plan.rolled_back_run_ordinals, handled)
    return tuple(histories.threads[pt].provider_thread for pt in stale)


def _to_undo_fork(
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


def _as_failure(step: str, error: BaseException) -> _StepFailed:
    if isinstance(error, _StepFailed):
        return error
    message = getattr(error, "message", None) or str(error)
    return _StepFailed(step, message)


def _failure_message(op: _Operation, failure: _StepFailed) -> str:
    text = f"the rollback failed at its {failure.step} step ({failure.message})"
    if op.undo_errors:
        return f"{text}; and could not be fully undone: {'; '.join(op.undo_errors)}"
    return f"{text}; files and conversation are as they were"

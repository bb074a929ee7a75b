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
Only a runtime whose `start_turn` accepts `handoff` (the scripted agent) can receive one; for any other the
rollback is refused with `ROLLBACK_UNSUPPORTED` rather than hiding text in the user's message.

`THREADLOOM_TEST_FAIL_ROLLBACK_STEP` (capture | provider | files | record) makes that step fail; it is read
only when set, for tests of the undo path, and is documented as test-only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
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
from threadloom.domain.access import Principal
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import (
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
from threadloom.domain.statuses import (
    ACTIVE_RUN_STATUSES,
    CheckpointScopeKind,
    CheckpointStatus,
    HandoffStatus,
    ProviderThreadStatus,
    RunStatus,
    TokenScope,
)
from threadloom.domain.threads import index_key, new_provider_thread
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.sessions import SessionManager
from threadloom.io_guard import allowing_io_in_transaction
from threadloom.providers.contract import ProviderError, ProviderRuntime, ThreadSettings
from threadloom.store import entities, handoff_facts
from threadloom.store import rollback_facts as facts
from threadloom.store import switching as switch_facts
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


def accepts_handoff(runtime: ProviderRuntime) -> bool:
    """Whether the runtime's `start_turn` takes a `handoff` context item (the scripted agent's does)."""
    try:
        return "handoff" in inspect.signature(runtime.start_turn).parameters
    except (TypeError, ValueError):
        return False


async def start_turn_with_handoff(
    runtime: ProviderRuntime, native_thread: str, text: str, settings: ThreadSettings, handoff: str
) -> str:
    """Start a turn that carries a handoff as its own context item; a runtime that takes none refuses."""
    if not accepts_handoff(runtime):
        raise ProviderError("unsupported", "this provider takes no handoff")
    start: Callable[..., Awaitable[str]] = runtime.start_turn
    return await start(native_thread, text, settings, handoff=handoff)


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

    def step_list(self) -> list[dict[str, str]]:
        return [{"step": name, "status": status} for name, status in self.steps.items()]


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
    ) -> None:
        self.pipeline = pipeline
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

    @allowing_io_in_transaction("rollback")  # its git and agent calls still run in its transaction
    async def rollback_to_run(
        self, principal: Principal, thread_id: uuid.UUID, ordinal: int, restore_files: bool, key: str | None
    ) -> dict[str, Any]:
        """Carry out the rollback; its result names the thread, the rolled-back runs and the pre-rollback ref."""
        op = _Operation(new_id(), ordinal, thread_id)
        await self._own_workspace(principal, thread_id)

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            op.project_id = thread.project_id
            return await self._carry_out(db, thread, op, restore_files)

        data = {"threadId": str(thread_id), "runOrdinal": ordinal, "restoreFiles": restore_files}
        command = Command(
            command_type="rollbackToRun", principal=principal, key=key, input=data, decide=decide, thread_id=thread_id
        )
        try:
            return await self.pipeline.execute(command)
        except DomainError:
            raise
        except Exception as error:
            if op.steps["capture"] == "pending" and not op.providers:
                raise  # nothing was done
            failure = op.failure or _StepFailed("record", f"recording the rollback failed: {error}")
            await self._undo(op)
            await self._record_failure(op, failure)
            if isinstance(error, _StepFailed | CheckpointError | ProviderError | OSError) or op.failure:
                raise DomainError(ErrorCode.ROLLBACK_FAILED, _failure_message(op, failure)) from error
            raise

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

    async def _carry_out(self, db: Reader, thread: AppThread, op: _Operation, restore_files: bool) -> Outcome:
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
        project = await entities.require(db, Project, thread.project_id)
        steps = self._provider_steps(plan, thread, pts)
        await self._check_handoffs(thread, project, steps, op.target)
        op.stale = await _stale_provider_threads(db, thread, plan, steps)

        # capture
        if plan.restore_checkpoint_id is not None:
            op.repo = self._repo(project, thread)
            with _step(op, "capture", CheckpointError, OSError):
                op.pre_ref = check_ref(f"{REF_PREFIX}{thread.id}/rollback/{op.id}")
                op.pre_commit = (await op.repo.capture(op.pre_ref, f"before rollback to run {op.target}")).commit
        else:
            op.steps["capture"] = "skipped"

        # provider (an in-place rollback that cannot be undone waits until the files are restored)
        early = [s for s in steps if not (s.strategy == plan_rules.Strategy.NATIVE_ROLLBACK and not self._forks(s))]
        late = [s for s in steps if s not in early]
        await self._provider_step(db, thread, project, op, early, final=not late)
        # files
        if plan.restore_checkpoint_id is not None and op.repo is not None:
            target = next(c for c, _ in checkpoints if c.id == plan.restore_checkpoint_id)
            with _step(op, "files", CheckpointError, OSError):
                commit = await op.repo.resolve(target.ref) if target.ref else None
                if commit is None:
                    raise _StepFailed("files", f"the checkpoint of run {op.target} has no commit any more")
                op.files_restored = True  # from here on, an undo restores the pre-rollback capture
                await op.repo.restore(commit)
        else:
            op.steps["files"] = "skipped"
        if late:
            await self._provider_step(db, thread, project, op, late, final=True)

        # record
        with _step(op, "record"):
            pass  # only the test hook: the caller commits what `_recorded` returns
        op.rebridge = await self._rebridge(db, thread, op, plan, runs)
        return self._recorded(thread, op, plan, runs, [c for c, _ in checkpoints])

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

    async def _check_handoffs(
        self, thread: AppThread, project: Project, steps: list[_ProviderStep], target: int
    ) -> None:
        """Refuse before touching anything when a replacement would need a handoff its runtime cannot take."""
        for step in steps:
            if step.strategy not in (plan_rules.Strategy.REPLACE, plan_rules.Strategy.DISCARD) or target == 0:
                continue
            async with self.sessions.using(step.provider_thread.provider_instance_id, project.id) as session:
                if not accepts_handoff(session.runtime):
                    raise DomainError(
                        ErrorCode.ROLLBACK_UNSUPPORTED,
                        f"{step.provider_thread.provider_instance_id} can neither roll back nor fork this "
                        "conversation, and takes no handoff; start a new thread instead",
                        "runOrdinal",
                    )

    async def _provider_step(
        self, db: Reader, thread: AppThread, project: Project, op: _Operation, steps: list[_ProviderStep], final: bool
    ) -> None:
        try:
            if steps:
                _injected("provider")
            for step in steps:
                op.providers.append(step)
                await self._roll_back_provider(db, thread, project, op, step)
        except (_StepFailed, ProviderError, DomainError, OSError) as error:
            op.steps["provider"] = "failed"
            op.failure = _as_failure("provider", error)
            raise op.failure from error
        if final:
            op.steps["provider"] = "done" if op.providers else "skipped"

    async def _roll_back_provider(
        self, db: Reader, thread: AppThread, project: Project, op: _Operation, step: _ProviderStep
    ) -> None:
        pt = step.provider_thread
        now = self.now
        fresh = new_provider_thread(thread, pt.provider_instance_id, now, new_id, first_run_ordinal=op.target + 1)
        if step.strategy in (plan_rules.Strategy.REPLACE, plan_rules.Strategy.DISCARD):
            step.replacement = fresh
            if op.target > 0:
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
        elif op.providers:
            # new provider threads never became active; an in-place rollback is replaced by its undo fork
            op.steps["provider"] = "undone"

    async def _record_failure(self, op: _Operation, failure: _StepFailed) -> None:
        """Record the failed operation, and switch to the undo fork of a provider thread rolled back in place."""
        now = self.now

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            changes: list[Change] = []
            for step in op.providers:
                if not (step.rolled_back and step.undo_native_ref):
                    continue
                current = await entities.get(db, ProviderThread, step.provider_thread.id)
                if current is None:
                    continue
                # the fork holds every run so far
                back, swapped = _to_undo_fork(current, step.undo_native_ref, await _last_ran(db, thread.id) + 1, now)
                changes += swapped
                if thread.active_provider_thread_id == current.id:
                    changes.append(Change.updated(thread.evolve(active_provider_thread_id=back.id, updated_at=now)))
            record = {
                "operationId": str(op.id),
                "targetOrdinal": op.target,
                "failedStep": failure.step,
                "error": failure.message,
                "steps": op.step_list(),
                "undoErrors": op.undo_errors,
            }
            what = f"rollback to run {op.target}" if op.target >= 0 else "node rollback"
            summary = f"{what} failed at {failure.step}; nothing changed"
            if op.undo_errors:
                summary = f"{what} failed at {failure.step}: {'; '.join(op.undo_errors)}"
            changes.append(activity(thread.id, ActivityKind.ROLLBACK_FAILED, summary, now, new_id, payload=record))
            return Outcome(changes)

        await self.pipeline.execute(Command(command_type="rollback.failed", decide=decide, thread_id=op.thread_id))

    # ---- undoRollback -------------------------------------------------------------------------------------

    @allowing_io_in_transaction("rollback")  # its git and agent calls still run in its transaction
    async def undo_rollback(self, principal: Principal, thread_id: uuid.UUID, key: str | None) -> dict[str, Any]:
        """Go forward again: the thread's last rollback is taken back if no run was started since."""

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
            return await self._undo_recorded(db, thread, record)

        command = Command(
            command_type="undoRollback",
            principal=principal,
            key=key,
            input={"threadId": str(thread_id)},
            decide=decide,
            thread_id=thread_id,
        )
        return await self.pipeline.execute(command)

    async def _undo_recorded(self, db: Reader, thread: AppThread, record: dict[str, Any]) -> Outcome:
        now = self.now
        project = await entities.require(db, Project, thread.project_id)
        pre = record.get("preRollback") or {}
        if pre.get("commit"):
            try:
                await self._repo(project, thread).restore(str(pre["commit"]))
            except (CheckpointError, OSError) as error:
                raise DomainError(ErrorCode.ROLLBACK_FAILED, f"files could not be put back: {error}") from error
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

    @allowing_io_in_transaction("rollback")  # its git and agent calls still run in its transaction
    async def rollback_node(
        self, principal: Principal, node_id: uuid.UUID, checkpoint_id: uuid.UUID, key: str | None
    ) -> dict[str, Any]:
        """Restore a child scope's checkpoint; the parent's runs and conversation stay as they are."""
        async with self.pipeline.db.read() as db:
            node = await entities.get(db, ExecutionNode, node_id)
        if node is None:
            raise not_found("nodeId")
        op = _Operation(new_id(), -1, node.thread_id)

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "nodeId")
            return await self._restore_node(db, thread, node_id, checkpoint_id, op)

        asked = {"command_type": "rollbackNode", "principal": principal, "key": key, "decide": decide}
        data = {"checkpointId": str(checkpoint_id)}
        command = Command.naming("nodeId", node_id, data, thread_id=node.thread_id, **asked)
        try:
            return await self.pipeline.execute(command)
        except DomainError:
            raise
        except (_StepFailed, CheckpointError, ProviderError, OSError) as error:
            failure = op.failure or _as_failure("record", error)
            await self._undo(op)
            await self._record_failure(op, failure)
            raise DomainError(ErrorCode.ROLLBACK_FAILED, _failure_message(op, failure)) from error

    async def _restore_node(
        self, db: Reader, thread: AppThread, node_id: uuid.UUID, checkpoint_id: uuid.UUID, op: _Operation
    ) -> Outcome:
        node = await entities.get(db, ExecutionNode, node_id)
        checkpoint = await entities.get(db, Checkpoint, checkpoint_id)
        if node is None or node.thread_id != thread.id:
            raise not_found("nodeId")
        if checkpoint is None or checkpoint.thread_id != thread.id:
            raise not_found("checkpointId")
        all_scopes = {s.id: s for s in await facts.scopes_of(db, thread.id)}
        scope = all_scopes.get(checkpoint.scope_id)
        if scope is None or scope.kind == CheckpointScopeKind.ROOT_RUN or scope.node_id != node_id:
            raise DomainError(ErrorCode.INVALID_INPUT, "checkpointId is not a checkpoint of this node", "checkpointId")
        if checkpoint.status != CheckpointStatus.READY or not checkpoint.ref:
            raise DomainError(ErrorCode.CHECKPOINT_MISSING, "that checkpoint cannot be restored", "checkpointId")
        runs = await facts.runs_of(db, thread.id)
        if any(run.status in ACTIVE_RUN_STATUSES for run in runs):
            raise DomainError(ErrorCode.THREAD_BUSY, "a run is active; interrupt it or wait first", "nodeId")
        if any(pt.owner_node_id == node_id for pt in await facts.provider_threads_of(db, thread.id)):
            # Its conversation would have to go back too, and that is not built: refuse rather than diverge.
            raise DomainError(
                ErrorCode.ROLLBACK_UNSUPPORTED,
                "this subagent has a provider thread of its own, which cannot be rolled back yet",
                "nodeId",
            )
        project = await entities.require(db, Project, thread.project_id)
        op.repo = self._repo(project, thread)
        with _step(op, "capture", CheckpointError, OSError):
            op.pre_ref = check_ref(f"{REF_PREFIX}{thread.id}/rollback/{op.id}")
            op.pre_commit = (await op.repo.capture(op.pre_ref, "before node rollback")).commit
        with _step(op, "files", CheckpointError, OSError):
            commit = await op.repo.resolve(checkpoint.ref)
            if commit is None:
                raise _StepFailed("files", "the checkpoint has no commit any more")
            op.files_restored = True
            await op.repo.restore(commit)
        now = self.now
        changes: list[Change] = []
        # descendants: scopes under this one (transitively) whose checkpoints are now out of date
        descendants = _descendants(scope.id, all_scopes)
        checkpoints = [c for c, _ in await facts.checkpoints_of(db, thread.id)]
        later = [c for c in checkpoints if c.scope_id == scope.id and c.ordinal > checkpoint.ordinal]
        stale = [
            c
            for c in [*later, *(c for c in checkpoints if c.scope_id in descendants)]
            if c.status != CheckpointStatus.STALE
        ]
        changes += [Change.updated(c.evolve(status=CheckpointStatus.STALE)) for c in stale]
        dirtied = _shares_parent_workspace(node)
        payload = {
            "operationId": str(op.id),
            "nodeId": str(node_id),
            "checkpointId": str(checkpoint_id),
            "preRollback": {"ref": op.pre_ref, "commit": op.pre_commit},
            "staleCheckpoints": [{"id": str(c.id), "status": c.status.value} for c in stale],
            "dirtiedParentWorkspace": dirtied,
            "steps": op.step_list(),
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
                node_id=node_id,
                payload=payload,
            )
        )
        return Outcome(
            changes,
            result={
                "threadId": str(thread.id),
                "nodeId": str(node_id),
                "checkpointId": str(checkpoint_id),
                "dirtiedParentWorkspace": dirtied,
                "preRollbackRef": op.pre_ref,
            },
        )


async def _last_ran(db: Reader, thread_id: uuid.UUID) -> int:
    """The ordinal of the thread's last run that reached the provider (0: none)."""
    ran = [run.ordinal for run in await facts.runs_of(db, thread_id) if run.status in plan_rules.RAN]
    return max(ran, default=0)


def _descendants(scope_id: uuid.UUID, scopes: dict[uuid.UUID, CheckpointScope]) -> set[uuid.UUID]:
    found: set[uuid.UUID] = set()
    frontier = {scope_id}
    while frontier:
        frontier = {s.id for s in scopes.values() if s.parent_scope_id in frontier and s.id not in found}
        found |= frontier
    return found


def _shares_parent_workspace(node: ExecutionNode) -> bool:
    """A subagent works in its parent's workspace unless it was given a folder of its own (a delegated task
    on another thread, `child_thread_id`, has its own conversation but the same project workspace)."""
    return True


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

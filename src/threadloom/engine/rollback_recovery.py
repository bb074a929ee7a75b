"""Rollback operations whose process is gone: a server killed in the middle of one leaves its thread
ROLLING_BACK with the operation's record; the recovery pass (at start, then periodically) adopts each one,
rebuilds it from the record and carries it on or takes it back (`domain.rollback_ops.resume_action`)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from threadloom.domain import rollback as plan_rules
from threadloom.domain import rollback_ops as ops
from threadloom.domain.changes import Change, Valued
from threadloom.domain.entities import (
    Activity,
    AppThread,
    ContextHandoff,
    Project,
    ProviderThread,
)
from threadloom.domain.errors import DomainError
from threadloom.domain.rollback_ops import StepStatus
from threadloom.engine.pipeline import Step
from threadloom.engine.rollback_operation import (
    Operation,
    ProviderStep,
    StepFailed,
)
from threadloom.engine.rollback_runner import Runner
from threadloom.store import entities
from threadloom.store import rollback_facts as facts
from threadloom.store import workers as worker_store
from threadloom.store.db import Reader

log = logging.getLogger("threadloom.rollback")


class AbandonedRollbacks:
    def __init__(self, runner: Runner) -> None:
        self.runner = runner

    async def resume_abandoned(self) -> None:
        """Carry on (or take back, `rollback_ops.resume_action`) each rollback whose process is gone: a
        server killed in the middle of one leaves the thread ROLLING_BACK until the next start does this."""
        async with self.runner.pipeline.db.read() as db:
            records = await facts.rollbacks_under_way(db)
            owners = [uuid.UUID(o) for r in records if (o := facts.payload(r).get("workerId"))]
            alive = await worker_store.alive(db, owners)
        me = self.runner.worker_id or uuid.UUID(int=0)
        for record in records:
            payload = facts.payload(record)
            if uuid.UUID(payload["operationId"]) in self.runner.running or not ops.abandoned([payload], alive, me):
                continue
            op = await self._adopt(record)
            if op is None:
                continue
            self.runner.running.add(op.id)
            try:
                if ops.resume_action(payload.get("providerSteps") or []) == ops.Resume.COMPENSATE:
                    await self._compensate(op)
                else:
                    await self.runner.carry_on(op)
                log.warning("rollback %s of thread %s, abandoned by its process, is over", op.id, op.thread_id)
            except DomainError as error:
                log.warning("rollback %s of thread %s was taken back: %s", op.id, op.thread_id, error.message)
            finally:
                self.runner.running.discard(op.id)

    async def _adopt(self, record: Activity) -> Operation | None:
        """Make this process the operation's owner (under the thread's lock, if it is still abandoned) and
        rebuild it from its record."""
        me = self.runner.worker_id

        async def decide(db: Reader, thread: AppThread) -> Valued[Operation | None]:
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
        return await self.runner.pipeline.execute(adopt)

    async def started(self, thread_id: uuid.UUID, begun: dict[str, Any]) -> Operation | None:
        """The operation a command just recorded (its result names the record), rebuilt from that record to
        be carried out by this process; None when the answer was a repeat's (the operation is not this call's
        to carry out: over, or under way here or in a process recovery will replace)."""
        async with self.runner.pipeline.db.read() as db:
            record = await entities.get(db, Activity, uuid.UUID(str(begun["recordId"])))
            thread = await entities.get(db, AppThread, thread_id)
            if record is None or thread is None:
                return None
            payload = facts.payload(record)
            mine = payload.get("workerId") == str(self.runner.worker_id) and payload.get("status") == "running"
            if not mine or uuid.UUID(payload["operationId"]) in self.runner.running:
                return None
            return await self._rebuilt(db, thread, record, payload)

    async def _rebuilt(self, db: Reader, thread: AppThread, record: Activity, payload: dict[str, Any]) -> Operation:
        op = Operation(uuid.UUID(payload["operationId"]), int(payload["targetOrdinal"]), thread.id)
        op.project_id, op.record_activity = thread.project_id, record
        op.kind = str(payload.get("kind") or "rollback")
        op.plan = ops.plan_from(payload["plan"]) if payload.get("plan") else None
        op.undo_of = payload.get("undoOf")
        op.restore_ref, op.restore_commit = payload.get("restoreRef"), payload.get("restoreCommit")
        op.file_paths = payload.get("filePaths")
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
                ProviderStep(
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
            op.repo = self.runner.repo(project, thread)
        return op

    async def _compensate(self, op: Operation) -> None:
        """Take back an operation whose in-place provider rollback is in doubt: its undo fork holds the
        conversation as it was, and the files go back to the pre-rollback capture if they were touched."""
        for step in op.providers:
            if step.status == StepStatus.RUNNING and step.undo_native_ref:
                step.rolled_back = True  # or not: either way the undo fork is the conversation before it
        failure = StepFailed("provider", "the server stopped during the provider step")
        op.steps["provider"] = StepStatus.FAILED
        await self.runner.undo(op)
        await self.runner.record_failure(op, failure)

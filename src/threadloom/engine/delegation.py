"""App-owned delegated tasks: child threads with lineage `subagent` (rules in `domain.delegation`)."""

from __future__ import annotations

import uuid

from threadloom.domain import delegation, wakes
from threadloom.domain import dispatch as rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.effects import DeliverToParent
from threadloom.domain.entities import AppThread, ContextTransfer, ConversationMessage, ExecutionNode, Run
from threadloom.domain.errors import not_found
from threadloom.domain.ids import new_id
from threadloom.domain.leases import refuse_other_writer
from threadloom.domain.statuses import RunStatus, TokenScope, TransferStatus, TransferType
from threadloom.domain.threads import ThreadState
from threadloom.engine.pipeline import Command, GlobalCommand, Pipeline
from threadloom.engine.runs import RunEngine
from threadloom.store import entities, runs
from threadloom.store import tables as t
from threadloom.store import threads as thread_store
from threadloom.store.db import Reader


class Delegation:
    def __init__(self, pipeline: Pipeline, run_engine: RunEngine) -> None:
        self.pipeline = pipeline
        self.runs = run_engine

    async def delegate(
        self, principal: Principal, parent_id: uuid.UUID, *, text: str, title: str | None, key: str | None
    ) -> uuid.UUID:
        """Create the child thread and start the task as its first run, then mark it on the parent."""
        now = self.pipeline.clock.now()
        child_id = new_id()

        async def create_child(db: Reader) -> Outcome:
            parent = await thread_store.get_thread(db, parent_id)
            if parent is None or not principal.sees(parent.project_id):
                raise not_found("threadId")
            principal.require(TokenScope.OPERATE)
            # It writes to the parent (its subagent node), so it is a writer there: the parent's lease holds.
            refuse_other_writer(parent, principal, "delegateTask", now)
            child = delegation.child_thread(parent, child_id, title or text.strip().splitlines()[0][:80], now)
            state = ThreadState(thread=child, active=None, queue=(), last_ordinal=0)
            first = rules.new_run(
                state, applied=rules.AppliedDispatch.START_IMMEDIATELY, text=text, now=now, new_id=new_id
            )
            outcome = Outcome(
                [
                    Change.created(child),
                    delegation.spawn_transfer(parent, child, text, now, new_id),
                    *first.changes,
                ],
                first.effects,
                result={"threadId": str(child.id)},
                project_id=parent.project_id,
            )
            return outcome

        data = {"threadId": str(parent_id), "text": text, "title": title}
        result = await self.pipeline.execute(
            GlobalCommand(command_type="delegateTask", principal=principal, key=key, input=data, decide=create_child)
        )
        created = uuid.UUID(result["threadId"])
        if created == child_id:  # not a replay of an earlier request: mark it on the parent

            async def on_parent(db: Reader, parent: AppThread) -> Outcome:
                child = await entities.require(db, AppThread, created)
                active = await entities.get(db, Run, parent.active_run_id)
                delivered = await _results(db, parent.id, child.id)  # a very quick task reported already
                first = delivered[0] if delivered else None
                return delegation.parent_node(parent, active, child, now, new_id, delivered=first)

            await self.pipeline.execute(
                Command(command_type="delegateTask.parent", decide=on_parent, thread_id=parent_id)
            )
        return created

    async def deliver_effect(self, effect: DeliverToParent) -> None:
        """The completion delivery: the child's result reaches the parent thread, its subagent node ends as
        the child's run did, the agent gets the result with its next turn, and an idle parent is woken."""
        parent_id, child_id, run_id = effect.parent_thread_id, effect.child_thread_id, effect.run_id
        now = self.pipeline.clock.now()

        async def decide(db: Reader, parent: AppThread) -> Outcome:
            results = await _results(db, parent.id, child_id)
            if any((r.source_point or {}).get("runId") == str(run_id) for r in results):
                return Outcome()  # delivered already (the effect may be replayed)
            child = await entities.require(db, AppThread, child_id)
            run = await entities.require(db, Run, run_id)
            answers = await entities.in_order(
                db,
                ConversationMessage,
                t.conversation_messages.c.run_id == run_id,
                t.conversation_messages.c.role == "assistant",
            )
            nodes = await entities.where(
                db,
                ExecutionNode,
                t.execution_nodes.c.thread_id == parent.id,
                t.execution_nodes.c.child_thread_id == child_id,
            )
            state = await runs.thread_state(db, parent)
            owed = [r for r in results if r.status == TransferStatus.PENDING]
            node = nodes[0] if nodes else None
            asked_by = await entities.get(db, Run, node.run_id) if node is not None else None
            delivery = delegation.Delivery(
                parent=parent,
                child=child,
                run=run,
                answer="\n".join(m.text for m in answers).strip(),
                node=node,
                owed=owed[0] if owed else None,
                queued=len(state.queue),
                undone=asked_by is not None and asked_by.status == RunStatus.ROLLED_BACK,
            )
            delivered = delegation.deliver(delivery, now, new_id)
            outcome = delivered.outcome
            if delivered.wake == delegation.Wake.WOKE:
                woken = wakes.wake_run(
                    parent, state.last_ordinal, delivered.transfer, child.title, run.status, now, new_id
                )
                outcome.changes += woken.changes
                outcome.effects += woken.effects
                await self.runs.route(db, parent, outcome)
            return outcome

        await self.pipeline.execute(Command(command_type="subagent.deliver", decide=decide, thread_id=parent_id))


async def _results(db: Reader, parent_id: uuid.UUID, child_id: uuid.UUID) -> list[ContextTransfer]:
    """The child's results on the parent (pending: the task's, owed), oldest first."""
    c = t.context_transfers.c
    return await entities.in_order(
        db,
        ContextTransfer,
        c.thread_id == parent_id,
        c.source_thread_id == child_id,
        c.type == TransferType.SUBAGENT_RESULT.value,
    )


async def owed_results(db: Reader, parent_id: uuid.UUID) -> list[ContextTransfer]:
    """The results the parent's tasks still owe it (a Stop drops their wakes, `delegation.drop_wakes`)."""
    c = t.context_transfers.c
    return await entities.where(
        db,
        ContextTransfer,
        c.thread_id == parent_id,
        c.type == TransferType.SUBAGENT_RESULT.value,
        c.status == TransferStatus.PENDING.value,
    )

"""What provider events change: each normalized event of a turn becomes changes to its run's entities
(nodes, messages, plans, requests, activities; built by `domain/items.py`), decided under the thread lock.

`engine/ingest.py` partitions, coalesces and writes the events; this module is the decision it writes. A
batch's changes coalesce per entity (`Batch`), and what must happen after the commit (provider requests
nobody can answer here, to release) is handed back as the decision's value, never kept aside.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadloom.domain import items
from threadloom.domain import requests as request_rules
from threadloom.domain import runs as rules
from threadloom.domain import usage as usage_rules
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, EventVerb, Outcome, Valued
from threadloom.domain.entities import (
    AppThread,
    ConversationMessage,
    ExecutionNode,
    PlanArtifact,
    ProviderTurn,
    Run,
    RunAttempt,
)
from threadloom.domain.ids import new_id
from threadloom.domain.records import Record
from threadloom.domain.statuses import AttemptStatus, NodeStatus
from threadloom.engine import subagent_threads
from threadloom.engine.sessions import TurnBinding
from threadloom.providers import contract as ev
from threadloom.store import entities
from threadloom.store import usage as ledger
from threadloom.store.db import Reader

Decision = Callable[[Reader, AppThread], Awaitable[Valued[tuple[str, ...]]]]


class Batch:
    """Entities changed while applying some events in one transaction.

    Coalescing happens here: an entity changed several times in one batch (a message
    growing by fifty deltas) is written as one event with its latest state, at the place
    of its first change.
    """

    def __init__(self, db: Reader, structured_questions: bool, pricing: usage_rules.Pricing | None = None) -> None:
        self.db = db
        self.structured_questions = structured_questions  # the runtime can ask the user a structured question
        self.pricing = pricing or usage_rules.Pricing()
        self.recorded_calls: set[str] = set()  # provider call refs already in the ledger (read once a batch)
        self.unanswerable: list[str] = []  # provider requests to release with an empty answer after the commit
        self.cache: dict[uuid.UUID, Record] = {}
        self.outcome = Outcome()
        self._index: dict[uuid.UUID, int] = {}

    async def get(self, cls: type[Any], entity_id: uuid.UUID | None) -> Any:
        if entity_id is None:
            return None
        if entity_id in self.cache:
            return self.cache[entity_id]
        found = await entities.get(self.db, cls, entity_id)
        if found is not None:
            self.cache[entity_id] = found
        return found

    async def prefetch(self, binding: TurnBinding, events: list[Any]) -> None:
        """What a batch reads, in one statement instead of one each: the turn's attempt, run, root node
        and provider turn, and the nodes and messages of the items its events name (those made earlier)."""
        wanted: dict[uuid.UUID, type[Record]] = {
            binding.attempt_id: RunAttempt,
            binding.run_id: Run,
            binding.root_node_id: ExecutionNode,
            binding.provider_turn_id: ProviderTurn,
        }
        for event in events:
            item = getattr(event, "item_id", None)
            if not isinstance(item, str):
                continue
            node_id, message_id = binding.items.get(item), binding.messages.get(item)
            if node_id is not None:
                wanted[node_id] = ExecutionNode
            if message_id is not None:
                wanted[message_id] = ConversationMessage
        missing = [(cls, entity_id) for entity_id, cls in wanted.items() if entity_id not in self.cache]
        for found in await entities.get_many(self.db, missing):
            if found is not None:
                self.cache[found.id] = found

    def seal(self) -> None:
        """Later changes are events of their own: only deltas between two structural events coalesce,
        so a batch of several events logs what they would have logged one by one."""
        self._index.clear()

    def put(self, verb: EventVerb, entity: Record, *, node_id: uuid.UUID | None = None) -> None:
        self.add(Change.of(verb, entity, node_id=node_id))

    def add(self, change: Change) -> None:
        """Coalesce: an entity changed twice in one batch is one event with its latest state, named as
        its first (a node created and updated in one batch is `node.created`)."""
        entity = change.entity
        self.cache[entity.id] = entity
        at = self._index.get(entity.id)
        if at is not None:
            earlier = self.outcome.changes[at]
            self.outcome.changes[at] = dataclasses.replace(
                earlier, entity=entity, node_id=earlier.node_id or change.node_id
            )
            return
        self._index[entity.id] = len(self.outcome.changes)
        self.outcome.changes.append(change)


def decision(
    binding: TurnBinding,
    events: list[Any],
    now: Any,
    structured_questions: bool,
    pricing: usage_rules.Pricing | None = None,
) -> Decision:
    """What `events` change, decided under the thread lock (nothing for an attempt no longer live but its
    model calls' usage: spent is spent); its value: the provider requests to release with an empty answer
    once it is written."""

    async def decide(db: Reader, thread: AppThread) -> Valued[tuple[str, ...]]:
        batch = Batch(db, structured_questions, pricing)
        await batch.prefetch(binding, events)
        calls = [e.call_ref for e in events if isinstance(e, ev.UsageReported)]
        batch.recorded_calls = await ledger.recorded_refs(db, binding.thread_id, calls)
        attempt = await batch.get(RunAttempt, binding.attempt_id)
        if attempt is None or attempt.status not in (AttemptStatus.PENDING, AttemptStatus.RUNNING):
            # late events of a superseded or finished attempt: only what its calls cost is still recorded, and
            # that its turn reached the provider (a rollback must drop it from the provider's conversation)
            for event in events:
                if isinstance(event, ev.UsageReported) and attempt is not None:
                    await _usage(batch, binding, event, now)
                elif isinstance(event, ev.TurnStarted) and event.parent_turn is None and attempt is not None:
                    await _late_turn_started(batch, binding, event)
            return batch.outcome.carrying(())
        for event in events:
            structural = not isinstance(event, ev.TextDelta | ev.OutputDelta)
            if structural:
                batch.seal()
            handler = _HANDLERS.get(type(event))
            if handler is not None:
                await handler(batch, binding, event, now)
            if structural:
                batch.seal()
        return batch.outcome.carrying(tuple(batch.unanswerable))

    return decide


async def _turn_started(b: Batch, binding: TurnBinding, event: ev.TurnStarted, now: Any) -> None:
    if event.parent_turn is None:
        binding.know_turn(event.native_turn)
        run = await b.get(Run, binding.run_id)
        attempt = await b.get(RunAttempt, binding.attempt_id)
        root = await b.get(ExecutionNode, binding.root_node_id)
        turn = await b.get(ProviderTurn, binding.provider_turn_id)
        for change in rules.turn_started(run, attempt, root, turn, event.native_turn, now, new_id).changes:
            b.add(change)
    elif event.native_turn in binding.child_turns:
        node = await b.get(ExecutionNode, binding.child_turns[event.native_turn])
        b.put(EventVerb.UPDATED, node.evolve(status=NodeStatus.RUNNING, updated_at=now))


async def _late_turn_started(b: Batch, binding: TurnBinding, event: ev.TurnStarted) -> None:
    binding.know_turn(event.native_turn)
    turn = await b.get(ProviderTurn, binding.provider_turn_id)
    if turn is not None:
        for change in rules.late_turn_started(turn, event.native_turn).changes:
            b.add(change)


async def _turn_completed(b: Batch, binding: TurnBinding, event: ev.TurnCompleted, now: Any) -> None:
    node = await b.get(ExecutionNode, binding.child_turns.get(event.native_turn))
    run = await b.get(Run, binding.run_id)
    if node is not None and not rules.completes_run(node, run):  # a child's end is only the child's
        status = items.ITEM_STATUS.get(event.status, NodeStatus.FAILED)
        b.put(EventVerb.UPDATED, node.evolve(status=status, updated_at=now, completed_at=now))
        summary = f"subagent turn {event.status}"
        b.add(_activity(binding.thread_id, ActivityKind.SUBAGENT_COMPLETED, summary, now, binding.run_id, node.id))
        await subagent_threads.ended(b, node, event.native_turn, event.status, now)


async def _output(b: Batch, binding: TurnBinding, event: ev.OutputDelta, now: Any) -> None:
    node = await b.get(ExecutionNode, binding.items.get(event.item_id))
    if node is not None:
        b.put(EventVerb.UPDATED, items.with_output(node, event.delta, now), node_id=node.id)


async def _request(b: Batch, binding: TurnBinding, event: ev.RequestOpened, now: Any) -> None:
    if event.kind == "user_input" and not b.structured_questions:
        # No structured questions: the question is shown as a plain message, with nothing to answer.
        b.put(EventVerb.CREATED, items.question_as_message(binding, event.payload, now, new_id))
        b.unanswerable.append(event.request_ref)
        return
    run = await b.get(Run, binding.run_id)
    parent = _parent_of(binding, event.native_turn)
    outcome, request = request_rules.open_request(
        binding, run, parent, event.kind, event.request_ref, event.payload, now, new_id
    )
    binding.requests[event.request_ref] = request.id
    for change in outcome.changes:
        b.add(change)


async def _warning(b: Batch, binding: TurnBinding, event: ev.Warning, now: Any) -> None:
    b.add(_activity(binding.thread_id, ActivityKind.RUNTIME_WARNING, event.message, now, binding.run_id, None))


def _parent_of(binding: TurnBinding, native_turn: str) -> uuid.UUID:
    return binding.child_turns.get(native_turn, binding.root_node_id)


async def _item_started(b: Batch, binding: TurnBinding, event: ev.ItemStarted, now: Any) -> None:
    parent = _parent_of(binding, event.native_turn)
    node = items.item_node(binding, parent, event.kind, event.title, event.detail, now, new_id)
    binding.items[event.item_id] = node.id
    b.put(EventVerb.CREATED, node, node_id=node.id)
    if event.kind == "assistant_message":
        message = items.streaming_message(binding, node.id, now, new_id)
        binding.messages[event.item_id] = message.id
        b.put(EventVerb.CREATED, message, node_id=node.id)
    elif event.kind in ("tool_call", "file_change"):
        title = event.title or event.kind
        b.add(
            _activity(binding.thread_id, ActivityKind.TOOL_STARTED, title, now, binding.run_id, node.id, event.detail)
        )
    elif event.kind == "subagent":
        child = event.detail.get("childTurnId")
        if child:
            binding.child_turns[str(child)] = node.id
        title = event.title or "subagent"
        b.add(_activity(binding.thread_id, ActivityKind.SUBAGENT_STARTED, title, now, binding.run_id, node.id))
        await subagent_threads.spawned(b, binding, node, event.detail, now)  # its own provider thread, if any
    elif event.kind == "plan":
        plan = items.proposed_plan(binding, node.id, now, new_id)
        binding.todo_plans[node.id] = plan.id
        b.put(EventVerb.CREATED, plan, node_id=node.id)


async def _text(b: Batch, binding: TurnBinding, event: ev.TextDelta, now: Any) -> None:
    message = await b.get(ConversationMessage, binding.messages.get(event.item_id))
    if message is not None:
        b.put(
            EventVerb.UPDATED,
            message.evolve(text=message.text + event.delta, updated_at=now),
            node_id=message.node_id,
        )
        return
    node_id = binding.items.get(event.item_id)
    plan = await b.get(PlanArtifact, binding.todo_plans.get(node_id) if node_id else None)
    if plan is not None:
        b.put(EventVerb.UPDATED, plan.evolve(text=(plan.text or "") + event.delta, updated_at=now), node_id=node_id)


async def _item_completed(b: Batch, binding: TurnBinding, event: ev.ItemCompleted, now: Any) -> None:
    node = await b.get(ExecutionNode, binding.items.get(event.item_id))
    if node is None:
        return
    done = items.completed_item(node, event.status, event.detail, now)
    detail, status = done.detail or {}, done.status
    b.put(EventVerb.UPDATED, done, node_id=node.id)
    message = await b.get(ConversationMessage, binding.messages.get(event.item_id))
    if message is not None:
        text = event.text if event.text is not None else message.text
        b.put(EventVerb.UPDATED, message.evolve(text=text, streaming=False, updated_at=now), node_id=node.id)
    if event.kind == "tool_call":
        summary = f"{node.title} exited {detail.get('exitCode')}"
        b.add(
            _activity(
                binding.thread_id,
                ActivityKind.TOOL_COMPLETED,
                summary,
                now,
                binding.run_id,
                node.id,
                {"exitCode": detail.get("exitCode"), "status": status.value},
            )
        )
    elif event.kind == "file_change":
        b.add(
            _activity(
                binding.thread_id,
                ActivityKind.FILE_CHANGED,
                node.title or "files changed",
                now,
                binding.run_id,
                node.id,
                {"changes": detail.get("changes")},
            )
        )
    elif event.kind == "plan":
        plan = await b.get(PlanArtifact, binding.todo_plans.get(node.id))
        if plan is not None:
            text = event.text if event.text is not None else plan.text
            b.put(EventVerb.UPDATED, plan.evolve(text=text, updated_at=now), node_id=node.id)


async def _todo(b: Batch, binding: TurnBinding, event: ev.TodoUpdated, now: Any) -> None:
    node_id = _parent_of(binding, event.native_turn)
    todo = items.todo_items(event.items)
    plan = await b.get(PlanArtifact, binding.todo_plans.get(node_id))
    if plan is None:
        plan = items.todo_list(binding, node_id, todo, now, new_id)
        binding.todo_plans[node_id] = plan.id
        b.put(EventVerb.CREATED, plan, node_id=node_id)
    else:
        b.put(EventVerb.UPDATED, plan.evolve(items=todo, updated_at=now), node_id=node_id)
    done = sum(1 for i in todo if i["status"] == "completed")
    b.add(
        _activity(
            binding.thread_id,
            ActivityKind.PLAN_UPDATED,
            f"{done}/{len(todo)} steps done",
            now,
            binding.run_id,
            node_id,
            {"items": todo},
        )
    )


async def _usage(b: Batch, binding: TurnBinding, event: ev.UsageReported, now: Any) -> None:
    """One model call into the ledger, on the node whose turn made it; a call already recorded is skipped."""
    if event.call_ref in b.recorded_calls:
        return
    b.recorded_calls.add(event.call_ref)
    run = await b.get(Run, binding.run_id)
    model = event.model or run.model or b.pricing.default_model
    call = usage_rules.Call(
        thread_id=binding.thread_id,
        run_id=binding.run_id,
        attempt_id=binding.attempt_id,
        node_id=_parent_of(binding, event.native_turn),
        provider_instance_id=run.provider_instance_id,
    )
    found = usage_rules.record(
        call,
        event.call_ref,
        event.figures,
        model,
        event.cost_usd,
        b.pricing.prices,
        now,
        new_id(),
        in_turn_total=event.cost_in_turn_total,
    )
    b.put(EventVerb.CREATED, found, node_id=found.node_id)


def _activity(
    thread_id: uuid.UUID,
    kind: ActivityKind,
    summary: str,
    now: Any,
    run_id: uuid.UUID,
    node_id: uuid.UUID | None,
    payload: dict[str, Any] | None = None,
) -> Change:
    return activity(thread_id, kind, summary, now, new_id, run_id=run_id, node_id=node_id, payload=payload)


# What each kind of provider event does; other events (the turn's end, handled by the run) do nothing.
_HANDLERS: dict[type, Callable[[Batch, TurnBinding, Any, Any], Awaitable[None]]] = {
    ev.TurnStarted: _turn_started,
    ev.TurnCompleted: _turn_completed,
    ev.ItemStarted: _item_started,
    ev.TextDelta: _text,
    ev.OutputDelta: _output,
    ev.ItemCompleted: _item_completed,
    ev.TodoUpdated: _todo,
    ev.RequestOpened: _request,
    ev.Warning: _warning,
    ev.UsageReported: _usage,
}

"""Provider events become entities: the ingestor of one live runtime.

Events are handled in order. Text and output deltas are coalesced per thread and
written at most every 50 ms (or before the next structural event of that thread), so
a streamed reply costs a few transactions, not one per token. Events of a native
thread with no binding, or of an attempt that is no longer active, are dropped.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadloom.domain import items
from threadloom.domain import requests as request_rules
from threadloom.domain import runs as rules
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, EventVerb, Outcome
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
from threadloom.domain.statuses import (
    AttemptStatus,
    NodeStatus,
    RunStatus,
)
from threadloom.engine.checkpoints import Checkpoints
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.sessions import LiveSession, TurnBinding
from threadloom.providers import contract as ev
from threadloom.store import entities
from threadloom.store.db import Reader

log = logging.getLogger("threadloom.ingest")
COALESCE_SECONDS = 0.05
_TURN_STATUS = {"completed": RunStatus.COMPLETED, "failed": RunStatus.FAILED, "interrupted": RunStatus.INTERRUPTED}
Delta = ev.TextDelta | ev.OutputDelta


class _Batch:
    """Entities changed while applying some events in one transaction.

    Coalescing happens here: an entity changed several times in one batch (a message
    growing by fifty deltas) is written as one event with its latest state, at the place
    of its first change.
    """

    def __init__(self, db: Reader) -> None:
        self.db = db
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


class Ingestor:
    def __init__(
        self,
        pipeline: Pipeline,
        session: LiveSession,
        finish: Callable[..., Any],
        on_exit: Callable[[LiveSession, str], Any],
        checkpoints: Checkpoints | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.session = session
        self.finish = finish
        self.on_exit = on_exit
        self.checkpoints = checkpoints
        self.deltas: dict[str, list[Delta]] = {}
        self.first_delta_at: float | None = None
        self.structured_questions = session.runtime.capabilities.supports_structured_questions
        self.unanswerable: list[str] = []  # provider requests to release with an empty answer

    async def run(self) -> None:
        queue: asyncio.Queue[ev.ProviderEvent] = asyncio.Queue()

        async def pump() -> None:
            """Feed the queue; a stream that breaks off without RuntimeExited is made one (and closed)."""
            try:
                async for event in self.session.runtime.events():
                    await queue.put(event)
                    if isinstance(event, ev.RuntimeExited):
                        return
            except Exception:
                log.exception("the %s event stream failed", self.session.instance_id)
            with contextlib.suppress(Exception):
                await self.session.runtime.close()
            await queue.put(ev.RuntimeExited("the provider's event stream broke off"))

        pumper = asyncio.create_task(pump())
        try:
            while True:
                timeout = None
                if self.first_delta_at is not None:
                    timeout = max(0.0, self.first_delta_at + COALESCE_SECONDS - time.monotonic())
                try:
                    event = await asyncio.wait_for(queue.get(), timeout)
                except TimeoutError:
                    await self.flush_all()
                    continue
                try:
                    if await self.handle(event):
                        return
                except Exception:
                    log.exception("ingest failed on %s", type(event).__name__)
        finally:
            pumper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await pumper

    async def handle(self, event: ev.ProviderEvent) -> bool:
        """Apply one event; True when the runtime is gone."""
        if isinstance(event, ev.RuntimeExited):
            await self.flush_all()
            await self.on_exit(self.session, f"{event.reason} (exit code {event.exit_code})")
            return True
        if isinstance(event, ev.TextDelta | ev.OutputDelta):
            if event.native_thread in self.session.bindings:
                self.deltas.setdefault(event.native_thread, []).append(event)
                if self.first_delta_at is None:
                    self.first_delta_at = time.monotonic()
            return False
        native_thread = event.native_thread
        if native_thread is None or native_thread not in self.session.bindings:
            if isinstance(event, ev.RequestOpened):  # nobody can answer it: refuse, or the agent waits forever
                await self._refuse(event)
            log.debug("dropping %s for an unbound thread", type(event).__name__)
            return False
        binding = self.session.bindings[native_thread]
        await self.flush(native_thread)
        if (
            isinstance(event, ev.TurnCompleted)
            and event.parent_turn is None
            and (binding.native_turn is None or event.native_turn == binding.native_turn)
        ):
            self.session.unbind(native_thread)
            status = _TURN_STATUS.get(event.status, RunStatus.FAILED)
            hold = f"run failed: {event.error}" if status == RunStatus.FAILED else None
            await self.finish(
                binding.run_id,
                status,
                event.error if status != RunStatus.COMPLETED else None,
                hold_reason=hold,
                attempt_id=binding.attempt_id,
            )
            return False
        await self._apply(binding, [event])
        await self._scope_step(binding, event)
        while self.unanswerable:  # release the provider: it asked something nobody can answer here
            ref = self.unanswerable.pop()
            try:
                await self.session.runtime.respond_to_request(ref, {"answers": {}})
            except Exception:
                log.exception("could not release provider request %s", ref)
        return False

    async def _scope_step(self, binding: TurnBinding, event: ev.ProviderEvent) -> None:
        """A subagent's child scope: captured when its node starts and when it ends (after the event is
        recorded, outside its transaction)."""
        if self.checkpoints is None:
            return
        if isinstance(event, ev.ItemStarted) and event.kind == "subagent":
            node_id = binding.items.get(event.item_id)
            if node_id is not None:
                await self.checkpoints.node_started(node_id)
        elif isinstance(event, ev.ItemCompleted) and event.kind == "subagent":
            node_id = binding.items.get(event.item_id)
            if node_id is not None:
                await self.checkpoints.node_ended(node_id)
        elif isinstance(event, ev.TurnCompleted) and event.native_turn in binding.child_turns:
            await self.checkpoints.node_ended(binding.child_turns[event.native_turn])

    async def _refuse(self, event: ev.RequestOpened) -> None:
        response: dict[str, Any] = {"answers": {}} if event.kind == "user_input" else {"decision": "decline"}
        log.warning("declining %s request %s of unbound thread %s", event.kind, event.request_ref, event.native_thread)
        try:
            await self.session.runtime.respond_to_request(event.request_ref, response)
        except Exception:
            log.exception("could not decline provider request %s", event.request_ref)

    async def flush_all(self) -> None:
        for native_thread in list(self.deltas):
            await self.flush(native_thread)
        self.first_delta_at = None

    async def flush(self, native_thread: str) -> None:
        pending = self.deltas.pop(native_thread, None)
        if not self.deltas:
            self.first_delta_at = None
        binding = self.session.bindings.get(native_thread)
        if pending and binding is not None:
            await self._apply(binding, pending)

    async def _apply(self, binding: TurnBinding, events: list[Any]) -> None:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            batch = _Batch(db)
            attempt = await batch.get(RunAttempt, binding.attempt_id)
            if attempt is None or attempt.status not in (AttemptStatus.PENDING, AttemptStatus.RUNNING):
                return Outcome()  # late events of a superseded or finished attempt
            for event in events:
                await self._one(batch, binding, event, now)
            return batch.outcome

        await self.pipeline.execute(Command(command_type="ingest", decide=decide, thread_id=binding.thread_id))

    async def _one(self, b: _Batch, binding: TurnBinding, event: Any, now: Any) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            await handler(b, binding, event, now)

    @property
    def _handlers(self) -> dict[type, Callable[[_Batch, TurnBinding, Any, Any], Awaitable[None]]]:
        """What each kind of provider event does; other events (the turn's end, handled by the run) do nothing."""
        return {
            ev.TurnStarted: self._turn_started,
            ev.TurnCompleted: self._turn_completed,
            ev.ItemStarted: self._item_started,
            ev.TextDelta: self._text,
            ev.OutputDelta: self._output,
            ev.ItemCompleted: self._item_completed,
            ev.TodoUpdated: self._todo,
            ev.RequestOpened: self._request,
            ev.Warning: self._warning,
        }

    async def _turn_started(self, b: _Batch, binding: TurnBinding, event: ev.TurnStarted, now: Any) -> None:
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

    async def _turn_completed(self, b: _Batch, binding: TurnBinding, event: ev.TurnCompleted, now: Any) -> None:
        node = await b.get(ExecutionNode, binding.child_turns.get(event.native_turn))
        run = await b.get(Run, binding.run_id)
        if node is not None and not rules.completes_run(node, run):  # a child's end is only the child's
            status = items.ITEM_STATUS.get(event.status, NodeStatus.FAILED)
            b.put(EventVerb.UPDATED, node.evolve(status=status, updated_at=now, completed_at=now))
            summary = f"subagent turn {event.status}"
            b.add(_activity(binding.thread_id, ActivityKind.SUBAGENT_COMPLETED, summary, now, binding.run_id, node.id))

    async def _output(self, b: _Batch, binding: TurnBinding, event: ev.OutputDelta, now: Any) -> None:
        node = await b.get(ExecutionNode, binding.items.get(event.item_id))
        if node is not None:
            b.put(EventVerb.UPDATED, items.with_output(node, event.delta, now), node_id=node.id)

    async def _request(self, b: _Batch, binding: TurnBinding, event: ev.RequestOpened, now: Any) -> None:
        if event.kind == "user_input" and not self.structured_questions:
            # No structured questions: the question is shown as a plain message, with nothing to answer.
            b.put(EventVerb.CREATED, items.question_as_message(binding, event.payload, now, new_id))
            self.unanswerable.append(event.request_ref)
            return
        run = await b.get(Run, binding.run_id)
        parent = self._parent_of(binding, event.native_turn)
        outcome, request = request_rules.open_request(
            binding, run, parent, event.kind, event.request_ref, event.payload, now, new_id
        )
        binding.requests[event.request_ref] = request.id
        for change in outcome.changes:
            b.add(change)

    async def _warning(self, b: _Batch, binding: TurnBinding, event: ev.Warning, now: Any) -> None:
        b.add(_activity(binding.thread_id, ActivityKind.RUNTIME_WARNING, event.message, now, binding.run_id, None))

    def _parent_of(self, binding: TurnBinding, native_turn: str) -> uuid.UUID:
        return binding.child_turns.get(native_turn, binding.root_node_id)

    async def _item_started(self, b: _Batch, binding: TurnBinding, event: ev.ItemStarted, now: Any) -> None:
        parent = self._parent_of(binding, event.native_turn)
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
                _activity(
                    binding.thread_id, ActivityKind.TOOL_STARTED, title, now, binding.run_id, node.id, event.detail
                )
            )
        elif event.kind == "subagent":
            child = event.detail.get("childTurnId")
            if child:
                binding.child_turns[str(child)] = node.id
            title = event.title or "subagent"
            b.add(_activity(binding.thread_id, ActivityKind.SUBAGENT_STARTED, title, now, binding.run_id, node.id))
        elif event.kind == "plan":
            plan = items.proposed_plan(binding, node.id, now, new_id)
            binding.todo_plans[node.id] = plan.id
            b.put(EventVerb.CREATED, plan, node_id=node.id)

    async def _text(self, b: _Batch, binding: TurnBinding, event: ev.TextDelta, now: Any) -> None:
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

    async def _item_completed(self, b: _Batch, binding: TurnBinding, event: ev.ItemCompleted, now: Any) -> None:
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

    async def _todo(self, b: _Batch, binding: TurnBinding, event: ev.TodoUpdated, now: Any) -> None:
        node_id = self._parent_of(binding, event.native_turn)
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

"""The subscription fast path: cohorts of alike subscriptions, each event executed and encoded once.

Subscriptions of `threadEvents` or `activities` with the same document, operation, filter
arguments and visibility (the token's project) form a *cohort*. The cohort is a sink of the
thread's feed (`streams.hub`): each log row becomes the subscription's item, is executed once
against the document — or, for selections of `ThreadEvent`'s own scalar fields, built directly —
and encoded once; every member's socket gets the same JSON with only its operation id spliced
in front. An idle member holds no task and no queue of its own: its socket has one writer task
and one bounded queue for all its fast subscriptions.

A joining subscriber enters its cohort first, holding live rows aside, replays the log after
its cursor (from the feed's memory when it reaches back that far, else from the database in
pages), sends `synchronized`, then the held rows that come after its replay: gapless and exactly
once, as on the general path. A socket whose queue overflows ends those subscriptions with
SUBSCRIBER_TOO_SLOW and the cursor of the last event it was sent.

Anything else — other subscriptions, documents with directives or with variables below the
root field, invisible threads, bad arguments, `THREADLOOM_FAST_PATHS=0` — takes the general path
(Strawberry's execution per operation), which also reports every error. Both paths send the
same bytes; tests/test_fast_paths.py compares them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import inspect
import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import orjson
from graphql import (
    DocumentNode,
    FieldNode,
    GraphQLError,
    OperationDefinitionNode,
    OperationType,
    Visitor,
    parse,
    validate,
    visit,
)
from graphql.execution.values import get_argument_values

from threadloom import metrics
from threadloom.api import ids as gid
from threadloom.api.bounds import big, inline
from threadloom.api.errors import CodedErrors
from threadloom.api.subscriptions import THREAD_SUBSCRIPTIONS, row_filter, stream_ended, thread_event_head
from threadloom.api.validation import all_rules
from threadloom.store import events as log_reader
from threadloom.store.events import LogEvent
from threadloom.streams.budget import QueueAccount, utf8_size
from threadloom.streams.hub import Feed
from threadloom.streams.merge import (
    PAGE,
    EventUnreadable,
    GoingAway,
    ReloadRequired,
    StreamEnded,
    Synchronized,
    TooSlow,
)

if TYPE_CHECKING:
    from threadloom.api.token_guard import GuardedTransportWSHandler

log = logging.getLogger("threadloom.api.cohorts")
PLAN_CACHE = 512

# ThreadEvent's scalar fields and how each is serialised (as graphql-core would).
_THREAD_EVENT_FIELDS: dict[str, Callable[[Any], Any]] = {
    "sequence": lambda e: e.sequence,
    "type": lambda e: e.type,
    "runId": lambda e: None if e.run_id is None else str(e.run_id),
    "nodeId": lambda e: None if e.node_id is None else str(e.node_id),
    "occurredAt": lambda e: None if e.occurred_at is None else e.occurred_at.isoformat(),
    "cursor": lambda e: e.cursor,
    "__typename": lambda e: "ThreadEvent",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    """A document the fast path serves: its root field and, when it can, a direct builder."""

    query: str
    operation_name: str | None
    document: DocumentNode
    root: FieldNode
    field: str
    build: Callable[[Any], dict[str, Any]] | None  # item → `data`; None: execute the document


class _Plain(Visitor):
    """Finds what the fast path does not serve below the root field: variables and directives."""

    def __init__(self) -> None:
        super().__init__()
        self.plain = True

    def enter_variable(self, *_: Any) -> None:
        self.plain = False

    def enter_directive(self, *_: Any) -> None:
        self.plain = False


def _compile(plan_root: FieldNode, field: str) -> Callable[[Any], dict[str, Any]] | None:
    """A builder for `threadEvents { <ThreadEvent scalars> }`, or None."""
    selection_set = plan_root.selection_set
    if field != "threadEvents" or selection_set is None:
        return None
    getters: list[tuple[str, Callable[[Any], Any]]] = []
    for selection in selection_set.selections:
        if not isinstance(selection, FieldNode) or selection.selection_set is not None or selection.arguments:
            return None
        getter = _THREAD_EVENT_FIELDS.get(selection.name.value)
        if getter is None:
            return None
        getters.append(((selection.alias or selection.name).value, getter))
    key = (plan_root.alias or plan_root.name).value

    def build(item: Any) -> dict[str, Any]:
        return {key: {name: get(item) for name, get in getters}}

    return build


class Plans:
    """Parsed and validated documents the fast path serves, by (query, operation name); None: it does not."""

    def __init__(self, schema: Any, limits: Any) -> None:
        self.schema = schema
        self.limits = limits
        self._plans: collections.OrderedDict[tuple[str, str | None], Plan | None] = collections.OrderedDict()

    def get(self, query: str, operation_name: str | None) -> Plan | None:
        key = (query, operation_name)
        if key in self._plans:
            self._plans.move_to_end(key)
            return self._plans[key]
        plan = self._make(query, operation_name)
        self._plans[key] = plan
        if len(self._plans) > PLAN_CACHE:
            self._plans.popitem(last=False)
        return plan

    def _make(self, query: str, operation_name: str | None) -> Plan | None:
        if big(query):
            return None  # the general path parses, pre-checks and validates it off the event loop
        try:
            document = parse(query, max_tokens=self.limits.max_tokens)
        except GraphQLError:
            return None
        operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
        if len(operations) != 1 or (operation_name is not None and operations[0].name is None):
            return None
        operation = operations[0]
        if operation_name is not None and operation.name is not None and operation.name.value != operation_name:
            return None
        if operation.operation != OperationType.SUBSCRIPTION or operation.directives:
            return None
        if len(operation.selection_set.selections) != 1 or len(document.definitions) != 1:
            return None  # fragments: the general path
        root = operation.selection_set.selections[0]
        if not isinstance(root, FieldNode) or root.directives or root.name.value not in THREAD_SUBSCRIPTIONS:
            return None
        plain = _Plain()
        if root.selection_set is not None:
            visit(root.selection_set, plain)
        if not plain.plain or not inline(document, query):
            return None  # the general path refuses it or validates it off the event loop
        if validate(self.schema._schema, document, all_rules(self.limits)):
            return None
        field = root.name.value
        return Plan(query, operation_name, document, root, field, _compile(root, field))


class Cohort:
    """Alike subscriptions of one thread: one rendering per event for all members."""

    def __init__(self, key: tuple[Any, ...], plan: Plan, feed: Feed[uuid.UUID], executor: Any, schema: Any) -> None:
        self.key = key
        self.plan = plan
        self.feed = feed
        self.executor = executor
        self.schema = schema
        to_item, entity_type = THREAD_SUBSCRIPTIONS[plan.field]
        # A built selection never reads the entity or the payload: neither is made nor read.
        self.light = plan.build is not None
        self.to_item = thread_event_head if self.light else to_item
        self.entity_type = entity_type
        self.match: Callable[[LogEvent], bool] = lambda row: True
        self.members: dict[Member, None] = {}

    async def render(self, item: Any) -> str | None:
        """The `payload` JSON of a `next` message for an item (None: the subscription skips it)."""
        if item is None:
            return None
        if self.plan.build is not None:
            return orjson.dumps({"data": self.plan.build(item)}).decode()
        result = self.executor.build_per_event_executor(item).execute_operation(False)
        if inspect.isawaitable(result):
            result = await result
        payload: dict[str, Any] = {"data": result.data}
        if result.errors:
            self.schema.process_errors(result.errors)
            payload["errors"] = [e.formatted for e in CodedErrors()._process_errors(list(result.errors))]
        return orjson.dumps(payload).decode()

    async def deliver(self, row: LogEvent) -> None:
        if not self.members or not self.match(row):
            return
        try:
            payload = await self.render(self.to_item(row))
        except Exception:
            log.exception("event %s of thread %s could not be rendered", row.sequence, row.thread_id)
            for member in list(self.members):
                member.end_with(EventUnreadable(member.last))
            return
        if payload is not None:
            metrics.DELIVERED_FAST.inc(len(self.members))  # once per event, not per member
            size = utf8_size(payload)  # once per event: every member queues the same payload
            for member in list(self.members):
                member.offer(row.sequence, payload, size)


class Member:
    """One fast subscription: its frame prefix, the rows held aside while it replays, its last sent sequence,
    and the account of the bytes queued for it (the held rows and its frames in the socket's queue)."""

    __slots__ = (
        *("account", "closed", "cohort", "handler", "id", "last", "outbox"),
        *("overflowed", "pending", "prefix", "sent", "task"),
    )

    def __init__(
        self,
        handler: GuardedTransportWSHandler,
        operation_id: str,
        cohort: Cohort,
        outbox: Outbox,
        account: QueueAccount,
    ) -> None:
        self.handler = handler
        self.id = operation_id
        self.cohort = cohort
        self.outbox = outbox
        self.account = account
        self.prefix = '{"id":' + orjson.dumps(operation_id).decode() + ',"type":"next","payload":'
        self.pending: list[tuple[int, str, int]] | None = []
        self.overflowed = False
        self.sent = 0  # the last sequence written to the socket
        self.last = 0  # the last sequence handed to the socket's queue: the replay may run ahead of the feed
        self.closed = False
        self.task: asyncio.Task[None] | None = None

    def frame(self, payload: str) -> str:
        return self.prefix + payload + "}"

    def frame_size(self, payload_size: int) -> int:
        """The encoded size of `frame(payload)` for a payload of `payload_size` bytes (the prefix is ASCII
        but for the operation id, which the client chose and is counted as sent)."""
        return utf8_size(self.prefix) + payload_size + 1

    def offer(self, sequence: int, payload: str, size: int) -> None:
        """Queue the payload (`size` bytes, encoded) of a live event for this subscription, or hold it while the
        replay runs; past the frame or byte bound the subscription is ended with SUBSCRIBER_TOO_SLOW."""
        if self.closed or sequence <= self.last:
            return
        if self.pending is None:
            self.last = sequence
            self.outbox.push(self, sequence, payload, self.frame_size(size))
        elif self.overflowed:
            return
        elif len(self.pending) >= self.outbox.limit or not self.account.take(self.frame_size(size)):
            metrics.DROPPED_FAST.inc(len(self.pending) + 1)
            self.overflowed = True
            self.pending.clear()
            self.account.clear()
        else:
            self.pending.append((sequence, payload, size))

    def close(self) -> None:
        """Leave the cohort and stop replaying (the client completed, the socket closed, or the server ended it)."""
        if self.closed:
            return
        self.closed = True
        self.handler.guard.cohorts.leave(self)
        self.outbox.members -= 1
        if self.pending:  # held rows of a replay that will not finish
            self.pending.clear()
            self.account.clear()
        if self.task is not None and not self.task.done():
            self.task.cancel()

    def end(self, *messages: str) -> None:
        """End this subscription from the server side: leave, then send its last messages and `complete`."""
        operations: dict[str, Any] = self.handler.operations
        if operations.get(self.id) is self:
            del operations[self.id]
        self.close()
        for message in messages:
            self.outbox.control(message)
        self.outbox.control('{"id":' + orjson.dumps(self.id).decode() + ',"type":"complete"}')

    def end_too_slow(self, resume_from: int) -> None:
        self.end_with(TooSlow(resume_from))

    def end_with(self, ended: StreamEnded) -> None:
        """End with the error item that tells the client why and where to resume."""
        error = stream_ended(ended).formatted
        self.end(self.frame(orjson.dumps({"data": None, "errors": [error]}).decode()))


class Outbox:
    """A socket's queue of fast-path frames and its one writer task.

    Frames go out in the order pushed. A subscription's frame is queued as the payload its cohort
    rendered once (shared by every member, on every socket) and framed when it is written, but each
    member's account counts the whole frame's encoded size (streams.budget): a member whose queued
    bytes would pass THREADLOOM_SUBSCRIBER_QUEUE_BYTES, or its token's THREADLOOM_TOKEN_QUEUE_BYTES,
    has its queued frames dropped and ends with SUBSCRIBER_TOO_SLOW and the last sequence it was sent.
    When the queue holds more than `limit` frames per subscription of the socket, the whole socket is too
    slow: its queued frames are dropped and each subscription that lost frames ends the same way.

    The writer sends one frame at a time and waits while the socket's transport is over its write
    buffer's high-water mark (uvicorn's websockets-sansio protocol pauses `send` until the peer reads:
    asyncio's 64 KiB by default), so what a socket that does not read holds beyond this queue is at most
    that mark plus one frame.
    """

    def __init__(self, handler: GuardedTransportWSHandler, limit: int) -> None:
        self.handler = handler
        self.limit = limit
        self.members = 0
        # (member or None for control frames, sequence, payload or whole frame, counted bytes)
        self.queue: collections.deque[tuple[Member | None, int, str, int]] = collections.deque()
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def push(self, member: Member, sequence: int, payload: str, size: int, *, control: bool = False) -> None:
        """Queue a subscription's frame (`payload` framed when written, `size` its encoded bytes). A `control`
        frame (the `synchronized` marker) is never refused."""
        if control:
            member.account.force(size)
        elif len(self.queue) >= self.limit * max(1, self.members):
            self._overflow()
            return
        elif not member.account.take(size):
            self._cut(member)
            return
        self.queue.append((member, sequence, payload, size))
        self._started()

    def control(self, frame: str) -> None:
        """Queue a whole message of the protocol (an error item, `complete`): small, never refused, not counted."""
        self.queue.append((None, 0, frame, 0))
        self._started()

    def _started(self) -> None:
        if self.task is None:
            self.task = asyncio.create_task(self._write(), name="ws-outbox")
        self.wake.set()

    def _too_slow(self, behind: list[Member], dropped: int) -> None:
        metrics.DROPPED_FAST.inc(dropped + 1)  # and the frame that did not fit
        metrics.SLOW_CONSUMERS.inc(len(behind))
        metrics.error("SUBSCRIBER_TOO_SLOW", len(behind))  # as the general path's error items count
        for member in behind:
            member.end_too_slow(member.sent)

    def _cut(self, member: Member) -> None:
        """The member would pass its byte bound: its queued frames go, and it ends with SUBSCRIBER_TOO_SLOW."""
        queued = len(self.queue)
        self.queue = collections.deque(item for item in self.queue if item[0] is not member)
        member.account.clear()
        self._too_slow([member], queued - len(self.queue))

    def _overflow(self) -> None:
        behind = list({member: None for member, _, _, _ in self.queue if member is not None})
        queued = len(self.queue)
        self.queue = collections.deque(item for item in self.queue if item[0] is None)
        for member in behind:
            member.account.clear()
        self._too_slow(behind, queued - len(self.queue))

    async def send(self, frame: str) -> None:
        await self.handler.websocket.ws.send_text(frame)  # type: ignore[attr-defined]

    async def _write(self) -> None:
        with contextlib.suppress(Exception):  # the socket closed: the handler's shutdown cleans up
            while True:
                while self.queue:
                    member, sequence, text, size = self.queue.popleft()
                    if member is not None:  # taken off the queue: it goes out even if the socket is ended
                        member.sent = sequence
                        member.account.give(size)
                        text = member.frame(text)
                    await self.send(text)
                self.wake.clear()
                await self.wake.wait()

    def stop(self) -> None:
        """The socket is gone: nothing more goes out, and what was queued no longer counts."""
        if self.task is not None:
            self.task.cancel()
        for member, _, _, size in self.queue:
            if member is not None:
                member.account.give(size)
        self.queue.clear()


class Cohorts:
    """This process's cohorts, by (document, thread, filters, visibility), and the fast path's entry."""

    def __init__(self, limits: Any) -> None:
        self.limits = limits
        self.schema: Any = None
        self.plans: Plans | None = None
        self.cohorts: dict[tuple[Any, ...], Cohort] = {}
        self.closing = False

    def going_away(self) -> None:
        """Shutdown: every member ends after what its socket's queue holds, with the sequence to resume after."""
        self.closing = True
        for cohort in list(self.cohorts.values()):
            for member in list(cohort.members):
                member.end_with(GoingAway(member.last))

    def plan(self, handler: GuardedTransportWSHandler, message: Any) -> Plan | None:
        """The plan of a `subscribe` message the fast path may serve (arguments not yet checked)."""
        context = handler.context
        payload = message.get("payload")
        query = payload.get("query") if isinstance(payload, dict) else None
        if not context.services.settings.fast_paths or context.live is None or not isinstance(query, str):
            return None
        operation_name = payload.get("operationName")
        if self.plans is None:
            self.schema, self.plans = handler.schema, Plans(handler.schema, self.limits)
        variables = payload.get("variables")
        if not (variables is None or isinstance(variables, dict)):
            return None
        return self.plans.get(query, operation_name if isinstance(operation_name, str) else None)

    def serves(self, handler: GuardedTransportWSHandler, message: Any) -> bool:
        return self.plan(handler, message) is not None

    async def subscribe(self, handler: GuardedTransportWSHandler, message: Any) -> bool:
        """Serve a `subscribe` message on the fast path; False: the general path must serve it."""
        context = handler.context
        live = context.live
        plan = self.plan(handler, message)
        if plan is None or live is None or self.closing:
            return False  # while shutting down the general path replays, then ends with SERVER_GOING_AWAY
        variables = message["payload"].get("variables")
        executor = self.schema.execution_context_class.build(
            self.schema._schema, plan.document, None, context, variables, plan.operation_name
        )
        if isinstance(executor, list):
            return False  # variables the general path reports
        field_def = self.schema._schema.subscription_type.fields[plan.field]
        try:
            args = get_argument_values(field_def, plan.root, executor.variable_values)
        except GraphQLError:
            return False
        thread = gid.maybe_as(_arg(args, "threadId", "thread_id"), "Thread")
        after = _arg(args, "afterSequence", "after_sequence")
        if thread is None or (after is not None and after < 0) or any(_arg(args, *name) for name in _GENERAL_ONLY):
            return False  # a view of a project, a subtree or a cursor: the general path (api.stream_scopes)
        hub = live.hub
        feed = await hub.ready_thread_feed(thread)
        if feed.project_id is None or not context.principal.sees(feed.project_id):
            hub.release_if_idle(thread)
            return False  # NOT_FOUND, from the general path
        run_id, node_id = _arg(args, "runId", "run_id"), _arg(args, "nodeId", "node_id")
        key = (plan.query, plan.operation_name, thread, run_id, node_id, context.principal.project_id)
        cohort = self.cohorts.get(key)
        if cohort is None:
            cohort = self.cohorts[key] = Cohort(key, plan, feed, executor, self.schema)
            cohort.match = row_filter(run_id, node_id, cohort.entity_type)
            feed.sinks.add(cohort)
        outbox = handler.outbox(self.limits.subscriber_queue)
        member = Member(handler, message["id"], cohort, outbox, hub.budget.account(context.principal.token_id))
        member.last = after or 0  # what the client has: ended before its replay sends anything, it resumes here
        cohort.members[member] = None
        outbox.members += 1
        handler.operations[member.id] = member  # type: ignore[assignment]
        metrics.OPERATIONS.labels(metrics.operation_label(plan.operation_name), "subscription").inc()
        member.task = asyncio.create_task(self._replay(member, feed, after), name="ws-replay")
        return True

    def leave(self, member: Member) -> None:
        cohort = member.cohort
        cohort.members.pop(member, None)
        if not cohort.members and self.cohorts.get(cohort.key) is cohort:
            del self.cohorts[cohort.key]
            cohort.feed.sinks.discard(cohort)
            cohort.feed.hub.release_if_idle(cohort.feed.key)

    async def _replay(self, member: Member, feed: Feed[uuid.UUID], after: int | None) -> None:
        try:
            await self._catch_up(member, feed, after or 0)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("fast-path replay failed after sequence %s", member.last)
            member.end_with(EventUnreadable(member.last))
        finally:
            member.task = None

    async def _catch_up(self, member: Member, feed: Feed[uuid.UUID], last: int) -> None:
        cohort, outbox = member.cohort, member.outbox
        max_replay = self.limits.max_replay
        remembered = feed.recent_after(last)
        if remembered is not None:
            latest = max(last, feed.cursor)
            if latest - last > max_replay:
                await self._reload(member, latest)
                return
            metrics.REPLAYED.inc(len(remembered))
            for row in remembered:
                await self._send_row(member, row)
            last = latest
        else:
            db = feed.hub.db
            async with db.read() as reader:
                latest = await log_reader.latest_sequence(reader, feed.key)
            if latest - last > max_replay:
                await self._reload(member, latest)
                return
            while True:
                page = log_reader.thread_event_heads if cohort.light else log_reader.thread_events
                async with db.read() as reader:
                    rows = await page(reader, feed.key, last, limit=PAGE)
                metrics.REPLAYED.inc(len(rows))
                for row in rows:
                    last = row.sequence
                    await self._send_row(member, row)
                if len(rows) < PAGE:
                    break
        marker = await cohort.render(cohort.to_item(Synchronized(last)))
        # From here on no await: the held rows go out behind the marker, then the member is live.
        held, member.pending = member.pending or [], None
        member.account.clear()  # the held rows are counted again as they are queued
        member.sent = member.last = last
        if member.overflowed:
            metrics.SLOW_CONSUMERS.inc()
            metrics.error("SUBSCRIBER_TOO_SLOW")
            member.end_too_slow(last)
            return
        if marker is not None:
            outbox.push(member, last, marker, member.frame_size(utf8_size(marker)), control=True)
        for sequence, payload, size in held:
            member.offer(sequence, payload, size)

    async def _send_row(self, member: Member, row: LogEvent) -> None:
        cohort = member.cohort
        if cohort.match(row):
            payload = await cohort.render(cohort.to_item(row))
            if payload is not None:
                await member.outbox.send(member.frame(payload))
        member.last = row.sequence  # sent (or filtered out): a replay ended now resumes after it

    async def _reload(self, member: Member, latest: int) -> None:
        marker = await member.cohort.render(member.cohort.to_item(ReloadRequired(latest)))
        member.end(*([member.frame(marker)] if marker is not None else []))


# Arguments whose views only the general path serves.
_GENERAL_ONLY = (("projectId", "project_id"), ("includeDescendants", "include_descendants"), ("after", "after"))


def _arg(args: dict[str, Any], name: str, python_name: str) -> Any:
    return args.get(name, args.get(python_name))

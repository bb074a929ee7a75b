"""Subscriptions (their names are part of the public API) over graphql-transport-ws.

Every item carries its `sequence`, `runId` and `nodeId`. Access is checked when a
subscription starts; an invisible or unknown thread is NOT_FOUND, exactly as a query.
A subscriber that falls behind is ended with SUBSCRIBER_TOO_SLOW and the cursor to
resume from, and every subscription of a server shutting down with SERVER_GOING_AWAY and
its cursor; a replay over the configured bound gets a `reload_required` item.
"""

from __future__ import annotations

import enum
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from datetime import datetime
from typing import Annotated, Any, Union

import strawberry
from graphql import GraphQLError

from threadloom.api import enums, vocab
from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.errors import ApiError
from threadloom.api.feed_cursor import decode_feed_cursor, encode_feed_cursor
from threadloom.api.stream_scopes import ViewArgs, resolve_view, stream_view
from threadloom.api.types import NODE_TYPES, Activity, ExecutionNode, Run, Thread, link
from threadloom.api.usage import Usage, load_usage
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.store import events as log_reader
from threadloom.store import graph_reads
from threadloom.store import tables as t
from threadloom.store.events import LogEvent
from threadloom.streams.merge import (
    FeedReloadRequired,
    FeedSynchronized,
    ReloadRequired,
    StreamEnded,
    Synchronized,
    TooSlow,
    project_stream,
    thread_stream,
)
from threadloom.streams.views import NodeShape, ViewMatch, graph_change, ordered_graph

_BY_ENTITY_TYPE = {cls._record.entity_type: cls for cls in NODE_TYPES.values()}
Entity = Annotated[Union[tuple(NODE_TYPES.values())], strawberry.union("Entity")]  # type: ignore[valid-type]  # noqa: UP007

# The longest text an entity carries in a subscription frame, in characters. Each event of an item
# carries its whole state (a streamed message its text so far, a tool call its output so far, itself
# kept to the last 64 KiB on the node): without a cap one frame could be megabytes, and a subscriber
# that does not read would hold them all. A longer text (a message, a `detail` field) is cut to its first
# STREAM_TEXT_MAX characters, so a client that takes the growth of a text as its delta keeps working
# up to the cap, and the event says `truncated: true`; the query API (`node(id:)`) has the whole text.
STREAM_TEXT_MAX = 64 * 1024
_CUT_DEPTH = 4  # nested JSON (`detail`) is walked this deep; a deeper text is left as it is


def _capped(value: Any, depth: int = 0) -> tuple[Any, bool]:
    """`value` with every text longer than STREAM_TEXT_MAX cut to it, and whether one was cut
    (the same object when nothing was: the common case copies nothing)."""
    if isinstance(value, str):
        return (value[:STREAM_TEXT_MAX], True) if len(value) > STREAM_TEXT_MAX else (value, False)
    if depth >= _CUT_DEPTH:
        return value, False
    if isinstance(value, dict):
        cut: dict[Any, Any] | None = None
        for key, item in value.items():
            capped, was_cut = _capped(item, depth + 1)
            if was_cut:
                cut = cut if cut is not None else dict(value)
                cut[key] = capped
        return (value, False) if cut is None else (cut, True)
    if isinstance(value, list):
        pairs = [_capped(item, depth + 1) for item in value]
        return ([v for v, _ in pairs], True) if any(c for _, c in pairs) else (value, False)
    return value, False


def _entity(row: LogEvent) -> Any:
    """The GraphQL object of the row's entity, built once per row for all subscribers, its texts capped
    to STREAM_TEXT_MAX (`row.shared["truncated"]` says whether one was cut)."""
    found = row.shared.get("entity")
    if found is None:
        cls = _BY_ENTITY_TYPE[row.entity_type]
        payload, row.shared["truncated"] = _capped(dict(row.payload))
        if row.entity_type == "thread":
            payload["last_sequence"] = row.sequence
        found = row.shared["entity"] = strawberry.cast(cls, cls.from_row(payload))
    return found


def _gid(type_name: str, value: uuid.UUID | None) -> strawberry.ID | None:
    return None if value is None else strawberry.ID(gid.encode(type_name, value))


@strawberry.type(description="One event of a thread's log, or a marker (`synchronized`, `reload_required`).")
class ThreadEvent:
    sequence: int
    type: str = strawberry.field(description="The event name (`run.updated`, `node.created` …) or a marker.")
    run_id: strawberry.ID | None
    node_id: strawberry.ID | None
    occurred_at: datetime | None
    entity: Entity | None  # type: ignore[valid-type]
    truncated: bool = strawberry.field(
        default=False,
        description="A text of `entity` was longer than 65,536 characters and is cut to its first 65,536 in this "
        "event (a stream frame's bound); read the whole entity by query (`node(id:)`).",
    )
    cursor: str | None = strawberry.field(
        default=None,
        description="Where this item is in the log: pass it as `after` to resume right after it (any scope: "
        "project, thread, run or node). Set on every event, and on a project-wide stream's markers; null on a "
        "thread's markers (resume those with `afterSequence: sequence`).",
    )
    thread_uuid: strawberry.Private[uuid.UUID | None] = None

    @strawberry.field(description="The event's name as an enum; null only for a name this server does not know.")
    def event_type(self) -> vocab.ThreadEventType | None:
        return vocab.thread_event_type(self.type)

    @strawberry.field(description="The thread whose log holds the event; null for a marker.")
    def thread(self, info: Info) -> Thread | None:
        return link(info, "Thread", self.thread_uuid)  # type: ignore[no-any-return]

    @strawberry.field(description="The run the event belongs to, if any.")
    def run(self, info: Info) -> Run | None:
        return link(info, "Run", gid.maybe_as(self.run_id, "Run") if self.run_id else None)  # type: ignore[no-any-return]

    @strawberry.field(description="The execution node the event belongs to, if any.")
    def node(self, info: Info) -> ExecutionNode | None:
        found = gid.maybe_as(self.node_id, "ExecutionNode") if self.node_id else None
        return link(info, "ExecutionNode", found)  # type: ignore[no-any-return]


@strawberry.enum(
    description="What an `executionGraph` item is: SNAPSHOT, a node as it is when the subscription starts; CHANGE, "
    "a node was made or its status, kind, parent or times moved; SYNCHRONIZED, the client holds the whole graph; "
    "USAGE, a model call of the node was recorded (its `usage` has grown; sent only when `usage` is selected)."
)
class ExecutionGraphItemType(enum.StrEnum):
    SNAPSHOT = "snapshot"
    CHANGE = "change"
    SYNCHRONIZED = "synchronized"
    USAGE = "usage"


@strawberry.type(
    description="One item of a run's execution graph, keyed by `nodeId`: a node's state (the whole graph first, "
    "then each change), or the `synchronized` marker."
)
class ExecutionGraphEvent:
    sequence: int = strawberry.field(
        description="The thread's log sequence of the change (of the snapshot, for its items): resume with "
        "`afterSequence: sequence`."
    )
    type: ExecutionGraphItemType
    node_id: strawberry.ID | None = strawberry.field(description="The node (the key); null on the marker.")
    parent_node_id: strawberry.ID | None = strawberry.field(description="The node's parent; null for a root.")
    kind: enums.NodeKind | None = strawberry.field(description="The node's kind.")
    status: enums.NodeStatus | None = strawberry.field(description="The node's status.")
    created_at: datetime | None = strawberry.field(description="When the node was made.")
    updated_at: datetime | None = strawberry.field(description="When the node last changed (as of this item).")
    completed_at: datetime | None = strawberry.field(description="When the node ended; null while it runs.")
    node: ExecutionNode | None = strawberry.field(description="The whole node as of this item.")
    node_uuid: strawberry.Private[uuid.UUID | None] = None

    @strawberry.field(
        description="What the node's subtree has used and cost so far (read when the item is sent); null on the marker."
    )
    async def usage(self, info: Info) -> Usage | None:
        return None if self.node_uuid is None else await load_usage(info, "nodes", self.node_uuid)


def _graph_item(sequence: int, kind: ExecutionGraphItemType, row: LogEvent | None) -> ExecutionGraphEvent:
    if row is None:
        return ExecutionGraphEvent(
            sequence=sequence,
            type=kind,
            node_id=None,
            parent_node_id=None,
            kind=None,
            status=None,
            created_at=None,
            updated_at=None,
            completed_at=None,
            node=None,
        )
    node = _entity(row)
    rec = node.rec
    return ExecutionGraphEvent(
        sequence=sequence,
        type=kind,
        node_id=node.id,
        parent_node_id=_gid("ExecutionNode", rec.parent_node_id),
        kind=rec.kind,
        status=rec.status,
        created_at=rec.created_at,
        updated_at=rec.updated_at,
        completed_at=rec.completed_at,
        node=node,
        node_uuid=rec.id,
    )


async def _execution_graph(info: Info, run_id: str, after_sequence: int | None) -> AsyncIterator[ExecutionGraphEvent]:
    """The run's graph as of now (or its state at `afterSequence`, kept on the server), then each change that
    `streams.views.graph_change` says a drawing shows, in log order."""
    run = gid.maybe_as(run_id, "Run")
    after = _after(after_sequence)
    live = _live(info)
    principal = info.context.principal
    async with live.db.read() as db:
        place = None if run is None else await graph_reads.run_place(db, run)
        if place is None or run is None or not principal.sees(place.project_id):
            raise ApiError(not_found("runId"))
        latest = await log_reader.latest_sequence(db, place.thread_id)
        snapshot = after is None or latest - after > live.limits.max_replay
        upto = latest if snapshot or after is None else after
        states = await graph_reads.node_states(db, place.thread_id, run, upto)
    by_id = {row.entity_id: row for row in states}
    known = {node_id: NodeShape.of(_entity(row).rec) for node_id, row in by_id.items()}
    if snapshot:
        for rec in ordered_graph(_entity(row).rec for row in states):
            yield _graph_item(upto, ExecutionGraphItemType.SNAPSHOT, by_id[rec.id])
    # Other rows of the run are read only when items for recorded calls are wanted (`usage` selected).
    match = ViewMatch(
        principal.sees, entity_type=None if _selects_usage(info) else "execution_node", run=run, home=place.project_id
    )
    stream = thread_stream(
        live.hub, live.db, place.thread_id, upto, match, max_replay=live.limits.max_replay, token=principal.token_id
    )
    try:
        async for item in stream:
            if isinstance(item, Synchronized):
                yield _graph_item(item.sequence, ExecutionGraphItemType.SYNCHRONIZED, None)
            elif isinstance(item, ReloadRequired):  # more than the bound committed since the read above
                raise TooSlow(upto)
            elif item.entity_type == "usage_record":  # a call of a node: its usage grew
                made_by = by_id.get(_uuid_of(item.payload.get("node_id")) or uuid.UUID(int=0))
                if made_by is not None:
                    yield _graph_item(item.sequence, ExecutionGraphItemType.USAGE, made_by)
            elif item.entity_type == "execution_node":
                by_id[item.entity_id] = item
                shape = NodeShape.of(_entity(item).rec)
                if graph_change(known, item.entity_id, shape):
                    known[item.entity_id] = shape
                    yield _graph_item(item.sequence, ExecutionGraphItemType.CHANGE, item)
    except StreamEnded as error:
        raise stream_ended(error) from None


@strawberry.type
class RunStatusUpdate:
    sequence: int
    run: Run
    status: enums.RunStatus

    @strawberry.field(
        description="What the run has used and cost so far (read when the item is sent). A subscription that selects "
        "it also gets an item whenever a model call of the run is recorded, with the status unchanged."
    )
    async def usage(self, info: Info) -> Usage:
        return await load_usage(info, "runs", self.run.rec.id)


def _selects_usage(info: Info) -> bool:
    """Whether the subscription's document selects `usage` on its items: only then are items sent for recorded
    model calls (a client following statuses alone sees the statuses as before)."""
    pending = [s for field in info.selected_fields for s in field.selections]
    while pending:
        selection = pending.pop()
        if getattr(selection, "name", None) == "usage":
            return True
        pending.extend(getattr(selection, "selections", None) or [])
    return False


def _uuid_of(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except ValueError:
        return None


@strawberry.type(description="A change of a thread in the project, in feed order.")
class ProjectThreadUpdate:
    cursor: str = strawberry.field(description="Pass as `after` to resume right after this item.")
    sequence: int
    type: str = strawberry.field(description="The event name (`thread.updated` …) or `reload_required`.")
    thread: Thread | None = strawberry.field(description="The thread as of this change; null for `reload_required`.")


@strawberry.type(
    name="ReloadRequired",
    description="The replay would be longer than the server allows (THREADLOOM_MAX_REPLAY): reload the thread "
    "by query, then subscribe again with `afterSequence: sequence`. The subscription ends after this item.",
)
class ReloadRequiredItem:
    sequence: int = strawberry.field(
        description="The thread's latest sequence when the replay was refused (0 on a project-wide stream)."
    )
    cursor: str | None = strawberry.field(
        default=None,
        description="On a project-wide stream, the feed's head: reload by query, then subscribe with `after: cursor`.",
    )


ActivityItem = Annotated[
    Union[Activity, ReloadRequiredItem],  # noqa: UP007
    strawberry.union("ActivityItem", description="An activity, or the marker that the replay is too long."),
]


def stream_ended(error: StreamEnded) -> GraphQLError:
    """The last item of a subscription the server ends (too slow, going away): its code and where to resume."""
    resume = error.resume_from
    cursor = encode_feed_cursor(resume) if isinstance(resume, tuple) else resume
    return GraphQLError(str(error), extensions={"code": error.code, "resumeFrom": cursor})


def _after(after_sequence: int | None) -> int | None:
    if after_sequence is not None and after_sequence < 0:
        raise ApiError(DomainError(ErrorCode.INVALID_INPUT, "afterSequence must not be negative", "afterSequence"))
    return after_sequence


async def _thread(info: Info, thread_id: str) -> uuid.UUID:
    entity_id = gid.maybe_as(thread_id, "Thread")
    row = await info.context.load_visible(t.threads, entity_id)
    if row is None or entity_id is None:
        raise ApiError(not_found("threadId"))
    return entity_id


async def _run_thread(info: Info, run_id: str | None) -> uuid.UUID:
    """The thread of a visible run (a stream of one run needs no threadId)."""
    if run_id is None:
        raise ApiError(DomainError(ErrorCode.INVALID_INPUT, "threadId or runId is needed", "threadId"))
    run = gid.maybe_as(run_id, "Run")
    async with _live(info).db.read() as db:
        place = None if run is None else await graph_reads.run_place(db, run)
    if place is None or not info.context.principal.sees(place.project_id):
        raise ApiError(not_found("runId"))
    return place.thread_id


def _filter_ids(run_id: str | None, node_id: str | None) -> tuple[uuid.UUID | None, uuid.UUID | None, bool]:
    """(run, node, impossible): an id of the wrong kind matches nothing."""
    run = gid.maybe_as(run_id, "Run") if run_id is not None else None
    node = gid.maybe_as(node_id, "ExecutionNode") if node_id is not None else None
    impossible = (run_id is not None and run is None) or (node_id is not None and node is None)
    return run, node, impossible


def row_filter(run_id: str | None, node_id: str | None, entity_type: str | None) -> Callable[[LogEvent], bool]:
    """Which log rows a thread subscription with these filter arguments delivers."""
    run, node, impossible = _filter_ids(run_id, node_id)

    def match(row: LogEvent) -> bool:
        return (
            not impossible
            and (entity_type is None or row.entity_type == entity_type)
            and (run is None or row.run_id == run)
            and (node is None or row.node_id == node)
        )

    return match


def _live(info: Info) -> Any:
    live = info.context.live
    assert live is not None, "subscriptions need the live hub"
    return live


async def _filtered(info: Info, args: ViewArgs) -> AsyncIterator[Any]:
    """The view's stream (api.stream_scopes: a project's, thread's, run's or node's), its filters applied to
    replay and live."""
    view = await resolve_view(info, args)
    try:
        async for item in stream_view(info, view):
            yield item
    except StreamEnded as error:
        raise stream_ended(error) from None


def _marker(sequence: int, name: str, cursor: str | None = None) -> ThreadEvent:
    return ThreadEvent(
        sequence=sequence, type=name, run_id=None, node_id=None, occurred_at=None, entity=None, cursor=cursor
    )


def thread_event_item(item: Any, *, with_entity: bool = True) -> ThreadEvent:
    """The `threadEvents` item of a log row or marker; `with_entity=False` skips building the entity
    (for selections that do not ask for it)."""
    if isinstance(item, Synchronized):
        return _marker(item.sequence, "synchronized")
    if isinstance(item, ReloadRequired):
        return _marker(item.latest, "reload_required")
    if isinstance(item, FeedSynchronized):
        return _marker(0, "synchronized", encode_feed_cursor(item.cursor))
    if isinstance(item, FeedReloadRequired):
        return _marker(0, "reload_required", encode_feed_cursor(item.head))
    entity = _entity(item) if with_entity else None
    return ThreadEvent(
        sequence=item.sequence,
        type=item.event_type,
        run_id=_gid("Run", item.run_id),
        node_id=_gid("ExecutionNode", item.node_id),
        occurred_at=item.occurred_at,
        entity=entity,
        truncated=with_entity and bool(item.shared.get("truncated")),
        cursor=event_cursor(item),
        thread_uuid=item.thread_id,
    )


def event_cursor(row: LogEvent) -> str:
    """A row's place in the log as a stream cursor (made once per row, shared by every subscriber)."""
    found: str | None = row.shared.get("cursor")
    if found is None:
        found = row.shared["cursor"] = encode_feed_cursor((row.xid, row.position))
    return found


def thread_event_head(item: Any) -> ThreadEvent:
    return thread_event_item(item, with_entity=False)


def activity_item(item: Any) -> Any:
    # cast: the union's type resolver then needs no structural match (see `_entity`).
    if isinstance(item, LogEvent):
        return strawberry.cast(Activity, Activity.from_row(item.payload))
    if isinstance(item, ReloadRequired):
        return strawberry.cast(ReloadRequiredItem, ReloadRequiredItem(sequence=item.latest))
    if isinstance(item, FeedReloadRequired):
        return strawberry.cast(ReloadRequiredItem, ReloadRequiredItem(sequence=0, cursor=encode_feed_cursor(item.head)))
    return None  # `synchronized`: not an item of this subscription


_THREAD_ARG = "A thread: its log. The widest of projectId, threadId, runId, nodeId picks the stream; others filter."
_PROJECT_ARG = (
    "A project: every thread's log in it, in commit order. Starts at the feed's head unless `after` is given."
)
_RUN_ARG = "A run: alone, the run's events from its start; with a thread or project, a filter."
_NODE_ARG = "An execution node: alone, its events from its run's start; with a wider scope, a filter."
_DESCENDANTS_ARG = "With nodeId: the node's whole subtree (a subagent's own tool calls and requests included)."
_AFTER_SEQUENCE_ARG = "Replay the thread's log after this sequence (a thread, run or node stream)."
_AFTER_ARG = "Replay after this cursor: a ThreadEvent's `cursor`, or an Activity's `id` (any scope)."


def _thread_subscription(
    item_type: Any, to_item: Callable[[Any], Any], *, description: str, entity_type: str | None = None
) -> Any:
    """A subscription over a view's filtered stream (`_filtered`), each replayed or live item mapped by
    `to_item` (None: skipped). threadEvents and activities share these arguments and their meaning."""

    async def resolve(
        self: Any,
        info: Info,
        thread_id: Annotated[strawberry.ID | None, strawberry.argument(description=_THREAD_ARG)] = None,
        after_sequence: Annotated[int | None, strawberry.argument(description=_AFTER_SEQUENCE_ARG)] = None,
        run_id: Annotated[strawberry.ID | None, strawberry.argument(description=_RUN_ARG)] = None,
        node_id: Annotated[strawberry.ID | None, strawberry.argument(description=_NODE_ARG)] = None,
        project_id: Annotated[strawberry.ID | None, strawberry.argument(description=_PROJECT_ARG)] = None,
        include_descendants: Annotated[bool | None, strawberry.argument(description=_DESCENDANTS_ARG)] = False,
        after: Annotated[str | None, strawberry.argument(description=_AFTER_ARG)] = None,
    ) -> AsyncGenerator[Any, None]:
        args = ViewArgs(
            project_id=project_id,
            thread_id=thread_id,
            run_id=run_id,
            node_id=node_id,
            include_descendants=bool(include_descendants),
            after_sequence=after_sequence,
            after=after,
            entity_type=entity_type,
        )
        async for item in _filtered(info, args):
            found = to_item(item)
            if found is not None:
                yield found

    resolve.__annotations__["return"] = AsyncGenerator[item_type, None]  # the field's type for Strawberry
    return strawberry.subscription(resolver=resolve, description=description)


# The thread subscriptions the fast path (api.cohorts) may serve: field → (item mapper, entity type filter).
THREAD_SUBSCRIPTIONS: dict[str, tuple[Callable[[Any], Any], str | None]] = {
    "threadEvents": (thread_event_item, None),
    "activities": (activity_item, "activity"),
}


@strawberry.type
class Subscription:
    thread_events = _thread_subscription(
        ThreadEvent,
        thread_event_item,
        description="Replay after `afterSequence` (all when absent), `synchronized`, then live.",
    )
    activities = _thread_subscription(
        ActivityItem,
        activity_item,
        entity_type="activity",
        description="Activities of a thread: replay after `afterSequence`, then live; a `ReloadRequired` item "
        "instead when the replay would be too long.",
    )

    @strawberry.subscription(
        description="The status of a run (or of the thread's runs) as it changes. Starts with the current status "
        "(of the run; else of every unfinished run and the latest one), then live; with `afterSequence`, replays "
        "status changes after it instead (a replay longer than the server allows starts from the current status)."
    )
    async def run_status(
        self,
        info: Info,
        thread_id: Annotated[
            strawberry.ID | None, strawberry.argument(description="The thread; may be left out when runId is given.")
        ] = None,
        run_id: Annotated[
            strawberry.ID | None, strawberry.argument(description="The run (alone: its thread is the run's).")
        ] = None,
        after_sequence: Annotated[
            int | None, strawberry.argument(description="Replay status changes after this sequence of the thread.")
        ] = None,
    ) -> AsyncGenerator[RunStatusUpdate, None]:
        thread = await _thread(info, thread_id) if thread_id is not None else await _run_thread(info, run_id)
        after = _after(after_sequence)
        run_filter, _, impossible = _filter_ids(run_id, None)
        seen: dict[uuid.UUID, str] = {}
        live = _live(info)
        max_replay = live.limits.max_replay
        async with live.db.read() as db:
            latest = await log_reader.latest_sequence(db, thread)
            if after is None or latest - after > max_replay:
                # The current state: each run's last event up to `latest`, then live after it.
                current = await log_reader.run_states(
                    db, thread, latest, await log_reader.current_run_ids(db, thread, run_filter)
                )
                after = latest
            else:
                current = []

        runs: dict[uuid.UUID, Run] = {}  # each run as last seen, for the items a usage record sends
        wanted = ("run", "usage_record") if _selects_usage(info) else ("run",)

        def update(row: LogEvent) -> RunStatusUpdate | None:
            if row.entity_type == "usage_record":
                known = runs.get(row.run_id) if row.run_id is not None else None
                if impossible or known is None or (run_filter is not None and row.run_id != run_filter):
                    return None
                return RunStatusUpdate(sequence=row.sequence, run=known, status=known.rec.status)
            if impossible or (run_filter is not None and row.entity_id != run_filter):
                return None  # a runId of another type matches nothing
            run_obj = runs[row.entity_id] = Run.from_row(row.payload)
            status = str(row.payload["status"])
            if seen.get(row.entity_id) == status:
                return None
            seen[row.entity_id] = status
            return RunStatusUpdate(sequence=row.sequence, run=run_obj, status=run_obj.rec.status)

        for row in current:
            first = update(row)
            if first is not None:
                yield first
        try:
            async for item in thread_stream(
                live.hub,
                live.db,
                thread,
                after,
                lambda row: row.entity_type in wanted,
                max_replay=max_replay,
                token=info.context.principal.token_id,
            ):
                if isinstance(item, LogEvent):
                    found = update(item)
                    if found is not None:
                        yield found
        except StreamEnded as error:
            raise stream_ended(error) from None

    @strawberry.subscription(
        description="A run's execution graph, keyed by node: every node as it is now (`SNAPSHOT` items, each "
        "after its parent), `SYNCHRONIZED`, then a `CHANGE` item whenever a node is made or its status, kind, "
        "parent or times change. With `afterSequence` (an item's `sequence`), only the changes after it, then "
        "`SYNCHRONIZED`; a resume longer than THREADLOOM_MAX_REPLAY starts again from the snapshot."
    )
    async def execution_graph(
        self,
        info: Info,
        run_id: Annotated[strawberry.ID, strawberry.argument(description="The run whose graph to follow.")],
        after_sequence: Annotated[
            int | None, strawberry.argument(description="Resume after this item's `sequence` (changes only).")
        ] = None,
    ) -> AsyncGenerator[ExecutionGraphEvent, None]:
        async for item in _execution_graph(info, run_id, after_sequence):
            yield item

    @strawberry.subscription(
        description="Every thread change of a project, for dashboards. Resume with `after`. A resume with more "
        'than THREADLOOM_MAX_REPLAY changes behind it gets one item `type: "reload_required"` (no thread) whose '
        "`cursor` is the feed's head: reload the threads by query, then subscribe with `after: cursor`."
    )
    async def project_threads(
        self, info: Info, project_id: strawberry.ID, after: str | None = None
    ) -> AsyncGenerator[ProjectThreadUpdate, None]:
        project = gid.maybe_as(project_id, "Project")
        if project is None or await info.context.load_visible(t.projects, project) is None:
            raise ApiError(not_found("projectId"))
        cursor = None if after is None else decode_feed_cursor(after)
        live = _live(info)
        try:
            async for row in project_stream(
                live.hub,
                live.db,
                project,
                cursor,
                max_replay=live.limits.max_replay,
                token=info.context.principal.token_id,
            ):
                if isinstance(row, FeedReloadRequired):
                    head = encode_feed_cursor(row.head)
                    yield ProjectThreadUpdate(cursor=head, sequence=0, type="reload_required", thread=None)
                    return
                yield ProjectThreadUpdate(
                    cursor=encode_feed_cursor((row.xid, row.position)),
                    sequence=row.sequence,
                    type=row.event_type,
                    thread=_entity(row),
                )
        except StreamEnded as error:
            raise stream_ended(error) from None

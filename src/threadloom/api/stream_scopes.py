"""The scope of a live view (`threadEvents`, `activities`): which feed serves it and which rows it keeps.

A view is scoped by a project, a thread, a run or a node (streams.views.choose_scope: the widest id
given picks the feed, the others filter it). Every id that picks the feed must be visible to the caller,
else NOT_FOUND as for a query; an id that only filters and names nothing visible matches nothing, as before.
Each row is checked again against the caller's projects as it passes (`ViewMatch.sees`).

`after` resumes any view: a `ThreadEvent.cursor` (a log position) or an activity's id (the activity's
own event); `afterSequence` resumes a view of one thread's log.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator
from typing import Any

from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.errors import ApiError
from threadloom.api.feed_cursor import decode_feed_cursor
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.store import events as log_reader
from threadloom.store import graph_reads
from threadloom.store import tables as t
from threadloom.store.db import Reader
from threadloom.streams.merge import project_log_stream, thread_stream
from threadloom.streams.views import NodeTree, ScopeKind, ViewMatch, choose_scope


def _invalid(message: str, field: str) -> ApiError:
    return ApiError(DomainError(ErrorCode.INVALID_INPUT, message, field))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ViewArgs:
    """A view's arguments as the client passed them (global ids, unchecked)."""

    project_id: str | None = None
    thread_id: str | None = None
    run_id: str | None = None
    node_id: str | None = None
    include_descendants: bool = False
    after_sequence: int | None = None
    after: str | None = None
    entity_type: str | None = None


@dataclasses.dataclass(slots=True)
class View:
    """A resolved view: its feed (a project's, else a thread's), where its replay starts, and its rows."""

    match: ViewMatch
    project: uuid.UUID | None = None
    thread: uuid.UUID | None = None
    after_sequence: int | None = None
    after_cursor: tuple[int, int] | None = None


def _visible_place(info: Info, place: graph_reads.Place | None) -> graph_reads.Place | None:
    return place if place is not None and info.context.principal.sees(place.project_id) else None


async def _loaded_scope(info: Info, kind: ScopeKind, args: ViewArgs, view: View) -> None:
    """Fix a project or thread view's feed through the request's loaders. Called before `resolve_view` holds a
    connection: a loader checks out one of its own from the same pool, and many subscriptions starting at once
    each holding one while waiting for a second would use the pool up and wait on each other until its timeout."""
    if kind is ScopeKind.PROJECT:
        assert args.project_id is not None
        project = gid.maybe_as(args.project_id, "Project")
        if project is None or await info.context.load_visible(t.projects, project) is None:
            raise ApiError(not_found("projectId"))
        view.project = project
    elif kind is ScopeKind.THREAD:
        assert args.thread_id is not None
        thread = gid.maybe_as(args.thread_id, "Thread")
        row = None if thread is None else await info.context.load_visible(t.threads, thread)
        if row is None or thread is None:
            raise ApiError(not_found("threadId"))
        view.thread, view.match.home = thread, row["project_id"]


async def _placed_scope(
    info: Info, db: Reader, kind: ScopeKind, args: ViewArgs, view: View
) -> graph_reads.Place | None:
    """Fix a run or node view's feed; returns the node's place for a node scope (its run's tree is read from it)."""
    if kind is ScopeKind.RUN:
        assert args.run_id is not None
        run = gid.maybe_as(args.run_id, "Run")
        place = _visible_place(info, None if run is None else await graph_reads.run_place(db, run))
        if place is None:
            raise ApiError(not_found("runId"))
        view.thread, view.match.home = place.thread_id, place.project_id
        return None
    assert args.node_id is not None
    node = gid.maybe_as(args.node_id, "ExecutionNode")
    place = _visible_place(info, None if node is None else await graph_reads.node_place(db, node))
    if place is None:
        raise ApiError(not_found("nodeId"))
    view.thread, view.match.home = place.thread_id, place.project_id
    return place


async def _after(db: Reader, args: ViewArgs, view: View) -> None:
    """Where the replay starts: `afterSequence`, or the event an `after` cursor names (it must be the view's)."""
    if args.after_sequence is not None and args.after is not None:
        raise _invalid("pass afterSequence or after, not both", "after")
    if args.after_sequence is not None:
        if args.after_sequence < 0:
            raise _invalid("afterSequence must not be negative", "afterSequence")
        if view.thread is None:
            raise _invalid("a project-wide stream resumes with `after` (a cursor), not a sequence", "afterSequence")
        view.after_sequence = args.after_sequence
        return
    if args.after is None:
        return
    activity = gid.maybe_as(args.after, "Activity")
    if activity is not None:
        point = await graph_reads.activity_event(db, activity)
    else:
        cursor = decode_feed_cursor(args.after)
        if view.thread is None:
            # A place in the project feed's order (a marker's may be the project's own event): any is a valid
            # start, and the feed keeps only the project's rows after it.
            view.after_cursor = cursor
            return
        point = await graph_reads.event_at(db, cursor[1])
        if point is not None and point.xid != cursor[0]:
            point = None
    ours = point is not None and (
        point.thread_id == view.thread if view.thread is not None else point.project_id == view.project
    )
    if point is None or not ours:
        raise ApiError(DomainError(ErrorCode.INVALID_CURSOR, "not a cursor of this stream", "after"))
    view.after_sequence = point.sequence if view.thread is not None else None
    view.after_cursor = (point.xid, point.position) if view.thread is None else None


async def resolve_view(info: Info, args: ViewArgs) -> View:
    """Check a view's arguments and what the caller may see; read what its filters need (once)."""
    kind = choose_scope(*(x is not None for x in (args.project_id, args.thread_id, args.run_id, args.node_id)))
    if kind is None:
        raise _invalid("one of projectId, threadId, runId or nodeId is needed", "threadId")
    if args.include_descendants and args.node_id is None:
        raise _invalid("includeDescendants needs a nodeId", "includeDescendants")
    principal = info.context.principal
    run = gid.maybe_as(args.run_id, "Run") if args.run_id is not None else None
    node = gid.maybe_as(args.node_id, "ExecutionNode") if args.node_id is not None else None
    impossible = (args.run_id is not None and run is None) or (args.node_id is not None and node is None)
    view = View(ViewMatch(principal.sees, entity_type=args.entity_type, run=run, node=node, impossible=impossible))
    loaded = kind in (ScopeKind.PROJECT, ScopeKind.THREAD)
    if loaded:
        await _loaded_scope(info, kind, args, view)
    async with info.context.services.db.read() as db:
        place = None if loaded else await _placed_scope(info, db, kind, args, view)
        await _after(db, args, view)
        if view.thread is None and view.after_cursor is None:
            # Live from the head; fixed before the tree is read, so no node made in between goes unseen.
            view.after_cursor = await log_reader.project_head(db, view.project)  # type: ignore[arg-type]
        elif view.thread is not None and view.after_sequence is None and kind is ScopeKind.RUN and run is not None:
            view.after_sequence = await graph_reads.run_start(db, view.thread, run)
        elif view.after_sequence is None and kind is ScopeKind.NODE and place is not None:
            view.after_sequence = await graph_reads.run_start(db, place.thread_id, place.run_id)
        if args.include_descendants and node is not None:
            if place is None:
                place = _visible_place(info, await graph_reads.node_place(db, node))
            if place is None:
                view.match.impossible = True  # a node the caller cannot see: nothing is under it
            else:
                view.match.tree = NodeTree(node, await graph_reads.run_node_parents(db, place.run_id))
    return view


def stream_view(info: Info, view: View) -> AsyncIterator[Any]:
    """The view's items: log rows it keeps and the feed's markers (`Synchronized`/`ReloadRequired`, or their
    project-wide `Feed…` forms)."""
    live = info.context.live
    assert live is not None, "subscriptions need the live hub"
    token = info.context.principal.token_id
    if view.thread is not None:
        return thread_stream(
            live.hub,
            live.db,
            view.thread,
            view.after_sequence,
            view.match,
            max_replay=live.limits.max_replay,
            token=token,
        )
    assert view.project is not None
    return project_log_stream(
        live.hub, live.db, view.project, view.after_cursor, view.match, max_replay=live.limits.max_replay, token=token
    )

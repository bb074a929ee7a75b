"""Replay-then-live, gapless and exactly once (docs/architecture.md, "Live streams").

Attach to the hub first and wait until the feed has fixed its head, then replay the log after the
client's cursor in pages, then deliver live rows in sequence order: rows at or below the last
delivered sequence are dropped, and a jump in sequence is filled from the log before going on.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import AsyncIterator, Callable

from threadloom import metrics
from threadloom.store import events as log_reader
from threadloom.store import graph_reads
from threadloom.store.db import Database
from threadloom.store.events import LogEvent
from threadloom.streams.hub import Hub, Mailbox, ServerClosing, Skipped, SlowConsumer

PAGE = 500


@dataclasses.dataclass(frozen=True, slots=True)
class Synchronized:
    """The replay is over; `sequence` is the last sequence it covered."""

    sequence: int


@dataclasses.dataclass(frozen=True, slots=True)
class ReloadRequired:
    """The replay would be too long: reload the thread and subscribe from `latest`."""

    latest: int


@dataclasses.dataclass(frozen=True, slots=True)
class FeedReloadRequired:
    """The project feed's replay would be too long: reload by query and resume from `head`."""

    head: tuple[int, int]


@dataclasses.dataclass(frozen=True, slots=True)
class FeedSynchronized:
    """A project-wide replay is over; `cursor` is the feed position it covered."""

    cursor: tuple[int, int]


class StreamEnded(Exception):
    """The server ended a subscription; `resume_from` is the client's cursor (a sequence, or a feed
    cursor): subscribing again after it misses nothing. `code` is the error code the client sees."""

    code = "STREAM_ENDED"
    reason = "stream ended"

    def __init__(self, resume_from: int | tuple[int, int]) -> None:
        super().__init__(f"{self.reason}; resume from {resume_from}")
        self.resume_from = resume_from


class EventUnreadable(StreamEnded):
    """The next event of the log could not be turned into its item (a payload of a shape this release does not
    read: an upgrade that did not rewrite it). Said, not skipped: a quiet end or a gap would look complete."""

    code = "EVENT_UNREADABLE"
    reason = "the next event of the thread's log could not be read (the server's log says why)"


class TooSlow(StreamEnded):
    """The client fell behind its queue's bound."""

    code = "SUBSCRIBER_TOO_SLOW"
    reason = "subscriber too slow"


class GoingAway(StreamEnded):
    """The server is shutting down: resume on another replica (or after the restart)."""

    code = "SERVER_GOING_AWAY"
    reason = "server going away"


StreamItem = LogEvent | Synchronized | ReloadRequired


async def _next_live(box: Mailbox, resume_from: int | tuple[int, int]) -> LogEvent | Skipped:
    """The next live row (or run of rows a filtered box skipped), or the end of the stream as the error the client
    resumes from `resume_from` after."""
    try:
        return await box.get()
    except SlowConsumer:
        raise TooSlow(resume_from) from None
    except ServerClosing:
        raise GoingAway(resume_from) from None


async def _next_row(box: Mailbox, resume_from: tuple[int, int]) -> LogEvent:
    """The next live row of a box that keeps every row (a project's)."""
    row = await _next_live(box, resume_from)
    assert isinstance(row, LogEvent), "only a thread's box skips rows"
    return row


async def thread_stream(
    hub: Hub,
    db: Database,
    thread_id: uuid.UUID,
    after: int | None,
    match: Callable[[LogEvent], bool],
    *,
    max_replay: int,
    token: uuid.UUID | None = None,
) -> AsyncIterator[StreamItem]:
    """The thread's rows after `after` that `match` keeps, then live; the live rows' queue holds only those and
    counts their bytes under `token`."""
    box = hub.attach_thread(thread_id, token, match)
    try:
        await box.attached()
        last = after or 0
        async with db.read() as r:
            latest = await log_reader.latest_sequence(r, thread_id)
        if latest - last > max_replay:
            yield ReloadRequired(latest)
            return
        while True:
            async with db.read() as r:
                rows = await log_reader.thread_events(r, thread_id, last, limit=PAGE)
            metrics.REPLAYED.inc(len(rows))
            for row in rows:
                last = row.sequence
                if match(row):
                    yield row
            if len(rows) < PAGE:
                break
        yield Synchronized(last)
        while True:
            live = await _next_live(box, last)
            first, through = (live.first, live.last) if isinstance(live, Skipped) else (live.sequence, live.sequence)
            if through <= last:
                continue
            while last < first - 1:  # a gap: read it from the log
                async with db.read() as r:
                    gap = await log_reader.thread_events(r, thread_id, last, before=first, limit=PAGE)
                if not gap:
                    break
                for missed in gap:
                    last = missed.sequence
                    if match(missed):
                        yield missed
            last = through
            if isinstance(live, LogEvent) and match(live):
                yield live
    finally:
        hub.detach(box)


async def project_stream(
    hub: Hub,
    db: Database,
    project_id: uuid.UUID,
    after: tuple[int, int] | None,
    *,
    max_replay: int,
    token: uuid.UUID | None = None,
) -> AsyncIterator[LogEvent | FeedReloadRequired]:
    """Thread changes of a project in feed order (see store.events.project_events).

    A cursor with more than `max_replay` events after it gets one `FeedReloadRequired`
    (carrying the feed's head to resume from after a reload) and the stream ends.
    """
    box = hub.attach_project(project_id, token)
    try:
        await box.attached()
        if after is None:
            async with db.read() as r:
                after = await log_reader.project_head(r, project_id)
        else:
            async with db.read() as r:
                backlog = await log_reader.project_backlog(r, project_id, after, cap=max_replay + 1)
                head = await log_reader.project_head(r, project_id)
            if backlog > max_replay:
                yield FeedReloadRequired(head)
                return
        cursor = after
        while True:
            async with db.read() as r:
                rows = await log_reader.project_events(r, project_id, cursor, limit=PAGE)
            for row in rows:
                cursor = (row.xid, row.position)
                yield row
            if len(rows) < PAGE:
                break
        while True:
            row = await _next_row(box, cursor)
            if (row.xid, row.position) <= cursor:
                continue
            cursor = (row.xid, row.position)
            yield row
    finally:
        hub.detach(box)


async def project_log_stream(
    hub: Hub,
    db: Database,
    project_id: uuid.UUID,
    after: tuple[int, int] | None,
    match: Callable[[LogEvent], bool],
    *,
    max_replay: int,
    token: uuid.UUID | None = None,
) -> AsyncIterator[LogEvent | FeedSynchronized | FeedReloadRequired]:
    """Every thread event of a project that `match` keeps, in feed order: the replay after `after` (none without
    it: the stream starts at the feed's head), `FeedSynchronized`, then live. `match` sees every row, kept or
    not, in order. More than `max_replay` events after the cursor: one `FeedReloadRequired` and the end."""
    box = hub.attach_project_log(project_id, token)
    try:
        await box.attached()
        async with db.read() as r:
            head = await log_reader.project_head(r, project_id)
            backlog = (
                0 if after is None else await graph_reads.project_log_backlog(r, project_id, after, cap=max_replay + 1)
            )
        if backlog > max_replay:
            yield FeedReloadRequired(head)
            return
        cursor = head if after is None else after
        while after is not None:
            async with db.read() as r:
                rows = await graph_reads.project_log(r, project_id, cursor, limit=PAGE)
            metrics.REPLAYED.inc(len(rows))
            for row in rows:
                cursor = (row.xid, row.position)
                if match(row):
                    yield row
            if len(rows) < PAGE:
                break
        yield FeedSynchronized(cursor)
        while True:
            row = await _next_row(box, cursor)
            if (row.xid, row.position) <= cursor:
                continue
            cursor = (row.xid, row.position)
            if match(row):
                yield row
    finally:
        hub.detach(box)

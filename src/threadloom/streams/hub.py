"""The in-process hub: per-thread and per-project feeds that read the log once per wake-up
and fan the rows out to local subscribers' bounded queues.

A feed reads the log (never trusts the wake-up's content), so a lost or duplicated
wake-up costs latency, not correctness. Feeds also poll: fast while the wake-up channel
is degraded, slowly otherwise.

Besides mailboxes (one per subscriber, for the general path) a feed serves *sinks*: a sink
receives each row in the feed's task, in log order and without a queue, which is how the
subscription fast path executes an event once for a whole cohort of subscribers. A thread
feed also knows its thread's project (read with its head) and keeps its last `RECENT` rows,
so a subscriber that joins near the head replays from memory instead of the database.
"""

from __future__ import annotations

import abc
import asyncio
import collections
import contextlib
import dataclasses
import logging
import uuid
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

import orjson

from threadloom import metrics, tracing
from threadloom.store import events as log_reader
from threadloom.store import graph_reads
from threadloom.store.db import Database
from threadloom.store.events import LogEvent
from threadloom.streams.budget import QueueAccount, QueueBudget

log = logging.getLogger("threadloom.streams")
POLL_DEGRADED = 0.25
POLL_HEALTHY = 5.0
RECENT = 256
K = TypeVar("K")


class Sink(Protocol):
    """Takes every row of a feed, in order, inside the feed's task (it must not block for long)."""

    async def deliver(self, row: LogEvent) -> None: ...


class SlowConsumer(Exception):
    """The subscriber's queue overflowed; it must resume from its cursor."""


class ServerClosing(Exception):
    """The process is shutting down: the subscriber got what was queued and must resume elsewhere."""


def row_size(row: LogEvent) -> int:
    """The encoded size of a row's payload, once per row for every mailbox it is queued in: what the
    subscriber's frame for it carries, about (the frame's own fields are a few hundred bytes more, its
    texts at most `STREAM_TEXT_MAX` characters each)."""
    size: int | None = row.shared.get("size")
    if size is None:
        size = row.shared["size"] = len(orjson.dumps(row.payload, default=str)) + 256
    return size


@dataclasses.dataclass(slots=True)
class Skipped:
    """Rows `first` to `last` of a thread, which a mailbox that keeps only some rows (`Mailbox.keep`) saw and kept
    none of: its reader moves past them without taking them for a gap."""

    first: int
    last: int


class Mailbox:
    """A subscriber's queue, bounded in rows (`limit`) and in bytes (`account`, see streams.budget).
    On overflow it is emptied and holds only the overflow mark.

    `keep` (a thread's subscriber with a filter, such as `runStatus` or `activities`): only the rows it keeps are
    queued and counted; a run of others is one `Skipped` in their place, counted in neither. Counting the rows a
    subscriber never receives cut a `runStatus` subscriber that read promptly as too slow while a thread wrote
    many other events at once."""

    def __init__(self, limit: int, account: QueueAccount, keep: Callable[[LogEvent], bool] | None = None) -> None:
        self.limit = limit
        self.account = account
        self.keep = keep
        self.items: collections.deque[LogEvent | Skipped] = collections.deque()
        self.rows = 0  # the LogEvents among `items`
        self.overflowed = False
        self.closing = False
        self._ready = asyncio.Event()
        self.feed: Feed[Any] | None = None  # the feed it is attached to (Hub._attach)

    async def attached(self) -> None:
        """Wait until the feed this box is on knows its head. A replay read after this covers every row the
        feed will not deliver; read before it, a row committed in between is in neither."""
        if self.feed is not None:
            await self.feed.ready()

    def close(self) -> None:
        """No more rows: `get` hands out what is queued, then raises ServerClosing."""
        self.closing = True
        self._ready.set()

    def put(self, event: LogEvent) -> None:
        if self.overflowed:
            return
        if self.keep is not None and not self._keeps(event):
            tail = self.items[-1] if self.items else None
            if isinstance(tail, Skipped) and tail.last == event.sequence - 1:
                tail.last = event.sequence
            else:
                self.items.append(Skipped(event.sequence, event.sequence))
        elif self.rows >= self.limit or not self.account.take(row_size(event)):
            metrics.DROPPED_GENERAL.inc(self.rows + 1)
            metrics.SLOW_CONSUMERS.inc()
            self.items.clear()
            self.rows = 0
            self.account.clear()
            self.overflowed = True
        else:
            self.items.append(event)
            self.rows += 1
        self._ready.set()

    def _keeps(self, event: LogEvent) -> bool:
        """Whether the subscriber's filter keeps the row. It runs in the feed's task, which serves every subscriber
        of the thread: a filter that fails keeps the row, and fails again where its reader applies it."""
        assert self.keep is not None
        try:
            return self.keep(event)
        except Exception:
            return True

    def release(self) -> None:
        """The subscriber is gone: what it still held no longer counts."""
        self.items.clear()
        self.rows = 0
        self.account.clear()

    async def get(self) -> LogEvent | Skipped:
        """The next row, or the run of rows it did not keep (only with `keep`)."""
        while not self.items:
            if self.overflowed:
                raise SlowConsumer()
            if self.closing:
                raise ServerClosing()
            self._ready.clear()
            await self._ready.wait()
        row = self.items.popleft()
        if isinstance(row, LogEvent):
            self.rows -= 1
            self.account.give(row_size(row))
        return row


class Feed(abc.ABC, Generic[K]):
    """Reads new log rows for one key (thread or project) and fans them out.

    A subclass says where its log starts (`_head`), how rows after a cursor are read (`_read`) and what
    cursor a row leaves (`_advance`)."""

    def __init__(self, key: K, hub: Hub) -> None:
        self.key = key
        self.hub = hub
        self.cursor: Any = None
        self.mailboxes: set[Mailbox] = set()
        self.sinks: set[Sink] = set()
        self.recent: collections.deque[LogEvent] = collections.deque(maxlen=RECENT)
        self.project_id: uuid.UUID | None = None  # thread feeds: the thread's project, read with the head
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None
        self.waiters = 0  # subscribers waiting for the head before they add a sink (`Hub.ready_thread_feed`)
        self._ready = asyncio.Event()

    @abc.abstractmethod
    async def _head(self) -> Any:
        """The cursor of the log's end when the feed starts."""

    @abc.abstractmethod
    async def _read(self, after: Any) -> list[LogEvent]:
        """The rows after cursor `after`, in feed order."""

    @abc.abstractmethod
    def _advance(self, row: LogEvent) -> Any:
        """The cursor `row` leaves."""

    def start(self) -> None:
        with tracing.detached():  # the feed outlives the subscription that started it
            self.task = asyncio.create_task(self._run(), name=f"feed-{self.key}")

    @property
    def idle(self) -> bool:
        return not self.mailboxes and not self.sinks and not self.waiters

    async def ready(self) -> None:
        """Wait until the feed knows its head: every row after `cursor` will reach its sinks."""
        await self._ready.wait()

    def recent_after(self, after: int) -> list[LogEvent] | None:
        """The rows after `after` up to `cursor` from memory, or None when memory does not reach back."""
        if after >= self.cursor:
            return []
        if not self.recent or self.recent[0].sequence > after + 1:
            return None
        return [row for row in self.recent if row.sequence > after]

    async def _run(self) -> None:
        while True:
            try:
                if self.cursor is None:
                    self.cursor = await self._head()
                    self._ready.set()
                await self._drain()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("feed %s failed to read the log", self.key)
            interval = POLL_DEGRADED if self.hub.degraded else POLL_HEALTHY
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.wake.wait(), interval)
            self.wake.clear()

    async def _drain(self) -> None:
        while True:
            rows = await self._read(self.cursor)
            if rows and self.mailboxes:
                metrics.DELIVERED_GENERAL.inc(len(rows) * len(self.mailboxes))  # once per batch
            for row in rows:
                self.cursor = self._advance(row)
                self.recent.append(row)
                for box in list(self.mailboxes):
                    box.put(row)
                for sink in list(self.sinks):
                    try:
                        await sink.deliver(row)
                    except Exception:
                        log.exception("a sink of feed %s failed on sequence %s", self.key, row.sequence)
            if len(rows) < 500:
                return


class ThreadFeed(Feed[uuid.UUID]):
    """A thread's rows in sequence order, read in batches with other threads' (`BatchedReads`)."""

    async def _head(self) -> int:
        async with self.hub.db.read() as db:
            latest, self.project_id = await log_reader.thread_head(db, self.key)
        return latest

    async def _read(self, after: int) -> list[LogEvent]:
        return await self.hub.reads.read(self.key, after)

    def _advance(self, row: LogEvent) -> int:
        return row.sequence


class ProjectFeed(Feed[uuid.UUID]):
    """A project's thread changes in feed order (commit, then position)."""

    async def _head(self) -> tuple[int, int]:
        async with self.hub.db.read() as db:
            return await log_reader.project_head(db, self.key)

    async def _read(self, after: tuple[int, int]) -> list[LogEvent]:
        async with self.hub.db.read() as db:
            return await log_reader.project_events(db, self.key, after)

    def _advance(self, row: LogEvent) -> tuple[int, int]:
        return (row.xid, row.position)


class ProjectLogFeed(ProjectFeed):
    """Every thread event of a project (not only thread changes) in feed order: the project-wide views."""

    async def _read(self, after: tuple[int, int]) -> list[LogEvent]:
        async with self.hub.db.read() as db:
            return await graph_reads.project_log(db, self.key, after)


class BatchedReads:
    """Thread feeds' log reads, gathered per event-loop turn into one statement.

    A burst of wake-ups (a busy process, or another replica's commits arriving over the
    channel) wakes many feeds at once; each asks for its rows after its own cursor. The reads
    asked for before the loop's next turn go out together (`store.events.threads_events`), so
    a thousand threads changing at once cost one round trip, not a thousand.
    """

    def __init__(self, db: Database) -> None:
        self.db = db
        self._waiting: dict[uuid.UUID, tuple[int, asyncio.Future[list[LogEvent]]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def read(self, thread_id: uuid.UUID, after: int) -> asyncio.Future[list[LogEvent]]:
        loop = asyncio.get_running_loop()
        if not self._waiting:
            loop.call_soon(self._flush)
        future: asyncio.Future[list[LogEvent]] = loop.create_future()
        self._waiting[thread_id] = (after, future)  # one feed per thread: at most one read each
        return future

    def _flush(self) -> None:
        batch, self._waiting = self._waiting, {}
        task = asyncio.create_task(self._read(batch), name="feed-reads")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _read(self, batch: dict[uuid.UUID, tuple[int, asyncio.Future[list[LogEvent]]]]) -> None:
        try:
            async with self.db.read() as db:
                rows = await log_reader.threads_events(db, {k: after for k, (after, _) in batch.items()})
        except BaseException as error:
            for _, future in batch.values():
                if not future.done():
                    future.set_exception(error if isinstance(error, Exception) else RuntimeError("read cancelled"))
            if not isinstance(error, Exception):
                raise
            return
        by_thread: dict[uuid.UUID, list[LogEvent]] = {}
        for row in rows:
            by_thread.setdefault(row.thread_id, []).append(row)
        for thread_id, (_, future) in batch.items():
            if not future.done():
                future.set_result(by_thread.get(thread_id, []))


class Hub:
    def __init__(self, db: Database, mailbox_limit: int = 1000, budget: QueueBudget | None = None) -> None:
        self.db = db
        self.reads = BatchedReads(db)
        self.mailbox_limit = mailbox_limit
        # Queued subscriber bytes of this process, mailboxes and the fast path's socket queues alike.
        self.budget = budget if budget is not None else QueueBudget(4 * 1024 * 1024, 64 * 1024 * 1024)
        self.degraded = False
        self.closing = False
        self.threads: dict[uuid.UUID, Feed[uuid.UUID]] = {}
        self.projects: dict[uuid.UUID, Feed[uuid.UUID]] = {}
        self.project_logs: dict[uuid.UUID, Feed[uuid.UUID]] = {}  # every event of a project (ProjectLogFeed)

    @property
    def _all(self) -> tuple[dict[uuid.UUID, Feed[uuid.UUID]], ...]:
        return (self.threads, self.projects, self.project_logs)

    def set_degraded(self, degraded: bool) -> None:
        if degraded != self.degraded:
            log.warning("wake-ups %s", "degraded: feeds poll the log" if degraded else "restored")
        self.degraded = degraded
        if degraded:
            for feeds in self._all:
                for feed in feeds.values():
                    feed.wake.set()

    def wake(self, thread_id: uuid.UUID | None, project_id: uuid.UUID | None, sequence: int) -> None:
        if thread_id is not None and (feed := self.threads.get(thread_id)) is not None:
            feed.wake.set()
        if project_id is not None:
            for feeds in (self.projects, self.project_logs):
                if (pfeed := feeds.get(project_id)) is not None:
                    pfeed.wake.set()

    def thread_feed(self, thread_id: uuid.UUID) -> Feed[uuid.UUID]:
        """The thread's feed, started when new (release it with `release_if_idle` if unused)."""
        return self._started(self.threads, thread_id, ThreadFeed)

    async def ready_thread_feed(self, thread_id: uuid.UUID) -> Feed[uuid.UUID]:
        """The thread's feed once it knows its head. The caller adds a sink before its next await, or
        releases the feed (`release_if_idle`); while it waits, the feed counts as in use, so another
        subscriber leaving cannot stop it before its head is read (which would leave this wait hanging)."""
        feed = self.thread_feed(thread_id)
        feed.waiters += 1
        try:
            await feed.ready()
        finally:
            feed.waiters -= 1
        return feed

    def release_if_idle(self, thread_id: uuid.UUID) -> None:
        self._release_if_idle(self.threads, thread_id)

    @staticmethod
    def _release_if_idle(feeds: dict[uuid.UUID, Feed[uuid.UUID]], key: uuid.UUID) -> None:
        feed = feeds.get(key)
        if feed is not None and feed.idle:
            if feed.task is not None:
                feed.task.cancel()
            del feeds[key]

    def _started(
        self, feeds: dict[uuid.UUID, Feed[uuid.UUID]], key: uuid.UUID, kind: type[Feed[uuid.UUID]]
    ) -> Feed[uuid.UUID]:
        feed = feeds.get(key)
        if feed is None:
            feed = feeds[key] = kind(key, self)
            feed.start()
        return feed

    def _mailbox(self, token: uuid.UUID | None, keep: Callable[[LogEvent], bool] | None = None) -> Mailbox:
        box = Mailbox(self.mailbox_limit, self.budget.account(token), keep)
        if self.closing:  # subscribed while the server shuts down: the replay, then the going-away end
            box.close()
        return box

    def attach_thread(
        self, thread_id: uuid.UUID, token: uuid.UUID | None = None, keep: Callable[[LogEvent], bool] | None = None
    ) -> Mailbox:
        """A mailbox on the thread's feed, its bytes counted under `token` (the subscriber's), queueing only the rows
        `keep` keeps (all without it)."""
        return self._attach(self.thread_feed(thread_id), token, keep)

    def attach_project(self, project_id: uuid.UUID, token: uuid.UUID | None = None) -> Mailbox:
        return self._attach(self._started(self.projects, project_id, ProjectFeed), token)

    def attach_project_log(self, project_id: uuid.UUID, token: uuid.UUID | None = None) -> Mailbox:
        """A mailbox on the feed of every thread event of the project."""
        return self._attach(self._started(self.project_logs, project_id, ProjectLogFeed), token)

    def _attach(
        self, feed: Feed[uuid.UUID], token: uuid.UUID | None, keep: Callable[[LogEvent], bool] | None = None
    ) -> Mailbox:
        box = self._mailbox(token, keep)
        box.feed = feed
        feed.mailboxes.add(box)
        return box

    def going_away(self) -> None:
        """Shutdown: every subscriber gets what its mailbox holds, then ends with its resume cursor."""
        self.closing = True
        for feeds in self._all:
            for feed in feeds.values():
                for box in feed.mailboxes:
                    box.close()

    def detach(self, box: Mailbox) -> None:
        """The box leaves its feed, which stops when nothing else uses it. Only its own feed: another feed
        idle now may be one a subscriber is starting (`ready_thread_feed`)."""
        box.release()
        feed, box.feed = box.feed, None
        if feed is None:
            return
        feed.mailboxes.discard(box)
        for feeds in self._all:
            if feeds.get(feed.key) is feed:
                self._release_if_idle(feeds, feed.key)

    async def stop(self) -> None:
        for feeds in self._all:
            for feed in feeds.values():
                if feed.task is not None:
                    feed.task.cancel()
            feeds.clear()

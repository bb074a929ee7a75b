"""The in-process hub: per-thread and per-project feeds that read the log once per wake-up
and fan the rows out to local subscribers' bounded queues.

A feed reads the log (never trusts the wake-up's content), so a lost or duplicated
wake-up costs latency, not correctness. Feeds also poll: fast while the wake-up channel
is degraded, slowly otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

from threadloom.store import events as log_reader
from threadloom.store.db import Database
from threadloom.store.events import LogEvent

log = logging.getLogger("threadloom.streams")
POLL_DEGRADED = 0.25
POLL_HEALTHY = 5.0
K = TypeVar("K")


class SlowConsumer(Exception):
    """The subscriber's queue overflowed; it must resume from its cursor."""


class Mailbox:
    """A subscriber's bounded queue. On overflow it is emptied and holds only the overflow mark."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.items: collections.deque[LogEvent] = collections.deque()
        self.overflowed = False
        self._ready = asyncio.Event()

    def put(self, event: LogEvent) -> None:
        if self.overflowed:
            return
        if len(self.items) >= self.limit:
            self.items.clear()
            self.overflowed = True
        else:
            self.items.append(event)
        self._ready.set()

    async def get(self) -> LogEvent:
        while not self.items:
            if self.overflowed:
                raise SlowConsumer()
            self._ready.clear()
            await self._ready.wait()
        return self.items.popleft()


class Feed(Generic[K]):
    """Reads new log rows for one key (thread or project) and fans them out."""

    def __init__(
        self,
        key: K,
        hub: Hub,
        head: Callable[[], Awaitable[Any]],
        read: Callable[[Any], Awaitable[list[LogEvent]]],
        advance: Callable[[LogEvent], Any],
    ) -> None:
        self.key = key
        self.hub = hub
        self._head = head
        self._read = read
        self._advance = advance
        self.cursor: Any = None
        self.mailboxes: set[Mailbox] = set()
        self.wake = asyncio.Event()
        self.task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.task = asyncio.create_task(self._run(), name=f"feed-{self.key}")

    async def _run(self) -> None:
        while True:
            try:
                if self.cursor is None:
                    self.cursor = await self._head()
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
            for row in rows:
                self.cursor = self._advance(row)
                for box in list(self.mailboxes):
                    box.put(row)
            if len(rows) < 500:
                return


class Hub:
    def __init__(self, db: Database, mailbox_limit: int = 1000) -> None:
        self.db = db
        self.mailbox_limit = mailbox_limit
        self.degraded = False
        self.threads: dict[uuid.UUID, Feed[uuid.UUID]] = {}
        self.projects: dict[uuid.UUID, Feed[uuid.UUID]] = {}

    def set_degraded(self, degraded: bool) -> None:
        if degraded != self.degraded:
            log.warning("wake-ups %s", "degraded: feeds poll the log" if degraded else "restored")
        self.degraded = degraded
        if degraded:
            for feed in [*self.threads.values(), *self.projects.values()]:
                feed.wake.set()

    def wake(self, thread_id: uuid.UUID | None, project_id: uuid.UUID | None, sequence: int) -> None:
        if thread_id is not None and (feed := self.threads.get(thread_id)) is not None:
            feed.wake.set()
        if project_id is not None and (pfeed := self.projects.get(project_id)) is not None:
            pfeed.wake.set()

    def _thread_feed(self, thread_id: uuid.UUID) -> Feed[uuid.UUID]:
        feed = self.threads.get(thread_id)
        if feed is None:

            async def head() -> int:
                async with self.db.read() as db:
                    return await log_reader.latest_sequence(db, thread_id)

            async def read(after: int) -> list[LogEvent]:
                async with self.db.read() as db:
                    return await log_reader.thread_events(db, thread_id, after)

            feed = Feed(thread_id, self, head, read, lambda row: row.sequence)
            self.threads[thread_id] = feed
            feed.start()
        return feed

    def _project_feed(self, project_id: uuid.UUID) -> Feed[uuid.UUID]:
        feed = self.projects.get(project_id)
        if feed is None:

            async def head() -> tuple[int, int]:
                async with self.db.read() as db:
                    return await log_reader.project_head(db, project_id)

            async def read(after: tuple[int, int]) -> list[LogEvent]:
                async with self.db.read() as db:
                    return await log_reader.project_events(db, project_id, after)

            feed = Feed(project_id, self, head, read, lambda row: (row.xid, row.position))
            self.projects[project_id] = feed
            feed.start()
        return feed

    def attach_thread(self, thread_id: uuid.UUID) -> Mailbox:
        box = Mailbox(self.mailbox_limit)
        self._thread_feed(thread_id).mailboxes.add(box)
        return box

    def attach_project(self, project_id: uuid.UUID) -> Mailbox:
        box = Mailbox(self.mailbox_limit)
        self._project_feed(project_id).mailboxes.add(box)
        return box

    def detach(self, box: Mailbox) -> None:
        for feeds in (self.threads, self.projects):
            for key, feed in list(feeds.items()):
                feed.mailboxes.discard(box)
                if not feed.mailboxes and feed.task is not None:
                    feed.task.cancel()
                    del feeds[key]

    async def stop(self) -> None:
        for feeds in (self.threads, self.projects):
            for feed in feeds.values():
                if feed.task is not None:
                    feed.task.cancel()
            feeds.clear()

"""A subscription that starts a feed must not lose a change committed while the feed reads its head.

The replay reads the log after the client's cursor and the feed delivers what follows its own head. A
change committed after the replay's read but before the feed's head read is in neither, unless the
replay waits for the feed's head. Here the change is committed exactly there: inside the feed's first
head read, before it reads (the real read runs afterwards). Without the wait the change is lost for
good on a project feed, and held back until the next change on a thread feed.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest

from tests.support.graphql import workspace
from threadloom.domain.access import Principal
from threadloom.domain.statuses import TokenScope
from threadloom.engine.services import Services
from threadloom.store import events as log_reader
from threadloom.store.events import LogEvent
from threadloom.streams import hub as hub_module
from threadloom.streams.hub import Hub, Mailbox
from threadloom.streams.merge import project_stream, thread_stream

ADMIN = Principal(uuid.uuid4(), TokenScope.ADMIN, None)


async def _thread(services: Services, project: uuid.UUID, title: str) -> uuid.UUID:
    return await services.catalog.create_thread(
        ADMIN,
        project_id=project,
        title=title,
        provider_instance_id=None,
        model=None,
        runtime_mode="workspace_write",
        key=None,
    )


def _commit_before_first_head(
    monkeypatch: pytest.MonkeyPatch, feed: type[Any], change: Callable[[], Awaitable[None]]
) -> list[bool]:
    """The feed's first head read commits `change` first, then reads the head for real."""
    real = feed._head
    done: list[bool] = []

    async def head(self: Any) -> Any:
        if not done:
            await change()
            done.append(True)
        return await real(self)

    monkeypatch.setattr(feed, "_head", head)
    return done


async def _first(stream: Any, match: Callable[[Any], bool]) -> LogEvent:
    async def scan() -> LogEvent:
        async for item in stream:
            if isinstance(item, LogEvent) and match(item):
                return item
        raise AssertionError("the stream ended")

    return await asyncio.wait_for(scan(), 20)


async def test_a_project_feed_started_by_a_subscriber_keeps_a_change_committed_during_its_start(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = await services.catalog.create_project(ADMIN, name="P", workspace_root=workspace(), key=None)
    await _thread(services, project, "before")
    async with services.db.read() as r:
        cursor = await log_reader.project_head(r, project)
    created: list[uuid.UUID] = []

    async def change() -> None:
        created.append(await _thread(services, project, "during"))

    done = _commit_before_first_head(monkeypatch, hub_module.ProjectFeed, change)
    hub = Hub(services.db)
    try:
        stream = project_stream(hub, services.db, project, cursor, max_replay=100)
        row = await _first(stream, lambda row: row.thread_id in created)
        assert done and row.event_type == "thread.created"
        await stream.aclose()
    finally:
        await hub.stop()


async def test_a_thread_feed_started_by_a_subscriber_delivers_a_change_committed_during_its_start(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    project = await services.catalog.create_project(ADMIN, name="P", workspace_root=workspace(), key=None)
    thread = await _thread(services, project, "before")
    async with services.db.read() as r:
        latest = await log_reader.latest_sequence(r, thread)

    async def change() -> None:
        await services.catalog.rename_thread(ADMIN, thread, "during", None)

    done = _commit_before_first_head(monkeypatch, hub_module.ThreadFeed, change)
    hub = Hub(services.db)
    try:
        stream = thread_stream(hub, services.db, thread, latest, lambda row: True, max_replay=100)
        row = await _first(stream, lambda row: row.sequence > latest)
        assert done and row.event_type == "thread.renamed"  # not held back until a later change
        await stream.aclose()
    finally:
        await hub.stop()


def _leave_during_first_head(monkeypatch: pytest.MonkeyPatch, hub: Hub, thread: uuid.UUID, box: Mailbox) -> list[bool]:
    """The first head read of `thread`'s feed lets `box` leave its feed first, then reads the head for real."""
    real = hub_module.ThreadFeed._head
    left: list[bool] = []

    async def head(self: Any) -> Any:
        if self.key == thread and not left:
            hub.detach(box)
            left.append(True)
        return await real(self)

    monkeypatch.setattr(hub_module.ThreadFeed, "_head", head)
    return left


@pytest.mark.parametrize("leaving", ["another thread's subscriber", "this thread's subscriber"])
async def test_a_feed_starting_for_a_fast_path_subscriber_outlives_a_subscriber_leaving(
    services: Services, monkeypatch: pytest.MonkeyPatch, leaving: str
) -> None:
    """A fast-path subscribe waits for a new feed's head before it adds its sink, so meanwhile the feed has no
    subscriber. Another subscriber leaving then (of any thread: a leave once stopped every idle feed) must not
    stop it, or that subscribe, and every later message of its socket, waits forever. The twin: the leaving
    subscriber's own feed, unused by anyone else, is stopped."""
    project = await services.catalog.create_project(ADMIN, name="P", workspace_root=workspace(), key=None)
    starting, other = await _thread(services, project, "starting"), await _thread(services, project, "other")
    hub = Hub(services.db)
    try:
        box = hub.attach_thread(other if leaving == "another thread's subscriber" else starting)
        left = _leave_during_first_head(monkeypatch, hub, starting, box)
        async with asyncio.timeout(20):  # not wait_for: its task would start only after the feed's head read
            feed = await hub.ready_thread_feed(starting)
        assert left and hub.threads.get(starting) is feed and feed.task is not None and not feed.task.done()
        assert other not in hub.threads  # the leaving box's feed stopped (or, on this thread, never started one)
        hub.release_if_idle(starting)  # the subscribe found nothing to serve: the feed goes too
        assert starting not in hub.threads
    finally:
        await hub.stop()

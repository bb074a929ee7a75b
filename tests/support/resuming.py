"""A `threadEvents` subscriber that outlives the server it listens to, as a real client would.

It records every sequence it is given and the last status of each run it saw; when the socket drops (the
server was killed, or ended the subscription) it reconnects — to whatever URL the server now has — and
resumes with `afterSequence` = the last sequence it saw. A test then checks that what it holds is exactly
`1..latestSequence`: nothing lost across the crash, nothing delivered twice.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import websockets

from tests.support.graphql import make_project, make_thread
from tests.support.runs import finished
from tests.support.server import Client
from tests.support.waiting import until
from tests.support.ws import WsClient

EVENTS = """subscription($t: ID!, $after: Int) {
  threadEvents(threadId: $t, afterSequence: $after) { sequence type entity { __typename ... on Run { id status } } }
}"""
RETRY_S = 0.1  # the client's reconnect backoff while the server is down (not a wait for a condition)
ACTIVE = {"PREPARING", "STARTING", "RUNNING", "WAITING"}


class ResumingSubscriber:
    """Follows one thread's events across disconnects; `url()` names the server to (re)connect to."""

    def __init__(self, url: Callable[[], str], token: str, thread_id: str) -> None:
        self.url = url
        self.token = token
        self.thread_id = thread_id
        self.sequences: list[int] = []  # every event delivered, in order, duplicates kept
        self.markers: list[tuple[str, int]] = []  # (`synchronized` | `reload_required`, sequence)
        self.runs: dict[str, str] = {}  # run id -> the newest status an event carried
        self.errors: list[Any] = []  # `error` messages of the protocol (none expected)
        self.connections = 0
        self._task: asyncio.Task[None] | None = None

    @property
    def last(self) -> int:
        return self.sequences[-1] if self.sequences else 0

    def start(self) -> ResumingSubscriber:
        self._task = asyncio.create_task(self._follow(), name=f"subscriber {self.thread_id}")
        return self

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _follow(self) -> None:
        while True:
            try:
                ws = await WsClient.connect(self.url(), self.token)
            except (OSError, TimeoutError, ConnectionError, websockets.InvalidHandshake):
                await asyncio.sleep(RETRY_S)  # nobody listening yet: retry like a real client
                continue
            self.connections += 1
            try:
                await ws.subscribe(EVENTS, {"t": self.thread_id, "after": self.last or None})
                while await self._take(await ws.receive(within=3600)):
                    pass
            except (websockets.ConnectionClosed, OSError):
                pass  # the server went away: resume from the last sequence seen
            finally:
                with contextlib.suppress(Exception):
                    await ws.close()

    async def _take(self, message: dict[str, Any]) -> bool:
        """Record one protocol message; False when the subscription ended (then reconnect)."""
        kind = message.get("type")
        if kind == "error":
            self.errors.append(message.get("payload"))
            return False
        if kind != "next":
            return False  # `complete`: the server ended the subscription
        payload = message["payload"]
        if payload.get("errors"):
            self.errors.append(payload["errors"])
            return False
        item = payload["data"]["threadEvents"]
        if item["type"] in ("synchronized", "reload_required"):
            self.markers.append((item["type"], item["sequence"]))
            return True
        self.sequences.append(item["sequence"])
        entity = item.get("entity") or {}
        if entity.get("__typename") == "Run":
            self.runs[entity["id"]] = entity["status"]
        return True


SETTLED = """query($t: ID!) { thread(id: $t) {
  latestSequence queueHeld queueHoldReason
  activeRun { id }
  queue { id status queuePosition }
  runs(first: 100) { edges { node { id ordinal status statusReason } } }
  activities(last: 100) { edges { node { kind runId summary } } }
} }"""


async def settled(client: Client, thread_id: str, within: float = 30.0) -> dict[str, Any]:
    """The thread once nothing can move by itself: no active run and an empty or held queue."""

    async def check() -> dict[str, Any] | None:
        thread: dict[str, Any] = (await client.gql(SETTLED, {"t": thread_id}))["thread"]
        quiet = thread["activeRun"] is None and (not thread["queue"] or thread["queueHeld"])
        return thread if quiet else None

    return await until(check, within=within)


async def caught_up(client: Client, subscriber: ResumingSubscriber, within: float = 30.0) -> int:
    """The thread's latestSequence once the subscriber has reached it and it did not move meanwhile."""

    async def check() -> int | None:
        latest = int((await client.gql(SETTLED, {"t": subscriber.thread_id}))["thread"]["latestSequence"])
        if subscriber.last < latest:
            return None
        again = int((await client.gql(SETTLED, {"t": subscriber.thread_id}))["thread"]["latestSequence"])
        return latest if again == latest else None

    return await until(check, within=within)


Load = Callable[[Client, str, int], Awaitable[dict[str, Any]]]


async def threads_under_load(
    client: Client,
    url: Callable[[], str],
    token: str,
    folder: Path,
    count: int,
    load: Load,
    subscribers: list[ResumingSubscriber],
) -> list[dict[str, Any]]:
    """`count` threads of a new project in `folder` (an existing folder), each followed by a subscriber
    (appended to `subscribers`, which the caller closes) and given the runs `load` sends (its plan: the `slow`
    run and the runs `behind` it); returns once the subscriptions show every slow run streaming and the runs
    behind it still queued."""
    project = await make_project(client, folder.name, str(folder))
    threads = [(await make_thread(client, project, f"{folder.name} {i}"))["id"] for i in range(count)]
    subscribers.extend(ResumingSubscriber(url, token, t).start() for t in threads)
    plans = await asyncio.gather(*(load(client, t, i) for i, t in enumerate(threads)))

    async def mid_work() -> bool:
        return all(
            sub.runs.get(plan["slow"]) == "RUNNING" and all(sub.runs.get(r) == "QUEUED" for r in plan["behind"])
            for sub, plan in zip(subscribers, plans, strict=True)
        )

    await until(mid_work, within=30)
    return list(plans)


async def resume_and_drain(
    client: Client, threads: list[str], plans: list[dict[str, Any]], subscribers: list[ResumingSubscriber]
) -> None:
    """A person resumes each held queue: the runs behind complete, and every subscriber follows, gapless."""
    for thread in threads:
        resumed = await client.gql(
            "mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { userErrors { code } } }", {"t": thread}
        )
        assert resumed["resumeQueue"]["userErrors"] == []
    for plan in plans:
        for run_id in plan["behind"]:
            assert (await finished(client, run_id))["status"] == "COMPLETED"
    for sub in subscribers:
        latest = await caught_up(client, sub)
        assert sub.sequences == list(range(1, latest + 1)), sub.thread_id

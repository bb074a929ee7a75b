"""Measuring what a server holds for its subscribers while a burst of events runs (the byte-bound tests).

The byte bounds (`THREADLOOM_SUBSCRIBER_QUEUE_BYTES`, `THREADLOOM_TOKEN_QUEUE_BYTES`) are checked from the
outside, over WebSocket and over HTTP alike: the queued bytes the server accounts (a /metrics gauge) and the
resident memory of its process, sampled while the run goes, and the thread's latest sequence that every
stream must reach or be cut before.
"""

from __future__ import annotations

import asyncio
import contextlib
import re
from pathlib import Path
from types import TracebackType

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.server import Client

QUEUED = "threadloom_subscriber_queued_bytes"
OPEN_FAST = 'threadloom_subscriptions_open{path="fast"}'
OPEN_GENERAL = 'threadloom_subscriptions_open{path="general"}'
LATEST = "query($t: ID!) { thread(id: $t) { latestSequence } }"
MB = 1024 * 1024
SAMPLE_EVERY = 0.05  # seconds between samples: an interval, not a wait for an outcome


def rss(pid: int) -> int:
    """The resident memory of process `pid`, in bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def gauges(client: Client, *names: str) -> dict[str, float]:
    """The values of the series `names` on the server's /metrics (each a name with its labels, as written there)."""
    response = await client.http.get("/metrics", headers=client.headers())
    assert response.status_code == 200
    found: dict[str, float] = {}
    for name in names:
        match = re.search("^" + re.escape(name) + r" (\S+)$", response.text, re.M)
        assert match is not None, name
        found[name] = float(match.group(1))
    return found


async def thread_and_reader(client: Client, database_url: str, name: str, root: Path) -> tuple[str, str]:
    """A new project's thread (where the burst runs) and a read token of that project (whose streams are held
    to the token's bound, while the admin token's streams are the twins)."""
    data = await client.gql(CREATE_PROJECT, {"name": name, "root": workspace(root)})
    project = data["createProject"]["project"]["id"]
    thread = str((await make_thread(client, project, name))["id"])
    _, reader = create_token(database_url, "read", project)
    return thread, reader


async def latest_sequence(client: Client, thread: str) -> int:
    return int((await client.gql(LATEST, {"t": thread}))["thread"]["latestSequence"])


class QueuePeaks:
    """The highest queued-bytes gauge and server RSS seen inside `async with`, sampled until it exits and
    once more on the way out (so what is still queued at the end counts too)."""

    def __init__(self, client: Client, pid: int) -> None:
        self.client, self.pid = client, pid
        self.before = rss(pid)
        self.bytes = 0.0
        self.rss = self.before
        self._task: asyncio.Task[None] | None = None

    async def sample(self) -> None:
        self.bytes = max(self.bytes, (await gauges(self.client, QUEUED))[QUEUED])
        self.rss = max(self.rss, rss(self.pid))

    async def _watch(self) -> None:
        while True:
            await self.sample()
            await asyncio.sleep(SAMPLE_EVERY)

    async def __aenter__(self) -> QueuePeaks:
        self._task = asyncio.create_task(self._watch())
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if kind is None:
            await self.sample()
            print(f"queued bytes peak {self.bytes / MB:.1f} MiB; RSS {self.before / MB:.0f} -> {self.rss / MB:.0f} MiB")

    @property
    def grown(self) -> int:
        """How much the server's RSS grew over its size when sampling began, in bytes."""
        return self.rss - self.before

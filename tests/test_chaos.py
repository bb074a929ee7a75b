"""Crash under load: `kill -9` of the server while threads have runs streaming and runs queued.

Four threads each get a few quick runs, one slow run (`@delay`) that is streaming when the server dies, and
two runs queued behind it; each thread has one `threadEvents` subscriber that reconnects after the crash with
`afterSequence` = the last sequence it saw. After a restart on the same data directory:
- every subscriber holds exactly 1..latestSequence (nothing lost, nothing twice);
- no run is left active: the crashed run failed (the server that held its turn is gone);
- the queue behind a crashed run is held, with the reason, so a person decides what runs next; resuming it
  drains the queue and the subscribers follow on, still gapless.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.resuming import ACTIVE, ResumingSubscriber, caught_up, resume_and_drain, settled, threads_under_load
from tests.support.runs import send
from tests.support.server import Client, ServerProcess, providers_env

THREADS = 4
QUEUE = {"queueAfterActive": True}
CRASH_REASONS = {"provider_lost", "server_stopped"}
# This test is about the fail path under load: the lost runs fail (`provider_lost`) and hold their queues. By default a
# lost run that ran nothing is recovered on a new attempt instead (tests/test_restart_recovery.py); turned off here.
NO_RECOVERY = '[instances.scripted]\ndriver = "scripted"\nrecovery_retries = 0\n'
SLOW = "@delay 1000\n@reply " + " ".join(f"w{i}" for i in range(60))  # a minute: the crash comes first


class Cluster:
    """The server of the moment: killed and restarted on the same database and data directory."""

    def __init__(self, database_url: str, data_dir: Path) -> None:
        self.database_url = database_url
        self.data_dir = data_dir
        self.env = providers_env(data_dir.parent, NO_RECOVERY)
        self.server = ServerProcess(database_url, data_dir, env=self.env).wait_ready()
        assert self.server.admin_token is not None
        self.token: str = self.server.admin_token
        self.dead: list[ServerProcess] = []

    def url(self) -> str:
        return self.server.url

    def crash_and_restart(self) -> None:
        self.server.kill()  # SIGKILL: no shutdown code runs
        self.dead.append(self.server)
        self.server = ServerProcess(self.database_url, self.data_dir, env=self.env).wait_ready()


@pytest.fixture
async def cluster(database_url: str, data_dir: Path) -> AsyncIterator[Cluster]:
    c = Cluster(database_url, data_dir)
    yield c
    c.server.stop()
    for proc in [*c.dead, c.server]:
        print(proc.report(40))  # shown by pytest only when the test fails


async def _load(client: Client, thread: str, index: int) -> dict[str, Any]:
    """index+1 quick runs, the slow one, two behind it; all queued in order (the first starts at once)."""
    quick = [
        await send(client, thread, f"@delay 20\n@reply t{index} quick {n} a b c", d=QUEUE) for n in range(index + 1)
    ]
    slow = await send(client, thread, SLOW, d=QUEUE)
    behind = [await send(client, thread, f"@reply t{index} behind {n}", d=QUEUE) for n in range(2)]
    for sent in [*quick, slow, *behind]:
        assert sent["userErrors"] == [], sent
    return {
        "quick": [s["run"]["id"] for s in quick],
        "slow": slow["run"]["id"],
        "behind": [s["run"]["id"] for s in behind],
    }


async def test_kill_9_under_load(cluster: Cluster, tmp_path: Path) -> None:
    client = Client(cluster.url(), cluster.token)
    subscribers: list[ResumingSubscriber] = []
    try:
        (tmp_path / "chaos").mkdir()
        plans = await threads_under_load(
            client, cluster.url, cluster.token, tmp_path / "chaos", THREADS, _load, subscribers
        )
        threads = [sub.thread_id for sub in subscribers]
        seen_before = [sub.last for sub in subscribers]
        cluster.crash_and_restart()
        await client.aclose()
        client = Client(cluster.url(), cluster.token)

        after = [await settled(client, t) for t in threads]
        for sub in subscribers:  # 1. every subscriber has exactly the log
            latest = await caught_up(client, sub)
            assert sub.sequences == list(range(1, latest + 1)), sub.thread_id
            assert sub.errors == [] and all(kind == "synchronized" for kind, _ in sub.markers)
        for sub, before in zip(subscribers, seen_before, strict=True):
            assert sub.connections >= 2 and sub.last > before  # it reconnected and resumed past the crash

        for thread, plan in zip(after, plans, strict=True):  # 2. nothing left active; the crashed run failed
            runs = {e["node"]["id"]: e["node"] for e in thread["runs"]["edges"]}
            assert not [r for r in runs.values() if r["status"] in ACTIVE], runs
            assert all(runs[r]["status"] == "COMPLETED" for r in plan["quick"])
            slow = runs[plan["slow"]]
            assert slow["status"] == "FAILED" and slow["statusReason"] in CRASH_REASONS, slow

        for thread, plan in zip(after, plans, strict=True):  # 3. the queue behind a crash is held
            assert thread["queueHeld"], f"queue not held after a crash: {thread['queue']} {thread['runs']}"
            assert thread["queueHoldReason"]
            assert [(r["id"], r["status"], r["queuePosition"]) for r in thread["queue"]] == [
                (plan["behind"][0], "QUEUED", 1),
                (plan["behind"][1], "QUEUED", 2),
            ]
            held = [a["node"] for a in thread["activities"]["edges"] if a["node"]["kind"] == "queue.held"]
            assert [a["runId"] for a in held][-1:] == [plan["slow"]], held  # held because that run failed
            assert held[-1]["summary"] == thread["queueHoldReason"]

        await resume_and_drain(
            client, threads, plans, subscribers
        )  # a person resumes: the queue drains and the subscribers follow, gapless
    finally:
        for sub in subscribers:
            await sub.stop()
        await client.aclose()

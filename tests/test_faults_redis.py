"""Redis killed and restarted under three replicas: wake-ups fall back to polling the log, then recover.

Three `threadloom serve` processes share one PostgreSQL and one real Redis (`BROADCAST_URL=redis://…`). Each of
three threads has a subscriber on every replica and its messages go through one replica, so most subscribers
learn of an event only through a wake-up from another process. With runs streaming (held at an `@await` gate, so
they are certainly still running), Redis gets `kill -9`; the gate opens once every replica noticed:
- every replica reports `threadloom_wakeups_degraded 1` on /metrics, and its feeds poll the log: runs sent
  meanwhile reach every subscriber on every replica;
- Redis started again on the same port, every replica reports 0 again, and wake-ups carry events across
  replicas at once: a subscriber on another replica sees a run end within a moment of one on the replica that
  ran it (healthy feeds poll only every 5 s, so this holds only if the wake-up arrived);
- no subscriber's socket dropped, and each holds exactly 1..latestSequence.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.graphql import make_project, make_thread
from tests.support.redis import RedisServer, running_redis
from tests.support.resuming import ResumingSubscriber, caught_up
from tests.support.runs import TERMINAL, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until

REPLICAS = 3
THREADS = 3
GATE = "redis-gone"  # opened (created in the workspace) once every replica reports Redis gone
# A run that streams a reply, holds at the gate until Redis is dead, then streams the rest: its later events
# can only reach the other replicas' subscribers by polling.
STREAMING = f"@reply before the kill\n@await {GATE}\n@reply " + " ".join(f"w{i}" for i in range(20))
WAKE_UP_S = 1.5  # a woken feed reads at once; a healthy feed that was not woken waits up to 5 s (POLL_HEALTHY)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path / "redis") as server:
        yield server


class Replicas:
    """Three servers on one database, one Redis and one shared data dir."""

    def __init__(self, database_url: str, redis_url: str, data_dir: Path) -> None:
        env = {"BROADCAST_URL": redis_url}
        first = ServerProcess(database_url, data_dir, env=env).wait_ready()  # makes the admin token
        others = [ServerProcess(database_url, data_dir, env=env) for _ in range(REPLICAS - 1)]
        self.servers = [first, *(s.wait_ready() for s in others)]
        assert first.admin_token is not None
        self.token: str = first.admin_token
        self.clients = [Client(s.url, self.token) for s in self.servers]

    async def degraded(self) -> list[float]:
        """Each replica's `threadloom_wakeups_degraded`, scraped from its /metrics."""
        found = []
        for client in self.clients:
            response = await client.http.get("/metrics", headers=client.headers())
            assert response.status_code == 200, response.text
            samples = {s.name: s.value for f in text_string_to_metric_families(response.text) for s in f.samples}
            found.append(samples["threadloom_wakeups_degraded"])
        return found

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()
        for server in self.servers:
            server.stop()


@pytest.fixture
async def replicas(database_url: str, redis: RedisServer, tmp_path: Path) -> AsyncIterator[Replicas]:
    cluster = Replicas(database_url, redis.url, tmp_path / "shared-data")
    yield cluster
    await cluster.close()
    for index, server in enumerate(cluster.servers):
        print(f"--- replica {index}\n" + "\n".join(server.log[-30:]))  # shown by pytest only when the test fails


async def _seen(subscriber: ResumingSubscriber, run_id: str, within: float = 30) -> float:
    """When (time.monotonic) the subscriber saw the run end."""

    async def check() -> float | None:
        return time.monotonic() if subscriber.runs.get(run_id) in TERMINAL else None

    return await until(check, within=within, interval=0.01)


async def test_redis_killed_and_restarted_under_three_replicas(
    replicas: Replicas, redis: RedisServer, tmp_path: Path
) -> None:
    cluster = replicas
    client = cluster.clients[0]
    watching: dict[str, list[ResumingSubscriber]] = {}  # thread -> its subscriber on each replica
    try:
        workspace = tmp_path / "ws"
        workspace.mkdir()
        project = await make_project(client, "redis-faults", str(tmp_path / "ws"))
        threads = [(await make_thread(client, project, f"r{i}"))["id"] for i in range(THREADS)]
        for thread in threads:
            watching[thread] = [
                ResumingSubscriber(lambda url=server.url: url, cluster.token, thread).start()
                for server in cluster.servers
            ]
        assert await cluster.degraded() == [0.0] * REPLICAS

        async def run_everywhere(text: str, shift: int) -> list[str]:
            """One run per thread, thread i's through replica i + shift; the runs' ids."""
            ids = []
            for i, thread in enumerate(threads):
                sent = await send(cluster.clients[(i + shift) % REPLICAS], thread, text)
                assert sent["userErrors"] == [], sent
                ids.append(sent["run"]["id"])
            return ids

        async def ended_everywhere(run_ids: list[str]) -> None:
            """Every subscriber of each run's thread, on every replica, saw it end."""
            await asyncio.gather(
                *(
                    _seen(sub, run_id)
                    for thread, run_id in zip(threads, run_ids, strict=True)
                    for sub in watching[thread]
                )
            )

        streaming = await run_everywhere(STREAMING, 0)

        async def mid_stream() -> bool:  # every subscriber, on every replica, sees its run under way
            return all(
                sub.runs.get(run_id) == "RUNNING"
                for thread, run_id in zip(threads, streaming, strict=True)
                for sub in watching[thread]
            )

        await until(mid_stream, within=30)  # held at the gate: still running however slow the machine
        redis.kill()  # kill -9, mid-stream

        async def all_degraded() -> bool:
            return await cluster.degraded() == [1.0] * REPLICAS

        await until(all_degraded, within=15, interval=0.2)
        assert all(
            sub.runs[run_id] == "RUNNING" for t, run_id in zip(threads, streaming, strict=True) for sub in watching[t]
        )
        (workspace / GATE).touch()  # the rest of each reply is streamed with Redis gone
        await ended_everywhere(streaming)  # the streams went on, by polling
        await ended_everywhere(await run_everywhere("@reply while redis is down", 1))

        restarted = RedisServer(tmp_path / "redis", port=redis.port).wait_ready()  # same port, as its service would
        try:

            async def all_restored() -> bool:
                return await cluster.degraded() == [0.0] * REPLICAS

            await until(all_restored, within=30, interval=0.2)

            # Woken again: a run's end reaches the other replicas' subscribers with its own replica's.
            for n in range(4):
                runner = n % REPLICAS
                thread = threads[0]
                sent = await send(cluster.clients[runner], thread, f"@reply after redis came back {n}")
                assert sent["userErrors"] == [], sent
                seen = await asyncio.gather(*(_seen(sub, sent["run"]["id"]) for sub in watching[thread]))
                lag = max(seen) - seen[runner]
                assert lag < WAKE_UP_S, f"run {n} through replica {runner} reached the others {lag:.2f} s later: {seen}"

            for thread in threads:  # every subscriber holds exactly the log, over the one socket it opened
                for index, sub in enumerate(watching[thread]):
                    latest = await caught_up(cluster.clients[index], sub)
                    assert sub.sequences == list(range(1, latest + 1)), (thread, index)
                    assert sub.errors == [] and sub.connections == 1, (thread, index, sub.errors)
            lapses = [[line for line in s.log if "wake-ups degraded" in line] for s in cluster.servers]
            assert all(lapses), lapses  # each replica logged the fallback too
        finally:
            restarted.stop()
    finally:
        for subs in watching.values():
            for sub in subs:
                await sub.stop()

"""Replicas: three `threadloom serve` processes on one PostgreSQL and one real Redis, one of them killed mid-work.

Two replicas share one data dir (as on a shared volume: the agents' state is in its default place, `<data dir>/agents`);
the third has a data dir of its own and names that same agent-state folder with `THREADLOOM_AGENT_STATE_DIR`
(docs/providers.md, "Replicas"). `BROADCAST_URL` is a real `redis-server` started for the test. Thirty threads get
ten messages each (300 runs), every message sent to the next replica round-robin, each thread's next message once
its previous run ended; one `threadEvents` subscriber per thread, spread over the replicas. When a third of the runs
are done the replica holding the most provider threads gets `kill -9`. Then:
- every subscriber holds exactly 1..latestSequence (those of the dead replica reconnected to another and resumed
  with `afterSequence`);
- no run is stuck: each ended COMPLETED, or FAILED with a crash reason (its turn was on the dead replica);
- no effect ran twice: no effect that is not replay-safe was claimed twice, no attempt has two provider turns,
  each thread's agent received each message at most once (its `@recall` lists every message once), and the dead
  replica's agent processes ended with it (none goes on working beside the replica that resumes its threads);
- the dead replica's provider threads resume elsewhere: `@recall` sent to a survivor runs on the same native
  thread and replies with the conversation from before the crash;
- the survivors' Redis wake-ups never degraded to polling.
"""

from __future__ import annotations

import asyncio
import functools
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import sqlalchemy as sa

from tests.support import processes
from tests.support.graphql import make_project, make_thread
from tests.support.redis import RedisServer, running_redis
from tests.support.resuming import ResumingSubscriber, caught_up
from tests.support.runs import RUN, SEND, TERMINAL
from tests.support.server import Client, ServerProcess, providers_env
from tests.support.waiting import until
from threadloom.config import Settings
from threadloom.domain.errors import DomainError
from threadloom.domain.projects import check_workspace_root
from threadloom.providers.registry import build_driver, load_instances
from threadloom.providers.scripted import ScriptedDriver
from threadloom.store import tables as t
from threadloom.store.db import Database
from threadloom.streams.notifier import broadcast_for

REPLICAS = 3
THREADS = 30
MESSAGES = 10  # per thread: 300 runs
KILL_AFTER = THREADS * MESSAGES // 3  # runs ended when the replica dies
CRASH_REASONS = {"provider_lost", "server_stopped", "provider_crashed"}
# The crash's lost runs fail here (`provider_lost`), so that each message reaches its agent at most once. By default a
# lost run that ran nothing is recovered on a new attempt, which sends its message again on the resumed provider
# thread (tests/test_restart_recovery.py covers that for a lost replica); turned off here.
NO_RECOVERY = '[instances.scripted]\ndriver = "scripted"\nrecovery_retries = 0\n'
# The per-token limits are counted per process (docs/security.md); this test is about replicas, not limits.
UNLIMITED = {
    "THREADLOOM_RUN_STARTS_PER_MINUTE": "100000",
    "THREADLOOM_RUN_START_BURST": "100000",
    "THREADLOOM_MUTATIONS_PER_MINUTE": "100000",
    "THREADLOOM_MUTATION_BURST": "100000",
}
REPLY = """query($t: ID!) { thread(id: $t) { messages(last: 4) { nodes { role text run { id } } } } }"""
RUNS = """query($t: ID!) {
  thread(id: $t) { activeRun { id } runs(first: 100) { nodes { id status statusReason } } }
}"""


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[RedisServer]:
    with running_redis(tmp_path / "redis") as server:
        yield server


class Replicas:
    """Three servers on one database, Redis and agent-state folder, each on its own port."""

    def __init__(self, database_url: str, redis_url: str, root: Path) -> None:
        env = {"BROADCAST_URL": redis_url, **UNLIMITED, **providers_env(root, NO_RECOVERY)}
        shared = root / "shared-data"  # r0 and r1; r2 keeps its own data dir but the agents' state is shared
        own = {**env, "THREADLOOM_AGENT_STATE_DIR": str(shared / "agents")}
        first = ServerProcess(database_url, shared, env=env).wait_ready()  # makes the admin token
        others = [ServerProcess(database_url, shared, env=env), ServerProcess(database_url, root / "r2-data", env=own)]
        self.servers = [first, *(s.wait_ready() for s in others)]
        assert first.admin_token is not None
        self.token: str = first.admin_token
        self.clients = [Client(s.url, self.token) for s in self.servers]
        self.dead: set[int] = set()

    def live(self, preferred: int) -> int:
        """`preferred` (mod the replica count) if it lives, else the next live replica."""
        for step in range(REPLICAS):
            index = (preferred + step) % REPLICAS
            if index not in self.dead:
                return index
        raise AssertionError("no replica left")

    def url(self, preferred: int) -> str:
        return self.servers[self.live(preferred)].url

    def kill(self, index: int) -> None:
        self.dead.add(index)  # clients go elsewhere from now on
        self.servers[index].kill()  # SIGKILL: no shutdown code runs

    async def close(self) -> None:
        for client in self.clients:
            await client.aclose()
        for index, server in enumerate(self.servers):
            if index not in self.dead:
                server.stop()


@pytest.fixture
async def replicas(database_url: str, redis: RedisServer, tmp_path: Path) -> AsyncIterator[Replicas]:
    cluster = Replicas(database_url, redis.url, tmp_path)
    yield cluster
    await cluster.close()
    for index, server in enumerate(cluster.servers):
        print(f"--- replica {index}\n" + "\n".join(server.log[-40:]))  # shown by pytest only when the test fails


async def _send(cluster: Replicas, preferred: int, thread: str, text: str, key: str) -> str:
    """sendMessage through `preferred` (the next live replica if it is dead or dies meanwhile); the run's id.

    A retry carries the same clientMessageId: a request whose answer was lost to the crash is not sent twice."""
    for attempt in range(REPLICAS * 3):
        client = cluster.clients[cluster.live(preferred + attempt)]
        try:
            data = await client.gql(SEND, {"t": thread, "text": text, "key": key})
        except httpx.HTTPError:
            continue
        sent = data["sendMessage"]
        assert sent["userErrors"] == [], sent
        return str(sent["run"]["id"])
    raise AssertionError(f"no replica took {text!r}")


async def _ended(subscriber: ResumingSubscriber, run_id: str) -> str:
    """The run's terminal status, as its thread's subscriber saw it."""

    async def check() -> str | None:
        status = subscriber.runs.get(run_id)
        return status if status in TERMINAL else None

    return await until(check, within=120)


async def _workers(db: Database) -> dict[int, uuid.UUID]:
    """pid → worker id of the live server processes."""
    async with db.read() as r:
        rows = await r.rows(sa.select(t.workers.c.pid, t.workers.c.id).where(t.workers.c.stopped_at.is_(None)))
    return {int(row["pid"]): row["id"] for row in rows}


async def _native_threads(db: Database) -> dict[str, tuple[str, str | None]]:
    """App thread id → (its provider thread's native ref, the worker owning the runtime it was last used on)."""
    pt, ps = t.provider_threads, t.provider_sessions
    async with db.read() as r:
        rows = await r.rows(
            sa.select(pt.c.thread_id, pt.c.native_thread_ref, ps.c.owner)
            .select_from(pt.join(ps, pt.c.session_id == ps.c.id))
            .where(pt.c.native_thread_ref.is_not(None))
        )
    return {str(row["thread_id"]): (str(row["native_thread_ref"]), row["owner"]) for row in rows}


async def _recall(cluster: Replicas, preferred: int, thread: str, subscriber: ResumingSubscriber) -> tuple[str, Any]:
    """Send `@recall` through a live replica; the reply's text and the run (its provider thread)."""
    run_id = await _send(cluster, preferred, thread, "@recall", f"{thread}-recall")
    assert await _ended(subscriber, run_id) == "COMPLETED"
    client = cluster.clients[cluster.live(preferred)]
    run = (await client.gql(RUN, {"id": run_id}))["run"]
    messages = (await client.gql(REPLY, {"t": thread}))["thread"]["messages"]["nodes"]
    replies = [m["text"] for m in messages if m["role"] == "ASSISTANT" and (m["run"] or {}).get("id") == run_id]
    assert len(replies) == 1, messages
    return replies[0], run


async def test_replicas_take_over_a_killed_replica(replicas: Replicas, database_url: str, tmp_path: Path) -> None:
    cluster = replicas
    db = Database.from_url(database_url, pool_size=1)
    subscribers: list[ResumingSubscriber] = []
    driving: asyncio.Future[list[None]] | None = None
    started = time.monotonic()
    try:
        (tmp_path / "ws").mkdir()
        project = await make_project(cluster.clients[0], "replicas", str(tmp_path / "ws"))
        threads = [(await make_thread(cluster.clients[i % REPLICAS], project, f"r{i}"))["id"] for i in range(THREADS)]
        subscribers = [
            ResumingSubscriber(functools.partial(cluster.url, i), cluster.token, thread).start()
            for i, thread in enumerate(threads)
        ]
        sent: list[list[tuple[str, str]]] = [[] for _ in threads]  # per thread: (run id, text), in order
        ended = 0

        async def drive(i: int) -> None:
            nonlocal ended
            for k in range(MESSAGES):
                text = f"t{i} m{k}"  # the cheapest reply: `You said: t{i} m{k}`
                run_id = await _send(cluster, i + k, threads[i], text, f"{threads[i]}-{k}")
                sent[i].append((run_id, text))
                await _ended(subscribers[i], run_id)
                ended += 1

        async def mid_work() -> bool:
            return ended >= KILL_AFTER or (driving is not None and driving.done())  # done early: it failed

        driving = asyncio.gather(*(drive(i) for i in range(THREADS)))
        await until(mid_work, within=300)

        # The victim: the replica whose runtimes hold the most provider threads at that moment.
        pids = {server.proc.pid: index for index, server in enumerate(cluster.servers)}
        owners = {str(worker): pids[pid] for pid, worker in (await _workers(db)).items() if pid in pids}
        before = await _native_threads(db)
        held = [sum(1 for _, owner in before.values() if owners.get(owner or "") == i) for i in range(REPLICAS)]
        victim = held.index(max(held))
        orphans = {thread: ref for thread, (ref, owner) in before.items() if owners.get(owner or "") == victim}
        on_victim = [sub for i, sub in enumerate(subscribers) if i % REPLICAS == victim]
        seen_before = [sub.last for sub in on_victim]
        agents = processes.descendants(cluster.servers[victim].proc.pid)
        cluster.kill(victim)
        killed_at = ended

        async def agents_gone() -> bool:  # no agent of the dead replica goes on working beside its successor
            return not processes.running(agents)

        await until(agents_gone, within=30)
        await asyncio.wait_for(driving, 300)
        print(f"killed replica {victim} after {killed_at} runs; provider threads per replica then: {held}")
        assert orphans, "the dead replica held no provider thread"
        assert agents, "the dead replica ran no agent process"

        survivor = cluster.clients[cluster.live(victim + 1)]
        for sub in subscribers:  # 1. every subscriber holds exactly the log
            latest = await caught_up(survivor, sub)
            assert sub.sequences == list(range(1, latest + 1)), sub.thread_id
            assert sub.errors == [], sub.errors
        for sub, last in zip(on_victim, seen_before, strict=True):  # ...those of the dead replica resumed elsewhere
            assert sub.connections >= 2 and sub.last > last, sub.thread_id

        statuses: dict[str, tuple[str, str | None]] = {}
        for thread in threads:  # 2. no run stuck: COMPLETED, or FAILED because its turn died with the replica
            found = await survivor.gql(RUNS, {"t": thread})
            assert found["thread"]["activeRun"] is None, found
            statuses.update({r["id"]: (r["status"], r["statusReason"]) for r in found["thread"]["runs"]["nodes"]})
        assert len(statuses) == THREADS * MESSAGES
        failed = {run: why for run, why in statuses.items() if why[0] != "COMPLETED"}
        assert all(status == "FAILED" and reason in CRASH_REASONS for status, reason in failed.values()), failed

        async with db.read() as r:  # 3. no effect ran twice
            twice = await r.rows(
                sa.select(t.effects.c.id, t.effects.c.kind, t.effects.c.attempts).where(
                    t.effects.c.replay_safe.is_(False), t.effects.c.attempts > 1
                )
            )
            open_effects = await r.rows(
                sa.select(t.effects.c.id, t.effects.c.kind).where(t.effects.c.status.in_(["pending", "running"]))
            )
            turns = t.provider_turns
            doubled = await r.rows(
                sa.select(turns.c.run_attempt_id).group_by(turns.c.run_attempt_id).having(sa.func.count() > 1)
            )
        assert [dict(e) for e in twice] == [] and [dict(e) for e in doubled] == []
        assert [dict(e) for e in open_effects] == []

        # 4. Every thread's next message, on a survivor, continues its conversation: the dead replica's provider
        # threads were resumed (same native thread, no replacement handoff), and each message reached its agent
        # at most once (a failed run's message may have reached it before the crash).
        for i, thread in enumerate(threads):
            reply, run = await _recall(cluster, victim + 1 + i, thread, subscribers[i])
            lines = reply.split("\n")
            assert all(line.startswith("user: ") for line in lines), reply  # no handoff: nothing was replaced
            received = [line.removeprefix("user: ") for line in lines]
            assert len(received) == len(set(received)), reply
            completed = [text for run_id, text in sent[i] if statuses[run_id][0] == "COMPLETED"]
            crashed = {text for run_id, text in sent[i] if statuses[run_id][0] != "COMPLETED"}
            assert [text for text in received if text not in crashed] == [*completed, "@recall"], reply
            if thread in orphans:
                assert run["providerThread"]["nativeThreadRef"] == orphans[thread], run
                assert received[0] == f"t{i} m0", reply  # the conversation from before the crash

        after = await _native_threads(db)
        dead_worker = next(worker for worker, index in owners.items() if index == victim)
        assert all(after[thread][1] != dead_worker for thread in orphans)  # resumed on a survivor's runtime
        resumed_on = [sum(1 for thread in orphans if owners.get(after[thread][1] or "") == i) for i in range(REPLICAS)]

        # 5. Redis wake-ups stayed up on the survivors. Broken ones degrade every few seconds (measured with
        # broadcaster's own Redis backend: from the first seconds on, again and again); one lapse is allowed, as a
        # starved machine may hold a heartbeat past its 3.5 s window.
        for index, server in enumerate(cluster.servers):
            if index != victim:
                lapses = [line for line in server.log if "wake-ups degraded" in line]
                assert len(lapses) <= 1, (index, lapses)
        elapsed = time.monotonic() - started
        print(f"{len(statuses)} runs, {len(failed)} failed by the crash; {len(orphans)} provider threads resumed, per")
        print(f"replica: {resumed_on}; {elapsed:.1f} s")
    finally:
        if driving is not None and not driving.done():
            driving.cancel()
        for sub in subscribers:
            await sub.stop()
        await db.dispose()


async def test_a_redis_wake_up_published_right_after_subscribing_arrives(redis: RedisServer) -> None:
    """broadcaster 0.3.1's own Redis backend never delivers (its listener stops before the channel is recorded)."""
    broadcast = broadcast_for(redis.url)
    await broadcast.connect()
    try:
        async with broadcast.subscribe("threadloom_test") as subscriber:
            for n in range(3):
                await broadcast.publish("threadloom_test", f"wake {n}")
            got = [(await asyncio.wait_for(subscriber.get(), 10)).message for _ in range(3)]
        assert got == ["wake 0", "wake 1", "wake 2"]
    finally:
        await broadcast.disconnect()


def test_only_a_server_whose_wake_ups_go_through_redis_imports_redis_py() -> None:
    """redis-py is ~0.1 s of CPU at every start: a server on the default (PostgreSQL) wake-ups never imports it,
    and one given a redis:// URL does (the twin)."""
    code = (
        "import sys, threadloom.app, threadloom.cli\n"
        "from threadloom.streams.notifier import broadcast_for\n"
        "broadcast_for('postgres://localhost/x')\n"
        "print('redis' in sys.modules)\n"
        "broadcast_for('redis://localhost:1')\n"
        "print('redis' in sys.modules)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True"]


def test_the_agent_state_dir_setting_holds_every_driver_state(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("THREADLOOM_AGENT_STATE_DIR", str(tmp_path / "shared"))
    settings = Settings.from_env(data_dir=str(tmp_path / "data"))
    assert settings.agents_dir == tmp_path / "shared"
    assert Settings(data_dir=tmp_path / "data", database_url=None).agents_dir == tmp_path / "data" / "agents"
    toml = tmp_path / "providers.toml"
    toml.write_text('[instances.codex]\ndriver = "codex"\n[instances.claude]\ndriver = "claude"\n')
    instances = load_instances(toml)
    assert {config.driver for config in instances.values()} == {"scripted", "codex", "claude"}
    for name, config in instances.items():
        driver = build_driver(config, settings.data_dir, settings.agents_dir)
        assert driver.state_dir == tmp_path / "shared" / name  # type: ignore[attr-defined]
        if isinstance(driver, ScriptedDriver):  # outside the data dir, still out of the commands' sight
            assert set(driver.hidden) == {tmp_path / "data", tmp_path / "shared"}


def test_a_workspace_may_not_hold_the_agent_state_dir(tmp_path: Path) -> None:
    shared = str(tmp_path / "shared" / "agents")
    with pytest.raises(DomainError, match="agents' state folder"):
        check_workspace_root(str(tmp_path / "shared"), existing=[], data_dir=str(tmp_path / "data"), agents_dir=shared)
    check_workspace_root(str(tmp_path / "ws"), existing=[], data_dir=str(tmp_path / "data"), agents_dir=shared)

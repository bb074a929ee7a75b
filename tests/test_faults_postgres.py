"""PostgreSQL restarted under load: a real `threadloom serve` on a PostgreSQL of the test's own, threads with runs
streaming (scripted agent, `@delay`) and runs queued behind them, one `threadEvents` subscriber per thread.

PostgreSQL goes away in two ways: killed (`kill -9` of the postmaster; back only once the server has noticed)
and stopped fast (`pg_ctl stop -m fast`, PostgreSQL's SIGINT; started again at once, before the server notices).
docs/deploy.md ("A replica cut off from PostgreSQL") promises what happens then, and the test holds the server to it:
- the server notices its worker lock's connection broke, ends every subscription with SERVER_GOING_AWAY and the
  cursor to resume from, and exits with 75 for its supervisor; the test is that supervisor and starts it again
  on the same port and database;
- every subscriber, reconnecting with `afterSequence`, ends with exactly 1..latestSequence;
- no run is left active: the runs streaming when PostgreSQL went failed with a crash reason, the queue behind
  each is held with the reason, and resuming it runs the queued runs to completion.

Those two cases turn recovery off (`recovery_retries = 0`) to test the fail path. With the default settings, a
turn lost with the killed PostgreSQL that ran nothing irreversible (it waits at an `@await` gate) is instead
completed by a `PROVIDER_RECOVERY` attempt on the restarted server, and the queue behind it runs on by itself,
as docs/deploy.md says.

One PostgreSQL serves the module (a fresh database per test); each test kills or stops it and starts it again.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import processes
from tests.support.pg import PgServer, postgres_pids, postmaster_pid
from tests.support.resuming import ACTIVE, ResumingSubscriber, caught_up, resume_and_drain, settled, threads_under_load
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, free_port, providers_env
from tests.support.waiting import until
from threadloom.app import WORKER_LOST_EXIT

THREADS = 3
QUEUE = {"queueAfterActive": True}
CRASH_REASONS = {"provider_lost", "server_stopped"}
# This test is about the fail path under load: the lost runs fail (`provider_lost`) and hold their queues. By default a
# lost run that ran nothing is recovered on a new attempt instead (tests/test_restart_recovery.py); turned off here.
NO_RECOVERY = '[instances.scripted]\ndriver = "scripted"\nrecovery_retries = 0\n'
DEFAULT_RECOVERY = '[instances.scripted]\ndriver = "scripted"\n'  # recovery_retries at its default (2)
SLOW = "@delay 1000\n@reply " + " ".join(f"w{i}" for i in range(60))  # a minute: PostgreSQL goes first


class OwnPostgres:
    """A PostgreSQL for this test alone (the session's serves every other test), restartable on its data dir."""

    def __init__(self, root: Path) -> None:
        self.pg = PgServer(root)
        self.pgdata = root / "pg"
        self.templated = False

    async def database(self) -> str:
        """A fresh migrated database (the template is made once)."""
        if not self.templated:
            await self.pg.create_template()
            self.templated = True
        return await self.pg.fresh()

    def go_away(self, how: str) -> None:
        """`kill`: SIGKILL of the postmaster, as a crashed or OOM-killed PostgreSQL; `fast`: SIGINT, the fast
        shutdown (`pg_ctl stop -m fast`). Returns once no process of it is left."""
        postmaster = postmaster_pid(self.pgdata)
        assert postmaster is not None and postgres_pids(self.pgdata) == [postmaster]
        family = processes.children(postmaster) | {postmaster}
        os.kill(postmaster, signal.SIGKILL if how == "kill" else signal.SIGINT)
        deadline = time.monotonic() + 30
        # Killed, its backends end once they see the postmaster gone (a new postmaster refuses to start on
        # shared memory they still hold), and the postmaster must have been reaped: PostgreSQL takes the pid
        # in postmaster.pid for a live server while even a zombie holds it.
        while processes.running(family) or Path(f"/proc/{postmaster}").exists():
            assert time.monotonic() < deadline, f"PostgreSQL processes left: {processes.running(family) or postmaster}"
            time.sleep(0.02)

    def start(self) -> None:
        """Start PostgreSQL again on the same data dir (crash recovery after a kill), as its service would."""
        handle = self.pg.server
        with handle._lock:
            handle.ensure_postgres_running()
        assert postgres_pids(self.pgdata) == [postmaster_pid(self.pgdata)]

    def stop(self) -> None:
        self.pg.stop()


@pytest.fixture(scope="module")
def own_postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnPostgres]:
    server = OwnPostgres(tmp_path_factory.mktemp("pgroot"))
    try:
        yield server
    finally:
        server.stop()


class Supervised:
    """`threadloom serve` under a supervisor that restarts it on the same port when it exits (Restart=always)."""

    def __init__(self, database_url: str, data_dir: Path, providers: str) -> None:
        self.database_url = database_url
        self.data_dir = data_dir
        self.port = free_port()
        self.env = providers_env(data_dir.parent, providers)
        self.server = ServerProcess(database_url, data_dir, env=self.env, port=self.port).wait_ready()
        assert self.server.admin_token is not None
        self.token: str = self.server.admin_token
        self.exited: list[ServerProcess] = []

    def url(self) -> str:
        return self.server.url

    async def exit_code(self, within: float = 30) -> int:
        """The server's exit code once it stopped by itself."""
        code = await asyncio.to_thread(self.server.proc.wait, within)
        self.exited.append(self.server)
        return code

    def restart(self) -> None:
        self.server = ServerProcess(self.database_url, self.data_dir, env=self.env, port=self.port).wait_ready()


async def _supervising(own_postgres: OwnPostgres, data_dir: Path, providers: str) -> AsyncIterator[Supervised]:
    s = Supervised(await own_postgres.database(), data_dir, providers)
    yield s
    s.server.stop()
    for proc in [*s.exited, s.server]:
        print(proc.report(40))  # shown by pytest only when the test fails


@pytest.fixture
async def supervised(own_postgres: OwnPostgres, data_dir: Path) -> AsyncIterator[Supervised]:
    """A supervised server whose lost runs fail (recovery off)."""
    async for s in _supervising(own_postgres, data_dir, NO_RECOVERY):
        yield s


@pytest.fixture
async def supervised_recovering(own_postgres: OwnPostgres, data_dir: Path) -> AsyncIterator[Supervised]:
    """A supervised server with the default recovery settings."""
    async for s in _supervising(own_postgres, data_dir, DEFAULT_RECOVERY):
        yield s


async def _load(client: Client, thread: str, index: int) -> dict[str, Any]:
    """A quick run, the slow one streaming behind it, two queued behind that."""
    quick = await send(client, thread, f"@reply t{index} quick", d=QUEUE)
    slow = await send(client, thread, SLOW, d=QUEUE)
    behind = [await send(client, thread, f"@reply t{index} behind {n}", d=QUEUE) for n in range(2)]
    for sent in [quick, slow, *behind]:
        assert sent["userErrors"] == [], sent
    return {"quick": quick["run"]["id"], "slow": slow["run"]["id"], "behind": [b["run"]["id"] for b in behind]}


@pytest.mark.parametrize("how", ["kill", "fast"], ids=["kill-9-then-start", "fast-stop-and-start-at-once"])
async def test_a_postgres_restart_under_load_loses_no_event_and_leaves_no_run_active(
    own_postgres: OwnPostgres, supervised: Supervised, tmp_path: Path, how: str
) -> None:
    client = Client(supervised.url(), supervised.token)
    subscribers: list[ResumingSubscriber] = []
    try:
        (tmp_path / "pg-restart").mkdir()
        plans = await threads_under_load(
            client, supervised.url, supervised.token, tmp_path / "pg-restart", THREADS, _load, subscribers
        )
        threads = [sub.thread_id for sub in subscribers]
        seen_before = [sub.last for sub in subscribers]
        agents = processes.descendants(supervised.server.proc.pid)
        assert agents, "the server runs no agent process"

        await asyncio.to_thread(own_postgres.go_away, how)
        if how == "fast":
            await asyncio.to_thread(own_postgres.start)  # back before the server's next look at its lock
        assert await supervised.exit_code(within=30) == WORKER_LOST_EXIT, "\n".join(supervised.server.log[-40:])
        stopped = supervised.exited[-1].log
        assert any("lost its lock connection" in line for line in stopped)
        assert not any("Application shutdown failed" in line for line in stopped), "\n".join(stopped[-20:])

        async def agents_gone() -> bool:  # none goes on working for a server that is no longer a worker
            return not processes.running(agents)

        await until(agents_gone, within=15)
        if how == "kill":
            await asyncio.to_thread(own_postgres.start)
        supervised.restart()
        await client.aclose()
        client = Client(supervised.url(), supervised.token)

        after = [await settled(client, t) for t in threads]
        for sub, before in zip(subscribers, seen_before, strict=True):  # 1. every subscriber holds exactly the log
            latest = await caught_up(client, sub)
            assert sub.sequences == list(range(1, latest + 1)), sub.thread_id
            assert sub.connections >= 2 and sub.last > before  # it reconnected and resumed past the restart
            # The only error a subscriber may see: the stopping server's SERVER_GOING_AWAY, with its cursor.
            for errors in sub.errors:
                assert [e["extensions"]["code"] for e in errors] == ["SERVER_GOING_AWAY"], sub.errors

        for thread, plan in zip(after, plans, strict=True):  # 2. nothing left active; the cut-off run failed
            runs = {e["node"]["id"]: e["node"] for e in thread["runs"]["edges"]}
            assert not [r for r in runs.values() if r["status"] in ACTIVE], runs
            assert runs[plan["quick"]]["status"] == "COMPLETED"
            slow = runs[plan["slow"]]
            assert slow["status"] == "FAILED" and slow["statusReason"] in CRASH_REASONS, slow
            assert thread["queueHeld"] and thread["queueHoldReason"], thread
            assert [r["id"] for r in thread["queue"]] == plan["behind"]

        await resume_and_drain(
            client, threads, plans, subscribers
        )  # 3. the server works on: resumed, each queue drains
    finally:
        for sub in subscribers:
            await sub.stop()
        await client.aclose()


RUN_ATTEMPTS = """query($r: ID!) { run(id: $r) { id status attempts { attemptOrdinal reason status statusReason } } }"""
THREAD_LOG = """query($t: ID!) { thread(id: $t) {
  queueHeld messages(first: 50) { nodes { role text } } activities(last: 100) { nodes { kind runId } } } }"""


async def _gated_load(client: Client, thread: str, index: int) -> dict[str, Any]:
    """A quick run, then one held at a gate (it has run nothing when PostgreSQL goes), two queued behind it."""
    quick = await send(client, thread, f"@reply t{index} quick", d=QUEUE)
    held = await send(client, thread, f"@await gate-{index}\n@reply t{index} back after the restart", d=QUEUE)
    behind = [await send(client, thread, f"@reply t{index} behind {n}", d=QUEUE) for n in range(2)]
    for sent in [quick, held, *behind]:
        assert sent["userErrors"] == [], sent
    return {"quick": quick["run"]["id"], "slow": held["run"]["id"], "behind": [b["run"]["id"] for b in behind]}


def _attempts(run: dict[str, Any]) -> list[tuple[int, str, str, str | None]]:
    return [(a["attemptOrdinal"], a["reason"], a["status"], a["statusReason"]) for a in run["attempts"]]


async def test_with_default_recovery_a_turn_lost_with_a_killed_postgres_completes_on_a_recovery_attempt(
    own_postgres: OwnPostgres, supervised_recovering: Supervised, tmp_path: Path
) -> None:
    """docs/deploy.md: a replica cut off from PostgreSQL exits 75; the turns it was running that its stop could
    not fail (the database was gone) are recovered once the database is back: one that ran nothing irreversible
    gets a PROVIDER_RECOVERY attempt, which completes, and nothing holds the queue behind it."""
    supervised = supervised_recovering
    client = Client(supervised.url(), supervised.token)
    subscribers: list[ResumingSubscriber] = []
    workspace = tmp_path / "pg-recover"
    try:
        workspace.mkdir()
        plans = await threads_under_load(
            client, supervised.url, supervised.token, workspace, THREADS, _gated_load, subscribers
        )
        threads = [sub.thread_id for sub in subscribers]
        await asyncio.to_thread(own_postgres.go_away, "kill")  # gone until the server has exited
        assert await supervised.exit_code(within=30) == WORKER_LOST_EXIT, "\n".join(supervised.server.log[-40:])
        stopped = supervised.exited[-1].log
        assert any("could not fail run" in line for line in stopped)  # its stop could not fail them: recovery will
        await asyncio.to_thread(own_postgres.start)
        supervised.restart()
        await client.aclose()
        client = Client(supervised.url(), supervised.token)

        for index, plan in enumerate(plans):  # each held run gets a new attempt, at its gate again

            async def recovering(run_id: str = plan["slow"]) -> dict[str, Any] | None:
                run = (await client.gql(RUN_ATTEMPTS, {"r": run_id}))["run"]
                return run if len(run["attempts"]) == 2 and run["attempts"][1]["status"] == "RUNNING" else None

            run = await until(recovering, within=45)
            assert _attempts(run) == [
                (1, "INITIAL", "FAILED", "provider_lost"),
                (2, "PROVIDER_RECOVERY", "RUNNING", None),
            ]
            (workspace / f"gate-{index}").touch()

        for index, (thread, plan) in enumerate(zip(threads, plans, strict=True)):
            for run_id in [plan["slow"], *plan["behind"]]:  # the queue behind was never held: it runs on by itself
                assert (await finished(client, run_id))["status"] == "COMPLETED", run_id
            run = (await client.gql(RUN_ATTEMPTS, {"r": plan["slow"]}))["run"]
            assert _attempts(run) == [
                (1, "INITIAL", "FAILED", "provider_lost"),
                (2, "PROVIDER_RECOVERY", "COMPLETED", None),
            ]
            state = (await client.gql(THREAD_LOG, {"t": thread}))["thread"]
            assert not state["queueHeld"]
            replies = [m["text"] for m in state["messages"]["nodes"] if m["role"] == "ASSISTANT"]
            assert replies == [
                f"t{index} quick",
                f"t{index} back after the restart",
                *(f"t{index} behind {n}" for n in range(2)),
            ]
            retried = [a for a in state["activities"]["nodes"] if a["kind"] == "run.retried"]
            assert [a["runId"] for a in retried] == [plan["slow"]]

        for sub in subscribers:  # every subscriber holds exactly the log, across the exit and the restart
            latest = await caught_up(client, sub)
            assert sub.sequences == list(range(1, latest + 1)), sub.thread_id
            assert sub.connections >= 2
            for errors in sub.errors:
                assert [e["extensions"]["code"] for e in errors] == ["SERVER_GOING_AWAY"], sub.errors
    finally:
        for sub in subscribers:
            await sub.stop()
        await client.aclose()

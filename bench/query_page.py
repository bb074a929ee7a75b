"""Benchmark: one page of `threads(first: 100)` over HTTP against a measured floor.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/query_page.py [--threads 10000] [--requests 200] [--smoke]

`--smoke` uses 300 threads and 20 requests (seconds, for tests/test_bench_smoke.py).

Beside wall-clock latency it prints the CPU time each server process used per timed
request (/proc/<pid>/stat): on a shared machine that moves much less than the wall clock.

It starts an embedded PostgreSQL in a temp dir under /tmp, migrates a fresh database,
writes one project and 10,000 threads through the real event log (`store.log.append`),
makes an admin token, then starts two servers as subprocesses:

- the system under test: `python -m threadloom serve` (its normal settings);
- the floor: bench/floor_app.py, plain Starlette + uvicorn, one raw asyncpg statement
  and orjson for the same rows and the same JSON shape (no auth, no GraphQL).

Both are measured in the same run with sequential requests from one keep-alive httpx
client, and the SQL statement count the server reports in `server-timing` is compared
between `first: 10` and `first: 100`. A few minutes at most on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import httpx
from common import REPO, bench_tmp, create_database, embedded_postgres

from threadloom.api import ids
from threadloom.domain.changes import Change
from threadloom.domain.entities import Project
from threadloom.domain.ids import new_id
from threadloom.domain.projects import create_project
from threadloom.domain.statuses import TokenScope
from threadloom.domain.threads import create_thread
from threadloom.store import log, migrate, tokens
from threadloom.store.db import Database

QUERY = (
    "query($p: ID!, $n: Int) { threads(projectId: $p, first: $n) { edges { cursor node { "
    "id title status latestSequence providerInstanceId model runtimeMode queueHeld archivedAt "
    "createdAt updatedAt project { id name } } } pageInfo { hasNextPage endCursor } } }"
)
SQL_TIMING = re.compile(r'sql;(?:dur=[0-9.]+;)?desc="(\d+) statements"')  # the dur was dropped in 816396e


@dataclass(frozen=True, slots=True)
class Fixture:
    url: str
    socket_dir: str
    database: str
    project_id: uuid.UUID
    token: str


@dataclass(frozen=True, slots=True)
class Stats:
    median_ms: float
    p95_ms: float
    cpu_ms: float  # the server process's user+system CPU per timed request


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process `pid` has used so far (Linux /proc).

    Wall-clock ratios swing with whatever else shares the machine; the server's own CPU
    per request does much less.
    """
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    # After the ")" closing comm, utime and stime are fields 12 and 13 (0-based 11, 12).
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


# ---------------------------------------------------------------- setup


async def analyze(socket_dir: str, database: str) -> None:
    """Fresh statistics, as autovacuum would have by steady state.

    Right after a bulk load the planner thinks the project has ~1 thread and sorts all
    10,000 for every page (tens of ms for both servers); that is not what we measure.
    """
    conn = await asyncpg.connect(host=socket_dir, user="postgres", database=database)
    try:
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def populate(url: str, n_threads: int, batch: int) -> tuple[uuid.UUID, str]:
    """Migrate, then one project and `n_threads` threads through `log.append`; an admin token.

    `append` takes one thread's changes per call, so it is called once per thread, with
    `batch` threads per transaction.
    """
    db = Database.from_url(url, pool_size=2)
    try:
        await migrate.upgrade(db.engine)
        now = datetime.now(UTC)
        project_change = create_project(new_id(), "bench project", "/tmp/bench-workspace", now)
        project = project_change.entity
        assert isinstance(project, Project)
        async with db.transaction() as tx:
            # As the pipeline does for createProject: a thread-less event, no project id.
            await log.append(tx, [project_change], project_id=None, command_id=None, now=now)
            _, secret = await tokens.create_token(
                tx, name="bench admin", scope=TokenScope.ADMIN, project_id=None, now=now
            )
        for start in range(0, n_threads, batch):
            async with db.transaction() as tx:
                for i in range(start, min(start + batch, n_threads)):
                    change: Change = create_thread(
                        thread_id=new_id(),
                        project=project,
                        title=f"Thread {i:05d}",
                        provider_instance_id="scripted",
                        model=None,
                        runtime_mode="workspace_write",
                        now=now,
                    )
                    await log.append(tx, [change], project_id=project.id, command_id=None, now=now)
        return project.id, secret
    finally:
        await db.dispose()


# ---------------------------------------------------------------- subprocesses


def start_floor(port: int, socket_dir: str, database: str) -> subprocess.Popen[bytes]:
    env = {**os.environ, "FLOOR_PG_HOST": socket_dir, "FLOOR_PG_DB": database}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench.floor_app:app",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-access-log",
            "--log-level",
            "warning",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )


def wait_ready(url: str, proc: subprocess.Popen[bytes], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
            raise RuntimeError(f"floor server exited {proc.returncode}:\n{err[-3000:]}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not become ready")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- measurement


def measure(call: Callable[[], httpx.Response], pid: int, warmup: int, requests: int) -> Stats:
    for _ in range(warmup):
        call()
    samples: list[float] = []
    cpu0 = cpu_seconds(pid)
    for _ in range(requests):
        t0 = time.perf_counter()
        call()
        samples.append((time.perf_counter() - t0) * 1000)
    cpu_ms = (cpu_seconds(pid) - cpu0) * 1000 / requests
    samples.sort()
    p95 = samples[min(len(samples) - 1, round(0.95 * len(samples)) - 1)]
    return Stats(statistics.median(samples), p95, cpu_ms)


def sql_statements(response: httpx.Response) -> int:
    header = response.headers.get("server-timing", "")
    found = SQL_TIMING.search(header)
    if found is None:
        raise RuntimeError(f"no SQL count in server-timing: {header!r}")
    return int(found.group(1))


def check_page(body: dict[str, Any], n: int, what: str) -> None:
    if body.get("errors"):
        raise RuntimeError(f"{what}: errors {body['errors']}")
    page = body["data"]["threads"]
    if len(page["edges"]) != n or not page["pageInfo"]["hasNextPage"]:
        raise RuntimeError(f"{what}: expected {n} edges and a next page, got {len(page['edges'])}")


# ---------------------------------------------------------------- main


def run(args: argparse.Namespace, tmp: Path) -> None:
    sys.path.insert(0, str(REPO))
    from tests.support.server import ServerProcess, free_port

    t_start = time.perf_counter()
    with embedded_postgres(tmp) as pg:
        socket_dir = pg.socket_dir
        database = "tl_bench"
        url = pg.url(database)
        asyncio.run(create_database(socket_dir, database))
        project_id, token = asyncio.run(populate(url, args.threads, args.batch))
        asyncio.run(analyze(socket_dir, database))
        t_setup = time.perf_counter() - t_start
        print(
            f"setup: embedded PostgreSQL, migrated, 1 project + {args.threads:,} threads "
            f"(via store.log.append), VACUUM ANALYZE: {t_setup:.1f} s"
        )

        data_dir = tmp / "data"
        data_dir.mkdir()
        server = ServerProcess(url, data_dir)
        floor_port = free_port()
        floor = start_floor(floor_port, socket_dir, database)
        try:
            server.wait_ready()
            floor_url = f"http://127.0.0.1:{floor_port}"
            wait_ready(floor_url, floor)
            gid = ids.encode("Project", project_id)
            n = args.first
            with httpx.Client(timeout=30) as http:
                headers = {"authorization": f"Bearer {token}"}

                def graphql(first: int) -> httpx.Response:
                    r = http.post(
                        server.url + "/graphql",
                        json={"query": QUERY, "variables": {"p": gid, "n": first}},
                        headers=headers,
                    )
                    r.raise_for_status()
                    return r

                def floor_page() -> httpx.Response:
                    r = http.get(floor_url + "/threads", params={"project": str(project_id), "first": n})
                    r.raise_for_status()
                    return r

                # Sanity: both return a full page of the same threads.
                g_body, f_body = graphql(n).json(), floor_page().json()
                check_page(g_body, n, "graphql")
                check_page(f_body, n, "floor")
                g_ids = [e["node"]["id"] for e in g_body["data"]["threads"]["edges"]]
                f_ids = [e["node"]["id"] for e in f_body["data"]["threads"]["edges"]]
                if g_ids != f_ids:
                    raise RuntimeError("graphql and floor returned different threads")

                sql_small = sql_statements(graphql(10))
                sql_large = sql_statements(graphql(n))

                g = measure(lambda: graphql(n), server.proc.pid, args.warmup, args.requests)
                f = measure(floor_page, floor.pid, args.warmup, args.requests)
        finally:
            server.stop()
            stop_process(floor)

    equal = "equal" if sql_small == sql_large else "NOT EQUAL: the statement count grows with the page"
    print()
    print(
        f"threads(first: {n}) over HTTP, {args.threads:,} threads, "
        f"{args.requests} sequential requests after {args.warmup} warm-up"
    )
    print(
        f"  graphql   median {g.median_ms:6.2f} ms  p95 {g.p95_ms:6.2f} ms  server CPU per request {g.cpu_ms:5.2f} ms"
    )
    print(
        f"  floor     median {f.median_ms:6.2f} ms  p95 {f.p95_ms:6.2f} ms  server CPU per request {f.cpu_ms:5.2f} ms"
        "   (raw asyncpg + orjson, plain Starlette)"
    )
    print(f"  ratio     median {g.median_ms / f.median_ms:.1f}x   server CPU per request {g.cpu_ms / f.cpu_ms:.1f}x")
    print(f"  SQL statements per request: first:10 -> {sql_small}, first:{n} -> {sql_large} ({equal})")
    print(f"total run time {time.perf_counter() - t_start:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--threads", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500, help="threads per setup transaction")
    parser.add_argument("--first", type=int, default=100)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="a small project and few requests (for the tests)")
    args = parser.parse_args()
    if args.smoke:
        args.threads, args.warmup, args.requests = 3 * args.first, 3, 20
    with bench_tmp() as tmp:
        run(args, tmp)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

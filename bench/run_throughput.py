"""Benchmark: runs/s through the scripted agent, end to end through the real engine, against a floor.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/run_throughput.py [--runs 500] [--threads 10] [--single-runs 50] [--smoke]

`--smoke` runs a few runs per phase (seconds, for tests/test_bench_smoke.py): the same code
paths and report, figures too small to mean anything.

It starts an embedded PostgreSQL in a temp dir under /tmp, migrates a fresh database and
drives the engine in-process (no HTTP: bench/query_page.py measures that layer):
`Services.build(...)`, `start()`, one project, then `dispatch.send_message(..., "hello")`, which
the scripted agent (a `python -m threadloom.agent` subprocess, zero chunk delay) answers
with "You said: hello", streamed word by word.

Phases, each on fresh threads:
- warm-up: one run (opens the agent process, warms caches); not measured;
- main: `--threads` threads x `--runs / --threads` messages, all sent up front (one active
  run per thread, the rest queue), round-robin over the threads;
- single: `--single-runs` messages on one thread, sent up front: the serial figure.
A phase ends when the `runs` table (polled every 50 ms on a separate connection) shows
all its runs terminal; any run that is not `completed` fails the benchmark, printing its
reason and event trail. The engine's periodic recovery pass keeps running, as in a server;
`--no-recovery-loop` stops it after startup to measure the rest without its polling.

Sending up front has a cost of its own, reported separately: each run start renumbers
every run still queued on its thread (one `run.updated` event and projection row each), so
with 50 queued messages per thread about 40% of the event rows are queue renumbering.

Counting: a SQLAlchemy listener on the engine counts every statement it sends, and a wrapper
of `Reader._fetch_direct` every statement run straight on the asyncpg connection (the effect
worker's and recovery's polling included; claims are reported separately), rows bound per
statement, and transactions (commit = write, rollback = read: SQLAlchemy's own, and the driver's
`Database.transaction` blocks, by how they end), and apart from them
the statements run outside a transaction (autocommit: an effect claim, which also marks the
loop's last effect done, and the run-end capture's read). The events a run
wrote are counted in the `events` table afterwards. PostgreSQL's own transaction counter
(pg_stat_database) is compared with the listener's over the engine's whole lifetime.

The floor, measured in the same run: per run, one raw asyncpg transaction inserting as
many rows as the run wrote (its event rows + its projection row upserts) into a scratch
copy of `events` (`LIKE events INCLUDING ALL`), reusing the phase's real payloads, with
the phase's concurrency (one connection per thread). A few minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import functools
import io
import pstats
import re
import sys
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import asyncpg
import psutil
import sqlalchemy as sa
from common import EmbeddedPostgres, bench_tmp, create_database, embedded_postgres
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from threadloom.config import Settings
from threadloom.domain.access import Principal
from threadloom.domain.dispatch import Dispatch, DispatchMode
from threadloom.domain.statuses import TokenScope
from threadloom.engine.clock import SystemClock
from threadloom.engine.services import Services
from threadloom.providers.registry import load_instances
from threadloom.store import migrate
from threadloom.store.db import Database, Reader

DATABASE = "tl_bench"
TEXT = "hello"
POLL = 0.05
CLAIM = "claim effect (WITH done AS ... UPDATE effects)"
APPEND = "append (events, projections, outbox: one statement)"


# ---------------------------------------------------------------- counting statements


@functools.lru_cache(maxsize=1024)  # the listener runs inside the measured process: keep it cheap
def shape(statement: str) -> str:
    """A statement's kind: verb and table ("upsert runs", "select threads for update", ...)."""
    s = " ".join(statement.split())
    if s.startswith(("WITH next AS", "WITH done AS")):
        return CLAIM
    if s.startswith("WITH ") and "INSERT INTO events" in s:
        return APPEND
    verb = s.split(" ", 1)[0].upper()
    if verb == "INSERT":
        m = re.match(r"INSERT INTO (\w+)", s)
        table = m.group(1) if m else "?"
        return f"{'upsert' if 'ON CONFLICT' in s else 'insert'} {table}"
    if verb == "UPDATE":
        m = re.match(r"UPDATE (\w+)", s)
        table = m.group(1) if m else "?"
        return f"update {table}" + (" (sequence bump)" if "last_sequence" in s else "")
    if verb == "SELECT":
        m = re.search(r"\bFROM (\w+)", s)
        return f"select {m.group(1) if m else s[7:47]}" + (" for update" if s.endswith("FOR UPDATE") else "")
    return s[:50]


@dataclass(slots=True)
class Tally:
    statements: int = 0
    commits: int = 0
    rollbacks: int = 0
    alone: int = 0  # statements outside a transaction (autocommit: claims, the run-end capture's read)
    shapes: Counter[str] = field(default_factory=Counter)
    rows: Counter[str] = field(default_factory=Counter)  # parameter sets bound, per shape

    @property
    def transactions(self) -> int:
        return self.commits + self.rollbacks

    def copy(self) -> Tally:
        return Tally(
            self.statements, self.commits, self.rollbacks, self.alone, Counter(self.shapes), Counter(self.rows)
        )

    def __sub__(self, other: Tally) -> Tally:
        return Tally(
            self.statements - other.statements,
            self.commits - other.commits,
            self.rollbacks - other.rollbacks,
            self.alone - other.alone,
            self.shapes - other.shapes,
            self.rows - other.rows,
        )

    def projection_rows(self) -> int:
        """Rows written by projection upserts (`store.log.upsert_entities`)."""
        return sum(n for s, n in self.rows.items() if s.startswith("upsert "))


def _autocommit(conn: Any) -> bool:
    return bool(conn.get_execution_options().get("isolation_level") == "AUTOCOMMIT")


def _in_driver_transaction(conn: Any) -> bool:
    """Whether the asyncpg connection under `conn` is in a transaction the driver began (`Database.transaction`)."""
    return bool(conn.connection.dbapi_connection.driver_connection.is_in_transaction())


# The counters by the pool their engine checks connections out of (`Database`'s autocommit engine shares it).
_COUNTERS: dict[int, SqlCounter] = {}


def _count_what_skips_sqlalchemy() -> None:
    """Wrap `Reader._fetch_direct` and `Database.transaction` (once) so the statements run straight on the
    driver, and the driver's transactions, reach the counter of their engine."""
    if getattr(Reader._fetch_direct, "counted", False):
        return
    fetch = Reader._fetch_direct
    transaction = Database.transaction

    async def counted_fetch(self: Reader, stmt: sa.Executable, params: Any) -> list[Any] | None:
        records = await fetch(self, stmt, params)
        counter = _COUNTERS.get(id(self.conn.sync_engine.pool))
        if records is not None and counter is not None:
            alone = not self.conn.sync_connection.connection.dbapi_connection.driver_connection.is_in_transaction()
            counter.count(getattr(stmt, "text", None) or str(stmt), 1, alone)
        return records

    @contextlib.asynccontextmanager
    async def counted_transaction(self: Database, counter: Any = None) -> AsyncIterator[Reader]:
        tally = _COUNTERS.get(id(self.engine.sync_engine.pool))
        try:
            async with transaction(self, counter) as reader:
                yield reader
        except BaseException:
            if tally is not None:
                tally.tally.rollbacks += 1
            raise
        if tally is not None:
            tally.tally.commits += 1

    counted_fetch.counted = True  # type: ignore[attr-defined]
    Reader._fetch_direct = counted_fetch  # type: ignore[method-assign]
    Database.transaction = counted_transaction  # type: ignore[method-assign]


class SqlCounter:
    """Counts what one engine's connections send to PostgreSQL, through SQLAlchemy or straight on the driver."""

    def __init__(self, engine: AsyncEngine) -> None:
        self.tally = Tally()
        self.connections = 0  # new DBAPI connections (their setup queries bypass the listeners)
        sync = engine.sync_engine
        _COUNTERS[id(sync.pool)] = self
        _count_what_skips_sqlalchemy()
        event.listen(sync, "connect", self._connect)
        event.listen(sync, "before_cursor_execute", self._execute)
        event.listen(sync, "commit", self._commit)
        event.listen(sync, "rollback", self._rollback)

    def count(self, statement: str, rows: int, alone: bool) -> None:
        kind = shape(statement)
        self.tally.statements += 1
        if alone:
            self.tally.alone += 1
        self.tally.shapes[kind] += 1
        self.tally.rows[kind] += rows

    def _execute(self, conn: Any, cursor: Any, statement: str, params: Any, context: Any, executemany: bool) -> None:
        # An autocommit connection is outside a transaction unless the driver began one on it.
        alone = _autocommit(conn) and not _in_driver_transaction(conn)
        self.count(statement, len(params) if executemany else 1, alone)

    def _connect(self, dbapi_conn: Any, record: Any) -> None:
        self.connections += 1

    def _commit(self, conn: Any) -> None:
        self.tally.commits += 1

    def _rollback(self, conn: Any) -> None:
        if not _autocommit(conn):  # an autocommit connection's reset on return is no transaction
            self.tally.rollbacks += 1

    def snapshot(self) -> Tally:
        return self.tally.copy()


# ---------------------------------------------------------------- time by command


@dataclass(slots=True)
class Busy:
    count: Counter[str] = field(default_factory=Counter)
    seconds: Counter[str] = field(default_factory=Counter)

    def copy(self) -> Busy:
        return Busy(Counter(self.count), Counter(self.seconds))

    def __sub__(self, other: Busy) -> Busy:
        return Busy(self.count - other.count, self.seconds - other.seconds)


class CommandTimer:
    """Wall time inside `Pipeline.execute` per command type and inside each effect handler.

    An observer wrapped around the instances' methods; the engine's code is unchanged. The
    ingestor of the (single) provider session applies each thread's events in a task of that
    thread (events, then `run.finish` at the end of a turn, the turn's last events with it), so
    their sum over the wall is how busy those tasks are together.
    """

    def __init__(self, services: Services) -> None:
        self.busy = Busy()
        original = services.pipeline.execute

        async def execute(command: Any, counter: Any = None) -> dict[str, Any]:
            t = time.perf_counter()
            try:
                return await original(command, counter)
            finally:
                self.busy.count[command.command_type] += 1
                self.busy.seconds[command.command_type] += time.perf_counter() - t

        services.pipeline.execute = execute  # type: ignore[method-assign]
        for kind, handler in list(services.effects.handlers.items()):
            services.effects.handlers[kind] = self._timed(f"effect {kind}", handler)

    def _timed(self, name: str, handler: Any) -> Any:
        async def timed(payload: dict[str, Any]) -> None:
            t = time.perf_counter()
            try:
                await handler(payload)
            finally:
                self.busy.count[name] += 1
                self.busy.seconds[name] += time.perf_counter() - t

        return timed

    def snapshot(self) -> Busy:
        return self.busy.copy()


# ---------------------------------------------------------------- CPU by process


@dataclass(frozen=True, slots=True)
class Cpu:
    engine: float
    agent: float
    postgres: float

    def __sub__(self, other: Cpu) -> Cpu:
        return Cpu(self.engine - other.engine, self.agent - other.agent, self.postgres - other.postgres)


def _cpu(p: psutil.Process, reaped_children: bool) -> float:
    try:
        t = p.cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    own = t.user + t.system
    return own + (t.children_user + t.children_system if reaped_children else 0.0)


def cpu_now(postmaster: int) -> Cpu:
    """CPU seconds so far: this process, the processes below it (the agent, below the `unshare` that gives
    it a PID namespace), PostgreSQL (all backends)."""
    me = psutil.Process()
    pm = psutil.Process(postmaster)
    return Cpu(
        engine=_cpu(me, False),
        # each live one's own, and what the ones it reaped used (each process counted once)
        agent=sum(_cpu(c, True) for c in me.children(recursive=True)),
        # exited backends are in the postmaster's children_* once it has reaped them
        postgres=_cpu(pm, True) + sum(_cpu(c, False) for c in pm.children()),
    )


# ---------------------------------------------------------------- phases


@dataclass(slots=True)
class Phase:
    name: str
    threads: int
    runs: int
    wall: float = 0.0  # first send → last completed_at
    send_time: float = 0.0  # time to send every message
    tally: Tally = field(default_factory=Tally)
    busy: Busy = field(default_factory=Busy)
    cpu: Cpu = Cpu(0, 0, 0)
    events: int = 0
    event_types: Counter[str] = field(default_factory=Counter)
    renumbering: int = 0  # run.updated events of still-queued runs (queue_position changes)
    payload_bytes: float = 0.0
    run_ms: float = 0.0  # median started → completed
    samples: list[tuple[Any, ...]] = field(default_factory=list)
    floor_wall: float = 0.0
    floor_rows: int = 0

    def per_run(self, n: float) -> float:
        return n / self.runs


class Bench:
    def __init__(self, services: Services, poller: Database, counter: SqlCounter, pg: EmbeddedPostgres) -> None:
        self.services = services
        self.timer = CommandTimer(services)
        self.poller = poller
        self.counter = counter
        self.pg = pg
        self.admin = Principal(uuid.uuid4(), TokenScope.ADMIN, None)
        self.project_id: uuid.UUID | None = None
        self.postmaster = int(pg.server.get_pid())

    async def setup(self, workspace: Path) -> None:
        self.project_id = await self.services.catalog.create_project(
            self.admin, name="bench", workspace_root=str(workspace), key=None
        )

    async def new_threads(self, n: int, prefix: str) -> list[uuid.UUID]:
        assert self.project_id is not None
        return [
            await self.services.catalog.create_thread(
                self.admin,
                project_id=self.project_id,
                title=f"{prefix} {i}",
                provider_instance_id=None,
                model=None,
                runtime_mode="workspace_write",
                key=None,
            )
            for i in range(n)
        ]

    async def send(self, thread_id: uuid.UUID) -> None:
        await self.services.dispatch.send_message(
            self.admin,
            thread_id,
            text=TEXT,
            # queued behind the active run (the default would steer the active run instead)
            dispatch=Dispatch(mode=DispatchMode.QUEUE_AFTER_ACTIVE),
            provider_instance_id=None,
            model=None,
            client_message_id=None,
        )

    async def wait_terminal(self, thread_ids: list[uuid.UUID], expected: int, limit: float) -> None:
        deadline = time.monotonic() + limit
        query = sa.text("SELECT status, count(*) AS n FROM runs WHERE thread_id = ANY(:ids) GROUP BY status")
        counts: dict[str, int] = {}
        while time.monotonic() < deadline:
            async with self.poller.read() as db:
                counts = {r["status"]: r["n"] for r in await db.rows(query, {"ids": thread_ids})}
            bad = {s: n for s, n in counts.items() if s in ("failed", "cancelled", "interrupted", "rolled_back")}
            if bad:
                raise RuntimeError(f"runs did not complete: {bad}\n{await self.explain_failure(thread_ids)}")
            if counts.get("completed", 0) >= expected:
                return
            await asyncio.sleep(POLL)
        raise TimeoutError(f"after {limit:.0f} s: {counts} (expected {expected} completed)")

    async def explain_failure(self, thread_ids: list[uuid.UUID]) -> str:
        """The first failed run, its reason and its event trail (what the run went through)."""
        async with self.poller.read() as db:
            run = await db.one_or_none(
                sa.text(
                    "SELECT id, ordinal, status, status_reason FROM runs WHERE thread_id = ANY(:ids) "
                    "AND status IN ('failed', 'cancelled', 'interrupted', 'rolled_back') ORDER BY requested_at LIMIT 1"
                ),
                {"ids": thread_ids},
            )
            if run is None:
                return ""
            trail = await db.rows(
                sa.text(
                    "SELECT e.occurred_at, e.command_id, e.event_type, e.payload->>'status' AS status FROM events e "
                    "WHERE e.run_id = :id OR e.entity_id = :id ORDER BY e.position"
                ),
                {"id": run["id"]},
            )
        t0 = trail[0]["occurred_at"] if trail else None
        lines = [
            f"  +{(r['occurred_at'] - t0).total_seconds() * 1000:7.1f} ms  {r['event_type']:<24} {r['status'] or ''}"
            for r in trail
        ]
        return (
            f"first: run {run['id']} (ordinal {run['ordinal']}) {run['status']}: {run['status_reason']}\n"
            + "\n".join(lines)
            + "\n(if the reason is provider_lost: the periodic recovery pass misjudged a live run; "
            "--no-recovery-loop measures without that pass)"
        )

    async def run_phase(self, phase: Phase, limit: float, profile: cProfile.Profile | None = None) -> None:
        thread_ids = await self.new_threads(phase.threads, phase.name)
        per_thread = phase.runs // phase.threads
        t0 = datetime.now(UTC)
        before, busy0, cpu0 = self.counter.snapshot(), self.timer.snapshot(), cpu_now(self.postmaster)
        p0 = time.perf_counter()
        if profile is not None:
            profile.enable()
        for _ in range(per_thread):
            for thread_id in thread_ids:
                await self.send(thread_id)
        phase.send_time = time.perf_counter() - p0
        await self.wait_terminal(thread_ids, phase.runs, limit)
        if profile is not None:
            profile.disable()
        phase.tally, phase.cpu = self.counter.snapshot() - before, cpu_now(self.postmaster) - cpu0
        phase.busy = self.timer.snapshot() - busy0
        await self.read_results(phase, thread_ids, t0)

    async def read_results(self, phase: Phase, thread_ids: list[uuid.UUID], t0: datetime) -> None:
        args = {"ids": thread_ids, "t0": t0}
        async with self.poller.read() as db:
            timing = await db.one_or_none(
                sa.text(
                    "SELECT max(completed_at) AS last, count(*) AS n, percentile_cont(0.5) WITHIN GROUP "
                    "(ORDER BY extract(epoch FROM completed_at - started_at)) AS run_s "
                    "FROM runs WHERE thread_id = ANY(:ids)"
                ),
                {"ids": thread_ids},
            )
            types = await db.rows(
                sa.text(
                    "SELECT event_type, count(*) AS n, sum(length(payload::text)) AS bytes, "
                    "count(*) FILTER (WHERE payload->>'status' = 'queued' AND event_type = 'run.updated') AS renum "
                    "FROM events WHERE thread_id = ANY(:ids) AND occurred_at >= :t0 GROUP BY event_type"
                ),
                args,
            )
            # the floor reuses the phase's real rows, in their order
            samples = await db.execute(
                sa.text(
                    "SELECT project_id, event_type, entity_type, entity_id, run_id, node_id, command_id, "
                    "occurred_at, payload::text AS payload FROM events "
                    "WHERE thread_id = ANY(:ids) AND occurred_at >= :t0 ORDER BY position LIMIT 5000"
                ),
                args,
            )
            phase.samples = [tuple(r) for r in samples.all()]
        assert timing is not None and timing["n"] == phase.runs, timing
        phase.wall = (timing["last"] - t0).total_seconds()
        phase.run_ms = float(timing["run_s"]) * 1000
        phase.event_types = Counter({r["event_type"]: int(r["n"]) for r in types})
        phase.events = sum(phase.event_types.values())
        phase.renumbering = sum(int(r["renum"]) for r in types)
        phase.payload_bytes = sum(int(r["bytes"]) for r in types) / max(1, phase.events)


# ---------------------------------------------------------------- the floor

FLOOR_INSERT = (
    "INSERT INTO floor_events (thread_id, sequence, project_id, event_type, entity_type, entity_id, run_id, "
    "node_id, command_id, occurred_at, payload) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11::jsonb)"
)


async def floor(pg: EmbeddedPostgres, phase: Phase, rows_per_run: int) -> None:
    """Per run: BEGIN; one executemany INSERT of `rows_per_run` rows; COMMIT. Same concurrency."""
    samples = phase.samples
    conns = [await pg.connect(DATABASE) for _ in range(phase.threads)]
    try:
        await conns[0].execute("CREATE TABLE IF NOT EXISTS floor_events (LIKE events INCLUDING ALL)")

        async def worker(conn: asyncpg.Connection, runs: int) -> None:
            thread, seq, k = uuid.uuid4(), 0, 0
            for _ in range(runs):
                rows = []
                for _ in range(rows_per_run):
                    seq, k = seq + 1, (k + 1) % len(samples)
                    rows.append((thread, seq, *samples[k]))
                async with conn.transaction():
                    await conn.executemany(FLOOR_INSERT, rows)

        await asyncio.gather(*(worker(c, 2) for c in conns))  # warm-up: prepared statements, pages
        shares = [phase.runs // len(conns) + (i < phase.runs % len(conns)) for i in range(len(conns))]
        t = time.perf_counter()
        await asyncio.gather(*(worker(c, n) for c, n in zip(conns, shares, strict=True)))
        phase.floor_wall = time.perf_counter() - t
        phase.floor_rows = rows_per_run
    finally:
        for c in conns:
            await c.close()


# ---------------------------------------------------------------- PostgreSQL's own count


async def pg_transactions(pg: EmbeddedPostgres) -> tuple[int, int]:
    """(xact_commit, xact_rollback) of the bench database, once no other session is connected.

    Backends flush their statistics when they exit, so waiting for them to go makes the
    (asynchronously updated) counters exact. This session is on another database.
    """
    conn = await pg.connect("postgres")
    try:
        for _ in range(200):
            others = await conn.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", DATABASE
            )
            if others == 0:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.2)
        await conn.execute("SELECT pg_stat_clear_snapshot()")
        row = await conn.fetchrow(
            "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = $1", DATABASE
        )
        assert row is not None
        return int(row["xact_commit"]), int(row["xact_rollback"])
    finally:
        await conn.close()


# ---------------------------------------------------------------- report


def top(counter: Counter[str], runs: int, n: int) -> str:
    items = counter.most_common(n)
    rest = sum(counter.values()) - sum(v for _, v in items)
    parts = [f"{k} {v / runs:.1f}" for k, v in items]
    if rest:
        parts.append(f"other {rest / runs:.1f}")
    return ", ".join(parts)


def wrap(text: str, indent: str, width: int = 110) -> Iterable[str]:
    line = indent
    for part in text.split(", "):
        if len(line) + len(part) > width and line.strip():
            yield line.rstrip(", ") + ","
            line = indent
        line += part + ", "
    yield line.rstrip(", ")


@dataclass(frozen=True, slots=True)
class PgCheck:
    commits: int  # pg_stat_database deltas over the engine's lifetime
    rollbacks: int
    engine: Tally  # what the listeners saw over the same time
    poller: Tally
    connections: int  # opened by the engine and the poller


def report(phases: list[Phase], check: PgCheck, args: argparse.Namespace, total: float) -> None:
    if not args.recovery_loop:
        print()
        print("NOTE: --no-recovery-loop: the engine's periodic recovery pass was stopped after startup")
    for p in phases:
        t = p.tally
        claims = t.shapes[CLAIM]
        empty = claims - sum(n for k, n in p.busy.count.items() if k.startswith("effect "))
        rows = p.floor_rows
        engine_rate, floor_rate = p.runs / p.wall, p.runs / p.floor_wall
        print()
        print(
            f"{p.runs} runs through the scripted agent ({p.threads} thread{'s' if p.threads > 1 else ''} x "
            f"{p.runs // p.threads}, sent up front, zero delay)"
        )
        print(
            f"  engine  {engine_rate:6.1f} runs/s  {1000 * p.wall / p.runs:5.1f} ms/run   "
            f"statements/run {p.per_run(t.statements):.1f} (claims {p.per_run(claims):.1f}, "
            f"{p.per_run(empty):.1f} empty)   "
            f"transactions/run {p.per_run(t.transactions):.1f} ({p.per_run(t.commits):.1f} write, "
            f"{p.per_run(t.rollbacks):.1f} read) + {p.per_run(t.alone):.1f} statements outside one   "
            f"events/run {p.per_run(p.events):.1f}"
        )
        print(
            f"  floor   {floor_rate:6.1f} runs/s  {1000 * p.floor_wall / p.runs:5.1f} ms/run   "
            f"(raw asyncpg, {p.threads} connection{'s' if p.threads > 1 else ''}: per run one transaction, "
            f"one executemany of {rows} rows)"
        )
        print(f"  ratio   {floor_rate / engine_rate:.1f}x (floor runs/s over engine runs/s)")
        print("  details:")
        print(
            f"    wall {p.wall:.2f} s (sending all {p.runs} messages took {p.send_time:.2f} s of it); "
            f"median run started->completed {p.run_ms:.0f} ms"
        )
        busy = p.cpu.engine + p.cpu.agent + p.cpu.postgres
        ms = {k: 1000 * v / p.runs for k, v in (("e", p.cpu.engine), ("a", p.cpu.agent), ("p", p.cpu.postgres))}
        print(
            f"    CPU/run: engine {ms['e']:.1f} ms, agent {ms['a']:.1f} ms, postgres {ms['p']:.1f} ms "
            f"({busy / p.wall:.2f} of {psutil.cpu_count()} cores busy)"
        )
        print(
            f"    rows/run: {p.per_run(p.events):.1f} event rows + {p.per_run(t.projection_rows()):.1f} projection "
            f"upserts = floor's {rows}; event payload {p.payload_bytes:.0f} B avg"
        )
        print(
            f"    queue renumbering: {p.per_run(p.renumbering):.1f} of the events/run (run.updated of a run still "
            f"queued); {p.per_run(p.events - p.renumbering):.1f} without them"
        )
        b = p.busy
        commands = ", ".join(
            f"{k} {b.count[k] / p.runs:.1f} x {1000 * b.seconds[k] / b.count[k]:.1f} ms"
            for k, _ in b.seconds.most_common(None if args.verbose else 6)
        )
        print("    commands and effects per run (count x mean wall time):")
        for line in wrap(commands, " " * 6):
            print(line)
        effects = sum(v for k, v in b.seconds.items() if k.startswith("effect "))
        ingest = b.seconds["ingest"] + b.seconds["run.finish"]
        print(
            f"    busy: the ingest tasks {100 * ingest / p.wall:.0f}% of the wall (its ingest + run.finish commands; "
            f"each thread's agent events are applied by a task of its own); effect handlers {effects / p.wall:.2f} "
            f"of {args.effect_loops} loops"
        )
        n = 100 if args.verbose else 9
        breakdown = (("statements/run", top(t.shapes, p.runs, n)), ("events/run", top(p.event_types, p.runs, n)))
        for label, text in breakdown:
            print(f"    {label}:")
            for line in wrap(text, " " * 6):
                print(line)
    e, q = check.engine, check.poller
    print()
    print(
        f"cross-check over the engine's lifetime: pg_stat_database {check.commits} commits + {check.rollbacks} "
        f"rollbacks; the counters {e.commits + q.commits} + {e.rollbacks + q.rollbacks} "
        f"(engine {e.commits} + {e.rollbacks}, this benchmark's poller {q.commits} + {q.rollbacks}); "
        f"{check.connections} connections were opened, whose setup queries the listeners do not see"
    )
    print(f"total run time {total:.1f} s")


# ---------------------------------------------------------------- main


async def main_async(args: argparse.Namespace, tmp: Path, pg: EmbeddedPostgres) -> None:
    t_start = time.perf_counter()
    await create_database(pg.socket_dir, DATABASE)
    url = pg.url(DATABASE)
    setup_db = Database.from_url(url, pool_size=1)
    await migrate.upgrade(setup_db.engine)
    await setup_db.dispose()
    before = await pg_transactions(pg)

    db = Database.from_url(url)
    counter = SqlCounter(db.engine)
    poller = Database.from_url(url, pool_size=1)
    poll_counter = SqlCounter(poller.engine)
    services = Services.build(Settings.from_env(data_dir=str(tmp / "data")), db, SystemClock(), load_instances(None))
    await services.start()
    if not args.recovery_loop:
        await services.recovery.stop()  # the startup pass has run; no periodic passes
    args.effect_loops = services.effects.concurrency
    bench = Bench(services, poller, counter, pg)
    phases = [Phase("main", args.threads, args.runs)]
    if args.single_runs:
        phases.append(Phase("single", 1, args.single_runs))
    profile = cProfile.Profile() if args.profile else None
    try:
        await bench.setup(tmp / "workspace")
        warm = Phase("warm-up", 1, 1)
        await bench.run_phase(warm, args.timeout)
        print(f"setup + warm-up run: {time.perf_counter() - t_start:.1f} s", flush=True)
        for phase in phases:
            await bench.run_phase(phase, args.timeout, profile if phase.name == "main" else None)
            print(f"{phase.name}: {phase.runs} runs in {phase.wall:.1f} s", flush=True)
    finally:
        await services.stop()
        await db.dispose()
        await poller.dispose()
    after = await pg_transactions(pg)
    check = PgCheck(
        after[0] - before[0],
        after[1] - before[1],
        counter.snapshot(),
        poll_counter.snapshot(),
        counter.connections + poll_counter.connections,
    )

    for phase in phases:
        rows = round((phase.events + phase.tally.projection_rows()) / phase.runs)
        await floor(pg, phase, rows)
    report(phases, check, args, time.perf_counter() - t_start)
    if profile is not None:
        print_profile(profile, args.profile)


def print_profile(profile: cProfile.Profile, path: str) -> None:
    """Own time of the main phase by package, then the top functions (cProfile roughly doubles the time)."""
    out = io.StringIO()
    stats = pstats.Stats(profile, stream=out)
    stats.dump_stats(path)
    by_package: Counter[str] = Counter()
    raw: dict[Any, Any] = stats.stats  # type: ignore[attr-defined]
    for (filename, _, name), (_, _, own, _, _) in raw.items():
        if "sqlalchemy" in filename:
            key = "sqlalchemy"
        elif "asyncpg" in filename:
            key = "asyncpg"
        elif "/asyncio/" in filename or "selectors" in filename or "epoll" in name:
            key = "asyncio event loop (incl. waiting in epoll)"
        elif "threadloom" in filename:
            key = "threadloom/" + filename.split("/threadloom/")[-1]
        elif filename == "~":
            key = "builtins: " + name
        else:
            key = Path(filename).name
        by_package[key] += own
    total = sum(by_package.values())
    print()
    print(f"cProfile of the main phase, engine process (dump: {path}); own time {total:.1f} s by where it is spent:")
    for key, own in by_package.most_common(12):
        print(f"  {100 * own / total:5.1f}%  {key}")
    stats.sort_stats("tottime").print_stats(15)
    lines = out.getvalue().splitlines()
    start = next((i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls")), 0)
    print("top functions by own time:")
    print("\n".join(line[:160] for line in lines[start:] if line.strip()))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=500, help="runs in the main phase")
    parser.add_argument("--threads", type=int, default=10, help="threads in the main phase")
    parser.add_argument("--single-runs", type=int, default=50, help="runs on one thread (0: skip)")
    parser.add_argument("--timeout", type=float, default=180, help="seconds per phase before giving up")
    parser.add_argument(
        "--no-recovery-loop",
        dest="recovery_loop",
        action="store_false",
        help="stop the engine's periodic recovery pass after startup (see the module docstring)",
    )
    parser.add_argument("--smoke", action="store_true", help="tiny phases that finish in seconds (for the tests)")
    parser.add_argument("--verbose", action="store_true", help="every statement shape and event type")
    parser.add_argument("--profile", metavar="PATH", help="cProfile the main phase; write the stats to PATH")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.threads, args.single_runs, args.timeout = 6, 2, 3, 60
    if args.threads < 1 or args.runs < args.threads or args.runs % args.threads:
        parser.error("--runs must be a positive multiple of --threads")
    with bench_tmp() as tmp, embedded_postgres(tmp) as pg:
        (tmp / "workspace").mkdir()  # the project's workspace must exist
        try:
            asyncio.run(main_async(args, tmp, pg))
        except (RuntimeError, TimeoutError) as error:  # a run failed or hung: say so, no traceback
            print(f"FAILED: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

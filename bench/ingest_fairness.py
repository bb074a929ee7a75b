"""Benchmark: one thread's flood of deltas must not delay another thread's terminal event.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/ingest_fairness.py [--runs 20] [--words 20000] [--smoke]

`--smoke` does 3 short runs per phase with a small flood (seconds, for tests/test_bench_smoke.py).

The engine runs in-process on an embedded PostgreSQL with the scripted agent (zero chunk
delay). One project, so both threads are served by the same agent process and the same
ingestor: thread A (the flood) and thread B (short runs, `hello`, one at a time).

- floor: B's `--runs` short runs alone;
- flood: the same runs on B while A answers `@reply` with `--words` words (one delta each),
  one flood run after another for as long as B runs.

Measured per B run: the terminal-event delay, from the moment the agent's `turn/completed`
comes out of the runtime's event stream (the ingestor's input) to the end of the run's
`run.finish` transaction (the run is `completed` in the database). Printed as p50/p99 per
phase and the flood's p99 over the floor's; the flood phase also prints how many delta
events A streamed meanwhile. Figures are noisy on a shared machine: compare them with the
floor of the same invocation.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from common import EmbeddedPostgres, bench_tmp, create_database, embedded_postgres

from threadloom.config import Settings
from threadloom.domain.access import Principal
from threadloom.domain.dispatch import Dispatch
from threadloom.domain.entities import Run
from threadloom.domain.statuses import RunStatus, TokenScope
from threadloom.engine.clock import SystemClock
from threadloom.engine.pipeline import Committed
from threadloom.engine.services import Services
from threadloom.engine.sessions import LiveSession
from threadloom.providers import contract as ev
from threadloom.providers.registry import load_instances
from threadloom.store import entities, migrate
from threadloom.store.db import Database

DATABASE = "tl_fairness"
TERMINAL = ("completed", "failed", "interrupted", "cancelled")


class Probe:
    """Timestamps taken around the engine (observers wrapped around instances; the engine is unchanged):
    when a root turn's `TurnCompleted` leaves a runtime's event stream, and when `run.finish` returns."""

    def __init__(self, services: Services, changed: asyncio.Event) -> None:
        self.arrived: dict[uuid.UUID, float] = {}  # run → its turn's end read from the agent
        self.finished: dict[uuid.UUID, float] = {}  # run → its run.finish committed
        self.deltas = 0
        self.flow_at: int | None = None  # `flowing` is set once this many deltas were streamed
        self.flowing = asyncio.Event()
        opened = services.sessions.on_open
        finish = services.runs.finish

        async def on_open(session: LiveSession) -> None:
            self._watch(session)
            if opened is not None:
                await opened(session)

        async def timed_finish(run_id: uuid.UUID, *args: Any, **kwargs: Any) -> bool:
            try:
                return await finish(run_id, *args, **kwargs)
            finally:
                self.finished.setdefault(run_id, time.perf_counter())
                changed.set()

        services.sessions.on_open = on_open
        services.runs.finish = timed_finish  # type: ignore[method-assign]

    def _watch(self, session: LiveSession) -> None:
        events: Callable[[], AsyncIterator[ev.ProviderEvent]] = session.runtime.events

        async def timed() -> AsyncIterator[ev.ProviderEvent]:
            async for event in events():
                if isinstance(event, ev.TextDelta):
                    self.deltas += 1
                    if self.flow_at is not None and self.deltas >= self.flow_at:
                        self.flowing.set()
                elif isinstance(event, ev.TurnCompleted) and event.parent_turn is None:
                    binding = session.bindings.get(event.native_thread)
                    if binding is not None:
                        self.arrived.setdefault(binding.run_id, time.perf_counter())
                yield event

        session.runtime.events = timed  # type: ignore[method-assign]

    def delay(self, run_id: uuid.UUID) -> float | None:
        if run_id not in self.arrived or run_id not in self.finished:
            return None
        return self.finished[run_id] - self.arrived[run_id]


class Bench:
    def __init__(self, services: Services, probe: Probe, changed: asyncio.Event, limit: float) -> None:
        self.services = services
        self.limit = limit  # seconds a run may take
        self.probe = probe
        self.admin = Principal(uuid.uuid4(), TokenScope.ADMIN, None)
        self.changed = changed

        async def wake(_: Committed) -> None:
            self.changed.set()

        services.pipeline.listeners.append(wake)

    async def thread(self, project_id: uuid.UUID, title: str) -> uuid.UUID:
        return await self.services.catalog.create_thread(
            self.admin,
            project_id=project_id,
            title=title,
            provider_instance_id=None,
            model=None,
            runtime_mode="workspace_write",
            key=None,
        )

    async def send(self, thread_id: uuid.UUID, text: str) -> uuid.UUID:
        sent = await self.services.dispatch.send_message(
            self.admin,
            thread_id,
            text=text,
            dispatch=Dispatch(),
            provider_instance_id=None,
            model=None,
            client_message_id=None,
        )
        return sent.run_id

    async def status(self, run_id: uuid.UUID) -> str:
        async with self.services.db.read() as db:
            run = await entities.get(db, Run, run_id)
        return run.status.value if run is not None else "missing"

    async def finished(self, run_id: uuid.UUID) -> None:
        """Wait (woken by commits, never by polling) until the run is terminal and its `run.finish` has
        returned; it must have completed."""
        deadline = time.perf_counter() + self.limit
        while True:
            self.changed.clear()
            status = await self.status(run_id)
            if status in TERMINAL and run_id in self.probe.finished:
                if status != RunStatus.COMPLETED.value:
                    raise RuntimeError(f"run {run_id} ended {status}")
                return
            remaining = deadline - time.perf_counter()
            if remaining <= 0:
                raise TimeoutError(f"run {run_id} still {status} after {self.limit} s")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.changed.wait(), remaining)

    async def short_runs(self, thread_id: uuid.UUID, runs: int) -> list[float]:
        """B's runs, one at a time: each one's terminal-event delay."""
        delays = []
        for _ in range(runs):
            run_id = await self.send(thread_id, "hello")
            await self.finished(run_id)
            delay = self.probe.delay(run_id)
            if delay is None:
                raise RuntimeError(f"run {run_id}: its turn's end was not seen")
            delays.append(delay)
        return delays

    async def flood(self, thread_id: uuid.UUID, words: int, stop: asyncio.Event) -> int:
        """A's flood runs, one after another until `stop`; how many ran."""
        text = "@reply " + " ".join(f"w{i}" for i in range(words))
        ran = 0
        while not stop.is_set():
            await self.finished(await self.send(thread_id, text))
            ran += 1
        return ran


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def line(name: str, delays: list[float], extra: str = "") -> None:
    p50, p99 = statistics.median(delays) * 1000, percentile(delays, 0.99) * 1000
    print(f"  {name:<7} p50 {p50:7.1f} ms   p99 {p99:7.1f} ms   max {max(delays) * 1000:7.1f} ms{extra}")


async def main_async(args: argparse.Namespace, tmp: Path, pg: EmbeddedPostgres) -> None:
    await create_database(pg.socket_dir, DATABASE)
    url = pg.url(DATABASE)
    setup_db = Database.from_url(url, pool_size=1)
    await migrate.upgrade(setup_db.engine)
    await setup_db.dispose()
    db = Database.from_url(url)
    services = Services.build(Settings.from_env(data_dir=str(tmp / "data")), db, SystemClock(), load_instances(None))
    changed = asyncio.Event()
    probe = Probe(services, changed)
    await services.start()
    bench = Bench(services, probe, changed, args.timeout)
    try:
        workspace = tmp / "workspace"
        workspace.mkdir()
        project_id = await services.catalog.create_project(
            bench.admin, name="fairness", workspace_root=str(workspace), key=None
        )
        flooded, other = await bench.thread(project_id, "flood"), await bench.thread(project_id, "short")
        await bench.short_runs(other, 1)  # warm-up: opens the agent process
        await bench.short_runs(flooded, 1)
        floor = await bench.short_runs(other, args.runs)
        stop = asyncio.Event()
        deltas_before = probe.deltas
        probe.flow_at = deltas_before + min(args.words // 4, 2000)  # B starts once A's stream is flowing
        flooding = asyncio.create_task(bench.flood(flooded, args.words, stop))
        await asyncio.wait([flooding, asyncio.create_task(probe.flowing.wait())], return_when=asyncio.FIRST_COMPLETED)
        started = time.perf_counter()
        flood = await bench.short_runs(other, args.runs)
        wall = time.perf_counter() - started
        streamed = probe.deltas - deltas_before
        stop.set()
        flood_runs = await flooding
    finally:
        await services.stop()
        await db.dispose()
    print(f"terminal-event delay of thread B's short runs ({args.runs} per phase), scripted agent, one project")
    line("floor", floor, "   (B alone)")
    line("flood", flood, f"   (A streaming: {streamed} deltas over {wall:.1f} s in {flood_runs} runs of {args.words})")
    ratio = percentile(flood, 0.99) / percentile(floor, 0.99)
    added = (percentile(flood, 0.99) - percentile(floor, 0.99)) * 1000
    print(f"  ratio   {ratio:.2f}x (p99, flood over floor); added p99 {added:.1f} ms (target: at most 250 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=20, help="B's short runs per phase")
    parser.add_argument("--words", type=int, default=20000, help="words (deltas) per flood run on A")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per run before giving up")
    parser.add_argument("--smoke", action="store_true", help="3 runs per phase, a small flood (for the tests)")
    args = parser.parse_args()
    if args.smoke:
        args.runs, args.words = 3, 2000
    with bench_tmp() as tmp, embedded_postgres(tmp) as pg:
        asyncio.run(main_async(args, tmp, pg))


if __name__ == "__main__":
    main()

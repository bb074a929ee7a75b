"""Benchmark: what Threadloom adds to a real agent's turn, against the bare agent as the floor.

Not a test. Run from anywhere with the project's virtualenv (the CLIs from `npm ci`):

    .venv/bin/python bench/agent_turns.py [--turns 30] [--provider codex|claude|both] [--smoke]

`--smoke` runs 2 turns per side (the first only starts the process), for tests/test_bench_smoke.py.

Both sides talk to the same fake model server (tests/support/fake_model.py) and send the same
short messages, one turn at a time on one native thread. The server runs in a process of its own,
as a real model endpoint is remote: in a thread of this process it would wait for the engine's
Python code to release the interpreter lock, and count that as the agent's time.

- floor: the agent driven directly by its driver runtime (`CodexDriver`/`ClaudeDriver`:
  `open_session` for one project, start a thread, `start_turn`, read `events()` until
  `TurnCompleted`), no database;
- threadloom: the engine in-process on an embedded PostgreSQL (`Services.build`, `start`),
  `runs.send_message` → the run is `completed` (a commit listener wakes the waiter, so no
  polling granularity is added).

The two sides take turns, one turn each in alternation (who goes first alternates too), so a
drift of the machine's load moves both alike. Per side it prints the median and p90 turn latency
(first turn excluded: process start), the ratio threadloom / floor, and the median of the pairs'
differences. The difference is the engine: the command pipeline, event log,
projections and outbox hop of a run (three write transactions and the effect claim's statement,
all serial, each one write statement), the workspace checkpoint at the run's start and end, and the
ingest coalescing window.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

from common import REPO, EmbeddedPostgres, bench_tmp, create_database, embedded_postgres

sys.path.insert(0, str(REPO))  # tests.support.fake_model

from multiprocessing.connection import Connection

from tests.support.inproc import new_thread, send

from threadloom.config import Settings
from threadloom.domain.entities import Run
from threadloom.engine.clock import SystemClock
from threadloom.engine.pipeline import Committed
from threadloom.engine.services import Services
from threadloom.providers import contract as ev
from threadloom.providers.contract import ProviderRuntime
from threadloom.providers.registry import InstanceConfig, build_driver, load_instances
from threadloom.store import entities, migrate
from threadloom.store.db import Database

KEYS = {"codex": "BENCH_OPENAI_KEY", "claude": "BENCH_ANTHROPIC_KEY"}


def _serve_model(control: Connection) -> None:
    """The fake model's process: send its URL, serve until told to stop."""
    sys.path.insert(0, str(REPO))
    from tests.support.fake_model import FakeModel

    fake = FakeModel().start()
    control.send(fake.url)
    control.recv()
    fake.stop()


class ModelProcess:
    """The fake model server in a process of its own (started with `spawn`: no copy of this one's state)."""

    def __init__(self) -> None:
        context = multiprocessing.get_context("spawn")
        self._control, child = context.Pipe()
        self._process = context.Process(target=_serve_model, args=(child,), name="fake-model", daemon=True)
        self._process.start()
        if not self._control.poll(60):
            self._process.kill()
            raise RuntimeError("the fake model server did not start")
        self.url: str = self._control.recv()

    def stop(self) -> None:
        self._control.send("stop")
        self._process.join(10)
        if self._process.is_alive():
            self._process.kill()


def options(provider: str, fake: ModelProcess) -> dict[str, str]:
    base = f"{fake.url}/v1" if provider == "codex" else fake.url
    return {"base_url": base, "api_key_env": KEYS[provider]}


def summary(name: str, samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples[1:])  # the first turn starts the process
    median = statistics.median(ordered)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    print(f"  {name:<11} median {median * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms   ({len(ordered)} turns)")
    return median, p90


class Floor:
    """The bare agent through its driver runtime: no engine, no database."""

    def __init__(self, runtime: ProviderRuntime, native: str) -> None:
        self.runtime = runtime
        self.native = native
        self.events = runtime.events()

    @classmethod
    async def open(cls, provider: str, fake: ModelProcess, tmp: Path) -> Floor:
        driver = build_driver(InstanceConfig(provider, provider, options(provider, fake)), tmp / "floor")
        cwd = tmp / "floor-ws"
        cwd.mkdir(parents=True, exist_ok=True)
        scope = ev.SessionScope(project_id="bench", workspace_root=str(cwd), state_dir=tmp / "floor" / "state")
        runtime = await driver.open_session(scope)
        return cls(runtime, await runtime.start_thread(ev.ThreadSettings(cwd=str(cwd))))

    async def turn(self, text: str) -> float:
        started = time.perf_counter()
        await self.runtime.start_turn(self.native, text)
        async for event in self.events:
            if isinstance(event, ev.TurnCompleted) and event.parent_turn is None:
                assert event.status == "completed", event
                break
        return time.perf_counter() - started

    async def close(self) -> None:
        await self.runtime.close()


class Engine:
    """The same turns as runs through the engine."""

    def __init__(self, services: Services, db: Database, thread: uuid.UUID) -> None:
        self.services = services
        self.db = db
        self.thread = thread
        self.changed = asyncio.Event()

        async def wake(_: Committed) -> None:
            self.changed.set()

        services.pipeline.listeners.append(wake)

    @classmethod
    async def open(cls, provider: str, fake: ModelProcess, tmp: Path, pg: EmbeddedPostgres) -> Engine:
        name = f"bench_{provider}"
        await create_database(pg.socket_dir, name)
        setup = Database.from_url(pg.url(name), pool_size=1)
        await migrate.upgrade(setup.engine)
        await setup.dispose()
        config = tmp / f"{provider}.toml"
        opts = options(provider, fake)
        config.write_text(
            f'[instances.{provider}]\ndriver = "{provider}"\n'
            f'base_url = "{opts["base_url"]}"\napi_key_env = "{opts["api_key_env"]}"\n'
        )
        db = Database.from_url(pg.url(name))
        services = Services.build(
            Settings.from_env(data_dir=str(tmp / "engine")), db, SystemClock(), load_instances(config)
        )
        await services.start()
        workspace = tmp / f"{provider}-ws"
        workspace.mkdir(parents=True, exist_ok=True)  # a project's workspace must exist
        return cls(services, db, await new_thread(services, workspace, provider))

    async def turn(self, text: str) -> float:
        started = time.perf_counter()
        run_id = await send(self.services, self.thread, text)
        while True:
            self.changed.clear()
            async with self.db.read() as reader:
                run = await entities.get(reader, Run, run_id)
            if run is not None and run.status.value in ("completed", "failed", "interrupted"):
                assert run.status.value == "completed", run
                break
            await self.changed.wait()
        return time.perf_counter() - started

    async def close(self) -> None:
        await self.services.stop()
        await self.db.dispose()


async def compare(provider: str, fake: ModelProcess, tmp: Path, pg: EmbeddedPostgres, turns: int) -> None:
    """Turn by turn, alternately: a drift of the machine's load moves both sides alike, and each pair's
    difference is the engine's time for that turn."""
    floor = await Floor.open(provider, fake, tmp)
    engine = await Engine.open(provider, fake, tmp, pg)
    bare: list[float] = []
    ours: list[float] = []
    try:
        for i in range(turns):
            first, second = (floor, engine) if i % 2 == 0 else (engine, floor)
            timed = {first: await first.turn(f"hello {i}"), second: await second.turn(f"hello {i}")}
            bare.append(timed[floor])
            ours.append(timed[engine])
    finally:
        await engine.close()
        await floor.close()
    base = summary("floor", bare)
    mine = summary("threadloom", ours)
    added = statistics.median(o - b for o, b in zip(ours[1:], bare[1:], strict=True))
    print(f"  ratio       median {mine[0] / base[0]:.2f}x   p90 {mine[1] / base[1]:.2f}x")
    print(f"  added       median {added * 1000:.1f} ms per turn (of the pairs' differences)")


async def main_async(args: argparse.Namespace, tmp: Path, pg: EmbeddedPostgres) -> None:
    fake = ModelProcess()
    try:
        for provider in ["codex", "claude"] if args.provider == "both" else [args.provider]:
            os.environ[KEYS[provider]] = "bench-key"
            print(f"{provider}: {args.turns} sequential turns a side on one native thread, alternating")
            await compare(provider, fake, tmp, pg, args.turns)
    finally:
        fake.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--provider", choices=["codex", "claude", "both"], default="both")
    parser.add_argument("--smoke", action="store_true", help="2 turns per side: seconds (for the tests)")
    args = parser.parse_args()
    if args.smoke:
        args.turns = 2
    with bench_tmp() as tmp, embedded_postgres(tmp) as pg:
        asyncio.run(main_async(args, tmp, pg))


if __name__ == "__main__":
    main()

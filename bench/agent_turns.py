"""Benchmark: what Threadloom adds to a real agent's turn, against the bare agent as the floor.

Not a test. Run from anywhere with the project's virtualenv (the CLIs from `npm ci`):

    .venv/bin/python bench/agent_turns.py [--turns 30] [--provider codex|claude|both] [--smoke]

`--smoke` runs 2 turns per side (the first only starts the process), for tests/test_bench_smoke.py.

Both sides talk to the same fake model server (tests/support/fake_model.py, in its own
thread) and send the same short messages, one turn at a time on one native thread:

- floor: the agent driven directly by its driver runtime (`CodexDriver`/`ClaudeDriver`:
  `open_session` for one project, start a thread, `start_turn`, read `events()` until
  `TurnCompleted`), no database;
- threadloom: the engine in-process on an embedded PostgreSQL (`Services.build`, `start`),
  `runs.send_message` → the run is `completed` (a commit listener wakes the waiter, so no
  polling granularity is added).

Per side it prints the median and p90 turn latency (first turn excluded: process start) and
the ratio threadloom / floor. The difference is the engine: the command pipeline, event log,
projections and outbox hop of a run (three write transactions and the effect claim's statement,
all serial, each one write statement), the workspace checkpoint at the run's start and end, and the
ingest coalescing window.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
from pathlib import Path

from common import REPO, EmbeddedPostgres, bench_tmp, create_database, embedded_postgres

sys.path.insert(0, str(REPO))  # tests.support.fake_model

from tests.support.fake_model import FakeModel
from tests.support.inproc import new_thread, send

from threadloom.config import Settings
from threadloom.domain.entities import Run
from threadloom.engine.clock import SystemClock
from threadloom.engine.pipeline import Committed
from threadloom.engine.services import Services
from threadloom.providers import contract as ev
from threadloom.providers.registry import InstanceConfig, build_driver, load_instances
from threadloom.store import entities, migrate
from threadloom.store.db import Database

KEYS = {"codex": "BENCH_OPENAI_KEY", "claude": "BENCH_ANTHROPIC_KEY"}


def options(provider: str, fake: FakeModel) -> dict[str, str]:
    base = f"{fake.url}/v1" if provider == "codex" else fake.url
    return {"base_url": base, "api_key_env": KEYS[provider]}


def summary(name: str, samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples[1:])  # the first turn starts the process
    median = statistics.median(ordered)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    print(f"  {name:<11} median {median * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms   ({len(ordered)} turns)")
    return median, p90


async def floor(provider: str, fake: FakeModel, tmp: Path, turns: int) -> list[float]:
    """The bare agent through its driver runtime: no engine, no database."""
    driver = build_driver(InstanceConfig(provider, provider, options(provider, fake)), tmp / "floor")
    cwd = tmp / "floor-ws"
    cwd.mkdir(parents=True, exist_ok=True)
    scope = ev.SessionScope(project_id="bench", workspace_root=str(cwd), state_dir=tmp / "floor" / "state")
    runtime = await driver.open_session(scope)
    events = runtime.events()
    native = await runtime.start_thread(ev.ThreadSettings(cwd=str(cwd)))
    samples = []
    try:
        for i in range(turns):
            started = time.perf_counter()
            await runtime.start_turn(native, f"hello {i}")
            async for event in events:
                if isinstance(event, ev.TurnCompleted) and event.parent_turn is None:
                    assert event.status == "completed", event
                    break
            samples.append(time.perf_counter() - started)
    finally:
        await runtime.close()
    return samples


async def threadloom(provider: str, fake: FakeModel, tmp: Path, pg: EmbeddedPostgres, turns: int) -> list[float]:
    """The same turns as runs through the engine."""
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
    changed = asyncio.Event()

    async def wake(_: Committed) -> None:
        changed.set()

    services.pipeline.listeners.append(wake)
    await services.start()
    samples = []
    try:
        workspace = tmp / f"{provider}-ws"
        workspace.mkdir(parents=True, exist_ok=True)  # a project's workspace must exist
        thread = await new_thread(services, workspace, provider)
        for i in range(turns):
            started = time.perf_counter()
            run_id = await send(services, thread, f"hello {i}")
            while True:
                changed.clear()
                async with db.read() as reader:
                    run = await entities.get(reader, Run, run_id)
                if run is not None and run.status.value in ("completed", "failed", "interrupted"):
                    assert run.status.value == "completed", run
                    break
                await changed.wait()
            samples.append(time.perf_counter() - started)
    finally:
        await services.stop()
        await db.dispose()
    return samples


async def main_async(args: argparse.Namespace, tmp: Path, pg: EmbeddedPostgres) -> None:
    fake = FakeModel().start()
    try:
        for provider in ["codex", "claude"] if args.provider == "both" else [args.provider]:
            os.environ[KEYS[provider]] = "bench-key"
            print(f"{provider}: {args.turns} sequential turns on one native thread")
            base = summary("floor", await floor(provider, fake, tmp, args.turns))
            ours = summary("threadloom", await threadloom(provider, fake, tmp, pg, args.turns))
            print(f"  ratio       median {ours[0] / base[0]:.2f}x   p90 {ours[1] / base[1]:.2f}x")
            print(f"  added       median {(ours[0] - base[0]) * 1000:.1f} ms per turn")
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

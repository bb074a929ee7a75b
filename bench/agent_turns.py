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
import sys
import time
from pathlib import Path

from common import REPO, EmbeddedPostgres, bench_tmp, embedded_postgres

sys.path.insert(0, str(REPO))  # tests.support.fake_model

from multiprocessing.connection import Connection

from turn_timing import Engine, alternate

from threadloom.providers import contract as ev
from threadloom.providers.contract import ProviderRuntime
from threadloom.providers.registry import InstanceConfig, build_driver

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


async def compare(provider: str, fake: ModelProcess, tmp: Path, pg: EmbeddedPostgres, turns: int) -> None:
    floor = await Floor.open(provider, fake, tmp)
    opts = options(provider, fake)
    config = (
        f'[instances.{provider}]\ndriver = "{provider}"\n'
        f'base_url = "{opts["base_url"]}"\napi_key_env = "{opts["api_key_env"]}"\n'
    )
    engine = await Engine.open(tmp, pg, provider, config)
    await alternate(floor, engine, turns, lambda i: f"hello {i}")


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

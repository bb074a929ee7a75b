"""Benchmark: what Threadloom adds to an ACP agent's turn, against a bare ACP client as the floor.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/acp_turns.py [--turns 30] [--smoke]

`--smoke` runs 2 turns per side (the first only starts the process), for tests/test_bench_smoke.py.

The agent is the scripted agent's ACP face (`python -m threadloom.agent --acp`), the same command on both
sides, each turn a short `@reply`:

- floor: a bare ACP client (tests/support/acp_client.py: JSON-RPC lines on the agent's stdio,
  `initialize`, `session/new`, then `session/prompt` awaited until its answer), no engine, no database;
- threadloom: an `acp` provider instance over the same command, the engine in-process on an embedded
  PostgreSQL (`Services.build`, `start`), `runs.send_message` → the run is `completed` (a commit listener
  wakes the waiter, so no polling granularity is added).

The sides take turns, one turn each in alternation (who goes first alternates too), so a drift of the
machine's load moves both alike. Per side it prints the median and p90 turn latency (first turn excluded:
process start), the ratio threadloom / floor, and the median of the pairs' differences: the engine's time
per turn (the target is at most 30 ms added, as for the other drivers; docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

from common import REPO, EmbeddedPostgres, bench_tmp, create_database, embedded_postgres

sys.path.insert(0, str(REPO))  # tests.support

from tests.support.acp_client import AcpClient
from tests.support.acp_scripted import acp_command
from tests.support.inproc import new_thread, send

from threadloom.config import Settings
from threadloom.domain.entities import Run
from threadloom.engine.clock import SystemClock
from threadloom.engine.pipeline import Committed
from threadloom.engine.services import Services
from threadloom.providers.registry import load_instances
from threadloom.store import entities, migrate
from threadloom.store.db import Database


def summary(name: str, samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples[1:])  # the first turn starts the process
    median = statistics.median(ordered)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    print(f"  {name:<11} median {median * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms   ({len(ordered)} turns)")
    return median, p90


def filled(folder: Path, workspace: Path) -> list[str]:
    """The instance's command with the placeholders the driver fills in, filled for the bare client."""
    return [a.replace("{state_dir}", str(folder)).replace("{workspace}", str(workspace)) for a in acp_command()]


class Floor:
    """The agent through a bare ACP client."""

    def __init__(self, client: AcpClient, session: str) -> None:
        self.client = client
        self.session = session

    @classmethod
    async def open(cls, tmp: Path) -> Floor:
        state, workspace = tmp / "floor-state", tmp / "floor-ws"
        state.mkdir(parents=True)
        workspace.mkdir(parents=True)
        argv = [a for a in filled(state, workspace) if a != "{own_workspaces}"]
        argv.remove("--own-workspaces")
        client = await AcpClient.spawn(argv, cwd=str(state))
        await client.initialize()
        return cls(client, await client.new_session(str(workspace)))

    async def turn(self, text: str) -> float:
        started = time.perf_counter()
        result = await self.client.prompt(self.session, text)
        assert result["stopReason"] == "end_turn", result
        return time.perf_counter() - started

    async def close(self) -> None:
        await self.client.close()


class Engine:
    """The same turns as runs through the engine on an `acp` instance."""

    def __init__(self, services: Services, db: Database, thread: uuid.UUID) -> None:
        self.services = services
        self.db = db
        self.thread = thread
        self.changed = asyncio.Event()

        async def wake(_: Committed) -> None:
            self.changed.set()

        services.pipeline.listeners.append(wake)

    @classmethod
    async def open(cls, tmp: Path, pg: EmbeddedPostgres) -> Engine:
        await create_database(pg.socket_dir, "bench_acp")
        setup = Database.from_url(pg.url("bench_acp"), pool_size=1)
        await migrate.upgrade(setup.engine)
        await setup.dispose()
        config = tmp / "acp.toml"
        config.write_text(f'[instances.acp]\ndriver = "acp"\ncommand = {json.dumps(acp_command())}\n')
        db = Database.from_url(pg.url("bench_acp"))
        settings = Settings.from_env(data_dir=str(tmp / "engine"))
        services = Services.build(settings, db, SystemClock(), load_instances(config))
        await services.start()
        workspace = tmp / "acp-ws"
        workspace.mkdir(parents=True, exist_ok=True)
        return cls(services, db, await new_thread(services, workspace, "acp"))

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


async def compare(tmp: Path, pg: EmbeddedPostgres, turns: int) -> None:
    floor = await Floor.open(tmp)
    engine = await Engine.open(tmp, pg)
    bare: list[float] = []
    ours: list[float] = []
    try:
        for i in range(turns):
            first, second = (floor, engine) if i % 2 == 0 else (engine, floor)
            text = f"@reply hello {i}"
            timed = {first: await first.turn(text), second: await second.turn(text)}
            bare.append(timed[floor])
            ours.append(timed[engine])
    finally:
        await engine.close()
        await floor.close()
    base = summary("floor", bare)
    mine = summary("threadloom", ours)
    added = statistics.median(o - b for o, b in zip(ours[1:], bare[1:], strict=True))
    print(f"  ratio       median {mine[0] / base[0]:.2f}x   p90 {mine[1] / base[1]:.2f}x")
    print(f"  added       median {added * 1000:.1f} ms per turn (of the pairs' differences; target <= 30 ms)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="2 turns per side: seconds (for the tests)")
    args = parser.parse_args()
    if args.smoke:
        args.turns = 2
    print(f"acp (scripted agent's ACP face): {args.turns} sequential turns a side on one session, alternating")
    with bench_tmp() as tmp, embedded_postgres(tmp) as pg:
        asyncio.run(compare(tmp, pg, args.turns))


if __name__ == "__main__":
    main()

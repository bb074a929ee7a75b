"""The timing of a turn-latency benchmark (bench/agent_turns.py, bench/acp_turns.py): the same turns on a floor
(the agent without Threadloom) and through the engine, in alternation, then the per-side latencies, their ratio
and the engine's added time.

The sides take turns, one turn each (who goes first alternates too), so a drift of the machine's load moves both
alike and each pair's difference is the engine's time for that turn. The first turn of each side only starts
the agent process, so it is left out of every figure. Imported as `turn_timing` (the script's folder is first on
`sys.path`), like `common`.
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from common import REPO, EmbeddedPostgres, create_database

sys.path.insert(0, str(REPO))  # tests.support

from tests.support.inproc import new_thread, send

from threadloom.config import Settings
from threadloom.domain.entities import Run
from threadloom.engine.clock import SystemClock
from threadloom.engine.pipeline import Committed
from threadloom.engine.services import Services
from threadloom.providers.registry import load_instances
from threadloom.store import entities, migrate
from threadloom.store.db import Database


class Side(Protocol):
    """One side of the comparison: a turn's latency in seconds, and its shutdown."""

    async def turn(self, text: str) -> float: ...

    async def close(self) -> None: ...


def summary(name: str, samples: list[float]) -> tuple[float, float]:
    """Print and return (median, p90) of a side's turns, its first turn (the process start) left out."""
    ordered = sorted(samples[1:])
    median = statistics.median(ordered)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    print(f"  {name:<11} median {median * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms   ({len(ordered)} turns)")
    return median, p90


class Engine:
    """The turns as runs through the engine, in-process on an embedded PostgreSQL (`Services.build`, `start`):
    `runs.send_message`, then wait until the run is `completed` (a commit listener wakes the waiter, so no
    polling granularity is added)."""

    def __init__(self, services: Services, db: Database, thread: uuid.UUID) -> None:
        self.services = services
        self.db = db
        self.thread = thread
        self.changed = asyncio.Event()

        async def wake(_: Committed) -> None:
            self.changed.set()

        services.pipeline.listeners.append(wake)

    @classmethod
    async def open(cls, tmp: Path, pg: EmbeddedPostgres, instance: str, providers_toml: str) -> Engine:
        """The engine on a new database `bench_<instance>`, with the one provider instance `providers_toml`
        describes, and a thread of it in a new project."""
        name = f"bench_{instance}"
        await create_database(pg.socket_dir, name)
        setup = Database.from_url(pg.url(name), pool_size=1)
        await migrate.upgrade(setup.engine)
        await setup.dispose()
        config = tmp / f"{instance}.toml"
        config.write_text(providers_toml)
        db = Database.from_url(pg.url(name))
        settings = Settings.from_env(data_dir=str(tmp / "engine"))
        services = Services.build(settings, db, SystemClock(), load_instances(config))
        await services.start()
        workspace = tmp / f"{instance}-ws"
        workspace.mkdir(parents=True, exist_ok=True)  # a project's workspace must exist
        return cls(services, db, await new_thread(services, workspace, instance))

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


async def alternate(floor: Side, engine: Side, turns: int, text: Callable[[int], str], target: str = "") -> None:
    """`turns` turns a side in alternation (`text(i)` the i-th message of both), both sides closed afterwards;
    prints each side's figures, the ratio, and the median added time of the pairs (with `target` after it)."""
    bare: list[float] = []
    ours: list[float] = []
    try:
        for i in range(turns):
            first, second = (floor, engine) if i % 2 == 0 else (engine, floor)
            timed = {first: await first.turn(text(i)), second: await second.turn(text(i))}
            bare.append(timed[floor])
            ours.append(timed[engine])
    finally:
        await engine.close()
        await floor.close()
    base = summary("floor", bare)
    mine = summary("threadloom", ours)
    added = statistics.median(o - b for o, b in zip(ours[1:], bare[1:], strict=True))
    print(f"  ratio       median {mine[0] / base[0]:.2f}x   p90 {mine[1] / base[1]:.2f}x")
    print(f"  added       median {added * 1000:.1f} ms per turn (of the pairs' differences{target})")

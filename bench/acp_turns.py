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
import sys
import time
from pathlib import Path

from common import REPO, EmbeddedPostgres, bench_tmp, embedded_postgres

sys.path.insert(0, str(REPO))  # tests.support

from tests.support.acp_client import AcpClient
from tests.support.acp_scripted import acp_command
from turn_timing import Engine, alternate


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


async def compare(tmp: Path, pg: EmbeddedPostgres, turns: int) -> None:
    floor = await Floor.open(tmp)
    config = f'[instances.acp]\ndriver = "acp"\ncommand = {json.dumps(acp_command())}\n'
    engine = await Engine.open(tmp, pg, "acp", config)
    await alternate(floor, engine, turns, lambda i: f"@reply hello {i}", target="; target <= 30 ms")


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

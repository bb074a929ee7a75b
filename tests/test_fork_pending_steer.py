"""A fork made while a steer of its point's run is still on its way does not receive that steer.

A steer (`STEER_ACTIVE`) is filed under the run it steered at once, and handed to the live turn by an effect.
If the run ends first, the message becomes a run of its own, a later one. A fork of the ended run made in
between froze the run's messages as the log held them, the steer among them: the fork then recalled a message
its source said after the fork point (found by tests/test_thread_races.py, seed 3963516244). The hold point
`steer-delivery` (`THREADLOOM_TEST_HOLD_AT`) keeps the delivery back until the fork is made, so that order
happens every time. Real server, real git, the scripted agent.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from tests.support.pg import PgServer
from tests.support.runs import finished, running, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess, providers_env
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(120)

PROVIDERS = """
[instances.scripted]
driver = "scripted"
"""
FORK = """mutation($r: ID!) { forkThread(input: {source: {run: $r}}) {
  thread { id } transfer { id } userErrors { code message field } } }"""
TRANSFER = """query($id: ID!) { node(id: $id) { ... on ContextTransfer { handoff { text } } } }"""
RUNS = """query($t: ID!) { thread(id: $t) { runs(first: 5) { nodes { id ordinal status userMessage { text } } } } }"""


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


async def test_a_fork_of_a_run_that_ended_before_its_steer_arrived_leaves_the_steer_to_the_source(
    pg: PgServer, tmp_path: Path
) -> None:
    deliver = tmp_path / "deliver"
    env = providers_env(tmp_path, PROVIDERS, THREADLOOM_TEST_HOLD_AT=f"steer-delivery:{deliver}")
    (tmp_path / "ws").mkdir()
    server = ServerProcess(await pg.fresh(), tmp_path / "data", env=env)
    try:
        await asyncio.to_thread(server.wait_ready)
        client = Client(server.url, server.admin_token)
        source = await ScriptedThread.create(client, tmp_path / "ws")
        gate = source.workspace / "go"
        held = await send(client, source.id, "@await go\n@reply first done")
        run = held["run"]["id"]
        await running(client, run)  # the turn is live: a message now steers it
        steer = await send(client, source.id, "STEERED-LATER-42")
        assert (steer["appliedDispatch"], steer["run"]["id"]) == ("STEER_ACTIVE", run), steer
        await until(lambda: _exists(tmp_path / "deliver.held"), within=60)  # its delivery is held back
        await asyncio.to_thread(gate.touch)  # the turn ends before the steer reaches it
        assert (await finished(client, run))["status"] == "COMPLETED"

        forked = (await client.gql(FORK, {"r": run}))["forkThread"]
        assert forked["userErrors"] == [], forked
        fork = ScriptedThread(client, forked["thread"]["id"], source.workspace)

        await asyncio.to_thread(deliver.touch)  # the steer goes on: the run it steered has ended

        async def second_run() -> list[dict[str, str]] | None:
            runs = (await client.gql(RUNS, {"t": source.id}))["thread"]["runs"]["nodes"]
            return runs if len(runs) == 2 and runs[1]["status"] == "COMPLETED" else None

        runs = await until(second_run, within=60)
        assert [(r["ordinal"], r["userMessage"]["text"]) for r in runs] == [
            (1, "@await go\n@reply first done"),
            (2, "STEERED-LATER-42"),
        ]

        # The fork holds its point's run as it ended, and nothing its source said after it.
        memory = await fork.recall()
        handoff = (await client.gql(TRANSFER, {"id": forked["transfer"]["id"]}))["node"]["handoff"]["text"]
        assert "@reply first done" in handoff and "first done" in memory[0], memory
        assert "STEERED-LATER-42" not in handoff, handoff
        assert not any("STEERED-LATER-42" in line for line in memory), memory
        await client.aclose()
    finally:
        server.stop()

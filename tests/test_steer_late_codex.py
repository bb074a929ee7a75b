"""A steer the API accepted (`STEER_ACTIVE`) that reaches the real Codex only after its turn ended.

The steer is handed to the agent by an effect after `sendMessage` answers, so on a loaded machine the turn may
end first. Codex then refuses `turn/steer` ("no active turn to steer") and the message must become a run of its
own (docs/lifecycles/steering-and-queue.md), never be lost. The hold point `steer-delivery`
(`THREADLOOM_TEST_HOLD_AT`, src/threadloom/faults.py) keeps the delivery back until the held turn has ended, so
this order happens every time instead of once in many loaded runs.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import agent_thread, cli_api, until_held
from tests.support.fake_model import FakeModel
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(180)

STATE = """query($t: ID!) { thread(id: $t) {
  runs(first: 10) { nodes { id ordinal status userMessage { text } usage { calls } } }
  activities(last: 100) { nodes { kind run { id } } }
  messages(first: 100) { nodes { role text run { id } } } } }"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("steer-late")


@pytest.fixture(scope="module")
async def client(pg: PgServer, module_fake: FakeModel, folder: Path) -> AsyncIterator[Client]:
    hold = f"steer-delivery:{folder / 'deliver'}"
    async with cli_api(await pg.fresh(), folder, module_fake, THREADLOOM_TEST_HOLD_AT=hold) as found:
        yield found


async def test_a_steer_codex_gets_after_its_turn_ended_becomes_a_run_the_agent_answers(
    client: Client, module_fake: FakeModel, folder: Path
) -> None:
    thread = await agent_thread(client, folder / "ws", "codex")
    module_fake.reset_hold()
    held = await send(client, thread, "HOLD")
    await until_held(client, module_fake, held["run"]["id"], "/v1/responses")
    steer = await send(client, thread, "STEERED-LATE-77")
    assert steer["appliedDispatch"] == "STEER_ACTIVE" and steer["run"]["id"] == held["run"]["id"], steer
    await until(lambda: asyncio.to_thread((folder / "deliver.held").exists), within=60)  # delivery held back
    module_fake.release()
    assert (await finished(client, held["run"]["id"], within=120))["status"] == "COMPLETED"
    assert not any("STEERED-LATE-77" in str(b) for b in module_fake.bodies("/v1/responses"))  # the turn never had it
    await asyncio.to_thread((folder / "deliver").touch)

    async def two_runs() -> dict[str, Any] | None:
        state = (await client.gql(STATE, {"t": thread}))["thread"]
        runs = state["runs"]["nodes"]
        return state if len(runs) == 2 and runs[1]["status"] == "COMPLETED" else None

    state = await until(two_runs, within=60)
    first, second = state["runs"]["nodes"]
    assert (first["id"], first["userMessage"]["text"]) == (held["run"]["id"], "HOLD")
    assert (second["ordinal"], second["userMessage"]["text"]) == (2, "STEERED-LATE-77")
    became = [a["run"]["id"] for a in state["activities"]["nodes"] if a["kind"] == "steer.became_run"]
    assert became == [held["run"]["id"]]  # said on the run it was meant for
    # The agent answered it, in its own run, with one model call of its own.
    answers = [(m["run"]["id"], m["text"]) for m in state["messages"]["nodes"] if m["role"] == "ASSISTANT"]
    assert (second["id"], "echo: STEERED-LATE-77") in answers
    assert (first["usage"]["calls"], second["usage"]["calls"]) == (1, 1)

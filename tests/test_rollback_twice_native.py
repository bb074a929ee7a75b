"""A restarted run whose first turn reached the agent: rolling it back natively must drop that turn too.

Found by tests/test_thread_races.py (seed 3078369981, `[one-provider]`): `rollbackToRun(2)` then
`rollbackToRun(1)`, both native on the scripted agent, yet the agent's `@recall` still held run 2's messages.
Run 2 had been restarted (`restartActive`) while its first attempt's turn start was in flight: the agent had
started that turn (it ran, and was interrupted), but the attempt was superseded before the app read the turn's
start, so its provider turn kept no `nativeTurnRef`. The rollback then reverted the agent's thread before the
only dropped turn it knew (the new attempt's), and the superseded attempt's turn stayed in the conversation.

The window is held open, not raced: the hold point `turn-started` (`THREADLOOM_TEST_HOLD_AT`,
src/threadloom/faults.py) keeps the ingestion of a turn's start back until the test creates its gate file. The
gate is open for every other turn of the module's server; the test shuts it for run 2 only (removing the gate
and its `.held` marker) and waits for `.held` to know the agent started that turn.
"""

from __future__ import annotations

import asyncio
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import server_log
from tests.support.runs import finished, run, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

PROVIDERS = """
[instances.a]
driver = "scripted"
"""

_GATES = Path(tempfile.mkdtemp(prefix="threadloom-turn-started-"))  # unique per module import; removed below
GATE = _GATES / "turn-started"
GATE.touch()  # open: turns are held only while a test has removed it
SERVER_ENV = {"THREADLOOM_TEST_HOLD_AT": f"turn-started:{GATE}"}

ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) {
  rolledBackRuns { ordinal } userErrors { code message } } }"""
ACTIVITIES = """query($t: ID!) { thread(id: $t) { activities(first: 100) { nodes { kind payload } } } }"""


@pytest.fixture(scope="module", autouse=True)
def _gates() -> Iterator[None]:
    yield
    shutil.rmtree(_GATES, ignore_errors=True)


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


def _shut(held: Path) -> None:
    """Hold the next turn start's ingestion; `held` appears when it is reached."""
    GATE.unlink()
    held.unlink(missing_ok=True)


async def _rolled_back(client: Client, thread: ScriptedThread, ordinal: int) -> dict[str, Any]:
    """`rollbackToRun(ordinal)`, and the plan its `rollback.started` record carried out."""
    answer = (await client.gql(ROLLBACK, {"t": thread.id, "n": ordinal}))["rollbackToRun"]
    assert answer["userErrors"] == [], answer
    nodes = (await client.gql(ACTIVITIES, {"t": thread.id}))["thread"]["activities"]["nodes"]
    return [n["payload"] for n in nodes if n["kind"] == "rollback.started"][-1]["plan"]  # type: ignore[no-any-return]


async def _restarted_while_its_turn_start_is_unread(thread: ScriptedThread) -> dict[str, Any]:
    """Run 2: the agent starts its first attempt's turn, the app has not read that start yet (held at
    `turn-started`), and a `restartActive` supersedes the attempt meanwhile. Returns the completed run."""
    held = Path(f"{GATE}.held")
    await asyncio.to_thread(_shut, held)
    try:
        sent = await send(thread.client, thread.id, "@await go\n@reply two")
        assert sent["userErrors"] == [], sent
        run_id = sent["run"]["id"]
        await until(lambda: _exists(held))  # the agent has started the turn; its start is not recorded
        before = await run(thread.client, run_id)
        assert before["status"] == "STARTING", before  # really in the window: not yet RUNNING
        restart = {"restartActive": {"targetRunId": run_id}}
        restarted = await send(thread.client, thread.id, "@reply two-b", d=restart)
        assert restarted["userErrors"] == [] and restarted["appliedDispatch"] == "RESTART_ACTIVE", restarted
    finally:
        await asyncio.to_thread(GATE.touch)

    async def old_turn_ended() -> bool:
        first = (await run(thread.client, run_id))["attempts"][0]
        return bool(first["providerTurns"]) and first["providerTurns"][0]["status"] == "INTERRUPTED"

    await until(old_turn_ended)  # the agent interrupted the superseded turn at its gate
    await asyncio.to_thread((thread.workspace / "go").touch)  # the new attempt's input starts with the same gate
    done = await finished(thread.client, run_id)
    assert done["status"] == "COMPLETED", done
    shown = [(a["attemptOrdinal"], a["status"], len(a["providerTurns"])) for a in done["attempts"]]
    assert shown == [(1, "SUPERSEDED", 1), (2, "COMPLETED", 1)], shown
    return done


async def test_rolling_back_a_restarted_run_drops_its_superseded_turn_from_the_agent(
    client: Client, server: ServerProcess, workspace: Path
) -> None:
    thread = await ScriptedThread.create(client, workspace, "a")
    await thread.run("@reply one")
    two = await _restarted_while_its_turn_start_is_unread(thread)
    # The superseded attempt's turn reached the agent: the app knows it by the agent's own id.
    refs = [a["providerTurns"][0]["nativeTurnRef"] for a in two["attempts"]]
    assert all(refs) and len(set(refs)) == 2, refs
    await thread.run("@reply three")

    first = await _rolled_back(client, thread, 2)
    assert first["rolledBackRunOrdinals"] == [3], first
    second = await _rolled_back(client, thread, 1)
    steps = [(p["strategy"], p["turnCount"], p["droppedTurnOrdinals"]) for p in second["providerThreads"]]
    assert steps == [("native_rollback", 2, [2, 3])], second
    assert second["providerThreads"][0]["beforeTurnRef"] == refs[0], (second, refs)

    held = await thread.recall()  # the conversation the next run has
    assert held == ["user: @reply one"], held
    assert server_log.errors(server.log) == [], server.log[-40:]

"""A rollback on a thread that moved between providers: every provider thread that saw an undone run forgets
it, and none loses a kept run (real server, scripted agent on two instances, `@recall` on both).

- Runs 1-2 on `a`, runs 3-4 on `b`, `rollbackToRun(1)`: `b` (active) is replaced from the app's context, and
  `a`, which ran the undone run 2, is retired: back on `a`, the agent holds run 1 and not run 2.
- Runs 1-2 on `a`, 3-4 on `b`, back on `a` for run 5 (its first turn carried the delta of 3-4),
  `rollbackToRun(4)`: `a` rolls back natively before run 5's turn, which drops the delta with it; runs 3 and
  4 are kept, so `a` is handed them again with its next turn.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.acp_scripted import acp_instance
from tests.support.scripted import ScriptedThread
from tests.support.server import Client

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

PROVIDERS = (
    """
[instances.a]
driver = "scripted"

[instances.b]
driver = "scripted"

"""
    + acp_instance("acp-a")
    + acp_instance("acp-b")
)
# Each scenario on two scripted instances, and on two `acp` instances over the scripted agent's ACP face
# (rollback there is `_session/rewind`, resume `session/resume`, handoffs embedded resources).
PAIRS = pytest.mark.parametrize(("a", "b"), [("a", "b"), ("acp-a", "acp-b")])

ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) {
  rolledBackRuns { ordinal } userErrors { code message } } }"""
ROLLED = """query($t: ID!) { thread(id: $t) { activities(first: 100) { nodes { kind payload } } } }"""


async def _recall_on(thread: ScriptedThread, instance: str) -> str:
    await thread.run_on(instance, "@reply switching")  # the recall itself then continues where this ran
    return "\n".join(await thread.recall())


async def _rolled_back(client: Client, thread: ScriptedThread, ordinal: int) -> dict[str, Any]:
    answer = (await client.gql(ROLLBACK, {"t": thread.id, "n": ordinal}))["rollbackToRun"]
    assert answer["userErrors"] == [], answer
    nodes = (await client.gql(ROLLED, {"t": thread.id}))["thread"]["activities"]["nodes"]
    done = [n["payload"] for n in nodes if n["kind"] == "rollback.completed"]
    return done[-1]  # type: ignore[no-any-return]


@PAIRS
async def test_a_provider_thread_that_ran_an_undone_run_is_retired(
    client: Client, workspace: Path, a: str, b: str
) -> None:
    thread = await ScriptedThread.create(client, workspace, a)
    for text in ("@reply one", "@reply two"):
        await thread.run_on(a, text)
    for text in ("@reply three", "@reply four"):
        await thread.run_on(b, text)
    record = await _rolled_back(client, thread, 1)
    assert [p["providerInstanceId"] for p in record["staleProviderThreads"]] == [a]

    on_a = await _recall_on(thread, a)
    assert "@reply one" in on_a, on_a
    assert not any(word in on_a for word in ("@reply two", "@reply three", "@reply four")), on_a
    on_b = await _recall_on(thread, b)
    assert "@reply one" in on_b, on_b
    assert not any(word in on_b for word in ("@reply two", "@reply three", "@reply four")), on_b


@PAIRS
async def test_a_provider_thread_that_ran_only_kept_runs_is_not_retired(
    client: Client, workspace: Path, a: str, b: str
) -> None:
    """The twin: `a` ran run 1 only, which the rollback keeps; it is resumed, and holds run 1 as its own."""
    thread = await ScriptedThread.create(client, workspace, a)
    await thread.run_on(a, "@reply one")
    for text in ("@reply two", "@reply three"):
        await thread.run_on(b, text)
    record = await _rolled_back(client, thread, 2)
    assert record["staleProviderThreads"] == []
    on_a = await _recall_on(thread, a)
    assert on_a.startswith("user: @reply one"), on_a  # its own first turn: the same provider thread
    assert "@reply two" in on_a and "@reply three" not in on_a, on_a


@PAIRS
async def test_kept_runs_a_return_was_told_of_survive_the_rollback_of_that_return(
    client: Client, workspace: Path, a: str, b: str
) -> None:
    thread = await ScriptedThread.create(client, workspace, a)
    for text in ("@reply one", "@reply two"):
        await thread.run_on(a, text)
    for text in ("@reply three", "@reply four"):
        await thread.run_on(b, text)
    await thread.run_on(a, "@reply five")  # back on a: its first turn carries the delta of runs 3-4
    record = await _rolled_back(client, thread, 4)
    assert record["rebridgeHandoffId"] is not None
    assert [p["strategy"] for p in record["providerThreads"]] == ["native_rollback"]

    recalled = "\n".join(await thread.recall())  # continues on a, no switch
    for word in ("one", "two", "three", "four"):
        assert f"@reply {word}" in recalled, (word, recalled)
    assert "@reply five" not in recalled, recalled

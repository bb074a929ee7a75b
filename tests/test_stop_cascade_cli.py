"""The Stop cascade with the real Codex and Claude Code CLIs against the fake model (the only replaced part).

A parent thread's run on Codex is held by the model (`HOLD`: one streamed chunk, then nothing until released),
so it is provably mid-reply. A task runs on its parent's current provider (delegateTask takes none), so the
thread then moves to Claude (`switchProvider`: its later runs, and the tasks it delegates, go there) and
delegates a task, whose child thread's run on Claude is held the same way. One `stopThread` on the parent must
then stop both CLIs: the parent's run is asked first, then its task's; both runs end INTERRUPTED, both queues
stay held (a queued message does not start), the subagent node on the parent's graph reads INTERRUPTED, and the
model sees each CLI close its open request before the reply ended (the CLI really stopped, not only our
records). The task's interrupted end wakes nothing on the parent; resumeQueue then starts the held message.
The model never releases a held reply: a run that ended because its reply finished would not count.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import MODEL_PATH, cli_api
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, run, send
from tests.support.server import Client
from tests.support.waiting import until

WAIT_S = 60.0
CREATE_THREAD = """mutation($p: ID!, $i: String!) { createThread(input: {projectId: $p, providerInstanceId: $i,
  title: "parent"}) { thread { id } userErrors { code message } } }"""
SWITCH = """mutation($t: ID!, $i: String!) { switchProvider(input: {threadId: $t, providerInstanceId: $i}) {
  thread { providerInstanceId } userErrors { code message } } }"""
DELEGATE = """mutation($t: ID!, $text: String!) { delegateTask(input: {threadId: $t, text: $text}) {
  thread { id providerInstanceId lineage { relationship parentThread { id } }
           runs(first: 1) { edges { node { id status } } } }
  userErrors { code message } } }"""
STOP = """mutation($t: ID!) { stopThread(input: {threadId: $t}) { thread { queueHeld } userErrors { code } } }"""
THREAD = """query($t: ID!) { thread(id: $t) { queueHeld activeRun { id } } }"""
RUNS = """query($t: ID!) { thread(id: $t) { runs(first: 10) { edges { node { id } } } } }"""
RESUME = """mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { userErrors { code } } }"""
TIMES = """query($r: ID!) { run(id: $r) { status interruptRequestedAt } }"""


@pytest.fixture
async def api(database_url: str, tmp_path: Path, fake: FakeModel) -> AsyncIterator[Client]:
    async with cli_api(database_url, tmp_path, fake) as client:
        yield client


async def _running(api: Client, run_id: str) -> None:
    async def check() -> bool:
        return (await run(api, run_id))["status"] == "RUNNING"

    await until(check, within=WAIT_S)


async def _model_holds(fake: FakeModel, provider: str, marker: str) -> None:
    """Until the model has the CLI's streamed request for the message with `marker` (its reply is held)."""

    async def check() -> bool:
        bodies = fake.bodies(MODEL_PATH[provider])
        return any(marker in str(b) and b.get("stream", True) for b in bodies)

    await until(check, within=WAIT_S)


async def _subagent_node(api: Client, run_id: str) -> dict[str, Any]:
    nodes = [n for n in (await run(api, run_id))["rootNode"]["children"] if n["kind"] == "SUBAGENT"]
    assert len(nodes) == 1, nodes
    return nodes[0]


async def test_stop_thread_interrupts_a_held_codex_run_and_then_its_delegated_task_held_on_claude(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    project = (await api.gql(CREATE_PROJECT, {"name": "cascade", "root": str(workspace)}))["createProject"]
    made = (await api.gql(CREATE_THREAD, {"p": project["project"]["id"], "i": "codex"}))["createThread"]
    assert made["userErrors"] == [], made
    parent = made["thread"]["id"]

    top = await send(api, parent, "HOLD\nparent work on codex")
    assert top["userErrors"] == [], top
    parent_run = top["run"]["id"]
    await _model_holds(fake, "codex", "parent work on codex")
    await _running(api, parent_run)

    switched = (await api.gql(SWITCH, {"t": parent, "i": "claude"}))["switchProvider"]
    assert switched == {"thread": {"providerInstanceId": "claude"}, "userErrors": []}
    task = (await api.gql(DELEGATE, {"t": parent, "text": "HOLD\nchild work on claude"}))["delegateTask"]
    assert task["userErrors"] == [], task
    child = task["thread"]
    assert child["providerInstanceId"] == "claude"
    assert child["lineage"] == {"relationship": "SUBAGENT", "parentThread": {"id": parent}}
    child_run = child["runs"]["edges"][0]["node"]["id"]
    await _model_holds(fake, "claude", "child work on claude")
    await _running(api, child_run)
    assert (await _subagent_node(api, parent_run))["status"] == "RUNNING"
    assert (await run(api, parent_run))["status"] == "RUNNING"  # the model held both: neither ended on its own

    waiting = await send(api, parent, "after the stop", d={"queueAfterActive": True})
    assert waiting["userErrors"] == [] and waiting["appliedDispatch"] == "QUEUE_AFTER_ACTIVE", waiting

    stopped = (await api.gql(STOP, {"t": parent}))["stopThread"]
    assert stopped == {"thread": {"queueHeld": True}, "userErrors": []}

    assert (await finished(api, parent_run, within=WAIT_S))["status"] == "INTERRUPTED"
    assert (await finished(api, child_run, within=WAIT_S))["status"] == "INTERRUPTED"
    asked = [(await api.gql(TIMES, {"r": r}))["run"]["interruptRequestedAt"] for r in (parent_run, child_run)]
    assert None not in asked and asked[0] < asked[1], asked  # the thread's own run first, then its task's
    for thread in (parent, child["id"]):
        assert (await api.gql(THREAD, {"t": thread}))["thread"] == {"queueHeld": True, "activeRun": None}
    assert (await run(api, waiting["run"]["id"]))["status"] == "QUEUED"  # held: nothing started on its own

    async def node_ended() -> dict[str, Any] | None:
        node = await _subagent_node(api, parent_run)
        return node if node["status"] != "RUNNING" else None

    assert (await until(node_ended, within=WAIT_S))["status"] == "INTERRUPTED"

    # Each CLI closed its open model request before the reply ended: the agents really stopped.
    for provider, marker in (("codex", "parent work on codex"), ("claude", "child work on claude")):
        closed = await asyncio.to_thread(fake.wait_abandoned, MODEL_PATH[provider], 1, WAIT_S)
        assert any(marker in str(body) for body in closed), (provider, closed)

    # The task's interrupted end woke nothing on the stopped parent; resumeQueue starts the held message, on
    # the provider the thread moved to.
    edges = (await api.gql(RUNS, {"t": parent}))["thread"]["runs"]["edges"]
    assert {e["node"]["id"] for e in edges} == {parent_run, waiting["run"]["id"]}
    assert (await api.gql(RESUME, {"t": parent}))["resumeQueue"] == {"userErrors": []}
    assert (await finished(api, waiting["run"]["id"], within=WAIT_S))["status"] == "COMPLETED"
    assert any("after the stop" in str(b) for b in fake.bodies(MODEL_PATH["claude"]))

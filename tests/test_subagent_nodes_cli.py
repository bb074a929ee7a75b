"""Subagent nodes with the real Claude Code CLI against the fake model server.

Claude Code's Task (Agent) subagent lives inside its parent's session: its messages carry `parent_tool_use_id`,
and `claude -p` gives no way to resume, roll back or fork the subagent's conversation alone. So its node owns no
provider thread, and rollbackNode restores its files while the payload says `conversation: NOT_SUPPORTED`; a
fork of the node is refused (INVALID_INPUT), typed, never silently turned into something else.

With the real Codex app-server: a revert's result is read back and reconciled with the recorded turns.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import cli_api
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import TERMINAL, run, send
from tests.support.server import Client
from tests.support.waiting import until
from tests.test_codex_driver import Codex, codex  # noqa: F401  (the real Codex app-server, driven directly)
from threadloom.domain.entities import ProviderTurn
from threadloom.domain.statuses import ProviderTurnStatus
from threadloom.engine import node_rollback
from threadloom.providers.contract import ProviderError

THREAD = """mutation($p: ID!, $i: String!) {
  createThread(input: {projectId: $p, providerInstanceId: $i, runtimeMode: "approval_required", title: "t"}) {
    thread { id } userErrors { code message } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""
APPROVE = """mutation($r: ID!) {
  respondToApproval(input: {requestId: $r, decision: ACCEPT}) { userErrors { code } } }"""
GRAPH = """query($r: ID!) { run(id: $r) { executionGraph { nodes { id kind status } } } }"""
PROVIDER_THREADS = """query($t: ID!) { thread(id: $t) { providerThreads { id ownerNode { id } } } }"""
CHECKPOINTS = """query($t: ID!) { thread(id: $t) { checkpoints(first: 50) { edges { node {
  id ordinal status scope { kind node { id } } } } } } }"""
ROLLBACK_NODE = """mutation($n: ID!, $c: ID!) { rollbackNode(input: {nodeId: $n, checkpointId: $c}) {
  conversation conversationReason userErrors { code message } } }"""
FORK = """mutation($n: ID!) { forkThread(input: {source: {node: $n}}) { thread { id } userErrors { code message } } }"""


@pytest.fixture
async def api(database_url: str, tmp_path: Path, fake: FakeModel) -> AsyncIterator[Client]:
    async with cli_api(database_url, tmp_path, fake) as client:
        yield client


async def _approve_until_done(api: Client, thread: str, run_id: str) -> dict[str, Any]:
    """Accept every request the run asks (the Agent call, the subagent's Write) until it ends."""

    async def step() -> dict[str, Any] | None:
        for request in (await api.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"]:
            await api.gql(APPROVE, {"r": request["id"]})
        found = await run(api, run_id)
        return found if found["status"] in TERMINAL else None

    return await until(step, within=120)


async def test_rollbackNode_on_a_claude_task_restores_its_files_and_says_its_conversation_is_not_supported(
    api: Client, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    project = (await api.gql(CREATE_PROJECT, {"name": "claude", "root": str(workspace)}))["createProject"]
    made = (await api.gql(THREAD, {"p": project["project"]["id"], "i": "claude"}))["createThread"]
    thread = made["thread"]["id"]
    # The subagent asks before it writes (approval_required), so its start checkpoint is taken first.
    sent = await send(api, thread, "AGENT: WRITE: sub.txt from-sub")
    assert sent["userErrors"] == [], sent
    done = await _approve_until_done(api, thread, sent["run"]["id"])
    assert done["status"] == "COMPLETED", done
    assert (workspace / "sub.txt").read_text() == "from-sub"

    nodes = (await api.gql(GRAPH, {"r": done["id"]}))["run"]["executionGraph"]["nodes"]
    task = [n for n in nodes if n["kind"] == "SUBAGENT"]
    assert len(task) == 1 and task[0]["status"] == "COMPLETED", nodes
    pts = (await api.gql(PROVIDER_THREADS, {"t": thread}))["thread"]["providerThreads"]
    assert [pt["ownerNode"] for pt in pts] == [None]  # the Task has no provider thread of its own

    edges = (await api.gql(CHECKPOINTS, {"t": thread}))["thread"]["checkpoints"]["edges"]
    scope = sorted((e["node"] for e in edges if e["node"]["scope"]["kind"] == "SUBAGENT"), key=lambda c: c["ordinal"])
    assert [c["scope"]["node"]["id"] for c in scope] == [task[0]["id"]] * 2
    answer = (await api.gql(ROLLBACK_NODE, {"n": task[0]["id"], "c": scope[0]["id"]}))["rollbackNode"]
    assert answer["userErrors"] == [], answer
    assert answer["conversation"] == "NOT_SUPPORTED" and "parent's provider session" in answer["conversationReason"]
    assert not (workspace / "sub.txt").exists()  # the files went back all the same

    refused = (await api.gql(FORK, {"n": task[0]["id"]}))["forkThread"]
    assert [e["code"] for e in refused["userErrors"]] == ["INVALID_INPUT"], refused


def _turn(ref: str, ordinal: int) -> ProviderTurn:
    now = datetime.now(UTC)
    return ProviderTurn(
        id=uuid.uuid4(),
        thread_id=uuid.uuid4(),
        provider_thread_id=uuid.uuid4(),
        run_attempt_id=uuid.uuid4(),
        node_id=uuid.uuid4(),
        native_turn_ref=ref,
        ordinal=ordinal,
        status=ProviderTurnStatus.COMPLETED,
        created_at=now,
    )


async def test_a_codex_revert_is_read_back_and_reconciled_with_the_recorded_turns(codex: Codex) -> None:  # noqa: F811
    """The real Codex app-server's `thread/revert` answers with no turns (its schema: "hydrate retained history
    through thread/turns/list"), so what it holds is read back (`thread/read` with turns) and compared with the
    record: it agrees after a real revert, and a record that disagrees fails with ProviderError `reconcile`."""
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    first, _ = await s.turn(thread, "first ALPHA")
    second, _ = await s.turn(thread, "second BETA")
    caps = codex.driver.capabilities()
    await s.runtime.rollback_thread(thread, second)
    assert await node_rollback.read_back(s.runtime, caps, thread, [_turn(first, 1)], [_turn(second, 2)]) is True
    with pytest.raises(ProviderError) as lost:  # a record saying the second turn was kept
        await node_rollback.read_back(s.runtime, caps, thread, [_turn(first, 1), _turn(second, 2)], [])
    assert lost.value.code == "reconcile" and second in lost.value.message
    with pytest.raises(ProviderError) as held:  # a record saying the first turn was dropped too
        await node_rollback.read_back(s.runtime, caps, thread, [], [_turn(first, 1)])
    assert held.value.code == "reconcile" and first in held.value.message

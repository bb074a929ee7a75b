"""Codex collab agents as subagent nodes, through a real server with the real Codex CLI and the fake model.

`SPAWN: <task>` makes the model spawn a collab agent (`collaboration.spawn_agent`, then `wait_agent`) that works
on <task> in a native thread of its own; the parent then answers `child said: <answer>`. Asserted as an API user
sees it, as for the scripted `@subagent` and Claude's Task: a SUBAGENT node on the run's graph with the agent's
own items under it, owning a provider thread whose `nativeThreadRef` is the agent's Codex thread (the one its
model requests carry), its turn, its status, its own approval request (answered through the API; asked before
the write, so its start checkpoint is captured first); a fork of the node continues the agent's own
conversation; rollbackNode restores its files and says its conversation is
NOT_SUPPORTED (Codex refuses to revert an agent's thread); Stop while the agent runs stops both (the model sees
the agent's request cancelled); interruptNode ends the agent alone while its parent's run goes on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import cli_api
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import TERMINAL, finished, run, send
from tests.support.server import Client
from tests.support.waiting import until
from tests.test_restart_recovery_agents import Restartable

WAIT_S = 60.0
THREAD = """mutation($p: ID!, $m: String!) {
  createThread(input: {projectId: $p, providerInstanceId: "codex", title: "t", runtimeMode: $m}) {
    thread { id } userErrors { code message } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id kind node { parent { id } } } } }"""
APPROVE = """mutation($r: ID!) {
  respondToApproval(input: {requestId: $r, decision: ACCEPT}) { userErrors { code } } }"""
NODES = """query($r: ID!) { run(id: $r) { status executionGraph { nodes {
  id kind status title parent { id } detail } } } }"""
PROVIDER_THREADS = """query($t: ID!) { thread(id: $t) { providerThreads {
  id nativeThreadRef status ownerNode { id kind } turns(first: 10) { edges { node { nativeTurnRef status } } } } } }"""
CHECKPOINTS = """query($t: ID!) { thread(id: $t) { checkpoints(first: 50) { edges { node {
  id ordinal status scope { kind node { id } } } } } } }"""
ROLLBACK_NODE = """mutation($n: ID!, $c: ID!) { rollbackNode(input: {nodeId: $n, checkpointId: $c}) {
  conversation conversationReason userErrors { code message } } }"""
MESSAGES = """query($t: ID!) { thread(id: $t) { messages(first: 100) { edges { node { role text } } } } }"""
STOP = """mutation($t: ID!) { stopThread(input: {threadId: $t}) { userErrors { code } } }"""
FORK = """mutation($n: ID!) { forkThread(input: {source: {node: $n}, workspace: SHARED}) {
  thread { id } userErrors { code message } } }"""
INTERRUPT_NODE = """mutation($n: ID!) { interruptNode(input: {nodeId: $n}) {
  node { id } userErrors { code message } } }"""


@pytest.fixture
async def api(database_url: str, tmp_path: Path, fake: FakeModel) -> AsyncIterator[Client]:
    async with cli_api(database_url, tmp_path, fake) as client:
        yield client


async def _thread(api: Client, workspace: Path, mode: str = "workspace_write") -> str:
    workspace.mkdir()  # noqa: ASYNC240
    project = (await api.gql(CREATE_PROJECT, {"name": "collab", "root": str(workspace)}))["createProject"]
    made = (await api.gql(THREAD, {"p": project["project"]["id"], "m": mode}))["createThread"]
    assert made["userErrors"] == [], made
    return str(made["thread"]["id"])


async def _nodes(api: Client, run_id: str) -> list[dict[str, Any]]:
    return (await api.gql(NODES, {"r": run_id}))["run"]["executionGraph"]["nodes"]  # type: ignore[no-any-return]


async def _subagent(api: Client, run_id: str) -> dict[str, Any]:
    found = [n for n in await _nodes(api, run_id) if n["kind"] == "SUBAGENT"]
    assert len(found) == 1, found
    return found[0]


async def _owned(api: Client, thread: str) -> list[dict[str, Any]]:
    """The thread's provider threads owned by a node, each with its turns as a list."""
    pts = (await api.gql(PROVIDER_THREADS, {"t": thread}))["thread"]["providerThreads"]
    return [{**pt, "turns": [e["node"] for e in pt["turns"]["edges"]]} for pt in pts if pt["ownerNode"] is not None]


def _agent_requests(fake: FakeModel) -> list[dict[str, Any]]:
    """The model requests of spawned agents: their conversation ends with (or holds) their task."""
    return [b["client_metadata"] for b in fake.bodies("/v1/responses") if "NEW_TASK" in str(b["input"])]


async def _held_agent(api: Client, fake: FakeModel, thread: str, run_id: str) -> dict[str, Any]:
    """The running subagent node of a `SPAWN: HOLD` run, once the agent's model request is held."""

    async def check() -> dict[str, Any] | None:
        nodes = [n for n in await _nodes(api, run_id) if n["kind"] == "SUBAGENT" and n["status"] == "RUNNING"]
        return nodes[0] if nodes and _agent_requests(fake) and await _owned(api, thread) else None

    return await until(check, within=WAIT_S)


async def test_a_collab_agent_is_a_subagent_node_owning_its_codex_thread_and_the_parents_answer_follows(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    # The agent asks before it writes (approval_required): its start checkpoint is captured before anyone answers.
    thread = await _thread(api, workspace, "approval_required")
    sent = await send(api, thread, "SPAWN: WRITE: sub.txt from-the-agent")
    assert sent["userErrors"] == [], sent
    asked: list[dict[str, Any]] = []

    async def approved_until_done() -> dict[str, Any] | None:
        for request in (await api.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"]:
            asked.append(request)
            assert (await api.gql(APPROVE, {"r": request["id"]}))["respondToApproval"]["userErrors"] == []
        found = await run(api, sent["run"]["id"])
        return found if found["status"] in TERMINAL else None

    done = await until(approved_until_done, within=WAIT_S)
    assert done["status"] == "COMPLETED", done
    assert (workspace / "sub.txt").read_text().strip() == "from-the-agent"

    node = await _subagent(api, done["id"])
    assert (node["status"], node["title"]) == ("COMPLETED", "/root/helper")
    # The agent's own approval request was asked of the user, and answered, under its node.
    assert [(r["kind"], r["node"]["parent"]["id"]) for r in asked] == [("FILE_CHANGE_APPROVAL", node["id"])]
    # The agent's own items are its node's children: its approval request, the file it wrote and its answer.
    under = [n for n in await _nodes(api, done["id"]) if (n["parent"] or {}).get("id") == node["id"]]
    assert sorted(n["kind"] for n in under) == ["APPROVAL_REQUEST", "ASSISTANT_MESSAGE", "TOOL_CALL"], under
    [write] = [n for n in under if n["kind"] == "TOOL_CALL"]
    assert write["title"] == str(workspace / "sub.txt") and write["detail"]["changes"][0]["diff"] == "from-the-agent\n"
    assert all(n["status"] == "COMPLETED" for n in under)
    # The node owns a provider thread: the agent's Codex thread and turn, as its model requests carry them.
    [owned] = await _owned(api, thread)
    [agent] = {(m["thread_id"], m["turn_id"]) for m in _agent_requests(fake)}
    assert owned["ownerNode"] == {"id": node["id"], "kind": "SUBAGENT"} and owned["status"] == "IDLE"
    assert owned["nativeThreadRef"] == agent[0]
    assert owned["turns"] == [{"nativeTurnRef": agent[1], "status": "COMPLETED"}]
    assert node["detail"]["receiverThreadIds"] == [agent[0]]
    # The parent's answer, given once the agent's came back, follows in the thread.
    texts = [e["node"]["text"] for e in (await api.gql(MESSAGES, {"t": thread}))["thread"]["messages"]["edges"]]
    assert texts[-1].startswith("child said: ") and texts.index(texts[-1]) > 0

    # A fork of the completed node continues the agent's own conversation (Codex forks its thread natively).
    forked = (await api.gql(FORK, {"n": node["id"]}))["forkThread"]
    assert forked["userErrors"] == [], forked
    asked = await send(api, forked["thread"]["id"], "what did you do?")
    assert (await finished(api, asked["run"]["id"], within=WAIT_S))["status"] == "COMPLETED"
    fork_request = fake.bodies("/v1/responses")[-1]
    assert "WRITE: sub.txt from-the-agent" in str(fork_request["input"])  # the agent's task, its own history
    assert "SPAWN:" not in str(fork_request["input"])  # not the parent's conversation
    assert fork_request["client_metadata"]["thread_id"] != agent[0]  # a thread of its own

    # rollbackNode: its files go back to its start; its conversation cannot (Codex refuses to revert it).
    edges = (await api.gql(CHECKPOINTS, {"t": thread}))["thread"]["checkpoints"]["edges"]
    scope = sorted((e["node"] for e in edges if e["node"]["scope"]["kind"] == "SUBAGENT"), key=lambda c: c["ordinal"])
    assert [c["scope"]["node"]["id"] for c in scope] == [node["id"]] * 2
    back = (await api.gql(ROLLBACK_NODE, {"n": node["id"], "c": scope[0]["id"]}))["rollbackNode"]
    assert back["userErrors"] == [] and back["conversation"] == "NOT_SUPPORTED", back
    assert "cannot roll a conversation back" in back["conversationReason"]
    assert not (workspace / "sub.txt").exists()


async def test_stop_while_a_collab_agent_runs_interrupts_the_run_and_the_agent(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    thread = await _thread(api, tmp_path / "ws")
    sent = await send(api, thread, "SPAWN: HOLD")
    run_id = sent["run"]["id"]
    await _held_agent(api, fake, thread, run_id)

    assert (await api.gql(STOP, {"t": thread}))["stopThread"]["userErrors"] == []
    done = await finished(api, run_id, within=WAIT_S)
    assert done["status"] == "INTERRUPTED", done
    assert (await _subagent(api, run_id))["status"] == "INTERRUPTED"
    [owned] = await _owned(api, thread)
    assert [t["status"] for t in owned["turns"]] == ["INTERRUPTED"] and owned["status"] == "IDLE"
    # The CLI really cancelled the agent's held model request (Codex alone would have left the agent running).
    abandoned = fake.wait_abandoned("/v1/responses", 1, WAIT_S)
    assert any("NEW_TASK" in str(body["input"]) for body in abandoned)


async def test_interruptNode_ends_a_running_collab_agent_alone_and_its_parents_run_goes_on(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    thread = await _thread(api, tmp_path / "ws")
    sent = await send(api, thread, "SPAWN: HOLD")
    run_id = sent["run"]["id"]
    node = await _held_agent(api, fake, thread, run_id)

    answer = (await api.gql(INTERRUPT_NODE, {"n": node["id"]}))["interruptNode"]
    assert answer["userErrors"] == [], answer

    async def agent_ended() -> bool:
        return (await _subagent(api, run_id))["status"] == "INTERRUPTED"

    await until(agent_ended, within=WAIT_S)
    assert (await run(api, run_id))["status"] == "RUNNING"  # the parent still waits for its agent
    [owned] = await _owned(api, thread)
    assert [t["status"] for t in owned["turns"]] == ["INTERRUPTED"]
    again = (await api.gql(INTERRUPT_NODE, {"n": node["id"]}))["interruptNode"]
    assert [e["code"] for e in again["userErrors"]] == ["NOT_INTERRUPTIBLE"]

    assert (await api.gql(STOP, {"t": thread}))["stopThread"]["userErrors"] == []
    assert (await finished(api, run_id, within=WAIT_S))["status"] == "INTERRUPTED"


RESTART_RUN = """query($r: ID!) { run(id: $r) { status statusReason attempts { reason status statusReason }
  executionGraph { nodes { kind status } } } }"""


async def test_a_restart_while_a_collab_agent_runs_fails_the_run_and_ends_its_node(
    database_url: str, fake: FakeModel, tmp_path: Path
) -> None:
    """A turn that started a subagent made progress that cannot be replayed: after a kill -9 its run fails
    (`provider_lost`, no recovery attempt) and the agent's node ends with it instead of reading RUNNING."""
    restartable = Restartable(database_url, tmp_path, fake)
    client = restartable.client()
    try:
        thread = await _thread(client, tmp_path / "ws")
        sent = await send(client, thread, "SPAWN: HOLD")
        run_id = sent["run"]["id"]
        await _held_agent(client, fake, thread, run_id)
        restartable.crash_and_restart()
        await client.aclose()
        client = restartable.client()

        async def ended() -> dict[str, Any] | None:
            found = (await client.gql(RESTART_RUN, {"r": run_id}))["run"]
            return found if found["status"] in ("FAILED", "COMPLETED", "INTERRUPTED") else None

        found = await until(ended, within=WAIT_S)
        assert (found["status"], found["statusReason"]) == ("FAILED", "provider_lost"), found
        assert [a["reason"] for a in found["attempts"]] == ["INITIAL"]
        subagents = [n["status"] for n in found["executionGraph"]["nodes"] if n["kind"] == "SUBAGENT"]
        assert subagents == ["CANCELLED"], found  # as any child a failed run leaves open
        [owned] = await _owned(client, thread)
        # its own provider thread and turn end with the run, as they would have with their own end event
        assert (owned["status"], [t["status"] for t in owned["turns"]]) == ("IDLE", ["FAILED"]), owned
    finally:
        await client.aclose()
        restartable.server.stop()
        for proc in [*restartable.dead, restartable.server]:
            print(proc.report(40))

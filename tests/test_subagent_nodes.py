"""Subagents as first-class nodes, with the scripted agent against a real server, real git and a real agent process.

A `@subagent` spawns a native thread of its own (as a Codex collab agent does); its node owns that provider
thread. Asserted as an API user sees it: the provider thread and its turns, rollbackNode's files and
`conversation`, a fork of the completed node whose agent remembers the subagent's conversation (`@recall`), and
interruptNode on a running subagent held at a gate (`@subagent @await PATH`). Each mutation is also tried with a
token of another project (NOT_FOUND) next to its twin that succeeds.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client
from tests.support.waiting import until

APPROVE = """mutation($r: ID!) {
  respondToApproval(input: {requestId: $r, decision: ACCEPT}) { userErrors { code } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""
GRAPH = """query($r: ID!) { run(id: $r) { status executionGraph { nodes { id kind status title } } } }"""
PROVIDER_THREADS = """query($t: ID!) { thread(id: $t) { providerThreads {
  id nativeThreadRef status ownerNode { id kind } } } }"""
CHECKPOINTS = """query($t: ID!) { thread(id: $t) { checkpoints(first: 50) { edges { node {
  id ordinal status scope { kind node { id } } } } } } }"""
ROLLBACK_NODE = """mutation($n: ID!, $c: ID!) { rollbackNode(input: {nodeId: $n, checkpointId: $c}) {
  node { id } conversation conversationReason dirtiedParentWorkspace userErrors { code message } } }"""
FORK = """mutation($n: ID!) { forkThread(input: {source: {node: $n}, workspace: SHARED}) {
  thread { id } transfer { status } userErrors { code message } } }"""
INTERRUPT_NODE = """mutation($n: ID!) { interruptNode(input: {nodeId: $n}) {
  node { id } userErrors { code message } } }"""
ACTIVITIES = """query($t: ID!) { thread(id: $t) { activities(first: 100) { edges { node {
  kind payload node { id } } } } } }"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


async def _subagent_node(api: Client, run_id: str) -> dict[str, Any]:
    nodes = (await api.gql(GRAPH, {"r": run_id}))["run"]["executionGraph"]["nodes"]
    found = [n for n in nodes if n["kind"] == "SUBAGENT"]
    assert len(found) == 1, nodes
    node: dict[str, Any] = found[0]
    return node


async def _owned(api: Client, thread_id: str) -> list[dict[str, Any]]:
    pts = (await api.gql(PROVIDER_THREADS, {"t": thread_id}))["thread"]["providerThreads"]
    return [pt for pt in pts if pt["ownerNode"] is not None]


async def _stranger(api: Client, database_url: str, tmp_path: Path) -> Client:
    """A client holding an operate token of another project."""
    other_home = tmp_path / "other"
    other_home.mkdir()
    other = await api.gql(CREATE_PROJECT, {"name": "other", "root": str(other_home)})
    _, token = create_token(database_url, "operate", other["createProject"]["project"]["id"])
    return Client(api.base_url, token)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


async def test_rollbackNode_rolls_back_a_subagents_files_and_its_own_conversation(
    api: Client, home: Path, database_url: str, tmp_path: Path
) -> None:
    thread = await ScriptedThread.create(api, home)
    # The subagent asks before it writes: its start checkpoint is captured before anyone can answer.
    message = "@write parent.txt p\n@subagent @approval echo from-sub > sub.txt\n@reply back"
    sent = await send(api, thread.id, message)

    async def pending() -> str | None:
        found = (await api.gql(PENDING, {"t": thread.id}))["thread"]["pendingRequests"]
        return str(found[0]["id"]) if found else None

    assert (await api.gql(APPROVE, {"r": await until(pending)}))["respondToApproval"]["userErrors"] == []
    done = await finished(api, sent["run"]["id"])
    assert done["status"] == "COMPLETED"
    assert tree(home) == {"parent.txt": b"p", "sub.txt": b"from-sub\n"}
    node = await _subagent_node(api, done["id"])
    assert node["status"] == "COMPLETED"

    # The node owns a provider thread of its own; the thread's own provider thread has no owner.
    owned = await _owned(api, thread.id)
    assert [pt["ownerNode"] for pt in owned] == [{"id": node["id"], "kind": "SUBAGENT"}]
    assert owned[0]["nativeThreadRef"] and owned[0]["status"] == "IDLE"

    edges = (await api.gql(CHECKPOINTS, {"t": thread.id}))["thread"]["checkpoints"]["edges"]
    scope = sorted((e["node"] for e in edges if e["node"]["scope"]["kind"] == "SUBAGENT"), key=lambda c: c["ordinal"])
    start, end = scope

    # To its end checkpoint: files as it left them, nothing in its conversation is after that.
    stranger = await _stranger(api, database_url, tmp_path)
    try:
        refused = (await stranger.gql(ROLLBACK_NODE, {"n": node["id"], "c": end["id"]}))["rollbackNode"]
        assert [e["code"] for e in refused["userErrors"]] == ["NOT_FOUND"]
        refused_fork = (await stranger.gql(FORK, {"n": node["id"]}))["forkThread"]
        assert [e["code"] for e in refused_fork["userErrors"]] == ["NOT_FOUND"]
    finally:
        await stranger.aclose()
    kept = (await api.gql(ROLLBACK_NODE, {"n": node["id"], "c": end["id"]}))["rollbackNode"]  # the twin
    assert kept["userErrors"] == [] and kept["conversation"] == "UNCHANGED", kept

    # To its start checkpoint: its file is gone and the provider dropped its turn, as the agent's own
    # snapshot says (read back and reconciled: the payload would be ROLLBACK_FAILED otherwise).
    back = (await api.gql(ROLLBACK_NODE, {"n": node["id"], "c": start["id"]}))["rollbackNode"]
    assert back["userErrors"] == [] and back["conversation"] == "ROLLED_BACK", back
    assert "parent.txt" in tree(home) and "sub.txt" not in tree(home)
    done_activity = [
        a["node"]
        for a in (await api.gql(ACTIVITIES, {"t": thread.id}))["thread"]["activities"]["edges"]
        if a["node"]["kind"] == "rollback.completed"
    ][-1]
    assert done_activity["payload"]["conversation"] == "ROLLED_BACK"
    assert done_activity["payload"]["reconciled"] is True
    assert done_activity["payload"]["droppedTurns"] and done_activity["node"]["id"] == node["id"]

    # Nothing of it is left to fork: refused, typed.
    empty = (await api.gql(FORK, {"n": node["id"]}))["forkThread"]
    assert [e["code"] for e in empty["userErrors"]] == ["UNSTABLE_FORK_POINT"], empty
    # The parent's conversation is untouched: the agent still holds its one run.
    assert await thread.recall() == ["user: " + message.replace("\n", "\\n")]


async def test_a_completed_subagent_node_forks_with_the_subagents_own_conversation(api: Client, home: Path) -> None:
    thread = await ScriptedThread.create(api, home)
    done = await thread.run("@reply first\n@subagent look around\n@reply back")
    node = await _subagent_node(api, done["id"])
    forked = (await api.gql(FORK, {"n": node["id"]}))["forkThread"]
    assert forked["userErrors"] == [], forked
    fork = ScriptedThread(api, forked["thread"]["id"], home)
    # The fork's agent holds the subagent's conversation (its prompt), not the parent's message.
    assert await fork.recall() == ["user: look around"]
    edges = (await api.gql(FORK_TRANSFER, {"t": fork.id}))["thread"]["contextTransfers"]["edges"]
    into = [e["node"] for e in edges if e["node"]["type"] == "FORK" and e["node"]["targetThread"]["id"] == fork.id]
    assert [t["status"] for t in into] == ["RESOLVED_NATIVE"], into
    # The source's agent still holds its own conversation.
    assert await thread.recall() == ["user: @reply first\\n@subagent look around\\n@reply back"]


FORK_TRANSFER = """query($t: ID!) { thread(id: $t) { contextTransfers(first: 20) { edges { node {
  type status targetThread { id } } } } } }"""


async def test_interruptNode_ends_a_running_subagent_alone_and_its_parent_run_goes_on(
    api: Client, home: Path, database_url: str, tmp_path: Path
) -> None:
    thread = await ScriptedThread.create(api, home)
    sent = await send(api, thread.id, "@subagent @await gate\n@reply parent-after")
    assert sent["userErrors"] == [], sent
    run_id = sent["run"]["id"]

    async def running_subagent() -> dict[str, Any] | None:
        nodes = (await api.gql(GRAPH, {"r": run_id}))["run"]["executionGraph"]["nodes"]
        found = [n for n in nodes if n["kind"] == "SUBAGENT" and n["status"] == "RUNNING"]
        return found[0] if found and await _owned(api, thread.id) else None

    node = await until(running_subagent)  # held at its gate, which nobody opens
    stranger = await _stranger(api, database_url, tmp_path)
    try:
        refused = (await stranger.gql(INTERRUPT_NODE, {"n": node["id"]}))["interruptNode"]
        assert [e["code"] for e in refused["userErrors"]] == ["NOT_FOUND"]
    finally:
        await stranger.aclose()
    assert (await _subagent_node(api, run_id))["status"] == "RUNNING"  # the refusal changed nothing
    answer = (await api.gql(INTERRUPT_NODE, {"n": node["id"]}))["interruptNode"]  # the twin
    assert answer["userErrors"] == [] and answer["node"]["id"] == node["id"], answer

    run = await finished(api, run_id)
    assert run["status"] == "COMPLETED"  # the parent's turn went on past the subagent
    assert (await _subagent_node(api, run_id))["status"] == "INTERRUPTED"
    assert not (home / "gate").exists()
    messages = (await api.gql(REPLIES, {"t": thread.id}))["thread"]["messages"]["edges"]
    assert "parent-after" in [m["node"]["text"] for m in messages]
    # Its own provider thread recorded the turn as interrupted, and it is idle now.
    owned = await _owned(api, thread.id)
    assert [pt["status"] for pt in owned] == ["IDLE"]
    again = (await api.gql(INTERRUPT_NODE, {"n": node["id"]}))["interruptNode"]
    assert [e["code"] for e in again["userErrors"]] == ["NOT_INTERRUPTIBLE"]


REPLIES = """query($t: ID!) { thread(id: $t) { messages(first: 100) { edges { node { role text } } } } }"""

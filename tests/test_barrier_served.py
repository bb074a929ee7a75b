"""A delegated task outliving its parent's run, on a real server with the scripted agent: the parent's run ends
while the task is held at a gate (`@await PATH`), its subagent node still reads RUNNING, then ends as the child
did (COMPLETED, or FAILED); the result wakes the idle parent (a run whose attempt reason is WAKE) and reaches its
agent as the turn's context, which `@recall` shows; a result that arrives while the parent runs goes with its
next turn and wakes nothing; a Stop drops the wake. Everything is read through GraphQL, the node's history
through the `threadEvents` subscription."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.runs import finished, run, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

DELEGATE = """mutation($t: ID!, $text: String!, $title: String) {
  delegateTask(input: {threadId: $t, text: $text, title: $title}) {
    thread { id runs(first: 1) { edges { node { id } } } } userErrors { code } } }"""
THREAD = """query($t: ID!) { thread(id: $t) { status queueHeld
  runs(first: 10) { edges { node { id ordinal status userMessage { role text }
    attempts { reason } } } }
  activities(last: 100) { edges { node { kind runId payload } } }
  transfers(type: SUBAGENT_RESULT) { status sourcePoint targetRun { id }
    handoff { status text targetRun { id } } } } }"""
EVENTS = """subscription($t: ID!) { threadEvents(threadId: $t, afterSequence: 0) {
  sequence type entity { __typename ... on ExecutionNode { id nodeStatus: status } ... on Run { id runStatus: status } }
} }"""
TITLE = "count the files"


async def _parent(client: Client, tmp_path: Path) -> tuple[str, Path]:
    root = workspace(tmp_path)
    data = await client.gql(CREATE_PROJECT, {"name": "tree", "root": root})
    return str((await make_thread(client, data["createProject"]["project"]["id"], "parent"))["id"]), Path(root)


async def _delegate(client: Client, parent: str, text: str) -> tuple[str, str]:
    """The child thread and its first run (the task)."""
    data = (await client.gql(DELEGATE, {"t": parent, "text": text, "title": TITLE}))["delegateTask"]
    assert data["userErrors"] == []
    return data["thread"]["id"], data["thread"]["runs"]["edges"][0]["node"]["id"]


async def _status_is(client: Client, run_id: str, status: str) -> None:
    async def check() -> bool:
        found: dict[str, Any] = await run(client, run_id)
        return bool(found["status"] == status)

    await until(check)


async def _thread(client: Client, thread_id: str) -> dict[str, Any]:
    return (await client.gql(THREAD, {"t": thread_id}))["thread"]  # type: ignore[no-any-return]


def _task_node(parent_run: dict[str, Any]) -> dict[str, Any]:
    nodes: list[dict[str, Any]] = [n for n in parent_run["rootNode"]["children"] if n["kind"] == "SUBAGENT"]
    assert len(nodes) == 1, nodes
    return nodes[0]


async def _delivered(client: Client, parent: str) -> dict[str, Any]:
    """The parent once the task's result has arrived."""

    async def check() -> dict[str, Any] | None:
        found = await _thread(client, parent)
        return found if [t for t in found["transfers"] if t["status"] == "RESOLVED_PORTABLE"] else None

    return await until(check)


async def _node_history(server: ServerProcess, client: Client, parent: str, node_id: str) -> list[tuple[str, str]]:
    """What a subscriber of the parent's events saw, replayed from the start until the task's node ended:
    each run's and that node's statuses, in log order."""
    ws = await WsClient.connect(server.url, client.token)
    seen: list[tuple[str, str]] = []
    try:
        op = await ws.subscribe(EVENTS, {"t": parent})
        while True:
            message = await ws.receive()
            assert message["id"] == op and message["type"] == "next", message
            entity = message["payload"]["data"]["threadEvents"]["entity"] or {}
            if entity.get("__typename") == "Run":
                seen.append((f"run:{entity['id']}", entity["runStatus"]))
            elif entity.get("id") == node_id:
                seen.append(("node", entity["nodeStatus"]))
                if entity["nodeStatus"] not in ("PENDING", "RUNNING", "WAITING"):
                    return seen
    finally:
        await ws.close()


async def _recall(client: Client, thread_id: str, root: Path) -> list[str]:
    """The conversation the parent's agent holds, as `@recall` reports it (one entry per line), asked in a
    run of its own (left out)."""
    lines: list[str] = await ScriptedThread(client, thread_id, root).recall()
    return lines


async def _outlived(
    client: Client, server: ServerProcess, tmp_path: Path, child_text: str
) -> tuple[str, dict[str, Any], str, Path]:
    """A parent whose run 1 delegates a task held at the gate `child-go`, then ends while the task still
    runs: the parent, its finished run 1, the child's run, the workspace (where gates open)."""
    parent, root = await _parent(client, tmp_path)
    first = await send(client, parent, "@await parent-go\n@reply parent done")
    await _status_is(client, first["run"]["id"], "RUNNING")
    _, child_run = await _delegate(client, parent, f"@await child-go\n{child_text}")
    await _status_is(client, child_run, "RUNNING")
    (root / "parent-go").touch()
    ended = await finished(client, first["run"]["id"])
    assert ended["status"] == "COMPLETED"  # the parent's run ends although its task still runs …
    assert _task_node(ended)["status"] == "RUNNING"  # … and the task's node says so
    assert (await run(client, child_run))["status"] == "RUNNING"
    state = await _thread(client, parent)
    assert state["status"] == "IDLE"
    assert [(t["status"], t["sourcePoint"]) for t in state["transfers"]] == [
        ("PENDING", {"task": TITLE, "wake": "owed"})
    ]
    return parent, ended, child_run, root


async def test_a_task_outlives_its_parents_run_then_wakes_it_with_its_result(
    client: Client, server: ServerProcess, tmp_path: Path
) -> None:
    parent, first, child_run, root = await _outlived(client, server, tmp_path, "@reply there are 42 files")
    node_id = _task_node(first)["id"]
    (root / "child-go").touch()
    assert (await finished(client, child_run))["status"] == "COMPLETED"
    # A subscriber replaying the parent's log saw run 1 complete while the node ran, then the node complete.
    history = await _node_history(server, client, parent, node_id)
    assert history.index(("node", "RUNNING")) < history.index((f"run:{first['id']}", "COMPLETED"))
    assert history.index((f"run:{first['id']}", "COMPLETED")) < history.index(("node", "COMPLETED"))
    assert _task_node(await run(client, first["id"]))["status"] == "COMPLETED"

    # The idle parent was woken: run 2, Threadloom's, with the result as the context of its turn.
    state = await _delivered(client, parent)
    (transfer,) = state["transfers"]
    woken = transfer["targetRun"]["id"]
    assert transfer["sourcePoint"]["wake"] == "woke" and transfer["sourcePoint"]["answer"] == "there are 42 files"
    done = await finished(client, woken)
    assert done["status"] == "COMPLETED" and done["ordinal"] == 2
    assert [a["reason"] for a in done["attempts"]] == ["WAKE"]
    state = await _thread(client, parent)
    (second,) = [r["node"] for r in state["runs"]["edges"] if r["node"]["id"] == woken]
    assert second["userMessage"] == {
        "role": "SYSTEM",
        "text": f"Delegated task {TITLE!r} ended (completed); its result is in the context of this turn.",
    }
    assert [a["node"]["runId"] for a in state["activities"]["edges"] if a["node"]["kind"] == "run.woken"] == [woken]
    handoff = state["transfers"][0]["handoff"]
    assert handoff["status"] == "DELIVERED" and handoff["targetRun"] == {"id": woken}
    assert "    there are 42 files" in handoff["text"].splitlines()

    # The agent got the result as context with that turn, not in the message.
    recall = await _recall(client, parent, root)
    given = [i for i, line in enumerate(recall) if line.startswith("handoff: # Threadloom handoff: subagent_result")]
    assert len(given) == 1 and "there are 42 files" in recall[given[0]]
    assert recall[given[0] + 1] == f"user: {second['userMessage']['text']}"
    assert not [line for line in recall if line.startswith("user:") and "42 files" in line]


async def test_a_failing_task_ends_its_node_failed_after_its_parents_run(
    client: Client, server: ServerProcess, tmp_path: Path
) -> None:
    parent, first, child_run, root = await _outlived(client, server, tmp_path, "@fail the disk is gone")
    (root / "child-go").touch()
    assert (await finished(client, child_run))["status"] == "FAILED"
    history = await _node_history(server, client, parent, _task_node(first)["id"])
    assert history[-1] == ("node", "FAILED")
    assert ("node", "COMPLETED") not in history  # never closed as completed by the parent's barrier
    state = await _delivered(client, parent)
    (transfer,) = state["transfers"]
    assert transfer["sourcePoint"]["status"] == "failed" and transfer["sourcePoint"]["wake"] == "woke"
    done = await finished(client, transfer["targetRun"]["id"])
    assert [a["reason"] for a in done["attempts"]] == ["WAKE"] and done["status"] == "COMPLETED"
    assert "ended (failed)" in done["userMessage"]["text"]
    lines = transfer["handoff"]["text"].splitlines()
    assert f"## Task {TITLE!r} · run 1 · failed" in lines and "    (no result)" in lines
    assert [line for line in lines if line.startswith("Why: ") and "the disk is gone" in line]


async def test_a_result_that_comes_while_the_parent_runs_goes_with_its_next_turn(
    client: Client, tmp_path: Path
) -> None:
    parent, root = await _parent(client, tmp_path)
    first = await send(client, parent, "@await parent-go\n@reply parent done")
    await _status_is(client, first["run"]["id"], "RUNNING")
    _, child_run = await _delegate(client, parent, "@reply seven")
    assert (await finished(client, child_run))["status"] == "COMPLETED"
    state = await _delivered(client, parent)
    (transfer,) = state["transfers"]
    assert transfer["sourcePoint"]["wake"] == "busy" and transfer["targetRun"] is None
    assert transfer["handoff"]["status"] == "PENDING"  # the running turn started without it
    assert _task_node(await run(client, first["run"]["id"]))["status"] == "COMPLETED"  # while run 1 still runs
    (root / "parent-go").touch()
    assert (await finished(client, first["run"]["id"]))["status"] == "COMPLETED"
    # Delivered before run 1 ended, the result decided its wake then: no run was started for it.
    assert [r["node"]["ordinal"] for r in (await _thread(client, parent))["runs"]["edges"]] == [1]
    recall = await _recall(client, parent, root)  # the next turn, the user's, carries it
    assert recall[-1].startswith("handoff: # Threadloom handoff: subagent_result") and "seven" in recall[-1]
    assert recall[:-1] == ["user: @await parent-go\\n@reply parent done"]
    handoff = (await _thread(client, parent))["transfers"][0]["handoff"]
    assert handoff["status"] == "DELIVERED" and handoff["targetRun"] is not None


async def test_a_stop_drops_the_wake_a_task_still_owes(client: Client, server: ServerProcess, tmp_path: Path) -> None:
    parent, first, child_run, _ = await _outlived(client, server, tmp_path, "@reply never read")
    stopped = await client.gql(
        "mutation($t: ID!) { stopThread(input: {threadId: $t}) { thread { queueHeld } userErrors { code } } }",
        {"t": parent},
    )
    assert stopped["stopThread"] == {"thread": {"queueHeld": True}, "userErrors": []}
    assert (await finished(client, child_run))["status"] == "INTERRUPTED"  # the Stop reached the task
    state = await _delivered(client, parent)
    (transfer,) = state["transfers"]
    assert transfer["sourcePoint"]["wake"] == "dropped" and transfer["targetRun"] is None
    assert _task_node(await run(client, first["id"]))["status"] == "INTERRUPTED"
    resumed = await client.gql(
        "mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { userErrors { code } } }", {"t": parent}
    )
    assert resumed["resumeQueue"]["userErrors"] == []
    # The result was delivered (and its wake decided) before the queue was resumed: nothing restarted it.
    state = await _thread(client, parent)
    assert state["status"] == "IDLE" and [r["node"]["ordinal"] for r in state["runs"]["edges"]] == [1]

"""Dispatch rules a user meets when a run is active, through a real server and the real scripted agent:
auto falls back to the queue when the provider can neither steer nor restart, `NOT_STEERABLE`,
`THREAD_BUSY`, and a subagent's todo list nested under its node.

The active run is held open by an approval it waits for (`@approval`), so no test depends on a run
still streaming when the next request arrives; answering the approval lets it finish.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.graphql import CREATE_PROJECT, workspace
from tests.support.runs import finished, send
from tests.support.server import Client
from tests.support.waiting import until

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

# An instance that can neither steer a live turn nor interrupt it (so it cannot restart one either).
PROVIDERS = """
[instances.rigid]
driver = "scripted"
supports_active_steering = false
supports_interrupt = false
"""
CREATE_THREAD = """mutation($p: ID!, $i: String) { createThread(input: {projectId: $p, providerInstanceId: $i}) {
  thread { id } userErrors { code } } }"""
THREAD = """query($t: ID!) { thread(id: $t) {
  status archivedAt queueHeld
  activeRun { id status activeAttempt { id attemptOrdinal } }
  queue { id ordinal status queuePosition }
  runs(first: 50) { totalCount edges { node { id ordinal status attempts { attemptOrdinal } } } }
  messages(first: 100) { totalCount edges { node { role text run { id } } } }
  pendingRequests { id kind }
  todoList { id }
} }"""
APPROVE = """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) {
  userErrors { code } } }"""
HOLD = "@approval true\n@reply held run done"  # active (WAITING) until the approval is answered


async def _thread(client: Client, tmp_path: Path, instance: str | None = None) -> str:
    data = await client.gql(CREATE_PROJECT, {"name": "rules", "root": workspace(tmp_path)})
    created = await client.gql(CREATE_THREAD, {"p": data["createProject"]["project"]["id"], "i": instance})
    assert created["createThread"]["userErrors"] == []
    return str(created["createThread"]["thread"]["id"])


async def _state(client: Client, thread: str) -> dict[str, Any]:
    return (await client.gql(THREAD, {"t": thread}))["thread"]  # type: ignore[no-any-return]


async def _held_open(client: Client, thread: str) -> tuple[str, dict[str, Any]]:
    """Start a run that waits for an approval; returns its id and the thread as it is then."""
    sent = await send(client, thread, HOLD)
    assert sent["userErrors"] == [] and sent["appliedDispatch"] == "START_IMMEDIATELY"

    async def waiting() -> dict[str, Any] | None:
        state = await _state(client, thread)
        return state if state["pendingRequests"] else None

    state = await until(waiting)
    assert state["status"] == "WAITING" and state["activeRun"]["id"] == sent["run"]["id"]
    return str(sent["run"]["id"]), state


async def _release(client: Client, state: dict[str, Any]) -> None:
    answer = await client.gql(APPROVE, {"r": state["pendingRequests"][0]["id"]})
    assert answer["respondToApproval"]["userErrors"] == []


def _unchanged(before: dict[str, Any], after: dict[str, Any]) -> None:
    """A refused request left the thread as it was: same runs, same messages, same queue."""
    for key in ("runs", "messages", "queue", "activeRun", "archivedAt", "queueHeld"):
        assert after[key] == before[key], key


async def test_rigid_provider_advertises_no_steering(client: Client) -> None:
    data = await client.gql(
        """{ providerInstances { id driver capabilities {
             supportsActiveSteering supportsInterrupt supportsSteeringByInterruptRestart } } }"""
    )
    rigid = next(i for i in data["providerInstances"] if i["id"] == "rigid")
    assert rigid["driver"] == "scripted"
    assert rigid["capabilities"] == {
        "supportsActiveSteering": False,
        "supportsInterrupt": False,
        "supportsSteeringByInterruptRestart": False,
    }


async def test_auto_falls_back_to_queue(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "rigid")
    active, state = await _held_open(client, thread)
    queued = await send(client, thread, "@reply from the queue")  # no dispatch: auto
    assert queued["userErrors"] == []
    assert queued["appliedDispatch"] == "QUEUE_AFTER_ACTIVE"
    assert queued["run"]["id"] != active  # a new run, not a steer or restart of the active one
    assert queued["run"]["ordinal"] == 2 and queued["run"]["status"] == "QUEUED"
    assert queued["run"]["queuePosition"] == 1
    waiting = await _state(client, thread)
    assert [r["id"] for r in waiting["queue"]] == [queued["run"]["id"]]
    assert waiting["activeRun"] == state["activeRun"]  # same run, same attempt: nothing was interrupted
    await _release(client, state)
    first = await finished(client, active)
    assert first["status"] == "COMPLETED" and len(first["attempts"]) == 1
    second = await finished(client, queued["run"]["id"])  # the queue drained by itself
    assert second["status"] == "COMPLETED"
    done = await _state(client, thread)
    messages = [e["node"] for e in done["messages"]["edges"]]
    replies = [(m["run"]["id"], m["text"]) for m in messages if m["role"] == "ASSISTANT"]
    assert (queued["run"]["id"], "from the queue") in replies
    assert done["queue"] == [] and done["activeRun"] is None


@pytest.mark.parametrize("mode", ["steerActive", "restartActive"])
async def test_steer_or_restart_refused_as_not_steerable_changes_nothing(
    client: Client, tmp_path: Path, mode: str
) -> None:
    thread = await _thread(client, tmp_path, "rigid")
    active, state = await _held_open(client, thread)
    before = await _state(client, thread)
    refused = await send(client, thread, "@reply change course", d={mode: {"targetRunId": active}})
    assert refused["run"] is None and refused["message"] is None and refused["appliedDispatch"] is None
    assert [(e["code"], e["field"]) for e in refused["userErrors"]] == [("NOT_STEERABLE", "dispatch")]
    _unchanged(before, await _state(client, thread))  # no message kept, no run, no new attempt
    await _release(client, state)
    assert (await finished(client, active))["status"] == "COMPLETED"


async def test_promote_to_steer_not_steerable(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "rigid")
    active, state = await _held_open(client, thread)
    queued = await send(client, thread, "@reply promoted", d={"queueAfterActive": True})
    assert queued["appliedDispatch"] == "QUEUE_AFTER_ACTIVE"
    before = await _state(client, thread)
    promoted = await client.gql(
        "mutation($r: ID!) { promoteQueuedRunToSteer(input: {runId: $r}) { run { id } userErrors { code field } } }",
        {"r": queued["run"]["id"]},
    )
    assert promoted["promoteQueuedRunToSteer"] == {
        "run": None,
        "userErrors": [{"code": "NOT_STEERABLE", "field": "runId"}],
    }
    _unchanged(before, await _state(client, thread))  # the queued run is still queued, still first
    await _release(client, state)
    assert (await finished(client, active))["status"] == "COMPLETED"
    assert (await finished(client, queued["run"]["id"]))["status"] == "COMPLETED"


async def test_start_immediately_while_busy(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path)  # the default instance can steer: THREAD_BUSY is about dispatch
    active, state = await _held_open(client, thread)
    before = await _state(client, thread)
    refused = await send(client, thread, "@reply now", d={"startImmediately": True})
    assert refused["run"] is None and refused["appliedDispatch"] is None
    assert [(e["code"], e["field"]) for e in refused["userErrors"]] == [("THREAD_BUSY", "dispatch")]
    _unchanged(before, await _state(client, thread))
    archived = await client.gql(
        "mutation($t: ID!) { archiveThread(input: {threadId: $t}) { userErrors { code field } } }", {"t": thread}
    )
    assert archived["archiveThread"]["userErrors"] == [{"code": "THREAD_BUSY", "field": "threadId"}]
    _unchanged(before, await _state(client, thread))
    await _release(client, state)
    assert (await finished(client, active))["status"] == "COMPLETED"
    now = await send(client, thread, "@reply now", d={"startImmediately": True})  # idle again: it starts
    assert now["userErrors"] == [] and now["appliedDispatch"] == "START_IMMEDIATELY"
    assert (await finished(client, now["run"]["id"]))["status"] == "COMPLETED"


async def test_subagent_todo_list_nests_under_its_node(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path)
    sent = await send(client, thread, "@subagent @todo scan; patch; verify\n@reply parent done")
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "COMPLETED"
    [subagent] = [n for n in done["rootNode"]["children"] if n["kind"] == "SUBAGENT"]
    assert subagent["status"] == "COMPLETED"
    plans = await client.gql(
        """query($r: ID!) { run(id: $r) { plans { kind status items
             node { id kind parent { id kind } run { id } } } } }""",
        {"r": sent["run"]["id"]},
    )
    [todo] = [p for p in plans["run"]["plans"] if p["kind"] == "TODO_LIST"]
    assert todo["node"]["id"] == subagent["id"] and todo["node"]["kind"] == "SUBAGENT"
    assert todo["node"]["parent"] == {"id": done["rootNode"]["id"], "kind": "ROOT_TURN"}
    assert todo["node"]["run"] == {"id": sent["run"]["id"]}
    assert todo["status"] == "FINALIZED"
    assert todo["items"] == [
        {"step": "scan", "status": "completed"},
        {"step": "patch", "status": "completed"},
        {"step": "verify", "status": "completed"},
    ]
    # The thread's plan view is the root turn's todo list: a subagent's list is not the thread's plan.
    assert (await _state(client, thread))["todoList"] is None

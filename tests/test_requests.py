"""Approvals, questions and todo lists through the real scripted agent."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import pytest

from tests.support.graphql import CREATE_PROJECT, make_thread
from tests.support.graphql import workspace as workspace_dir
from tests.support.runs import finished, run, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from threadloom.api.ids import decode

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)
# An agent that pauses 60 s between steps: a todo list it shows stays as shown for longer than any test waits;
# and one that cannot ask structured questions.
PROVIDERS = """
[instances.paced]
driver = "scripted"
chunk_delay_ms = 60000

[instances.plain]
driver = "scripted"
supports_structured_questions = false
"""
PENDING = """query($t: ID!) { thread(id: $t) { status pendingRequests {
  id kind status responseCapability notResumableReason payload node { id kind status } run { id status } } } }"""
APPROVE = """mutation($r: ID!, $d: Decision!) { respondToApproval(input: {requestId: $r, decision: $d}) {
  request { id status response node { status } } userErrors { code field } } }"""
ANSWER = """mutation($r: ID!, $a: [QuestionAnswer!]!) { respondToUserInput(input: {requestId: $r, answers: $a}) {
  request { id status response } userErrors { code field message } } }"""
REQUEST = """query($r: ID!) { node(id: $r) { ... on RuntimeRequest { status responseCapability notResumableReason
  node { status } } } }"""


@pytest.fixture
async def thread_id(client: Client, workspace: Path) -> str:
    data = await client.gql(CREATE_PROJECT, {"name": "ask", "root": str(workspace)})
    return str((await make_thread(client, data["createProject"]["project"]["id"], "t"))["id"])


@pytest.fixture
async def activity_ids(client: Client, thread_id: str) -> Any:
    """After the scenario: every request, plan, tool and subagent activity names its run and node."""
    yield
    acts = await _activities(client, thread_id)
    scenario = [a for a in acts if a["kind"].split(".")[0] in ("approval", "question", "plan", "tool", "subagent")]
    assert scenario, "the scenario produced no activity to check"
    assert all(a["runId"] and a["nodeId"] for a in scenario), scenario


async def _pending(client: Client, thread: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        found = (await client.gql(PENDING, {"t": thread}))["thread"]
        return found if found["pendingRequests"] else None

    return await until(check)


async def _activities(client: Client, thread: str) -> list[dict[str, Any]]:
    data = await client.gql(
        "query($t: ID!) { thread(id: $t) { activities(last: 100) { edges { node { kind runId nodeId } } } } }",
        {"t": thread},
    )
    return [e["node"] for e in data["thread"]["activities"]["edges"]]


@pytest.mark.usefixtures("activity_ids")
async def test_an_accepted_approval_runs_its_command_and_the_run_completes(
    client: Client, thread_id: str, workspace: Path
) -> None:
    sent = await send(client, thread_id, "@approval echo approved > ok.txt\n@reply done")
    state = await _pending(client, thread_id)
    assert state["status"] == "WAITING"
    request = state["pendingRequests"][0]
    assert request["kind"] == "COMMAND_APPROVAL" and request["status"] == "PENDING"
    assert request["responseCapability"] == "LIVE" and request["payload"]["command"] == "echo approved > ok.txt"
    assert request["node"]["kind"] == "APPROVAL_REQUEST" and request["node"]["status"] == "WAITING"
    assert request["run"] == {"id": sent["run"]["id"], "status": "WAITING"}
    answer = (await client.gql(APPROVE, {"r": request["id"], "d": "ACCEPT"}))["respondToApproval"]
    assert answer["userErrors"] == []
    assert answer["request"]["status"] == "RESOLVED" and answer["request"]["node"]["status"] == "COMPLETED"
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    assert (workspace / "ok.txt").read_text() == "approved\n"
    acts = [a for a in await _activities(client, thread_id) if a["kind"].startswith("approval.")]
    assert [a["kind"] for a in acts] == ["approval.requested", "approval.resolved"]
    assert all(a["runId"] == sent["run"]["id"] and a["nodeId"] == request["node"]["id"] for a in acts)


@pytest.mark.usefixtures("activity_ids")
async def test_approval_decline_and_double_response(client: Client, thread_id: str, workspace: Path) -> None:
    sent = await send(client, thread_id, "@approval echo no > no.txt\n@reply went on")
    request = (await _pending(client, thread_id))["pendingRequests"][0]
    first = (await client.gql(APPROVE, {"r": request["id"], "d": "DECLINE"}))["respondToApproval"]
    again = (await client.gql(APPROVE, {"r": request["id"], "d": "DECLINE"}))["respondToApproval"]
    assert first == again  # the same answer twice is answered the same (and sent once)
    assert first["request"]["node"]["status"] == "CANCELLED"
    other = (await client.gql(APPROVE, {"r": request["id"], "d": "ACCEPT"}))["respondToApproval"]
    assert other["userErrors"] == [{"code": "REQUEST_NOT_PENDING", "field": "requestId"}]
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    assert not (workspace / "no.txt").exists()


@pytest.mark.usefixtures("activity_ids")
async def test_approval_after_agent_crash_is_not_resumable(
    client: Client, server: ServerProcess, thread_id: str, data_dir: Path
) -> None:
    sent = await send(client, thread_id, "@approval echo x\n@reply done")
    request = (await _pending(client, thread_id))["pendingRequests"][0]
    project = await client.gql("query($t: ID!) { thread(id: $t) { project { id } } }", {"t": thread_id})
    found = decode(project["thread"]["project"]["id"])
    assert found is not None
    agents = [p for p in os.listdir("/proc") if p.isdigit() and _is_agent(p, data_dir, str(found[1]))]
    assert len(agents) == 1
    os.kill(int(agents[0]), signal.SIGKILL)
    assert (await finished(client, sent["run"]["id"]))["statusReason"] == "provider_crashed"
    expired = (await client.gql(REQUEST, {"r": request["id"]}))["node"]
    assert expired["status"] == "EXPIRED" and expired["responseCapability"] == "NOT_RESUMABLE"
    assert "agent process exited" in expired["notResumableReason"]
    refused = (await client.gql(APPROVE, {"r": request["id"], "d": "ACCEPT"}))["respondToApproval"]
    assert refused["userErrors"] == [{"code": "NOT_RESUMABLE", "field": "requestId"}]
    assert (await client.gql(REQUEST, {"r": request["id"]}))["node"]["status"] == "EXPIRED"  # nothing changed


def _is_agent(pid: str, data_dir: Path, project: str) -> bool:
    """Whether `pid` is the agent of this project (its state folder is named by the project) of the server
    whose data dir is `data_dir`: the module's other tests' agents run on the same server."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    if Path(cmdline[0].decode()).name == "unshare":  # the agent's PID namespace holder names it too
        return False
    return b"threadloom.agent" in cmdline and any(
        str(data_dir).encode() in part and project.encode() in part for part in cmdline
    )


@pytest.mark.own_server  # it kills its server and starts another on the database
async def test_approval_after_server_restart_is_reconciled(
    client: Client, server: ServerProcess, thread_id: str, database_url: str, data_dir: Path
) -> None:
    """Nothing ran yet (the command waits for the approval), so the run is recovered on a new attempt
    (docs/lifecycles/resumption-and-recovery.md): the old request expires, not resumable, and the new attempt
    asks again."""
    sent = await send(client, thread_id, "@approval echo x\n@reply done")
    request = (await _pending(client, thread_id))["pendingRequests"][0]
    server.kill()
    again = ServerProcess(database_url, data_dir).wait_ready()
    try:
        other = Client(again.url, client.token)

        async def asked_again() -> dict[str, Any] | None:
            found = (await other.gql(PENDING, {"t": thread_id}))["thread"]["pendingRequests"]
            return found[0] if found and found[0]["id"] != request["id"] else None

        second = await until(asked_again, within=45)
        expired = (await other.gql(REQUEST, {"r": request["id"]}))["node"]
        assert expired["status"] == "EXPIRED" and expired["responseCapability"] == "NOT_RESUMABLE"
        assert "server that held the turn is gone" in expired["notResumableReason"]
        refused = (await other.gql(APPROVE, {"r": request["id"], "d": "ACCEPT"}))["respondToApproval"]
        assert refused["userErrors"] == [{"code": "NOT_RESUMABLE", "field": "requestId"}]
        accepted = (await other.gql(APPROVE, {"r": second["id"], "d": "ACCEPT"}))["respondToApproval"]
        assert accepted["userErrors"] == []
        done = await finished(other, sent["run"]["id"])
        assert done["status"] == "COMPLETED"
        assert [a["reason"] for a in done["attempts"]] == ["INITIAL", "PROVIDER_RECOVERY"]
        await other.aclose()
    finally:
        again.stop()


@pytest.mark.usefixtures("activity_ids")
async def test_question_answer_and_bad_answers(client: Client, thread_id: str) -> None:
    sent = await send(client, thread_id, "@ask Which color? | red | blue")
    request = (await _pending(client, thread_id))["pendingRequests"][0]
    assert request["kind"] == "USER_INPUT" and request["node"]["kind"] == "USER_INPUT_REQUEST"
    assert request["payload"]["questions"][0]["question"] == "Which color?"
    plans = (await run(client, sent["run"]["id"]))["plans"]
    assert [p["kind"] for p in plans] == ["QUESTIONS"]
    for answers, message in (
        ([{"questionId": "q9", "answers": ["red"]}], "no question"),
        ([], "needs an answer"),
        ([{"questionId": "q1", "answers": ["green"]}], "not an option"),
    ):
        bad = (await client.gql(ANSWER, {"r": request["id"], "a": answers}))["respondToUserInput"]
        assert bad["userErrors"][0]["code"] == "INVALID_INPUT" and message in bad["userErrors"][0]["message"]
    assert (await _pending(client, thread_id))["pendingRequests"][0]["status"] == "PENDING"  # nothing changed
    good = await client.gql(ANSWER, {"r": request["id"], "a": [{"questionId": "q1", "answers": ["blue"]}]})
    assert good["respondToUserInput"]["request"]["status"] == "RESOLVED"
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    texts = await client.gql(
        "query($t: ID!) { thread(id: $t) { messages(last: 1) { edges { node { text } } } } }", {"t": thread_id}
    )
    assert texts["thread"]["messages"]["edges"][0]["node"]["text"] == "Answer: blue"


@pytest.mark.usefixtures("activity_ids")
async def test_todo_progress_is_finalized_at_the_barrier(client: Client, thread_id: str, workspace: Path) -> None:
    done = await finished(client, (await send(client, thread_id, "@todo write; test; ship"))["run"]["id"])
    todo = next(p for p in done["plans"] if p["kind"] == "TODO_LIST")
    assert todo["status"] == "FINALIZED"
    assert [i["status"] for i in todo["items"]] == ["completed", "completed", "completed"]
    # On the paced agent the list is shown at once and its first step would start 60 s later: interrupted
    # while every step is open, however slow the machine.
    paced = await client.gql(CREATE_PROJECT, {"name": "paced", "root": workspace_dir(workspace.parent, "paced")})
    on_paced = await client.gql(
        """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "paced"}) {
             thread { id } userErrors { code } } }""",
        {"p": paced["createProject"]["project"]["id"]},
    )
    stopped = await send(client, on_paced["createThread"]["thread"]["id"], "@todo one; two; three")

    async def shown() -> list[str] | None:
        plans = (await run(client, stopped["run"]["id"]))["plans"]
        return next(([i["status"] for i in p["items"]] for p in plans if p["kind"] == "TODO_LIST"), None)

    assert await until(shown) == ["pending", "pending", "pending"]  # open when the interrupt is asked for
    interrupted = await client.gql(
        "mutation($r: ID!) { interruptRun(input: {runId: $r}) { userErrors { code } } }", {"r": stopped["run"]["id"]}
    )
    assert interrupted["interruptRun"]["userErrors"] == []
    ended = await finished(client, stopped["run"]["id"])
    assert ended["status"] == "INTERRUPTED"
    todo = next(p for p in ended["plans"] if p["kind"] == "TODO_LIST")
    assert todo["status"] == "FINALIZED"
    assert [i["status"] for i in todo["items"]] == ["interrupted"] * 3  # open items end as the run ended


IMPLEMENT = """mutation($p: ID!, $t: PlanTarget!) { implementPlan(input: {planId: $p, target: $t}) {
  plan { status } thread { id lineage { relationship } } run { id ordinal } userErrors { code field } } }"""


async def test_proposed_plan_implement_both_targets(client: Client, thread_id: str) -> None:
    done = await finished(client, (await send(client, thread_id, "@plan Step one then step two"))["run"]["id"])
    plan = next(p for p in done["plans"] if p["kind"] == "PROPOSED_PLAN")
    plan_id = (await client.gql("query($r: ID!) { run(id: $r) { plans { id kind text } } }", {"r": done["id"]}))["run"][
        "plans"
    ][0]
    assert plan["status"] == "FINALIZED" and plan_id["text"] == "Step one then step two"
    as_run = (await client.gql(IMPLEMENT, {"p": plan_id["id"], "t": "NEW_RUN"}))["implementPlan"]
    assert as_run["userErrors"] == [] and as_run["plan"]["status"] == "IMPLEMENTED"
    assert as_run["thread"]["id"] == thread_id and as_run["run"]["ordinal"] == 2
    implemented = await finished(client, as_run["run"]["id"])
    assert implemented["userMessage"]["text"].endswith("Step one then step two")
    again = (await client.gql(IMPLEMENT, {"p": plan_id["id"], "t": "NEW_RUN"}))["implementPlan"]
    assert again["userErrors"] == [{"code": "PLAN_ALREADY_IMPLEMENTED", "field": "planId"}]
    second = await finished(client, (await send(client, thread_id, "@plan Another plan"))["run"]["id"])
    other = await client.gql("query($r: ID!) { run(id: $r) { plans { id } } }", {"r": second["id"]})
    as_thread = (await client.gql(IMPLEMENT, {"p": other["run"]["plans"][0]["id"], "t": "NEW_THREAD"}))["implementPlan"]
    assert as_thread["userErrors"] == [] and as_thread["thread"]["id"] != thread_id
    assert as_thread["run"]["ordinal"] == 1
    assert (await finished(client, as_thread["run"]["id"]))["status"] == "COMPLETED"


async def test_root_todo_list_drives_the_thread_plan_view(client: Client, thread_id: str) -> None:
    await finished(client, (await send(client, thread_id, "@todo alpha; beta"))["run"]["id"])
    view = await client.gql("query($t: ID!) { thread(id: $t) { todoList { kind items status } } }", {"t": thread_id})
    assert view["thread"]["todoList"]["kind"] == "TODO_LIST"
    assert [i["step"] for i in view["thread"]["todoList"]["items"]] == ["alpha", "beta"]


@pytest.mark.usefixtures("activity_ids")
async def test_approval_from_a_subagent_is_actionable(client: Client, thread_id: str, workspace: Path) -> None:
    sent = await send(client, thread_id, "@subagent @approval echo from-child > child.txt\n@reply parent done")
    request = (await _pending(client, thread_id))["pendingRequests"][0]
    graph = (await run(client, sent["run"]["id"]))["executionGraph"]
    parents = {n["id"]: n["parent"] for n in graph["nodes"]}
    kinds = {n["id"]: n["kind"] for n in graph["nodes"]}
    assert kinds[parents[request["node"]["id"]]["id"]] == "SUBAGENT"  # asked by the child turn, nested under it
    answer = (await client.gql(APPROVE, {"r": request["id"], "d": "ACCEPT"}))["respondToApproval"]
    assert answer["userErrors"] == []
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "COMPLETED"
    assert (workspace / "child.txt").read_text() == "from-child\n"


async def test_provider_without_structured_questions(client: Client, tmp_path: Path) -> None:
    data = await client.gql(CREATE_PROJECT, {"name": "plain", "root": workspace_dir(tmp_path)})
    created = await client.gql(
        """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "plain"}) {
             thread { id } } }""",
        {"p": data["createProject"]["project"]["id"]},
    )
    thread = created["createThread"]["thread"]["id"]
    done = await finished(client, (await send(client, thread, "@ask Which one? | left | right"))["run"]["id"])
    assert done["status"] == "COMPLETED"
    messages = await client.gql(
        """query($t: ID!) { thread(id: $t) {
             pendingRequests { id } messages(first: 10) { edges { node { role text } } } } }""",
        {"t": thread},
    )
    assert messages["thread"]["pendingRequests"] == []
    edges = messages["thread"]["messages"]["edges"]
    texts = [m["node"]["text"] for m in edges if m["node"]["role"] == "ASSISTANT"]
    assert texts[0] == "Which one?\n- left\n- right"  # a plain message, nothing to answer


async def test_request_activities_carry_run_and_node(client: Client, thread_id: str) -> None:
    sent = await send(client, thread_id, "@todo a; b\n@ask Sure? | yes | no")
    request = (await _pending(client, thread_id))["pendingRequests"][0]
    await client.gql(ANSWER, {"r": request["id"], "a": [{"questionId": "q1", "answers": ["yes"]}]})
    await finished(client, sent["run"]["id"])
    acts = await _activities(client, thread_id)
    scenario = [a for a in acts if a["kind"].split(".")[0] in ("approval", "question", "plan", "tool", "subagent")]
    assert {a["kind"] for a in scenario} >= {"question.asked", "question.answered", "plan.updated"}
    assert all(a["runId"] == sent["run"]["id"] and a["nodeId"] for a in scenario)


async def test_implementing_a_plan_on_an_archived_thread_changes_nothing(client: Client, thread_id: str) -> None:
    done = await finished(client, (await send(client, thread_id, "@plan Keep it simple"))["run"]["id"])
    plans = await client.gql("query($r: ID!) { run(id: $r) { plans { id } } }", {"r": done["id"]})
    plan_id = plans["run"]["plans"][0]["id"]
    archived = await client.gql(
        "mutation($t: ID!) { archiveThread(input: {threadId: $t}) { userErrors { code } } }", {"t": thread_id}
    )
    assert archived["archiveThread"]["userErrors"] == []
    refused = (await client.gql(IMPLEMENT, {"p": plan_id, "t": "NEW_RUN"}))["implementPlan"]
    assert refused["userErrors"] == [{"code": "THREAD_ARCHIVED", "field": "threadId"}]
    plan = await client.gql("query($p: ID!) { node(id: $p) { ... on PlanArtifact { status } } }", {"p": plan_id})
    assert plan["node"]["status"] == "FINALIZED"  # still to implement: the refused send left no half-done work
    runs = await client.gql("query($t: ID!) { thread(id: $t) { runs(first: 5) { totalCount } } }", {"t": thread_id})
    assert runs["thread"]["runs"]["totalCount"] == 1

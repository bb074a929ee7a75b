"""Budgets through a real server and the scripted agent (docs/usage.md, "Budgets"): `@usage` calls cross a
budget, and STOP stops the run with its delegated tasks (queue held BUDGET_EXCEEDED, `budget.exceeded`
written), ASK asks a person first; the check before a turn; the refusal of a USD budget nobody can price;
another project's token; a restart that must not count a call twice.

One server for the module (the restart test starts its own): instance `priced` prices model `m1`,
`tokens_only` reports no cost and has no price table.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT, workspace
from tests.support.pg import PgServer
from tests.support.runs import finished, run, send
from tests.support.server import Client, ServerProcess, providers_env
from tests.support.waiting import until
from threadloom.api import ids as gid
from threadloom.store import budgets as budget_store
from threadloom.store.db import Database

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)
PROVIDERS = """
[instances.priced]
driver = "scripted"
[instances.priced.prices.m1]
input = 1.0
output = 2.0

[instances.tokens_only]
driver = "scripted"
reports_cost = false
"""

THREAD = """mutation($p: ID!, $i: String!, $m: String) {
  createThread(input: {projectId: $p, providerInstanceId: $i, model: $m}) { thread { id } userErrors { code } } }"""
SET = """mutation($in: SetBudgetInput!) { setBudget(input: $in) {
  budget { id window action maxCostUsd maxTokens clearedAt thread { id } project { id } }
  userErrors { code message field } } }"""
CLEAR = """mutation($b: ID!) { clearBudget(input: {budgetId: $b}) { budget { id clearedAt }
  userErrors { code field } } }"""
STATE = """query($t: ID!) { thread(id: $t) { id queueHeld queueHoldReason activeRun { id }
  budgets { id window exceeded spent { calls costUsd inputTokens outputTokens } }
  pendingRequests { id kind status payload }
  activities(first: 100) { edges { node { kind summary payload runId } } } } }"""
REQUESTS = """query($r: ID!) { run(id: $r) { id status statusReason runtimeRequests { id kind status response payload }
  attempts { providerTurns { id } } } }"""
RESPOND = """mutation($r: ID!, $d: Decision!) { respondToApproval(input: {requestId: $r, decision: $d}) {
  request { id status } userErrors { code message } } }"""
DELEGATE = """mutation($t: ID!, $text: String!) { delegateTask(input: {threadId: $t, text: $text}) {
  thread { id runs(first: 1) { edges { node { id } } } } userErrors { code } } }"""
RESUME = "mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { userErrors { code } } }"
NODE = "query($id: ID!) { node(id: $id) { id ... on Budget { window } } }"
PROJECT_BUDGETS = "query($p: ID!) { project(id: $p) { budgets { id window } } }"


async def _project(client: Client, root: Path, name: str) -> tuple[str, Path]:
    folder = workspace(root, name)
    data = await client.gql(CREATE_PROJECT, {"name": name, "root": folder})
    assert data["createProject"]["userErrors"] == [], data
    return str(data["createProject"]["project"]["id"]), Path(folder)


async def _thread(client: Client, project: str, instance: str = "priced", model: str | None = "m1") -> str:
    data = await client.gql(THREAD, {"p": project, "i": instance, "m": model})
    assert data["createThread"]["userErrors"] == [], data
    return str(data["createThread"]["thread"]["id"])


async def _set(client: Client, token: str | None = None, **fields: Any) -> dict[str, Any]:
    data = await client.gql(SET, {"in": fields}, **({"token": token} if token else {}))
    return data["setBudget"]  # type: ignore[no-any-return]


async def _delegate(client: Client, parent: str, text: str) -> tuple[str, str]:
    data = (await client.gql(DELEGATE, {"t": parent, "text": text}))["delegateTask"]
    assert data["userErrors"] == [], data
    return data["thread"]["id"], data["thread"]["runs"]["edges"][0]["node"]["id"]


async def _status(client: Client, run_id: str, status: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        found = await run(client, run_id)
        return found if found["status"] == status else None

    return await until(check)


async def _state(client: Client, thread: str) -> dict[str, Any]:
    return (await client.gql(STATE, {"t": thread}))["thread"]  # type: ignore[no-any-return]


def _kinds(state: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["node"] for e in state["activities"]["edges"] if e["node"]["kind"] == kind]


async def _pending_budget_request(client: Client, thread: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        pending = (await _state(client, thread))["pendingRequests"]
        return next((r for r in pending if r["kind"] == "BUDGET"), None)

    return await until(check)


async def test_stop_budget_crossed_in_a_root_run_stops_it_and_two_levels_of_tasks_and_holds_the_queues(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project, folder = await _project(client, tmp_path_factory.mktemp("stop"), "stop")
    parent = await _thread(client, project)
    made = await _set(client, threadId=parent, maxCostUsd=1.0, window="TOTAL", action="STOP")
    assert made["userErrors"] == [] and made["budget"]["maxCostUsd"] == 1.0, made
    top = await send(client, parent, "@await go-top\n@usage 100 100 5.0\n@await never-top\n@reply never")
    child, child_run = await _delegate(client, parent, "@await never-child\n@reply never")
    grandchild, grandchild_run = await _delegate(client, child, "@await never-grandchild\n@reply never")
    runs = [top["run"]["id"], child_run, grandchild_run]
    for run_id in runs:
        await _status(client, run_id, "RUNNING")
    queued = await send(client, parent, "@reply after the budget", d={"queueAfterActive": True})
    assert queued["run"]["status"] == "QUEUED"
    (folder / "go-top").touch()  # the root run makes its $5 call: past the $1 budget
    for run_id in runs:
        assert (await finished(client, run_id))["status"] == "INTERRUPTED"
    for thread in (parent, child, grandchild):
        state = await _state(client, thread)
        assert (state["queueHeld"], state["queueHoldReason"], state["activeRun"]) == (True, "BUDGET_EXCEEDED", None)
    state = await _state(client, parent)
    [note] = _kinds(state, "budget.exceeded")
    assert note["runId"] == top["run"]["id"]
    assert note["payload"]["budgetId"] == made["budget"]["id"]
    assert (note["payload"]["spentCostUsd"], note["payload"]["maxCostUsd"]) == (5.0, 1.0)
    assert "$5 of $1" in note["summary"]
    [shown] = state["budgets"]
    assert (shown["id"], shown["window"], shown["exceeded"]) == (made["budget"]["id"], "TOTAL", True)
    assert shown["spent"]["costUsd"] >= 5.0  # the $5 call (and what the interrupted tasks' turns reported)
    assert (await run(client, queued["run"]["id"]))["status"] == "QUEUED"  # held: nothing starts by itself


async def test_a_turn_past_a_stop_budget_never_reaches_the_agent(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project, _ = await _project(client, tmp_path_factory.mktemp("gate"), "gate")
    thread = await _thread(client, project)
    assert (await _set(client, threadId=thread, maxTokens=100, window="DAY", action="STOP"))["userErrors"] == []
    first = await send(client, thread, "@usage 100 50\n@reply spent")
    assert (await finished(client, first["run"]["id"]))["status"] in ("COMPLETED", "INTERRUPTED")
    await until(lambda: _held(client, thread))
    assert (await client.gql(RESUME, {"t": thread}))["resumeQueue"]["userErrors"] == []
    second = await send(client, thread, "@reply must not run")
    done = await finished(client, second["run"]["id"])
    assert (done["status"], done["statusReason"]) == ("INTERRUPTED", "interrupted before the provider started")
    checked = (await client.gql(REQUESTS, {"r": second["run"]["id"]}))["run"]
    assert checked["attempts"][0]["providerTurns"] == []  # the agent never got it
    state = await _state(client, thread)
    assert state["queueHoldReason"] == "BUDGET_EXCEEDED"
    assert [n["runId"] for n in _kinds(state, "budget.exceeded")][-1] == second["run"]["id"]


async def _held(client: Client, thread: str) -> bool:
    state = await _state(client, thread)
    return bool(state["queueHeld"] and state["activeRun"] is None)


async def test_ask_budget_approved_lets_the_run_go_on_past_it_asking_once(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project, folder = await _project(client, tmp_path_factory.mktemp("ask-yes"), "ask-yes")
    thread = await _thread(client, project)
    made = await _set(client, threadId=thread, maxTokens=100, window="RUN", action="ASK")
    sent = await send(client, thread, "@usage 100 50\n@await go-yes\n@usage 10 10\n@reply done")
    request = await _pending_budget_request(client, thread)
    assert request["payload"]["budgetId"] == made["budget"]["id"]
    assert (request["payload"]["spentTokens"], request["payload"]["maxTokens"]) == (150, 100)
    assert (await run(client, sent["run"]["id"]))["status"] == "WAITING"
    answered = (await client.gql(RESPOND, {"r": request["id"], "d": "ACCEPT"}))["respondToApproval"]
    assert answered == {"request": {"id": request["id"], "status": "RESOLVED"}, "userErrors": []}
    assert (await run(client, sent["run"]["id"]))["status"] == "RUNNING"
    (folder / "go-yes").touch()  # a second call past the budget: approved for this run, not asked again
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    requests = (await client.gql(REQUESTS, {"r": sent["run"]["id"]}))["run"]["runtimeRequests"]
    assert [(r["kind"], r["status"], r["response"]) for r in requests] == [
        ("BUDGET", "RESOLVED", {"decision": "accept"})
    ]
    state = await _state(client, thread)
    assert state["queueHeld"] is False


async def test_ask_budget_declined_stops_the_run_as_stop_would(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project, _ = await _project(client, tmp_path_factory.mktemp("ask-no"), "ask-no")
    thread = await _thread(client, project)
    assert (await _set(client, projectId=project, maxCostUsd=0.5, window="MONTH", action="ASK"))["userErrors"] == []
    sent = await send(client, thread, "@usage 10 10 0.75\n@await never-no\n@reply never")
    request = await _pending_budget_request(client, thread)
    queued = await send(client, thread, "@reply later", d={"queueAfterActive": True})
    answered = (await client.gql(RESPOND, {"r": request["id"], "d": "DECLINE"}))["respondToApproval"]
    assert answered["userErrors"] == []
    assert (await finished(client, sent["run"]["id"]))["status"] == "INTERRUPTED"
    state = await _state(client, thread)
    assert (state["queueHeld"], state["queueHoldReason"]) == (True, "BUDGET_EXCEEDED")
    assert (await run(client, queued["run"]["id"]))["status"] == "QUEUED"
    assert len(_kinds(state, "budget.exceeded")) == 2  # asked, then stopped


async def test_ask_before_a_turn_holds_it_until_approved(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project, _ = await _project(client, tmp_path_factory.mktemp("ask-gate"), "ask-gate")
    thread = await _thread(client, project)
    first = await send(client, thread, "@usage 300 0\n@reply spent")
    assert (await finished(client, first["run"]["id"]))["status"] == "COMPLETED"
    assert (await _set(client, threadId=thread, maxTokens=100, window="TOTAL", action="ASK"))["userErrors"] == []
    second = await send(client, thread, "@reply after the answer")
    request = await _pending_budget_request(client, thread)
    held = (await client.gql(REQUESTS, {"r": second["run"]["id"]}))["run"]
    assert held["status"] == "PREPARING" and held["attempts"][0]["providerTurns"] == []  # not sent
    await client.gql(RESPOND, {"r": request["id"], "d": "ACCEPT"})
    assert (await finished(client, second["run"]["id"]))["status"] == "COMPLETED"


async def test_a_usd_budget_nobody_can_price_is_refused_and_changes_nothing(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project, _ = await _project(client, tmp_path_factory.mktemp("unknown"), "unknown")
    bare = await _thread(client, project, "tokens_only", None)
    for scope in ({"threadId": bare}, {"projectId": project}):
        refused = await _set(client, **scope, maxCostUsd=1.0, window="DAY", action="STOP")
        assert refused["budget"] is None
        assert [(e["code"], e["field"]) for e in refused["userErrors"]] == [("BUDGET_COST_UNKNOWN", "maxCostUsd")]
        assert "tokens_only" in refused["userErrors"][0]["message"]
    assert (await _state(client, bare))["budgets"] == []
    assert (await client.gql(PROJECT_BUDGETS, {"p": project}))["project"]["budgets"] == []
    tokens = await _set(client, threadId=bare, maxTokens=1000, window="DAY", action="STOP")  # tokens are known
    assert tokens["userErrors"] == [] and tokens["budget"]["maxTokens"] == 1000
    priced = await _thread(client, project)  # `priced` has a price for m1
    assert (await _set(client, threadId=priced, maxCostUsd=1.0, window="DAY", action="STOP"))["userErrors"] == []
    for bad, field in (({}, "maxCostUsd"), ({"maxTokens": 0}, "maxTokens"), ({"maxCostUsd": -1.0}, "maxCostUsd")):
        wrong = await _set(client, threadId=priced, window="TOTAL", action="STOP", **bad)
        assert [(e["code"], e["field"]) for e in wrong["userErrors"]] == [("INVALID_INPUT", field)], bad
    both = await _set(client, threadId=priced, projectId=project, maxTokens=5, window="TOTAL", action="STOP")
    assert [e["code"] for e in both["userErrors"]] == ["INVALID_INPUT"]


async def test_setting_a_budget_again_changes_it_and_clearing_stops_checking_it(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project, _ = await _project(client, tmp_path_factory.mktemp("again"), "again")
    thread = await _thread(client, project)
    first = (await _set(client, threadId=thread, maxTokens=10, window="TOTAL", action="STOP"))["budget"]
    second = (await _set(client, threadId=thread, maxTokens=20, window="TOTAL", action="ASK"))["budget"]
    assert second["id"] == first["id"] and (second["maxTokens"], second["action"]) == (20, "ASK")
    cleared = (await client.gql(CLEAR, {"b": first["id"]}))["clearBudget"]
    assert cleared["userErrors"] == [] and cleared["budget"]["clearedAt"] is not None
    assert (await _state(client, thread))["budgets"] == []
    sent = await send(client, thread, "@usage 500 500\n@reply fine")
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    assert (await _state(client, thread))["queueHeld"] is False


async def test_the_checks_read_budgets_only_in_a_project_that_has_one(
    client: Client, server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """The check before each turn and after each model call first asks whether the thread's project has any
    budget (one statement, store.budgets.any_active): a thread budget counts for the whole project (its tasks'
    spending counts against it), another project's never, a cleared one no more."""
    root = tmp_path_factory.mktemp("any")
    project, _ = await _project(client, root, "any")
    other, _ = await _project(client, root, "any-other")
    thread, sibling = await _thread(client, project), await _thread(client, project)
    elsewhere = await _thread(client, other)
    db = Database.from_url(server.database_url, pool_size=1)

    async def has_any(thread_id: str) -> bool:
        async with db.statements() as reader:
            return await budget_store.any_active(reader, gid.decode_as(thread_id, "Thread", "threadId"))

    try:
        assert [await has_any(t) for t in (thread, sibling, elsewhere)] == [False, False, False]
        budget = (await _set(client, threadId=sibling, maxTokens=10, window="TOTAL", action="STOP"))["budget"]
        assert [await has_any(t) for t in (thread, sibling, elsewhere)] == [True, True, False]
        assert (await client.gql(CLEAR, {"b": budget["id"]}))["clearBudget"]["userErrors"] == []
        assert [await has_any(t) for t in (thread, sibling, elsewhere)] == [False, False, False]
        assert (await _set(client, projectId=other, maxTokens=10, window="DAY", action="ASK"))["userErrors"] == []
        assert [await has_any(t) for t in (thread, sibling, elsewhere)] == [False, False, True]
    finally:
        await db.dispose()


async def test_another_projects_token_can_neither_see_nor_set_budgets(
    client: Client, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("fence")
    mine, _ = await _project(client, root, "mine")
    theirs, _ = await _project(client, root, "theirs")
    thread = await _thread(client, mine)
    budget = (await _set(client, projectId=mine, maxTokens=1000, window="DAY", action="STOP"))["budget"]
    _, outsider = create_token(database_url, "admin", theirs)
    _, admin = create_token(database_url, "admin", mine)
    _, operator = create_token(database_url, "operate", mine)
    # The other project's admin: nothing to see, nothing to set or clear.
    assert (await client.gql(NODE, {"id": budget["id"]}, token=outsider))["node"] is None
    for scope in ({"threadId": thread}, {"projectId": mine}):
        refused = await _set(client, outsider, **scope, maxTokens=5, window="TOTAL", action="STOP")
        assert [e["code"] for e in refused["userErrors"]] == ["NOT_FOUND"], scope
    cleared = (await client.gql(CLEAR, {"b": budget["id"]}, token=outsider))["clearBudget"]
    assert [e["code"] for e in cleared["userErrors"]] == ["NOT_FOUND"]
    # The twin: this project's own tokens. An operator sets a thread's budget, not the project's.
    assert (await client.gql(NODE, {"id": budget["id"]}, token=admin))["node"] == {"id": budget["id"], "window": "DAY"}
    on_thread = await _set(client, operator, threadId=thread, maxTokens=5, window="TOTAL", action="STOP")
    assert on_thread["userErrors"] == [] and on_thread["budget"]["thread"]["id"] == thread
    forbidden = await _set(client, operator, projectId=mine, maxTokens=5, window="TOTAL", action="STOP")
    assert [e["code"] for e in forbidden["userErrors"]] == ["FORBIDDEN"]
    allowed = await _set(client, admin, projectId=mine, maxTokens=5, window="TOTAL", action="STOP")
    assert allowed["userErrors"] == []
    assert (await client.gql(CLEAR, {"b": budget["id"]}, token=admin))["clearBudget"]["userErrors"] == []
    listed = (await client.gql(PROJECT_BUDGETS, {"p": mine}, token=admin))["project"]["budgets"]
    assert [b["window"] for b in listed] == ["TOTAL"]


async def test_a_restart_mid_run_counts_each_call_once_against_the_budget(pg: PgServer, tmp_path: Path) -> None:
    """The server is killed (-9) while a run that made a $0.60 call holds at a gate; after the restart the
    budget has spent that call once: $0.35 more stays under the $1 budget, $0.10 after that crosses it."""
    database_url = await pg.fresh()
    (tmp_path / "data").mkdir()
    env = providers_env(tmp_path, PROVIDERS)
    first = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
    second: ServerProcess | None = None
    assert first.admin_token is not None
    client = Client(first.url, first.admin_token)
    try:
        project, _ = await _project(client, tmp_path, "restart")
        thread = await _thread(client, project)
        budget = (await _set(client, threadId=thread, maxCostUsd=1.0, window="TOTAL", action="STOP"))["budget"]
        # A command before the gate: the lost turn did something, so recovery fails the run rather than
        # running its script (and its call) again.
        sent = await send(client, thread, "@usage 10 10 0.6\n@tool true\n@await gate-restart\n@reply never")

        async def ran() -> bool:
            state = await _state(client, thread)
            return bool(_kinds(state, "tool.completed")) and state["budgets"][0]["spent"]["calls"] == 1

        await until(ran)
        first.kill()
        second = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
        await client.aclose()
        client = Client(second.url, first.admin_token)
        assert (await finished(client, sent["run"]["id"]))["status"] == "FAILED"
        state = await _state(client, thread)
        [shown] = state["budgets"]
        assert (shown["id"], shown["spent"]["calls"], shown["spent"]["costUsd"], shown["exceeded"]) == (
            budget["id"],
            1,
            0.6,
            False,
        )
        assert _kinds(state, "budget.exceeded") == []
        assert (await client.gql(RESUME, {"t": thread}))["resumeQueue"]["userErrors"] == []  # held by the failure
        under = await send(client, thread, "@usage 10 10 0.35\n@reply under")
        assert (await finished(client, under["run"]["id"]))["status"] == "COMPLETED"
        assert (await _state(client, thread))["queueHeld"] is False  # $0.95: not past $1
        over = await send(client, thread, "@usage 10 10 0.1\n@reply over")
        await finished(client, over["run"]["id"])
        await until(lambda: _held(client, thread))
        state = await _state(client, thread)
        assert state["queueHoldReason"] == "BUDGET_EXCEEDED"
        [note] = _kinds(state, "budget.exceeded")
        assert note["payload"]["spentCostUsd"] == pytest.approx(1.05)
    finally:
        await client.aclose()
        for server in (first, second):
            if server is not None:
                server.stop()
                print(server.report(40))

"""Every enum argument and every enum field of an input, given inline and given through a variable, gets
the same answer from a real server.

Strawberry hands an enum given through a variable to our code as its plain value ("fork", "overwrite"),
and given inline as the member; a resolver that did `.value` on it, or compared it with a member, answered
an internal error or ignored the choice for one of the two forms. The fields, found from the schema
(`test_the_enum_arguments_covered_here_are_all_the_schema_has` fails when one is added without a case
here): `Thread.contextTransfers(type:)`, `Thread.transfers(type:)`, `ForkThreadInput.workspace`,
`RollbackToRunInput.onConflict`, `RespondToApprovalInput.decision`, `ImplementPlanInput.target`,
`CreateTokenInput.scope`, `Query.usage(groupBy:)`, `SetBudgetInput.window` and `.action`, the webhook
endpoints' `events` and `Query.webhookDeliveries(status:)`; `CreateThreadInput.mode` and
`SetRuntimeModeInput.mode` in both forms are in tests/test_runtime_mode_input.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from graphql import GraphQLEnumType, GraphQLInputObjectType, GraphQLObjectType, get_named_type

from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client
from tests.support.waiting import until
from threadloom.api.schema import build_schema

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

COVERED = {
    "Thread.contextTransfers(type)",
    "Thread.transfers(type)",
    "ForkThreadInput.workspace",
    "RollbackToRunInput.onConflict",
    "RespondToApprovalInput.decision",
    "ImplementPlanInput.target",
    "CreateTokenInput.scope",
    "CreateThreadInput.mode",  # both forms: tests/test_runtime_mode_input.py
    "SetRuntimeModeInput.mode",  # both forms: tests/test_runtime_mode_input.py
    "Query.usage(groupBy)",
    "SetBudgetInput.window",
    "SetBudgetInput.action",
    "CreateWebhookEndpointInput.events",
    "UpdateWebhookEndpointInput.events",
    "Query.webhookDeliveries(status)",
}

FORK_BY = """mutation($run: ID!, $key: String) {
  forkThread(input: {source: {run: $run}, clientMutationId: $key}) { thread { id } userErrors { code } } }"""
TRANSFERS_INLINE = """query($t: ID!) { thread(id: $t) {
  contextTransfers(first: 10, type: FORK) { totalCount nodes { id type } }
  transfers(type: FORK) { id type } } }"""
TRANSFERS_VARIABLE = """query($t: ID!, $type: TransferType) { thread(id: $t) {
  contextTransfers(first: 10, type: $type) { totalCount nodes { id type } }
  transfers(type: $type) { id type } } }"""


def _folder(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


async def _forked_thread(api: Client, tmp_path: Path) -> tuple[ScriptedThread, str]:
    """A thread with one run and one fork of it: one FORK transfer out of the source thread."""
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    run = await source.run("@reply alpha")
    forked = (await api.gql(FORK_BY, {"run": run["id"]}))["forkThread"]
    assert forked["userErrors"] == [], forked
    return source, forked["thread"]["id"]


async def test_the_transfer_type_filter_answers_the_same_inline_and_through_a_variable(
    api: Client, tmp_path: Path
) -> None:
    source, _ = await _forked_thread(api, tmp_path)
    inline = (await api.gql(TRANSFERS_INLINE, {"t": source.id}))["thread"]
    assert inline["contextTransfers"]["totalCount"] == 1
    assert [n["type"] for n in inline["contextTransfers"]["nodes"]] == ["FORK"]
    assert inline["transfers"] == inline["contextTransfers"]["nodes"]
    through_variable = (await api.gql(TRANSFERS_VARIABLE, {"t": source.id, "type": "FORK"}))["thread"]
    assert through_variable == inline
    # Another type filters the fork out, in both forms.
    none_inline = await api.gql(
        "query($t: ID!) { thread(id: $t) { contextTransfers(first: 10, type: MERGE_BACK) { totalCount } "
        "transfers(type: MERGE_BACK) { id } } }",
        {"t": source.id},
    )
    none_variable = await api.gql(TRANSFERS_VARIABLE, {"t": source.id, "type": "MERGE_BACK"})
    assert none_inline["thread"] == {"contextTransfers": {"totalCount": 0}, "transfers": []}
    assert none_variable["thread"]["contextTransfers"]["totalCount"] == 0
    assert none_variable["thread"]["transfers"] == []


def test_the_enum_arguments_covered_here_are_all_the_schema_has() -> None:
    schema = build_schema()._schema
    found: set[str] = set()
    for name, named in schema.type_map.items():
        if name.startswith("__"):
            continue
        if isinstance(named, GraphQLObjectType):
            for field_name, field in named.fields.items():
                found |= {
                    f"{name}.{field_name}({arg_name})"
                    for arg_name, arg in field.args.items()
                    if isinstance(get_named_type(arg.type), GraphQLEnumType)
                }
        if isinstance(named, GraphQLInputObjectType):
            found |= {
                f"{name}.{field_name}"
                for field_name, field in named.fields.items()
                if isinstance(get_named_type(field.type), GraphQLEnumType)
            }
    assert found == COVERED


FORK_WITH = """mutation($run: ID!) {{ forkThread(input: {{source: {{run: $run}}, workspace: {workspace}}}) {{
  thread {{ workspacePath }} userErrors {{ code }} }} }}"""
FORK_WORKSPACE_VARIABLE = """mutation($run: ID!, $w: ForkWorkspace!) {
  forkThread(input: {source: {run: $run}, workspace: $w}) { thread { workspacePath } userErrors { code } } }"""


async def test_a_fork_workspace_is_the_same_choice_inline_and_through_a_variable(api: Client, tmp_path: Path) -> None:
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    run = (await source.run("@reply alpha"))["id"]
    for workspace in ("SHARED", "OWN"):
        inline = (await api.gql(FORK_WITH.format(workspace=workspace), {"run": run}))["forkThread"]
        through_variable = (await api.gql(FORK_WORKSPACE_VARIABLE, {"run": run, "w": workspace}))["forkThread"]
        assert inline["userErrors"] == through_variable["userErrors"] == []
        shared = [inline["thread"]["workspacePath"] is None, through_variable["thread"]["workspacePath"] is None]
        assert shared == [workspace == "SHARED"] * 2, (workspace, inline, through_variable)


ROLLBACK_WITH = """mutation($t: ID!) {{ rollbackToRun(input: {{threadId: $t, runOrdinal: 1, onConflict: {policy}}}) {{
  rolledBackRuns {{ ordinal }} userErrors {{ code }} }} }}"""
ROLLBACK_POLICY_VARIABLE = """mutation($t: ID!, $on: RollbackConflictPolicy!) {
  rollbackToRun(input: {threadId: $t, runOrdinal: 1, onConflict: $on}) {
    rolledBackRuns { ordinal } userErrors { code } } }"""
THREAD_IN = (
    """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "scripted"}) { thread { id } } }"""
)
PROJECT_OF = """query($t: ID!) { thread(id: $t) { project { id } } }"""


async def _conflicted(api: Client, workspace: Path) -> ScriptedThread:
    """Thread A whose rollback to run 1 would put back s.txt, which thread B changed since (a conflict)."""
    a = await ScriptedThread.create(api, _folder(workspace))
    project = (await api.gql(PROJECT_OF, {"t": a.id}))["thread"]["project"]["id"]
    b = ScriptedThread(api, (await api.gql(THREAD_IN, {"p": project}))["createThread"]["thread"]["id"], workspace)
    await a.run("@write s.txt one")
    await a.run("@write s.txt two")
    await b.run("@write s.txt bee")
    return a


@pytest.mark.parametrize("policy", ["REFUSE", "OVERWRITE"])
async def test_a_rollback_conflict_policy_is_the_same_choice_inline_and_through_a_variable(
    api: Client, tmp_path: Path, policy: str
) -> None:
    answers = []
    for form in ("inline", "variable"):
        a = await _conflicted(api, tmp_path / form)
        if form == "inline":
            answer = await api.gql(ROLLBACK_WITH.format(policy=policy), {"t": a.id})
        else:
            answer = await api.gql(ROLLBACK_POLICY_VARIABLE, {"t": a.id, "on": policy})
        answers.append((answer["rollbackToRun"], (tmp_path / form / "s.txt").read_text()))
    expected = (
        ({"rolledBackRuns": [{"ordinal": 2}], "userErrors": []}, "one")
        if policy == "OVERWRITE"
        else ({"rolledBackRuns": [], "userErrors": [{"code": "WORKSPACE_CONFLICT"}]}, "bee")
    )
    assert answers == [expected, expected]


PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""
APPROVE_WITH = """mutation($r: ID!) {{ respondToApproval(input: {{requestId: $r, decision: {decision}}}) {{
  request {{ status response }} userErrors {{ code }} }} }}"""
APPROVE_VARIABLE = """mutation($r: ID!, $d: Decision!) { respondToApproval(input: {requestId: $r, decision: $d}) {
  request { status response } userErrors { code } } }"""


async def _approval(api: Client, thread: ScriptedThread, name: str) -> tuple[str, str]:
    """An approval asked by a run that would write `name`: the request's id and the run's id."""
    sent = await send(api, thread.id, f"@approval echo yes > {name}\n@reply went on")
    assert sent["userErrors"] == [], sent

    async def pending() -> list[dict[str, str]] | None:
        return (await api.gql(PENDING, {"t": thread.id}))["thread"]["pendingRequests"] or None

    [request] = await until(pending)
    return request["id"], sent["run"]["id"]


@pytest.mark.parametrize("decision", ["ACCEPT", "DECLINE"])
async def test_an_approval_decision_is_the_same_inline_and_through_a_variable(
    api: Client, tmp_path: Path, decision: str
) -> None:
    thread = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    answers = []
    for form in ("inline", "variable"):
        request, run = await _approval(api, thread, f"{form}.txt")
        if form == "inline":
            answer = await api.gql(APPROVE_WITH.format(decision=decision), {"r": request})
        else:
            answer = await api.gql(APPROVE_VARIABLE, {"r": request, "d": decision})
        assert (await finished(api, run))["status"] == "COMPLETED"
        answers.append((answer["respondToApproval"], (thread.workspace / f"{form}.txt").exists()))
    assert answers[0] == answers[1]
    assert answers[0][0]["userErrors"] == [] and answers[0][1] == (decision == "ACCEPT")


LAST_RUN = "query($t: ID!) { thread(id: $t) { runs(last: 1) { nodes { id } } } }"
PLANS = "query($r: ID!) { run(id: $r) { plans { id } } }"
IMPLEMENT_WITH = """mutation($p: ID!) {{ implementPlan(input: {{planId: $p, target: {target}}}) {{
  plan {{ status }} thread {{ id }} userErrors {{ code }} }} }}"""
IMPLEMENT_VARIABLE = """mutation($p: ID!, $target: PlanTarget!) { implementPlan(input: {planId: $p, target: $target}) {
  plan { status } thread { id } userErrors { code } } }"""


@pytest.mark.parametrize("target", ["NEW_RUN", "NEW_THREAD"])
async def test_a_plan_target_is_the_same_inline_and_through_a_variable(
    api: Client, tmp_path: Path, target: str
) -> None:
    thread = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    seen = []
    for form in ("inline", "variable"):
        run = await thread.run(f"@plan Step {form}")
        [plan] = (await api.gql(PLANS, {"r": run["id"]}))["run"]["plans"]
        if form == "inline":
            answer = await api.gql(IMPLEMENT_WITH.format(target=target), {"p": plan["id"]})
        else:
            answer = await api.gql(IMPLEMENT_VARIABLE, {"p": plan["id"], "target": target})
        done = answer["implementPlan"]
        assert done["userErrors"] == [], done
        seen.append((done["plan"]["status"], done["thread"]["id"] == thread.id))
        if target == "NEW_RUN":  # its run waits behind nothing: let it finish before the next @plan
            runs = await api.gql(
                "query($t: ID!) { thread(id: $t) { runs(last: 1) { nodes { id } } } }", {"t": thread.id}
            )
            await finished(api, runs["thread"]["runs"]["nodes"][0]["id"])
    assert seen == [("IMPLEMENTED", target == "NEW_RUN")] * 2


TOKEN_WITH = """mutation {{ createToken(input: {{name: "t", scope: {scope}}}) {{
  token {{ scope state }} userErrors {{ code }} }} }}"""
TOKEN_VARIABLE = """mutation($s: TokenScope!) { createToken(input: {name: "t", scope: $s}) {
  token { scope state } userErrors { code } } }"""


@pytest.mark.parametrize("scope", ["READ", "OPERATE", "ADMIN"])
async def test_a_token_scope_is_the_same_inline_and_through_a_variable(api: Client, scope: str) -> None:
    inline = (await api.gql(TOKEN_WITH.format(scope=scope)))["createToken"]
    through_variable = (await api.gql(TOKEN_VARIABLE, {"s": scope}))["createToken"]
    assert inline == through_variable == {"token": {"scope": scope, "state": "ACTIVE"}, "userErrors": []}


async def _project_of(api: Client, thread: ScriptedThread) -> str:
    found = await api.gql("query($t: ID!) { thread(id: $t) { project { id } } }", {"t": thread.id})
    return found["thread"]["project"]["id"]  # type: ignore[no-any-return]


USAGE_WITH = """query($p: ID!) {{ usage(projectId: $p, groupBy: [{group}]) {{ day threadId usage {{ calls }} }} }}"""
USAGE_VARIABLE = """query($p: ID!, $g: [UsageGroupBy!]) { usage(projectId: $p, groupBy: $g) {
  day threadId usage { calls } } }"""


@pytest.mark.parametrize("group", ["DAY", "THREAD"])
async def test_a_usage_grouping_is_the_same_inline_and_through_a_variable(
    api: Client, tmp_path: Path, group: str
) -> None:
    thread = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    await thread.run("@usage 3 2\n@reply counted")
    project = await _project_of(api, thread)
    inline = (await api.gql(USAGE_WITH.format(group=group), {"p": project}))["usage"]
    through_variable = (await api.gql(USAGE_VARIABLE, {"p": project, "g": [group]}))["usage"]
    assert inline == through_variable and len(inline) == 1 and inline[0]["usage"]["calls"] == 1
    assert (inline[0]["threadId"] is None) == (group == "DAY")


BUDGET_WITH = """mutation($p: ID!) {{
  setBudget(input: {{projectId: $p, maxTokens: 5, window: {window}, action: {action}}}) {{
  budget {{ window action }} userErrors {{ code }} }} }}"""
BUDGET_VARIABLE = """mutation($p: ID!, $w: BudgetWindow!, $a: BudgetAction!) {
  setBudget(input: {projectId: $p, maxTokens: 5, window: $w, action: $a}) {
  budget { window action } userErrors { code } } }"""


@pytest.mark.parametrize(("window", "action"), [("DAY", "ASK"), ("TOTAL", "STOP")])
async def test_a_budget_window_and_action_are_the_same_inline_and_through_a_variable(
    api: Client, tmp_path: Path, window: str, action: str
) -> None:
    thread = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    inline = await api.gql(BUDGET_WITH.format(window=window, action=action), {"p": await _project_of(api, thread)})
    again = await api.gql(BUDGET_VARIABLE, {"p": await _project_of(api, thread), "w": window, "a": action})
    expected = {"budget": {"window": window, "action": action}, "userErrors": []}
    assert inline["setBudget"] == again["setBudget"] == expected  # set again: the same budget, changed


HOOK_WITH = """mutation($p: ID!) {{ createWebhookEndpoint(input: {{projectId: $p, url: "https://hooks.example.invalid/x",
  events: [{event}]}}) {{ endpoint {{ id events }} userErrors {{ code }} }} }}"""
HOOK_VARIABLE = """mutation($p: ID!, $e: [WebhookEvent!]!) { createWebhookEndpoint(input: {projectId: $p,
  url: "https://hooks.example.invalid/x", events: $e}) { endpoint { id events } userErrors { code } } }"""
HOOK_UPDATE_WITH = """mutation($id: ID!) {{ updateWebhookEndpoint(input: {{endpointId: $id, events: [{event}]}}) {{
  endpoint {{ events }} userErrors {{ code }} }} }}"""
HOOK_UPDATE_VARIABLE = """mutation($id: ID!, $e: [WebhookEvent!]) { updateWebhookEndpoint(input: {endpointId: $id,
  events: $e}) { endpoint { events } userErrors { code } } }"""
DELIVERIES_WITH = """query($id: ID!) {{ webhookDeliveries(endpointId: $id, status: {status}) {{ id }} }}"""
DELIVERIES_VARIABLE = """query($id: ID!, $s: WebhookDeliveryStatus) {
  webhookDeliveries(endpointId: $id, status: $s) { id } }"""


async def test_webhook_events_and_a_delivery_status_are_the_same_inline_and_through_a_variable(
    api: Client, tmp_path: Path
) -> None:
    thread = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    p = await _project_of(api, thread)
    inline = (await api.gql(HOOK_WITH.format(event="FORK_CREATED"), {"p": p}))["createWebhookEndpoint"]
    through_variable = (await api.gql(HOOK_VARIABLE, {"p": p, "e": ["FORK_CREATED"]}))["createWebhookEndpoint"]
    for made in (inline, through_variable):
        assert made["userErrors"] == [] and made["endpoint"]["events"] == ["FORK_CREATED"]
    endpoint = inline["endpoint"]["id"]
    updated = (await api.gql(HOOK_UPDATE_WITH.format(event="RUN_FAILED"), {"id": endpoint}))["updateWebhookEndpoint"]
    assert updated == {"endpoint": {"events": ["RUN_FAILED"]}, "userErrors": []}
    updated = (await api.gql(HOOK_UPDATE_VARIABLE, {"id": endpoint, "e": ["BUDGET_EXCEEDED"]}))["updateWebhookEndpoint"]
    assert updated == {"endpoint": {"events": ["BUDGET_EXCEEDED"]}, "userErrors": []}
    for status in ("PENDING", "DELIVERED", "FAILED"):
        listed = await api.gql(DELIVERIES_WITH.format(status=status), {"id": endpoint})
        assert listed == await api.gql(DELIVERIES_VARIABLE, {"id": endpoint, "s": status}) == {"webhookDeliveries": []}

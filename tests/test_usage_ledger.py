"""The usage ledger through a real server and the scripted agent (docs/usage.md): `@usage` calls become records
on the attempt and node that made them, and every roll-up (run, attempt, node subtree, thread with its delegated
tasks, forks apart, project, the grouped report) adds them up, an unknown cost staying unknown all the way.

One server for the module: instance `priced` has a price table for model `m1`, `scripted` has none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT, statements, workspace
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient
from tests.test_metrics import scrape, value
from threadloom.api import ids as gid

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)
PROVIDERS = """
[instances.priced]
driver = "scripted"
[instances.priced.prices.m1]
input = 1.0
output = 2.0
"""

USAGE = "usage { calls inputTokens cachedInputTokens outputTokens reasoningTokens costUsd costSource }"
THREAD = """mutation($p: ID!, $i: String!, $m: String) {
  createThread(input: {projectId: $p, providerInstanceId: $i, model: $m}) { thread { id } userErrors { code } } }"""
RUN = (
    """query($id: ID!) { run(id: $id) { id status """
    + USAGE
    + """ attempts { id """
    + USAGE
    + """ }
  usageRecords { node { id kind } attempt { id } model callRef inputTokens outputTokens costUsd costSource }
  rootNode { id """
    + USAGE
    + """ children { id kind """
    + USAGE
    + """ } } } }"""
)
THREAD_USAGE = "query($id: ID!) { thread(id: $id) { " + USAGE + " forksUsage { calls costUsd costSource } } }"
PROJECT_USAGE = "query($id: ID!) { project(id: $id) { " + USAGE + " } }"
REPORT = """query($p: ID!, $g: [UsageGroupBy!]) { usage(projectId: $p, groupBy: $g) {
  day threadId thread { id title } model providerInstanceId
  usage { calls inputTokens outputTokens costUsd costSource } } }"""
DELEGATE = """mutation($t: ID!, $text: String!) { delegateTask(input: {threadId: $t, text: $text}) {
  thread { id runs(first: 1) { nodes { id } } } userErrors { code } } }"""
FORK = """mutation($run: ID!) { forkThread(input: {source: {run: $run}, title: "fork"}) {
  thread { id } userErrors { code message } } }"""
STEER = """mutation($t: ID!, $text: String!, $r: ID!) { sendMessage(input: {threadId: $t, text: $text,
  dispatch: {steerActive: {targetRunId: $r}}}) { run { id } userErrors { code } } }"""


async def _project(client: Client, root: Path, name: str) -> str:
    data = await client.gql(CREATE_PROJECT, {"name": name, "root": workspace(root, name)})
    return str(data["createProject"]["project"]["id"])


async def _thread(client: Client, project: str, instance: str = "priced", model: str | None = "m1") -> str:
    data = await client.gql(THREAD, {"p": project, "i": instance, "m": model})
    assert data["createThread"]["userErrors"] == [], data
    return str(data["createThread"]["thread"]["id"])


async def _completed(client: Client, thread: str, text: str) -> dict[str, Any]:
    sent = await send(client, thread, text)
    assert sent["userErrors"] == [], sent
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "COMPLETED", done
    return (await client.gql(RUN, {"id": done["id"]}))["run"]  # type: ignore[no-any-return]


def _usage(calls: int, inp: int, out: int, cost: float | None, source: str | None) -> dict[str, Any]:
    return {
        "calls": calls,
        "inputTokens": inp,
        "cachedInputTokens": 0,
        "outputTokens": out,
        "reasoningTokens": 0,
        "costUsd": cost,
        "costSource": source,
    }


async def test_usage_calls_are_recorded_on_their_attempt_and_node_and_roll_up(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project = await _project(client, tmp_path_factory.mktemp("ledger"), "ledger")
    thread = await _thread(client, project)
    run = await _completed(client, thread, "@usage 100 20 0.5\n@usage 1000 200\n@subagent @usage 7 3\n@reply ok")
    records = run["usageRecords"]
    # One record per call, in order: the provider's cost, then two priced from m1 (1 $/M in, 2 $/M out).
    assert [(r["inputTokens"], r["outputTokens"], r["costUsd"], r["costSource"]) for r in records] == [
        (100, 20, 0.5, "REPORTED"),
        (1000, 200, 0.0014, "PRICED"),
        (7, 3, 0.000013, "PRICED"),
    ]
    assert {r["model"] for r in records} == {"m1"}
    assert len({r["callRef"] for r in records}) == 3
    attempt = run["attempts"][0]
    assert {r["attempt"]["id"] for r in records} == {attempt["id"]}
    root, subagent = run["rootNode"], next(c for c in run["rootNode"]["children"] if c["kind"] == "SUBAGENT")
    assert [r["node"]["id"] for r in records] == [root["id"], root["id"], subagent["id"]]
    whole = _usage(3, 1107, 223, 0.501413, "PRICED")
    assert run["usage"] == whole
    assert run["attempts"][0]["usage"] == whole
    assert root["usage"] == whole  # the root's subtree holds the subagent
    assert subagent["usage"] == _usage(1, 7, 3, 0.000013, "PRICED")
    assert (await client.gql(THREAD_USAGE, {"id": thread}))["thread"]["usage"] == whole
    assert (await client.gql(PROJECT_USAGE, {"id": project}))["project"]["usage"] == whole


async def test_a_call_reported_twice_is_recorded_once(client: Client, tmp_path_factory: pytest.TempPathFactory) -> None:
    project = await _project(client, tmp_path_factory.mktemp("twice"), "twice")
    thread = await _thread(client, project)
    run = await _completed(client, thread, "@usage 4 4 0.4\n@usage-again\n@usage 1 1 0.1")
    assert run["usage"] == _usage(2, 5, 5, 0.5, "REPORTED")
    assert len(run["usageRecords"]) == 2


async def test_an_unknown_cost_stays_unknown_through_every_roll_up(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project = await _project(client, tmp_path_factory.mktemp("unknown"), "unknown")
    priced = await _thread(client, project)
    first = await _completed(client, priced, "@usage 10 10 0.25\n@reply known")
    assert first["usage"] == _usage(1, 10, 10, 0.25, "REPORTED")
    bare = await _thread(client, project, "scripted", None)  # no price table, no model: unknown
    second = await _completed(client, bare, "no usage said")  # the default call: 10 in, 5 out
    assert second["usage"] == _usage(1, 10, 5, None, "UNKNOWN")
    assert second["usageRecords"][0]["costUsd"] is None
    assert (await client.gql(THREAD_USAGE, {"id": bare}))["thread"]["usage"] == _usage(1, 10, 5, None, "UNKNOWN")
    assert (await client.gql(THREAD_USAGE, {"id": priced}))["thread"]["usage"]["costUsd"] == 0.25
    assert (await client.gql(PROJECT_USAGE, {"id": project}))["project"]["usage"] == _usage(2, 20, 15, None, "UNKNOWN")
    rows = (await client.gql(REPORT, {"p": project, "g": ["THREAD"]}))["usage"]
    assert sorted((r["threadId"], r["usage"]["costUsd"], r["usage"]["costSource"]) for r in rows) == sorted(
        [(priced, 0.25, "REPORTED"), (bare, None, "UNKNOWN")]
    )
    assert all(r["thread"]["id"] == r["threadId"] for r in rows)  # the thread itself, selectable in place
    by_instance = (await client.gql(REPORT, {"p": project, "g": ["PROVIDER_INSTANCE", "MODEL"]}))["usage"]
    assert [(r["providerInstanceId"], r["model"], r["usage"]["calls"]) for r in by_instance] == [  # in that order
        ("priced", "m1", 1),
        ("scripted", None, 1),
    ]
    (whole,) = (await client.gql(REPORT, {"p": project, "g": []}))["usage"]
    assert whole["usage"]["costUsd"] is None and whole["usage"]["costSource"] == "UNKNOWN"
    (day,) = (await client.gql(REPORT, {"p": project, "g": ["DAY"]}))["usage"]
    assert day["day"] is not None and day["usage"]["inputTokens"] == 20 and day["threadId"] is None
    assert day["thread"] is None


async def test_the_reports_thread_link_costs_the_same_statements_for_2_and_6_threads(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("report-links")
    costs = []
    for count in (2, 6):
        project = await _project(client, root, f"report-{count}")
        threads = [await _thread(client, project) for _ in range(count)]
        for thread in threads:
            await _completed(client, thread, "@usage 1 1")
        response = await client.post(REPORT, {"p": project, "g": ["THREAD"]})
        body = response.json()
        assert "errors" not in body, body
        costs.append(statements(dict(response.headers)))
        assert sorted(r["thread"]["id"] for r in body["data"]["usage"]) == sorted(threads)
        assert all(r["thread"]["title"] for r in body["data"]["usage"])
    assert costs[0] == costs[1], f"{costs[0]} statements for 2 threads, {costs[1]} for 6"


async def test_a_steer_mid_turn_adds_its_call_to_the_same_run(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project = await _project(client, tmp_path_factory.mktemp("steer"), "steer")
    thread = await _thread(client, project)
    sent = await send(client, thread, "@usage 1 1 0.01\n@await-steer\n@reply after")
    steered = await client.gql(STEER, {"t": thread, "text": "@usage 3 4 0.02", "r": sent["run"]["id"]})
    assert steered["sendMessage"]["userErrors"] == []
    assert steered["sendMessage"]["run"]["id"] == sent["run"]["id"]  # the same run: the steer reached the turn
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    run = (await client.gql(RUN, {"id": sent["run"]["id"]}))["run"]
    assert run["usage"] == _usage(2, 4, 5, 0.03, "REPORTED")
    assert len(run["attempts"]) == 1


async def test_a_thread_counts_its_delegated_tasks_and_its_forks_apart(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project = await _project(client, tmp_path_factory.mktemp("tree"), "tree")
    parent = await _thread(client, project)
    first = await _completed(client, parent, "@usage 100 0 1")
    child = (await client.gql(DELEGATE, {"t": parent, "text": "@usage 10 0 0.1"}))["delegateTask"]["thread"]
    assert (await finished(client, child["runs"]["nodes"][0]["id"]))["status"] == "COMPLETED"
    grandchild = (await client.gql(DELEGATE, {"t": child["id"], "text": "@usage 1 0 0.01"}))["delegateTask"]["thread"]
    assert (await finished(client, grandchild["runs"]["nodes"][0]["id"]))["status"] == "COMPLETED"
    fork = (await client.gql(FORK, {"run": first["id"]}))["forkThread"]["thread"]["id"]
    await _completed(client, fork, "@usage 1000 0 10")

    # Each task's result wakes its idle parent: a WAKE run of the default call (10 in, 5 out, priced at 20 µ$).
    async def woken() -> dict[str, Any] | None:
        found = (await client.gql(THREAD_USAGE, {"id": parent}))["thread"]
        return found if found["usage"]["calls"] == 5 else None

    found = await until(woken)
    assert (found["usage"]["inputTokens"], found["usage"]["costUsd"]) == (131, 1.11004)
    assert found["forksUsage"] == {"calls": 1, "costUsd": 10.0, "costSource": "REPORTED"}
    child_usage = (await client.gql(THREAD_USAGE, {"id": child["id"]}))["thread"]["usage"]
    assert (child_usage["calls"], child_usage["costUsd"]) == (3, 0.11002)  # its task and its own wake
    assert (await client.gql(PROJECT_USAGE, {"id": project}))["project"]["usage"]["costUsd"] == 11.11004


async def test_each_roll_up_costs_the_same_statements_for_2_and_8_parents(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("statements")
    runs: list[dict[str, Any]] = []
    projects = [await _project(client, root, f"statements-{n}") for n in range(8)]
    threads = [await _thread(client, project) for project in projects]
    for thread in threads:
        runs.append(await _completed(client, thread, "@usage 5 5\n@subagent @usage 1 1"))

    async def cost(query: str, ids: list[str]) -> tuple[int, list[Any]]:
        response = await client.post(query, {"ids": ids})
        body = response.json()
        assert "errors" not in body, body
        return statements(dict(response.headers)), body["data"]["nodes"]

    shapes = {
        "Run": ("... on Run { " + USAGE + " attempts { " + USAGE + " } }", [r["id"] for r in runs]),
        "ExecutionNode": ("... on ExecutionNode { " + USAGE + " }", [r["rootNode"]["id"] for r in runs]),
        "Thread": ("... on Thread { " + USAGE + " forksUsage { calls } }", threads),
        "Project": ("... on Project { " + USAGE + " }", projects),
    }
    for name, (selection, ids) in shapes.items():
        query = "query($ids: [ID!]!) { nodes(ids: $ids) { " + selection + " } }"
        few, _ = await cost(query, ids[:2])
        many, found = await cost(query, ids)
        assert few == many, f"{name}: {few} statements for 2, {many} for {len(ids)}"
        assert all(n["usage"]["calls"] == 2 for n in found), name


async def test_another_projects_token_sees_no_usage_and_the_owners_token_does(
    client: Client, server: ServerProcess, database_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("denial")
    mine, other = await _project(client, root, "mine"), await _project(client, root, "other")
    thread = await _thread(client, mine)
    run = await _completed(client, thread, "@usage 9 9 0.9")
    _, stranger = create_token(database_url, "admin", other)
    _, owner = create_token(database_url, "read", mine)
    probes = [
        (REPORT, {"p": mine, "g": ["THREAD"]}, "usage"),
        (PROJECT_USAGE, {"id": mine}, "project"),
        (THREAD_USAGE, {"id": thread}, "thread"),
        ("query($id: ID!) { run(id: $id) { " + USAGE + " } }", {"id": run["id"]}, "run"),
    ]
    for query, variables, field in probes:
        assert (await client.gql(query, variables, token=stranger))[field] is None, field
        seen = (await client.gql(query, variables, token=owner))[field]
        assert seen, field  # the twin: the project's own read token gets it
    report = (await client.gql(REPORT, {"p": mine, "g": []}, token=owner))["usage"]
    assert report[0]["usage"]["costUsd"] == 0.9


async def test_run_status_and_the_graph_carry_growing_usage(
    client: Client, server: ServerProcess, tmp_path_factory: pytest.TempPathFactory
) -> None:
    root = tmp_path_factory.mktemp("live")
    project = await _project(client, root, "live")
    thread = await _thread(client, project)
    sent = await send(client, thread, "@usage 2 2 0.2\n@await gate\n@usage 3 3 0.3")
    run_id = sent["run"]["id"]
    ws = await WsClient.connect(server.url, server.admin_token)
    try:
        await ws.subscribe(
            "subscription($r: ID!) { runStatus(runId: $r) { status usage { calls costUsd } } }", {"r": run_id}
        )
        seen: list[tuple[str, int, float | None]] = []
        async for item in ws.items():
            update = item["payload"]["data"]["runStatus"]
            seen.append((update["status"], update["usage"]["calls"], update["usage"]["costUsd"]))
            if update["usage"]["calls"] == 1 and update["status"] == "RUNNING":
                (Path(workspace(root, "live")) / "gate").touch()
            if update["status"] == "COMPLETED":
                break
        assert ("RUNNING", 1, 0.2) in seen and seen[-1] == ("COMPLETED", 2, 0.5), seen
    finally:
        await ws.close()
    graph = await WsClient.connect(server.url, server.admin_token)
    try:
        await graph.subscribe(
            "subscription($r: ID!) { executionGraph(runId: $r) { type node { kind } usage { calls } } }",
            {"r": run_id},
        )
        snapshot = []
        async for item in graph.items():
            event = item["payload"]["data"]["executionGraph"]
            if event["type"] == "SYNCHRONIZED":
                break
            snapshot.append(event)
        root_turn = next(e for e in snapshot if e["node"]["kind"] == "ROOT_TURN")
        assert root_turn["usage"] == {"calls": 2}
    finally:
        await graph.close()

    async def recorded() -> bool:
        return (await client.gql(RUN, {"id": run_id}))["run"]["usage"]["calls"] == 2

    await until(recorded)


async def test_metrics_count_tokens_and_cost_by_project_and_instance(
    client: Client, tmp_path_factory: pytest.TempPathFactory
) -> None:
    project = await _project(client, tmp_path_factory.mktemp("metrics"), "metrics")
    thread = await _thread(client, project)
    await _completed(client, thread, "@usage 7 3 0.5\n@usage 100 10")
    samples = await scrape(client)
    label = str(gid.decode_as(project, "Project", "projectId"))

    def counted(name: str, **labels: str) -> float:
        return value(samples, name, project=label, instance="priced", **labels)

    assert counted("threadloom_usage_tokens_total", kind="input") == 107
    assert counted("threadloom_usage_tokens_total", kind="output") == 13
    assert counted("threadloom_usage_cost_usd_total") == pytest.approx(0.5 + 0.00012)
    assert counted("threadloom_usage_records_total", cost_source="reported") == 1
    assert counted("threadloom_usage_records_total", cost_source="priced") == 1

"""API correctness: fresh subscription data, typed markers, global ids in payloads, graph edges, HTTP shapes.

Every test runs against a real `threadloom serve` over real HTTP and WebSockets.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT, make_thread, statements, workspace
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

GRAPHQL_RESPONSE = "application/graphql-response+json"


async def _thread(client: Client, tmp_path: Path, title: str = "t") -> str:
    data = await client.gql(CREATE_PROJECT, {"name": "p", "root": workspace(tmp_path)})
    return str((await make_thread(client, data["createProject"]["project"]["id"], title))["id"])


PENDING = "query($t: ID!) { thread(id: $t) { pendingRequests { id kind } } }"
APPROVE = """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) {
  userErrors { code } } }"""


async def _pending(client: Client, thread_id: str) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]]:
        found: list[dict[str, Any]] = (await client.gql(PENDING, {"t": thread_id}))["thread"]["pendingRequests"]
        return found

    return await until(check)


# --- item 7: a subscription's nested fields are read when the event is sent -------------------------------


async def test_run_status_shows_the_thread_as_it_is_at_the_event(
    client: Client, server: ServerProcess, tmp_path: Path
) -> None:
    thread_id = await _thread(client, tmp_path)
    ws = await WsClient.connect(server.url, client.token)
    try:
        # The socket reads the thread while it is idle (a query operation over the same socket) …
        query = await ws.subscribe("query($t: ID!) { thread(id: $t) { status activeRun { id } } }", {"t": thread_id})
        answer = await ws.receive()
        assert answer["id"] == query and answer["payload"]["data"]["thread"] == {"status": "IDLE", "activeRun": None}
        assert await ws.receive() == {"id": query, "type": "complete"}
        op = await ws.subscribe(
            """subscription($t: ID!) { runStatus(threadId: $t) {
                 status run { id thread { status activeRun { id } } } } }""",
            {"t": thread_id},
        )
        # … then a run starts and waits for an approval, so it stays the thread's active run.
        sent = await send(client, thread_id, "@approval echo approved")
        run_id = sent["run"]["id"]
        while True:
            message = await ws.receive()
            assert message["id"] == op, message
            item = message["payload"]["data"]["runStatus"]
            if item["status"] == "RUNNING":
                break
        thread = item["run"]["thread"]
        assert thread["activeRun"] == {"id": run_id}
        assert thread["status"] != "IDLE"
    finally:
        await ws.close()
    request = (await _pending(client, thread_id))[0]
    assert (await client.gql(APPROVE, {"r": request["id"]}))["respondToApproval"]["userErrors"] == []
    assert (await finished(client, run_id))["status"] == "COMPLETED"


# --- item 12: the activities subscription delivers the typed reload marker ---------------------------------

ACTIVITIES = """subscription($t: ID!, $after: Int) { activities(threadId: $t, afterSequence: $after) {
  __typename ... on ReloadRequired { sequence } ... on Activity { sequence kind } } }"""


@pytest.mark.own_server  # a server of its own with THREADLOOM_MAX_REPLAY, on a database of its own
async def test_activities_past_the_replay_bound_get_reload_required(database_url: str, tmp_path: Path) -> None:
    server = ServerProcess(database_url, tmp_path / "d", env={"THREADLOOM_MAX_REPLAY": "3"}).wait_ready()
    client = Client(server.url, server.admin_token)
    try:
        thread_id = await _thread(client, tmp_path)
        rename = """mutation($t: ID!, $n: String!) {
                      renameThread(input: {threadId: $t, title: $n}) { userErrors { code } } }"""
        for i in range(5):
            await client.gql(rename, {"t": thread_id, "n": f"n{i}"})
        latest = await client.gql("query($t: ID!) { thread(id: $t) { latestSequence } }", {"t": thread_id})
        latest_sequence = latest["thread"]["latestSequence"]
        ws = await WsClient.connect(server.url, server.admin_token)
        try:
            op = await ws.subscribe(ACTIVITIES, {"t": thread_id, "after": 1})
            item = await ws.receive()
            assert item["id"] == op and item["type"] == "next", item
            expected = {"__typename": "ReloadRequired", "sequence": latest_sequence}
            assert item["payload"] == {"data": {"activities": expected}}
            assert await ws.receive() == {"id": op, "type": "complete"}
        finally:
            await ws.close()
    finally:
        await client.aclose()
        server.stop()
        print(server.report(60))  # shown by pytest only when the test fails


# --- item 13: ids inside activity payloads are global ids that node() resolves ------------------------------

ACTIVITY_PAYLOADS = """query($t: ID!) { thread(id: $t) { activities(last: 50) { nodes { kind payload } } } }"""
NODE = """query($id: ID!) { node(id: $id) { __typename id } }"""
DELEGATE = """mutation($t: ID!, $text: String!) { delegateTask(input: {threadId: $t, text: $text}) {
  thread { id runs(first: 1) { nodes { id } } } userErrors { code } } }"""


async def _payload(client: Client, thread_id: str, kind: str) -> dict[str, Any]:
    activities = (await client.gql(ACTIVITY_PAYLOADS, {"t": thread_id}))["thread"]["activities"]["nodes"]
    found = [a["payload"] for a in activities if a["kind"] == kind]
    assert found, [a["kind"] for a in activities]
    return found[0]  # type: ignore[no-any-return]


async def test_activity_payload_ids_are_global_ids(client: Client, tmp_path: Path) -> None:
    thread_id = await _thread(client, tmp_path)
    sent = await send(client, thread_id, "@approval echo ok")
    request = (await _pending(client, thread_id))[0]
    asked = await _payload(client, thread_id, "approval.requested")
    assert asked["requestId"] == request["id"]
    assert (await client.gql(NODE, {"id": asked["requestId"]}))["node"] == {
        "__typename": "RuntimeRequest",
        "id": request["id"],
    }
    assert (await client.gql(APPROVE, {"r": request["id"]}))["respondToApproval"]["userErrors"] == []
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    answered = await _payload(client, thread_id, "approval.resolved")
    assert answered["requestId"] == request["id"]

    delegated = (await client.gql(DELEGATE, {"t": thread_id, "text": "@reply child"}))["delegateTask"]
    assert delegated["userErrors"] == []
    child = delegated["thread"]
    assert (await finished(client, child["runs"]["nodes"][0]["id"]))["status"] == "COMPLETED"
    started = await _payload(client, thread_id, "subagent.started")
    assert started["childThreadId"] == child["id"]
    found = (await client.gql(NODE, {"id": started["childThreadId"]}))["node"]
    assert found == {"__typename": "Thread", "id": child["id"]}

    async def returned() -> dict[str, Any] | None:
        activities = (await client.gql(ACTIVITY_PAYLOADS, {"t": thread_id}))["thread"]["activities"]["nodes"]
        found = [a["payload"] for a in activities if a["kind"] == "subagent.completed" and a["payload"]]
        return found[0] if found else None

    result = await until(returned)
    assert result["childThreadId"] == child["id"]
    transfer = (await client.gql(NODE, {"id": result["transferId"]}))["node"]
    assert transfer is not None and transfer["__typename"] == "ContextTransfer"


# --- item 17: no lease expiry on provider sessions ----------------------------------------------------------


async def test_provider_session_has_no_lease_expiry(client: Client) -> None:
    found = await client.gql('{ __type(name: "ProviderSession") { fields { name description } } }')
    fields = {f["name"]: f["description"] for f in found["__type"]["fields"]}
    assert "leaseExpiresAt" not in fields
    assert "advisory lock" in fields["owner"]


# --- item 18: execution edges connect nodes, in a constant number of statements ---------------------------

GRAPH = """query($id: ID!) { run(id: $id) { executionGraph {
  nodes { id kind parent { id } }
  edges { parent { id kind } child { id kind parent { id } } } } } }"""


async def test_execution_edges_connect_nodes_in_constant_statements(client: Client, tmp_path: Path) -> None:
    thread_id = await _thread(client, tmp_path)
    small = await send(client, thread_id, "@reply one")
    await finished(client, small["run"]["id"])
    big = await send(client, thread_id, "@tool echo a\n@tool echo b\n@tool echo c\n@write x.txt hi\n@reply done")
    await finished(client, big["run"]["id"])
    counts = []
    graphs = []
    for run_id in (small["run"]["id"], big["run"]["id"]):
        response = await client.post(GRAPH, {"id": run_id})
        body = response.json()
        assert "errors" not in body, body
        counts.append(statements(response.headers))
        graphs.append(body["data"]["run"]["executionGraph"])
    small_graph, big_graph = graphs
    assert len(big_graph["edges"]) >= 5 > len(small_graph["edges"])
    by_id = {n["id"]: n for n in big_graph["nodes"]}
    for edge in big_graph["edges"]:
        assert edge["child"]["parent"] == {"id": edge["parent"]["id"]}
        assert edge["parent"]["kind"] == by_id[edge["parent"]["id"]]["kind"]
    assert {e["child"]["id"] for e in big_graph["edges"]} == {n["id"] for n in big_graph["nodes"] if n["parent"]}
    assert counts[0] == counts[1], counts  # the shape decides the statements, not the node count


# --- item 19: a request that fails before execution has no `data` entry ------------------------------------


@pytest.mark.parametrize(
    ("query", "code"),
    [("{ viewer {", "GRAPHQL_PARSE_FAILED"), ("{ nope }", "GRAPHQL_VALIDATION_FAILED")],
)
async def test_request_errors_have_no_data_entry(client: Client, query: str, code: str) -> None:
    response = await client.post(query, headers={"accept": GRAPHQL_RESPONSE})
    assert response.status_code == 400
    assert response.headers["content-type"].startswith(GRAPHQL_RESPONSE)
    body = response.json()
    assert "data" not in body, body
    assert body["errors"][0]["extensions"]["code"] == code
    executed = await client.post('{ node(id: "nope") { id } }', headers={"accept": GRAPHQL_RESPONSE})
    assert executed.status_code == 200 and executed.json() == {"data": {"node": None}}


# --- item 20: bad page arguments are refused during validation --------------------------------------------


@pytest.mark.parametrize(
    ("query", "code", "field"),
    [
        ("{ projects(first: 0, last: 0) { totalCount } }", "INVALID_INPUT", "last"),
        ("{ projects(first: -1) { totalCount } }", "INVALID_INPUT", "first"),
        ("{ projects(last: 101) { totalCount } }", "PAGE_SIZE_EXCEEDED", "last"),
        ('{ projects(after: "not a cursor") { totalCount } }', "INVALID_CURSOR", None),
        (
            "{ projects(first: 1) { nodes { threads(first: 1) { nodes { runs(first: 500) { totalCount } } } } } }",
            "PAGE_SIZE_EXCEEDED",
            "first",
        ),
        ('{ projects(first: 1) { nodes { threads(before: "Yzox") { totalCount } } } }', "INVALID_CURSOR", None),
        ("{ nodes(ids: [" + ", ".join(['"x"'] * 101) + "]) { id } }", "PAGE_SIZE_EXCEEDED", "ids"),
    ],
)
async def test_bad_page_arguments_are_validation_errors(client: Client, query: str, code: str, field: str) -> None:
    response = await client.post(query, headers={"accept": GRAPHQL_RESPONSE})
    body = response.json()
    assert response.status_code == 400, body
    assert "data" not in body
    [error] = body["errors"]
    assert "path" not in error or error["path"] is None
    assert error["extensions"]["code"] == code
    if field is not None:
        assert error["extensions"]["field"] == field
    plain = await client.post(query)  # application/json: 200, the same error, no data either
    assert plain.status_code == 200 and "data" not in plain.json()
    assert plain.json()["errors"][0]["extensions"]["code"] == code


async def test_valid_cursors_and_variables_still_work(client: Client, tmp_path: Path, database_url: str) -> None:
    data = await client.gql(CREATE_PROJECT, {"name": "p", "root": workspace(tmp_path)})
    _, token = create_token(database_url, "read", data["createProject"]["project"]["id"])  # sees this one alone
    first = await client.gql("{ projects(first: 1) { pageInfo { endCursor } } }", token=token)
    cursor = first["projects"]["pageInfo"]["endCursor"]
    page = f'{{ projects(first: 0, after: "{cursor}") {{ totalCount nodes {{ id }} }} }}'
    after = await client.gql(page, token=token)
    assert after["projects"] == {"totalCount": 1, "nodes": []}
    # A size only known from variables is checked when the field runs, with the same code.
    response = await client.post("query($n: Int) { projects(first: $n) { totalCount } }", {"n": 101})
    assert response.json()["errors"][0]["extensions"]["code"] == "PAGE_SIZE_EXCEEDED"


@pytest.mark.parametrize(
    ("query", "variables", "code"),
    [
        ("query($n: Int) { projects(first: $n) { totalCount } }", {"n": 101}, "PAGE_SIZE_EXCEEDED"),
        ("query($n: Int) { projects(first: $n, last: $n) { totalCount } }", {"n": 0}, "INVALID_INPUT"),
        ("query($c: String) { projects(after: $c) { totalCount } }", {"c": "not a cursor"}, "INVALID_CURSOR"),
    ],
)
async def test_bad_page_arguments_from_variables_are_request_errors(
    client: Client, query: str, variables: dict[str, object], code: str
) -> None:
    response = await client.post(query, variables, headers={"accept": GRAPHQL_RESPONSE})
    body = response.json()
    [error] = body["errors"]
    assert error["extensions"]["code"] == code
    assert "data" not in body and "path" not in error, body
    assert response.status_code == 400, body

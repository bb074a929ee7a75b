"""The API as a hostile tenant sees it: query cost, idempotency keys, not-found answers,
bounded replays and workspace roots. Two projects, project-bound tokens, a real server."""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT, CREATE_THREAD, make_project, make_thread, statements, workspace
from tests.support.runs import SEND, finished, send
from tests.support.server import Client, ServerProcess, serving
from tests.support.ws import WsClient

GRAPHQL_RESPONSE = {"accept": "application/graphql-response+json"}

# The query: pages of 100 nested three deep through `message.thread`.
NESTED = """threads(projectId: $p, first: 100) { edges { node {
  messages(first: 100) { edges { node { thread { messages(first: 100) { nodes { text } } } } } } } } }"""
NESTED_COST = 100 + 100 * 100 + 100 * 100 * 100


def random_id(type_name: str) -> str:
    return base64.urlsafe_b64encode(f"{type_name}:{uuid.uuid4()}".encode()).decode().rstrip("=")


async def _tenants(client: Client, database_url: str) -> dict[str, Any]:
    """Projects A and B, a thread in A, and B's operate and read tokens."""
    a = await make_project(client, "A")
    b = await make_project(client, "B")
    thread = (await make_thread(client, a, "a's thread"))["id"]
    return {
        "a": a,
        "b": b,
        "thread": thread,
        "a_operate": create_token(database_url, "operate", a)[1],
        "b_operate": create_token(database_url, "operate", b)[1],
        "b_read": create_token(database_url, "read", b)[1],
        "a_read": create_token(database_url, "read", a)[1],
    }


# ---- cost ---------------------------------------------------------------------------------


async def test_costly_query_is_refused_before_execution_while_a_small_one_answers(client: Client) -> None:
    project = await make_project(client)
    aliases = " ".join(f"a{i}: {NESTED}" for i in range(8))
    costly = f"query($p: ID!) {{ {aliases} }}"
    small = "{ viewer { scope } }"
    refused, answered = await asyncio.gather(
        client.post(costly, {"p": project}, headers=GRAPHQL_RESPONSE), client.post(small)
    )
    assert answered.json() == {"data": {"viewer": {"scope": "ADMIN"}}}
    assert refused.status_code == 400
    body = refused.json()
    assert "data" not in body or body["data"] is None
    [error] = body["errors"]
    assert error["extensions"] == {"code": "QUERY_TOO_COSTLY", "cost": 8 * NESTED_COST, "maxCost": 20_000}
    # Nothing ran: the refused query made as many SQL statements (the token check) as one touching no table.
    assert statements(refused.headers) == statements(answered.headers)

    # Variables count: the same shape with small pages is affordable and runs.
    shape = """query($p: ID!, $n: Int) { threads(projectId: $p, first: $n) { edges { node {
      messages(first: $n) { edges { node { thread { messages(first: $n) { nodes { text } } } } } } } } } }"""
    over = (await client.post(shape, {"p": project, "n": 100})).json()
    assert over["errors"][0]["extensions"]["cost"] == NESTED_COST
    fine = await client.gql(shape, {"p": project, "n": 10})
    assert fine == {"threads": {"edges": []}}

    # Fragments are expanded too.
    spread = """query($p: ID!) { ...f }
      fragment f on Query { threads(projectId: $p, first: 100) { edges { node { ...m } } } }
      fragment m on Thread { messages(first: 100) { nodes { thread { runs(first: 100) { nodes { id } } } } } }"""
    frag = (await client.post(spread, {"p": project})).json()
    assert frag["errors"][0]["extensions"]["code"] == "QUERY_TOO_COSTLY"


async def test_costly_subscription_is_refused(client: Client, server: ServerProcess) -> None:
    project = await make_project(client)
    thread = (await make_thread(client, project))["id"]
    ws = await WsClient.connect(server.url, client.token)
    try:
        op = await ws.subscribe(
            """subscription($t: ID!) { threadEvents(threadId: $t) { sequence entity { ... on Thread {
              messages(first: 100) { nodes { thread { messages(first: 100) { nodes { thread {
              messages(first: 100) { nodes { text } } } } } } } } } } } }""",
            {"t": thread},
        )
        message = await ws.receive()
        assert message["id"] == op and message["type"] == "error", message  # refused before it starts
        assert message["payload"][0]["extensions"] == {
            "code": "QUERY_TOO_COSTLY",
            "cost": NESTED_COST,
            "maxCost": 20_000,
        }
    finally:
        await ws.close()


@pytest.fixture
def strict_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    """A query time limit of one microsecond: every query that reads the database runs over it."""
    with serving(database_url, tmp_path / "data", {"THREADLOOM_QUERY_TIMEOUT": "0.000001"}) as server:
        yield server


async def test_a_query_over_the_time_limit_is_cancelled_with_a_code(strict_server: ServerProcess) -> None:
    client = Client(strict_server.url, strict_server.admin_token)
    try:
        created = await client.gql(CREATE_PROJECT, {"name": "slow", "root": workspace()})  # mutations are not cut
        project = created["createProject"]["project"]["id"]
        body = (await client.post("query($p: ID!) { project(id: $p) { name } }", {"p": project})).json()
        assert body["data"] is None
        [error] = body["errors"]
        assert error["extensions"]["code"] == "QUERY_TIMEOUT"
        assert "Traceback" not in "\n".join(strict_server.log)
    finally:
        await client.aclose()


# ---- idempotency keys -------------------------------------------------------------------------


async def test_keys_belong_to_their_token(client: Client, database_url: str) -> None:
    t = await _tenants(client, database_url)
    a_made = await client.gql(CREATE_THREAD, {"projectId": t["a"], "title": "x", "key": "k1"}, token=t["a_operate"])
    b_made = await client.gql(CREATE_THREAD, {"projectId": t["b"], "title": "x", "key": "k1"}, token=t["b_operate"])
    assert b_made["createThread"]["userErrors"] == []
    assert b_made["createThread"]["thread"]["id"] != a_made["createThread"]["thread"]["id"]
    # Within one token a key still means one command.
    again = await client.gql(CREATE_THREAD, {"projectId": t["a"], "title": "x", "key": "k1"}, token=t["a_operate"])
    assert again["createThread"]["thread"]["id"] == a_made["createThread"]["thread"]["id"]
    other = await client.gql(CREATE_THREAD, {"projectId": t["a"], "title": "y", "key": "k1"}, token=t["a_operate"])
    assert other["createThread"]["userErrors"][0]["code"] == "IDEMPOTENCY_KEY_REUSED"


RENAME = """mutation($t: ID!, $title: String!, $key: String) {
  renameThread(input: {threadId: $t, title: $title, clientMutationId: $key}) {
    thread { id title } userErrors { code message field } clientMutationId
  }
}"""


async def test_a_stored_answer_is_not_replayed_to_another_token(client: Client, database_url: str) -> None:
    t = await _tenants(client, database_url)
    done = await client.gql(RENAME, {"t": t["thread"], "title": "secret plan", "key": "r1"})
    assert done["renameThread"]["thread"]["title"] == "secret plan"
    replay = await client.gql(RENAME, {"t": t["thread"], "title": "secret plan", "key": "r1"}, token=t["b_read"])
    never_seen = await client.gql(
        RENAME, {"t": random_id("Thread"), "title": "secret plan", "key": "r1"}, token=t["b_read"]
    )
    assert replay == never_seen
    assert replay["renameThread"]["thread"] is None
    assert replay["renameThread"]["userErrors"] == [{"code": "NOT_FOUND", "message": "not found", "field": "threadId"}]
    # A read token of the same project is refused for its scope, not handed the stored payload.
    same_project = await client.gql(RENAME, {"t": t["thread"], "title": "secret plan", "key": "r1"}, token=t["a_read"])
    assert same_project["renameThread"]["userErrors"][0]["code"] == "FORBIDDEN"
    assert same_project["renameThread"]["thread"] is None


async def test_the_same_message_id_from_two_tokens_on_one_thread(client: Client, database_url: str) -> None:
    t = await _tenants(client, database_url)
    first = await send(client, t["thread"], "@reply one", key="m1")
    await finished(client, first["run"]["id"])
    second = await client.gql(SEND, {"t": t["thread"], "text": "@reply two", "key": "m1"}, token=t["a_operate"])
    assert second["sendMessage"]["run"] is None
    assert second["sendMessage"]["userErrors"][0]["code"] == "IDEMPOTENCY_KEY_REUSED"
    again = await send(client, t["thread"], "@reply one", key="m1")  # the first sender still gets its run
    assert again["run"]["id"] == first["run"]["id"]


# ---- not found means not found -----------------------------------------------------------------

ERRORS = "{ userErrors { code message field } }"
MUTATIONS = {
    "renameThread": ('renameThread(input: {threadId: $id, title: "t"})', "Thread"),
    "archiveThread": ("archiveThread(input: {threadId: $id})", "Thread"),
    "sendMessage": ('sendMessage(input: {threadId: $id, text: "hi"})', "Thread"),
    "stopThread": ("stopThread(input: {threadId: $id})", "Thread"),
    "delegateTask": ('delegateTask(input: {threadId: $id, text: "x"})', "Thread"),
    "createThread": ("createThread(input: {projectId: $id})", "Project"),
    "interruptRun": ("interruptRun(input: {runId: $id})", "Run"),
    "cancelQueuedRun": ("cancelQueuedRun(input: {runId: $id})", "Run"),
    "interruptNode": ("interruptNode(input: {nodeId: $id})", "ExecutionNode"),
}

SUBSCRIPTIONS = {
    "threadEvents": ("subscription($id: ID!) { threadEvents(threadId: $id) { sequence } }", "Thread"),
    "runStatus": ("subscription($id: ID!) { runStatus(threadId: $id) { status } }", "Thread"),
    "projectThreads": ("subscription($id: ID!) { projectThreads(projectId: $id) { cursor } }", "Project"),
}


async def test_an_object_of_another_project_looks_exactly_like_an_unknown_id(
    client: Client, database_url: str, server: ServerProcess
) -> None:
    t = await _tenants(client, database_url)
    sent = await send(client, t["thread"], "@reply done")
    run = await finished(client, sent["run"]["id"])
    theirs = {"Thread": t["thread"], "Project": t["a"], "Run": run["id"], "ExecutionNode": run["rootNode"]["id"]}
    for name, (call, type_name) in MUTATIONS.items():
        mutation = f"mutation($id: ID!) {{ {call} {ERRORS} }}"
        existing = await client.post(mutation, {"id": theirs[type_name]}, token=t["b_operate"])
        unknown = await client.post(mutation, {"id": random_id(type_name)}, token=t["b_operate"])
        assert existing.json() == unknown.json(), name
        [error] = next(iter(existing.json()["data"].values()))["userErrors"]
        assert (error["code"], error["message"]) == ("NOT_FOUND", "not found"), name
    for type_name, global_id in theirs.items():
        looked_up = await client.gql("query($id: ID!) { node(id: $id) { id } }", {"id": global_id}, token=t["b_read"])
        assert looked_up == {"node": None}, type_name
    ws = await WsClient.connect(server.url, t["b_read"])
    try:
        for name, (subscription, type_name) in SUBSCRIPTIONS.items():
            answers = []
            for global_id in (theirs[type_name], random_id(type_name)):
                op = await ws.subscribe(subscription, {"id": global_id})
                message = await ws.receive()
                assert message["id"] == op and message["type"] == "next", message
                answers.append(message["payload"])
                assert await ws.receive() == {"id": op, "type": "complete"}
            assert answers[0] == answers[1], name
            assert answers[0]["errors"][0]["extensions"]["code"] == "NOT_FOUND"
            assert answers[0]["errors"][0]["message"] == "not found"
    finally:
        await ws.close()


# ---- bounded replays --------------------------------------------------------------------------

RUN_STATUS = """subscription($t: ID!, $r: ID, $after: Int) {
  runStatus(threadId: $t, runId: $r, afterSequence: $after) { sequence status run { id ordinal } }
}"""
FEED = """subscription($p: ID!, $after: String) {
  projectThreads(projectId: $p, after: $after) { cursor sequence type thread { id title } }
}"""


async def _next(ws: WsClient, op: str) -> dict[str, Any]:
    message = await ws.receive()
    assert message["id"] == op and message["type"] == "next", message
    assert "errors" not in message["payload"], message
    return message["payload"]["data"]  # type: ignore[no-any-return]


async def test_run_status_starts_from_the_current_state(client: Client, server: ServerProcess) -> None:
    project = await make_project(client)
    thread = (await make_thread(client, project))["id"]
    runs = []
    for text in ("@reply one", "@reply two"):
        sent = await send(client, thread, text)
        runs.append(await finished(client, sent["run"]["id"]))
    ws = await WsClient.connect(server.url, client.token)
    try:
        current = await ws.subscribe(RUN_STATUS, {"t": thread})
        first = (await _next(ws, current))["runStatus"]
        assert (first["run"]["ordinal"], first["status"]) == (2, "COMPLETED")  # not run 1's queued state
        one = await ws.subscribe(RUN_STATUS, {"t": thread, "r": runs[0]["id"]})
        assert (await _next(ws, one))["runStatus"]["status"] == "COMPLETED"
        # Then live: a third run's statuses (the run-1 subscription stays quiet).
        third = await send(client, thread, "@reply three")
        await finished(client, third["run"]["id"])
        statuses = []
        while not statuses or statuses[-1] != "COMPLETED":
            item = (await _next(ws, current))["runStatus"]
            assert item["run"]["id"] == third["run"]["id"]
            statuses.append(item["status"])
        assert len(statuses) >= 2
        # With a cursor: the changes after it, run 1's history included.
        replay = await ws.subscribe(RUN_STATUS, {"t": thread, "after": 0})
        item = (await _next(ws, replay))["runStatus"]
        assert item["run"]["id"] == runs[0]["id"] and item["status"] != "COMPLETED"
    finally:
        await ws.close()


@pytest.fixture
def replay_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    server = ServerProcess(database_url, tmp_path / "data", env={"THREADLOOM_MAX_REPLAY": "5"}).wait_ready()
    yield server
    server.stop()
    print(server.report(40))


async def test_long_replays_are_refused_with_a_reload(replay_server: ServerProcess) -> None:
    client = Client(replay_server.url, replay_server.admin_token)
    ws = await WsClient.connect(replay_server.url, client.token)
    try:
        project = await make_project(client, "feed")
        cursor_query = "query($p: ID!) { project(id: $p) { feedCursor } }"
        old_cursor = (await client.gql(cursor_query, {"p": project}))["project"]["feedCursor"]
        threads = [(await make_thread(client, project, f"t{i}"))["id"] for i in range(4)]
        for i in range(4):
            await client.gql(RENAME, {"t": threads[0], "title": f"r{i}"})
        # Eight changes after the cursor: over the bound of 5.
        resumed = await ws.subscribe(FEED, {"p": project, "after": old_cursor})
        reload = (await _next(ws, resumed))["projectThreads"]
        assert reload["type"] == "reload_required" and reload["thread"] is None
        assert await ws.receive() == {"id": resumed, "type": "complete"}
        # Resuming from the reload's cursor gets only what comes next.
        fresh = await ws.subscribe(FEED, {"p": project, "after": reload["cursor"]})
        await client.gql(RENAME, {"t": threads[1], "title": "after reload"})
        item = (await _next(ws, fresh))["projectThreads"]
        assert (item["type"], item["thread"]["title"]) == ("thread.renamed", "after reload")

        # runStatus with a cursor too far back starts from the current state instead of replaying.
        sent = await send(client, threads[0], "@reply hi")
        await finished(client, sent["run"]["id"])
        status = await ws.subscribe(RUN_STATUS, {"t": threads[0], "after": 0})
        while True:
            message = await ws.receive()
            if message["id"] == status:
                break
        first = message["payload"]["data"]["runStatus"]
        assert (first["run"]["id"], first["status"]) == (sent["run"]["id"], "COMPLETED")
    finally:
        await ws.close()
        await client.aclose()


# ---- workspace roots ------------------------------------------------------------------------

CREATE = 'mutation($root: String!) { createProject(input: {name: "p", workspaceRoot: $root}) { project { id } userErrors { code field } } }'  # noqa: E501


async def test_create_project_refuses_system_data_and_overlapping_roots(
    client: Client, data_dir: Path, tmp_path: Path
) -> None:
    async def refusal(root: str) -> str:
        data = (await client.gql(CREATE, {"root": root}))["createProject"]
        assert data["project"] is None, root
        [error] = data["userErrors"]
        assert error["field"] == "workspaceRoot"
        return str(error["code"])

    base = Path(workspace(tmp_path, "projects"))  # beside the server's data dir, not around it
    first = workspace(base, "first")
    assert (await client.gql(CREATE, {"root": first}))["createProject"]["userErrors"] == []
    a_file = base / "file"
    a_file.write_text("x")
    link = base / "link"
    link.symlink_to(first)
    cases = {
        "/": "INVALID_WORKSPACE_ROOT",
        "/etc": "INVALID_WORKSPACE_ROOT",
        "/usr/lib": "INVALID_WORKSPACE_ROOT",
        "/proc/self": "INVALID_WORKSPACE_ROOT",
        "/tmp": "INVALID_WORKSPACE_ROOT",
        str(data_dir): "INVALID_WORKSPACE_ROOT",
        str(data_dir.parent): "INVALID_WORKSPACE_ROOT",  # holds the data dir
        str(base / "missing"): "INVALID_WORKSPACE_ROOT",
        str(a_file): "INVALID_WORKSPACE_ROOT",
        first: "WORKSPACE_OVERLAPS",
        workspace(Path(first), "inner"): "WORKSPACE_OVERLAPS",
        str(base): "WORKSPACE_OVERLAPS",
        str(link): "WORKSPACE_OVERLAPS",
        first + "/../first": "WORKSPACE_OVERLAPS",
    }
    for root, code in cases.items():
        assert await refusal(root) == code, root
    listed = await client.gql("{ projects { totalCount } }")
    assert listed["projects"]["totalCount"] == 1  # nothing was created by the refusals
    beside = workspace(base, "second")
    assert (await client.gql(CREATE, {"root": beside}))["createProject"]["userErrors"] == []


async def test_workspace_roots_through_proc_links_are_refused(client: Client, server: ServerProcess) -> None:
    """`/proc/self/cwd` resolves to the server's own working directory (its checkout here) and was accepted;
    `/proc/1/cwd` (unreadable) was an INTERNAL_SERVER_ERROR. Both name a path inside /proc, a system tree."""
    create = (
        'mutation($root: String!) { createProject(input: {name: "p", workspaceRoot: $root}) '
        "{ project { id workspaceRoot } userErrors { code field } } }"
    )
    got = {}
    for root in ("/proc/self/cwd", "/proc/1/cwd", "/proc/thread-self/cwd"):
        body = (await client.post(create, {"root": root})).json()
        payload = (body.get("data") or {}).get("createProject") or {}
        got[root] = [e["code"] for e in payload.get("userErrors") or []] or [
            e.get("extensions", {}).get("code") for e in body.get("errors") or []
        ]
    assert got == {root: ["INVALID_WORKSPACE_ROOT"] for root in got}
    assert "Traceback" not in "\n".join(server.log)


def _objects(value: Any) -> int:
    """How many objects (dicts) a response holds."""
    if isinstance(value, dict):
        return 1 + sum(_objects(v) for v in value.values())
    if isinstance(value, list):
        return sum(_objects(v) for v in value)
    return 0


async def test_plain_lists_cannot_return_more_than_the_budget(database_url: str, tmp_path: Path) -> None:
    """The static rule prices a run's `children` at one default page (20); a run with 60 children
    behind 25 aliases (1,500 objects) must still be stopped at the budget while it executes."""
    env = {"THREADLOOM_MAX_QUERY_COST": "600"}
    with serving(database_url, tmp_path / "data", env=env) as server:
        client = Client(server.url, server.admin_token)
        try:
            project = await make_project(client)
            thread = (await make_thread(client, project))["id"]
            sent = await send(client, thread, "\n".join("@reply x" for _ in range(60)))
            done = await finished(client, sent["run"]["id"])
            assert done["status"] == "COMPLETED"
            aliases = " ".join(f"a{i}: rootNode {{ children {{ id }} }}" for i in range(25))
            body = (await client.post(f"query($r: ID!) {{ run(id: $r) {{ {aliases} }} }}", {"r": done["id"]})).json()
            codes = {e.get("extensions", {}).get("code") for e in body.get("errors") or []}
            assert codes == {"QUERY_TOO_COSTLY"}, body.get("errors")
            assert _objects(body.get("data")) <= 600 + 30
            one = "query($r: ID!) { run(id: $r) { rootNode { children { id } } } }"
            small = (await client.post(one, {"r": done["id"]})).json()
            assert "errors" not in small and len(small["data"]["run"]["rootNode"]["children"]) == 60
        finally:
            await client.aclose()

"""Security review of the API as a tenant of project B: every mutation and subscription with another
project's ids (replaying that project's idempotency keys), keys per tenant for every keyed mutation, a read
token's mutation over a WebSocket, a subscription over GET, costs that plain lists and introspection hide,
and workspace-root edge cases. Real `threadloom serve`, real websockets."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import uuid
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest

from tests.support.cli import create_token
from tests.support.graphql import make_project, make_thread, workspace
from tests.support.runs import finished, run, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient

KEY = "shared-key-1"
ERRORS = "userErrors { code message field }"


def random_id(type_name: str) -> str:
    return base64.urlsafe_b64encode(f"{type_name}:{uuid.uuid4()}".encode()).decode().rstrip("=")


PENDING = "query($t: ID!) { thread(id: $t) { pendingRequests { id kind } } }"
PLANS = "query($r: ID!) { run(id: $r) { plans { id } } }"


async def _a_objects(client: Client, project: str) -> dict[str, str]:
    """One object of every kind in project A: a thread, a running and a queued run, a node, an approval
    request, a question, a plan."""
    waiting = (await make_thread(client, project, "waiting"))["id"]
    running = await send(client, waiting, "@approval true\n@reply done")

    async def pending(thread: str) -> str | None:
        found = (await client.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"]
        return found[0]["id"] if found else None

    request = await until(lambda: pending(waiting))
    queued = await send(client, waiting, "@reply later", d={"queueAfterActive": True})
    asking = (await make_thread(client, project, "asking"))["id"]
    await send(client, asking, "@ask Which? | x | y")
    question = await until(lambda: pending(asking))
    planning = (await make_thread(client, project, "planning"))["id"]
    planned = await finished(client, (await send(client, planning, "@plan do it\n@reply ok"))["run"]["id"])
    plans = (await client.gql(PLANS, {"r": planned["id"]}))["run"]["plans"]
    active = await run(client, running["run"]["id"])
    return {
        "Thread": waiting,
        "Project": project,
        "Run": running["run"]["id"],
        "QueuedRun": queued["run"]["id"],
        "ExecutionNode": active["rootNode"]["id"],
        "RuntimeRequest": request,
        "Question": question,
        "PlanArtifact": plans[0]["id"] if plans else random_id("PlanArtifact"),
    }


# Every mutation taking an id, with A's idempotency key: (call, kind of object).
MUTATIONS = {
    "renameThread": ('renameThread(input: {threadId: $id, title: "t", clientMutationId: $k})', "Thread"),
    "archiveThread": ("archiveThread(input: {threadId: $id, clientMutationId: $k})", "Thread"),
    "unarchiveThread": ("unarchiveThread(input: {threadId: $id, clientMutationId: $k})", "Thread"),
    "sendMessage": ('sendMessage(input: {threadId: $id, text: "hi", clientMessageId: $k})', "Thread"),
    "stopThread": ("stopThread(input: {threadId: $id, clientMutationId: $k})", "Thread"),
    "resumeQueue": ("resumeQueue(input: {threadId: $id, clientMutationId: $k})", "Thread"),
    "delegateTask": ('delegateTask(input: {threadId: $id, text: "x", clientMutationId: $k})', "Thread"),
    "createThread": ("createThread(input: {projectId: $id, clientMutationId: $k})", "Project"),
    "interruptRun": ("interruptRun(input: {runId: $id, clientMutationId: $k})", "Run"),
    "cancelQueuedRun": ("cancelQueuedRun(input: {runId: $id, clientMutationId: $k})", "QueuedRun"),
    "editQueuedRun": ('editQueuedRun(input: {runId: $id, text: "x", clientMutationId: $k})', "QueuedRun"),
    "reorderQueuedRun": ("reorderQueuedRun(input: {runId: $id, position: 1, clientMutationId: $k})", "QueuedRun"),
    "promoteQueuedRunToSteer": ("promoteQueuedRunToSteer(input: {runId: $id, clientMutationId: $k})", "QueuedRun"),
    "interruptNode": ("interruptNode(input: {nodeId: $id, clientMutationId: $k})", "ExecutionNode"),
    "respondToApproval": (
        "respondToApproval(input: {requestId: $id, decision: ACCEPT, clientMutationId: $k})",
        "RuntimeRequest",
    ),
    "respondToUserInput": (
        'respondToUserInput(input: {requestId: $id, answers: [{questionId: "q1", answers: ["x"]}], '
        "clientMutationId: $k})",
        "Question",
    ),
    "implementPlan": ("implementPlan(input: {planId: $id, target: NEW_RUN, clientMutationId: $k})", "PlanArtifact"),
}
ID_TYPE = {"QueuedRun": "Run", "Question": "RuntimeRequest"}

SUBSCRIPTIONS = {
    "activities": "subscription($id: ID!) { activities(threadId: $id) { __typename ... on Activity { sequence } } }",
    "threadEvents": "subscription($id: ID!) { threadEvents(threadId: $id) { sequence } }",
    "runStatus": "subscription($id: ID!) { runStatus(threadId: $id) { status } }",
}
# B's own thread with A's run or node: (query, kind of the id, whether it answers). A filtered threadEvents
# answers once its replay of B's thread is done (its `synchronized` marker at the thread's last sequence); the
# others have nothing to say.
MIXED = {
    "threadEvents(runId)": (
        "subscription($t: ID!, $id: ID!) { threadEvents(threadId: $t, runId: $id) { sequence } }",
        "Run",
        True,
    ),
    "threadEvents(nodeId)": (
        "subscription($t: ID!, $id: ID!) { threadEvents(threadId: $t, nodeId: $id) { sequence } }",
        "ExecutionNode",
        True,
    ),
    "activities(runId)": (
        "subscription($t: ID!, $id: ID!) { activities(threadId: $t, runId: $id) { ... on Activity { sequence } } }",
        "Run",
        False,
    ),
    "runStatus(runId)": (
        "subscription($t: ID!, $id: ID!) { runStatus(threadId: $t, runId: $id) { status } }",
        "Run",
        False,
    ),
}


WATCH = "subscription($t: ID!) { threadEvents(threadId: $t) { sequence } }"
LATEST = "query($t: ID!) { thread(id: $t) { latestSequence } }"
RENAME = (
    "mutation($t: ID!, $title: String!) { renameThread(input: {threadId: $t, title: $title}) { userErrors { code } } }"
)


def _sequence(message: dict[str, Any]) -> int:
    return int(((message["payload"]["data"] or {}).get("threadEvents") or {}).get("sequence", 0))


async def _reply(ws: WsClient, query: str, variables: dict[str, Any], within: float = 20.0) -> Any:
    """The first message of a subscription that must answer (a refusal as it starts, or the marker ending its
    replay), after which it is ended; `{"silent": True}` if none came within `within` seconds. Only a leak waits
    that long, so no barrier is needed (one raced the compared start on a loaded machine, whose pool was still
    opening the session the compared start waited for)."""
    op = await ws.subscribe(query, variables)
    answer: Any = {"silent": True}
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(within):
            while True:
                message = await ws.receive(within)
                if message.get("id") == op:
                    answer = {k: v for k, v in message.items() if k != "id"}
                    break
    await ws.ws.send(orjson.dumps({"id": op, "type": "complete"}).decode())  # its tail is skipped (another id)
    return answer


async def _first_answer(ws: WsClient, query: str, variables: dict[str, Any], barrier: tuple[Client, str, str]) -> Any:
    """The subscription's first message (the answer compared), after which it is ended; for subscriptions whose
    expected answer is silence (B's own thread filtered by an id that matches nothing there).

    A live subscription with nothing to say answers nothing. That silence is told from a slow answer by
    events, not a timer (an answer is decided when a subscription starts): `barrier` is (client, operate token,
    a thread of that project). Right after the compared one, a probe subscribes to a thread that does not exist,
    which is refused as it starts, and a watcher follows that thread, renamed once both started. A
    subscription that said nothing by the time the probe was refused and the watcher saw the rename is
    silent: the rename alone raced the compared start on a loaded machine (the watcher's event came first).
    The probe is the compared subscription itself on a thread that does not exist, so it starts the same way:
    a `threadEvents` probe took the fast path and was refused before a compared `activities` start (which
    strawberry runs) had answered, so a refusal read as silence on a loaded machine."""
    client, token, thread = barrier  # a thread of the socket's project that no compared subscription reads
    op = await ws.subscribe(query, variables)
    on = "t" if "t" in variables else "id"  # the variable naming the thread
    probe = await ws.subscribe(query, {**variables, on: random_id("Thread")})  # started after `op`, refused
    watch = await ws.subscribe(WATCH, {"t": thread})
    before = (await client.gql(LATEST, {"t": thread}, token=token))["thread"]["latestSequence"]
    renamed = await client.gql(RENAME, {"t": thread, "title": uuid.uuid4().hex}, token=token)
    assert renamed["renameThread"]["userErrors"] == [], renamed
    answer: Any = None
    probed = seen = False
    while answer is None:
        message = await ws.receive()
        if message.get("id") == op:
            answer = {k: v for k, v in message.items() if k != "id"}
        elif message.get("id") == probe:
            probed = True
        elif message.get("id") == watch and message["type"] == "next" and _sequence(message) > before:
            seen = True
        if answer is None and probed and seen:
            answer = {"silent": True}
    for ended in (op, probe, watch):  # the tails of all three are skipped by the next call (other ids)
        await ws.ws.send(orjson.dumps({"id": ended, "type": "complete"}).decode())
    return answer


async def test_another_projects_objects_and_keys_look_like_unknown_ids_everywhere(
    client: Client, server: ServerProcess, database_url: str
) -> None:
    a = await make_project(client, "A")
    b = await make_project(client, "B")
    a_operate = create_token(database_url, "operate", a)[1]
    b_operate = create_token(database_url, "operate", b)[1]
    b_read = create_token(database_url, "read", b)[1]
    theirs = await _a_objects(client, a)
    # A uses KEY on a rename first, so a replay of the key by B has a stored answer to leak.
    renamed = await client.gql(
        f'mutation($id: ID!, $k: String) {{ renameThread(input: {{threadId: $id, title: "secret", clientMutationId: $k}}) {{ {ERRORS} }} }}',  # noqa: E501
        {"id": theirs["Thread"], "k": KEY},
        token=a_operate,
    )
    assert renamed["renameThread"]["userErrors"] == []
    mine = (await make_thread(client, b, "mine"))["id"]

    differing = []
    for name, (call, kind) in MUTATIONS.items():
        mutation = f"mutation($id: ID!, $k: String) {{ {call} {{ {ERRORS} }} }}"
        existing = await client.post(mutation, {"id": theirs[kind], "k": KEY}, token=b_operate)
        unknown = await client.post(mutation, {"id": random_id(ID_TYPE.get(kind, kind)), "k": KEY}, token=b_operate)
        if existing.content != unknown.content:
            differing.append((name, existing.text, unknown.text))
    for kind, global_id in theirs.items():
        for query in ("query($id: ID!) { node(id: $id) { id } }", "query($id: ID!) { nodes(ids: [$id]) { id } }"):
            seen = await client.post(query, {"id": global_id}, token=b_read)
            never = await client.post(query, {"id": random_id(ID_TYPE.get(kind, kind))}, token=b_read)
            if seen.content != never.content:
                differing.append((f"{query} {kind}", seen.text, never.text))
    for query, kind in (
        ("query($id: ID!) { thread(id: $id) { id } }", "Thread"),
        ("query($id: ID!) { run(id: $id) { id } }", "Run"),
        ("query($id: ID!) { project(id: $id) { id } }", "Project"),
        ("query($id: ID!) { threads(projectId: $id) { totalCount } }", "Project"),
    ):
        seen = await client.post(query, {"id": theirs[kind]}, token=b_read)
        never = await client.post(query, {"id": random_id(kind)}, token=b_read)
        if seen.content != never.content:
            differing.append((query, seen.text, never.text))
    ws = await WsClient.connect(server.url, b_read)
    barrier = (client, b_operate, (await make_thread(client, b, "barrier"))["id"])  # not `mine`: it is compared
    try:
        for name, query in SUBSCRIPTIONS.items():  # a thread that does not exist is refused as it starts
            never = await _reply(ws, query, {"id": random_id("Thread")})
            assert never != {"silent": True}, (name, never)
            seen = await _reply(ws, query, {"id": theirs["Thread"]})
            if seen != never:
                differing.append((name, seen, never))
        for name, (query, kind, answers) in MIXED.items():
            if answers:  # its replay's end is an answer: no barrier (one judged a late marker as silence)
                seen = await _reply(ws, query, {"t": mine, "id": theirs[kind]})
                never = await _reply(ws, query, {"t": mine, "id": random_id(kind)})
                assert never != {"silent": True}, (name, never)
            else:
                seen = await _first_answer(ws, query, {"t": mine, "id": theirs[kind]}, barrier)
                never = await _first_answer(ws, query, {"t": mine, "id": random_id(kind)}, barrier)
            if seen != never:
                differing.append((name, seen, never))
    finally:
        await ws.close()
    assert differing == []
    # Nothing of A's changed: its approval is still pending, its thread keeps its title.
    state = (await client.gql(PENDING, {"t": theirs["Thread"]}))["thread"]["pendingRequests"]
    assert [r["id"] for r in state] == [theirs["RuntimeRequest"]]


async def test_every_keyed_mutation_key_belongs_to_its_tenant(client: Client, database_url: str) -> None:
    a = await make_project(client, "A")
    b = await make_project(client, "B")
    tokens = {"a": create_token(database_url, "operate", a)[1], "b": create_token(database_url, "operate", b)[1]}
    threads = {p: (await make_thread(client, pid, p))["id"] for p, pid in (("a", a), ("b", b))}
    projects = {"a": a, "b": b}
    calls = [
        ("$p", "createThread(input: {projectId: $p, clientMutationId: $k}) { thread { id } "),
        ("$t", 'renameThread(input: {threadId: $t, title: "x", clientMutationId: $k}) { thread { id } '),
        ("$t", "stopThread(input: {threadId: $t, clientMutationId: $k}) { thread { id } "),
        ("$t", "resumeQueue(input: {threadId: $t, clientMutationId: $k}) { thread { id } "),
        ("$t", "archiveThread(input: {threadId: $t, clientMutationId: $k}) { thread { id } "),
        ("$t", "unarchiveThread(input: {threadId: $t, clientMutationId: $k}) { thread { id } "),
        ("$t", 'sendMessage(input: {threadId: $t, text: "@reply hi", clientMessageId: $k}) { run { id } '),
        ("$t", 'delegateTask(input: {threadId: $t, text: "@reply hi", clientMutationId: $k}) { thread { id } '),
    ]
    refused = []
    for index, (var, call) in enumerate(calls):
        key = f"k-{index}"
        mutation = f"mutation({var}: ID!, $k: String) {{ m: {call} {ERRORS} }} }}"
        for tenant in ("a", "b"):
            target = projects[tenant] if var == "$p" else threads[tenant]
            body = await client.gql(mutation, {var[1:]: target, "k": key}, token=tokens[tenant])
            if body["m"]["userErrors"]:
                refused.append((tenant, call.split("(")[0], body["m"]["userErrors"]))
    assert refused == []


READ_MUTATION = 'mutation($t: ID!) { renameThread(input: {threadId: $t, title: "evil"}) { userErrors { code } } }'


async def test_read_token_mutation_over_websocket_and_subscription_over_get(
    client: Client, server: ServerProcess, database_url: str
) -> None:
    project = await make_project(client)
    thread = (await make_thread(client, project, "before"))["id"]
    reader = create_token(database_url, "read", project)[1]
    ws = await WsClient.connect(server.url, reader)
    try:
        op = await ws.subscribe(READ_MUTATION, {"t": thread})
        message = await ws.receive()
        assert message["id"] == op
        assert message["type"] in ("next", "error") and '"FORBIDDEN"' in orjson.dumps(message).decode(), message
    finally:
        await ws.close()
    title = await client.gql("query($t: ID!) { thread(id: $t) { title } }", {"t": thread})
    assert title["thread"]["title"] == "before"

    subscription = "subscription($t: ID!) { threadEvents(threadId: $t) { sequence } }"
    async with httpx.AsyncClient(base_url=server.url, timeout=10) as http:
        got = await http.get(
            "/graphql",
            params={"query": subscription, "variables": orjson.dumps({"t": thread}).decode()},
            headers={"authorization": f"Bearer {reader}", "accept": "application/json"},
        )
    assert got.status_code == 400, got.text
    assert got.json()["errors"][0]["extensions"]["code"] == "SUBSCRIPTION_OVER_HTTP"


async def test_deep_nesting_is_a_coded_refusal(client: Client, server: ServerProcess) -> None:
    project = await make_project(client)
    thread = (await make_thread(client, project))["id"]
    depth = 3000
    query = "query($t: ID!) { thread(id: $t) { " + "project { id " * depth + "}" * depth + " } }"
    response = await client.post(query, {"t": thread})
    assert response.status_code in (200, 400), response.status_code
    codes = [e.get("extensions", {}).get("code") for e in response.json().get("errors") or []]
    assert codes and "INTERNAL_SERVER_ERROR" not in codes, response.text[:500]
    assert (await client.gql("{ viewer { scope } }")) == {"viewer": {"scope": "ADMIN"}}
    assert "Traceback" not in "\n".join(server.log)


async def test_workspace_root_edge_cases(client: Client, data_dir: Path, tmp_path: Path) -> None:
    create = (
        'mutation($root: String!) { createProject(input: {name: "p", workspaceRoot: $root}) '
        "{ project { id workspaceRoot } userErrors { code field } } }"
    )
    base = Path(workspace(tmp_path, "projects"))
    first = workspace(base, "first")
    assert (await client.gql(create, {"root": first}))["createProject"]["userErrors"] == []
    to_root = base / "to-root"
    to_root.symlink_to("/")
    to_first_inner = base / "to-first"
    to_first_inner.symlink_to(first)
    cases = {
        str(to_root): "INVALID_WORKSPACE_ROOT",
        str(to_root) + "/": "INVALID_WORKSPACE_ROOT",
        "//": "INVALID_WORKSPACE_ROOT",
        "/proc/self/root": "INVALID_WORKSPACE_ROOT",
        "relative/path": "INVALID_INPUT",
        ".": "INVALID_INPUT",
        "/tmp/": "INVALID_WORKSPACE_ROOT",
        "/home/../etc": "INVALID_WORKSPACE_ROOT",
        str(data_dir) + "/": "INVALID_WORKSPACE_ROOT",
        str(data_dir.parent) + "/.": "INVALID_WORKSPACE_ROOT",
        first + "/": "WORKSPACE_OVERLAPS",
        first + "//": "WORKSPACE_OVERLAPS",
        str(to_first_inner) + "/": "WORKSPACE_OVERLAPS",
        "/x\x00y": "INVALID_INPUT",
    }
    wrong = {}
    for root, code in cases.items():
        response = await client.post(create, {"root": root})
        body = response.json()
        payload = (body.get("data") or {}).get("createProject") or {}
        got = [e["code"] for e in payload.get("userErrors") or []] or [
            e.get("extensions", {}).get("code") for e in body.get("errors") or []
        ]
        if got != [code]:
            wrong[root] = (got, payload.get("project"))
    assert wrong == {}, "\n".join(f"{k!r}: {v}" for k, v in wrong.items())


@pytest.fixture
def replay_server(database_url: str, tmp_path: Path) -> Any:
    server = ServerProcess(database_url, tmp_path / "data", env={"THREADLOOM_MAX_REPLAY": "3"}).wait_ready()
    yield server
    server.stop()
    print(server.report(40))


async def test_activities_replay_is_bounded(replay_server: ServerProcess) -> None:
    client = Client(replay_server.url, replay_server.admin_token)
    ws = await WsClient.connect(replay_server.url, client.token)
    try:
        project = await make_project(client)
        thread = (await make_thread(client, project))["id"]
        for text in ("@reply one", "@reply two", "@reply three"):
            await finished(client, (await send(client, thread, text))["run"]["id"])
        op = await ws.subscribe(
            """subscription($t: ID!) { activities(threadId: $t, afterSequence: 0) {
              __typename ... on ReloadRequired { sequence } ... on Activity { sequence } } }""",
            {"t": thread},
        )
        first = await ws.receive()
        assert first["id"] == op and first["payload"]["data"]["activities"]["__typename"] == "ReloadRequired", first
        assert await ws.receive() == {"id": op, "type": "complete"}
    finally:
        await ws.close()
        await client.aclose()

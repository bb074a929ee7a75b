"""Live views grouped the way dashboards draw them, through a real server and real websockets: a run's status
and its execution graph without a thread, event and activity streams of a project, a run or a node's subtree
(a subagent's own work included), each resumed by its cursor with nothing missed or repeated (compared with
the log in PostgreSQL), and another project's token refused at subscribe with a twin that succeeds.
"""

from __future__ import annotations

import uuid
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient
from threadloom.api.feed_cursor import decode_feed_cursor
from threadloom.api.ids import decode
from threadloom.store import tables as t
from threadloom.store.db import Database

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

EVENTS = """subscription($p: ID, $t: ID, $r: ID, $n: ID, $d: Boolean, $after: String, $seq: Int) {
  threadEvents(projectId: $p, threadId: $t, runId: $r, nodeId: $n, includeDescendants: $d, after: $after,
               afterSequence: $seq) { sequence type cursor runId nodeId } }"""
ACTIVITIES = """subscription($p: ID, $r: ID, $n: ID, $d: Boolean, $after: String) {
  activities(projectId: $p, runId: $r, nodeId: $n, includeDescendants: $d, after: $after) {
    __typename ... on Activity { id sequence kind nodeId } ... on ReloadRequired { sequence cursor } } }"""
GRAPH = """subscription($r: ID!, $after: Int) { executionGraph(runId: $r, afterSequence: $after) {
  sequence type nodeId parentNodeId kind status createdAt completedAt } }"""
RUN_STATUS = "subscription($r: ID!) { runStatus(runId: $r) { sequence status run { id } } }"
GRAPH_QUERY = """query($r: ID!) { run(id: $r) { executionGraph { nodes {
  id kind status createdAt completedAt parent { id } } } } }"""
RENAME = "mutation($t: ID!, $n: String!) { renameThread(input: {threadId: $t, title: $n}) { userErrors { code } } }"


def uid(gid: str) -> uuid.UUID:
    found = decode(gid)
    assert found is not None, gid
    return found[1]


async def project(client: Client, tmp_path: Path, name: str = "p") -> str:
    data = await client.gql(CREATE_PROJECT, {"name": name, "root": workspace(tmp_path, name)})
    return str(data["createProject"]["project"]["id"])


async def thread(client: Client, project_id: str, title: str = "T") -> str:
    return str((await make_thread(client, project_id, title))["id"])


async def log(database_url: str, **where: uuid.UUID) -> list[sa.RowMapping]:
    """Thread events (`project_id`, `thread_id` or `run_id` as given) in feed order: what a stream must deliver."""
    columns = (
        "thread_id",
        "sequence",
        "xid",
        "position",
        "event_type",
        "entity_type",
        "entity_id",
        "run_id",
        "node_id",
    )
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            return await r.rows(
                sa.select(*(t.events.c[c] for c in columns))
                .where(t.events.c.thread_id.is_not(None), *(t.events.c[k] == v for k, v in where.items()))
                .order_by(t.events.c.xid, t.events.c.position)
            )
    finally:
        await db.dispose()


def position(item: dict[str, Any]) -> int:
    return decode_feed_cursor(item["cursor"])[1]


# Per socket: messages of its other operations, kept for them. Keyed by the client itself, not `id(ws)`: a later
# test's client could get a closed one's id and take its leftovers (a stale `complete` for an op of the same id).
_HELD: weakref.WeakKeyDictionary[WsClient, dict[str, list[dict[str, Any]]]] = weakref.WeakKeyDictionary()


async def _message(ws: WsClient, op: str) -> dict[str, Any]:
    """The next message of one operation; those of the socket's other operations are kept for them."""
    held = _HELD.setdefault(ws, {})
    if held.get(op):
        return held[op].pop(0)
    while True:
        message = await ws.receive()
        if message.get("id") == op:
            return message
        held.setdefault(str(message.get("id")), []).append(message)


async def take(ws: WsClient, op: str, stop: Callable[[dict[str, Any]], bool]) -> list[dict[str, Any]]:
    """The items of one operation up to and including the first `stop` accepts (errors fail the test)."""
    items: list[dict[str, Any]] = []
    while True:
        message = await _message(ws, op)
        assert message["type"] == "next" and not message["payload"].get("errors"), message
        items.append(next(iter(message["payload"]["data"].values())))
        if stop(items[-1]):
            return items


def drop(ws: WsClient) -> None:
    """The client's connection drops mid-stream (no closing handshake, frames in flight lost)."""
    ws.ws.transport.abort()


def synced(item: dict[str, Any]) -> bool:
    return item.get("type") in ("synchronized", "SYNCHRONIZED")


async def first_error(ws: WsClient, op: str) -> str:
    message = await _message(ws, op)
    assert message["type"] in ("next", "error"), message
    errors = message["payload"]["errors"] if message["type"] == "next" else message["payload"]
    return str(errors[0]["extensions"]["code"])


async def graph_nodes(client: Client, run_id: str) -> dict[str, dict[str, Any]]:
    nodes = (await client.gql(GRAPH_QUERY, {"r": run_id}))["run"]["executionGraph"]["nodes"]
    return {
        n["id"]: {
            "parentNodeId": n["parent"] and n["parent"]["id"],
            "kind": n["kind"],
            "status": n["status"],
            "createdAt": n["createdAt"],
            "completedAt": n["completedAt"],
        }
        for n in nodes
    }


def drawing(item: dict[str, Any]) -> dict[str, Any]:
    return {k: item[k] for k in ("parentNodeId", "kind", "status", "createdAt", "completedAt")}


async def test_execution_graph_starts_with_the_whole_graph_then_each_change_and_resumes_exactly(
    client: Client, server: ServerProcess, tmp_path: Path, database_url: str
) -> None:
    thread_id = await thread(client, await project(client, tmp_path))
    sent = await send(client, thread_id, "@await go\n@tool echo hi\n@subagent @write note.txt hello\n@reply done")
    run_id = sent["run"]["id"]
    await until(lambda: _running(client, run_id))
    ws = await WsClient.connect(server.url, client.token)
    try:
        op = await ws.subscribe(GRAPH, {"r": run_id})
        snapshot = await take(ws, op, synced)
        # Held at the gate, the graph cannot move: the snapshot is the graph a query reads.
        assert {i["nodeId"]: drawing(i) for i in snapshot[:-1]} == await graph_nodes(client, run_id)
        assert {i["type"] for i in snapshot[:-1]} == {"SNAPSHOT"}
        (Path(workspace(tmp_path, "p")) / "go").touch()
        assert (await finished(client, run_id))["status"] == "COMPLETED"
        final = await graph_nodes(client, run_id)
        root = next(node for node, shape in final.items() if shape["parentNodeId"] is None)
        changes = await take(ws, op, lambda i: i["nodeId"] == root and i["status"] == "COMPLETED")
    finally:
        await ws.close()
    assert {i["type"] for i in changes} == {"CHANGE"}
    held: dict[str, dict[str, Any]] = {i["nodeId"]: drawing(i) for i in snapshot[:-1]}
    for item in changes:
        assert held.get(item["nodeId"]) != drawing(item), f"an item that changes nothing: {item}"
        held[item["nodeId"]] = drawing(item)
    assert held == final  # every node, each as it ended: nothing missed
    kinds = {shape["kind"] for shape in final.values()}
    assert {"ROOT_TURN", "TOOL_CALL", "SUBAGENT"} <= kinds
    node_rows = {
        r["sequence"] for r in await log(database_url, run_id=uid(run_id)) if r["entity_type"] == "execution_node"
    }
    assert {i["sequence"] for i in changes} <= node_rows
    # Resumed after any item: exactly the changes that followed it, then the marker.
    cut = changes[len(changes) // 2]["sequence"]
    again = await WsClient.connect(server.url, client.token)
    try:
        op2 = await again.subscribe(GRAPH, {"r": run_id, "after": cut})
        resumed = await take(again, op2, synced)
    finally:
        await again.close()
    assert resumed[:-1] == [i for i in changes if i["sequence"] > cut]
    assert resumed[-1]["sequence"] >= changes[-1]["sequence"]


async def _running(client: Client, run_id: str) -> bool | None:
    found = await client.gql("query($r: ID!) { run(id: $r) { status } }", {"r": run_id})
    return True if found["run"]["status"] == "RUNNING" else None


async def test_run_status_by_run_alone_and_streams_by_run_resume_by_cursor_exactly(
    client: Client, server: ServerProcess, tmp_path: Path, database_url: str
) -> None:
    thread_id = await thread(client, await project(client, tmp_path))
    first = await send(client, thread_id, "@tool echo one\n@reply one")
    await finished(client, first["run"]["id"])
    sent = await send(client, thread_id, "@await go\n@tool echo two\n@reply two")
    run_id = sent["run"]["id"]
    await until(lambda: _running(client, run_id))
    ws = await WsClient.connect(server.url, client.token)
    try:
        status_op = await ws.subscribe(RUN_STATUS, {"r": run_id})
        events_op = await ws.subscribe(EVENTS, {"r": run_id})
        whole_op = await ws.subscribe(EVENTS, {"t": thread_id})  # the thread's stream (the fast path serves it)
        activities_op = await ws.subscribe(ACTIVITIES, {"r": run_id})
        current = await take(ws, status_op, lambda i: True)
        assert [(i["run"]["id"], i["status"]) for i in current] == [(run_id, "RUNNING")]
        replayed = await take(ws, events_op, synced)
        (Path(workspace(tmp_path, "p")) / "go").touch()
        assert (await finished(client, run_id))["status"] == "COMPLETED"
        rows = await log(database_url, run_id=uid(run_id))
        live = await take(ws, events_op, lambda i: i["sequence"] == rows[-1]["sequence"])
        whole = await take(ws, whole_op, lambda i: i["sequence"] == rows[-1]["sequence"])
        statuses = await take(ws, status_op, lambda i: i["status"] == "COMPLETED")
        activity_rows = [r for r in rows if r["entity_type"] == "activity"]
        activities = await take(ws, activities_op, lambda i: i["sequence"] == activity_rows[-1]["sequence"])
    finally:
        await ws.close()
    events = replayed[:-1] + live
    assert [position(i) for i in events] == [r["position"] for r in rows]  # the run's rows, once each, in order
    assert all(i["runId"] == run_id for i in events)
    assert [i for i in whole if i["runId"] == run_id] == events  # the same items, cursors included
    assert 0 < len(replayed) - 1 < len(rows)  # its start replayed, its end live
    assert [s["status"] for s in statuses][-1] == "COMPLETED" and "RUNNING" not in [s["status"] for s in statuses]
    assert [uid(a["id"]) for a in activities] == [r["entity_id"] for r in activity_rows]
    # Resumed by cursor (a ThreadEvent's, an Activity's id): exactly what followed it.
    k = len(events) // 2
    again = await WsClient.connect(server.url, client.token)
    try:
        op = await again.subscribe(EVENTS, {"r": run_id, "after": events[k]["cursor"]})
        tail = await take(again, op, synced)
        op2 = await again.subscribe(ACTIVITIES, {"r": run_id, "after": activities[1]["id"]})
        activity_tail = await take(again, op2, lambda i: i["sequence"] == activity_rows[-1]["sequence"])
    finally:
        await again.close()
    assert tail[:-1] == events[k + 1 :]
    assert activity_tail == activities[2:]


async def test_a_project_stream_carries_every_thread_of_its_project_and_none_of_another_resumed_by_cursor(
    client: Client, server: ServerProcess, tmp_path: Path, database_url: str
) -> None:
    mine = await project(client, tmp_path, "mine")
    other = await project(client, tmp_path, "other")
    one, two, theirs = await thread(client, mine, "one"), await thread(client, mine, "two"), await thread(client, other)
    ws = await WsClient.connect(server.url, client.token)
    try:
        op = await ws.subscribe(EVENTS, {"p": mine})
        (start,) = await take(ws, op, synced)  # no replay without a cursor: the feed's head
        runs = [await send(client, tid, f"@tool echo {i}\n@reply r{i}") for i, tid in enumerate((one, two, theirs))]
        part: list[dict[str, Any]] = []
        while len(part) < 5:  # the first rows, then the connection drops
            part += await take(ws, op, lambda i: True)
    finally:
        drop(ws)
    for sent in runs:
        await finished(client, sent["run"]["id"])
    await client.gql(RENAME, {"t": one, "n": "the end"})  # the only rename: where the comparison ends
    again = await WsClient.connect(server.url, client.token)
    try:
        op2 = await again.subscribe(EVENTS, {"p": mine, "after": part[-1]["cursor"]})
        rest = await take(again, op2, lambda i: i["type"] == "thread.renamed")
    finally:
        await again.close()
    delivered = part + [i for i in rest if not synced(i)]
    # Read once the stream has passed the end: no writer below it can still commit (the feed reads below them).
    since = decode_feed_cursor(start["cursor"])
    end = decode_feed_cursor(delivered[-1]["cursor"])
    rows = [r for r in await log(database_url, project_id=uid(mine)) if since < (r["xid"], r["position"]) <= end]
    assert [position(i) for i in delivered] == [r["position"] for r in rows]  # gapless, each once, feed order
    assert {r["thread_id"] for r in rows} == {uid(one), uid(two)}  # both threads; never the other project's


async def test_a_node_subtree_holds_a_subagent_s_own_work_and_learns_nodes_made_while_it_streams(
    client: Client, server: ServerProcess, tmp_path: Path, database_url: str
) -> None:
    thread_id = await thread(client, await project(client, tmp_path))
    sent = await send(client, thread_id, "@tool echo top\n@subagent @await go\n@reply done")
    run_id = sent["run"]["id"]

    async def subagent() -> str | None:
        nodes = await graph_nodes(client, run_id)
        return next((n for n, s in nodes.items() if s["kind"] == "SUBAGENT" and s["status"] == "RUNNING"), None)

    sub = await until(subagent)
    ws = await WsClient.connect(server.url, client.token)
    try:
        whole = await ws.subscribe(EVENTS, {"n": sub, "d": True})
        own = await ws.subscribe(EVENTS, {"n": sub})  # the twin: the node alone
        activities = await ws.subscribe(ACTIVITIES, {"n": sub, "d": True})
        replayed = await take(ws, whole, synced)
        replayed_own = await take(ws, own, synced)
        (Path(workspace(tmp_path, "p")) / "go").touch()
        assert (await finished(client, run_id))["status"] == "COMPLETED"
        nodes = await graph_nodes(client, run_id)
        under = {n for n in nodes if _under(nodes, n, sub)}
        # The subtree's rows: its nodes', and what names them (the subagent's own provider thread and turns).
        rows = [r for r in await log(database_url, thread_id=uid(thread_id)) if r["node_id"] in {uid(n) for n in under}]
        live = await take(ws, whole, lambda i: i["sequence"] == rows[-1]["sequence"])
        activity_rows = [r for r in rows if r["entity_type"] == "activity"]
        streamed_activities = await take(ws, activities, lambda i: i["sequence"] == activity_rows[-1]["sequence"])
        own_rows = [r for r in rows if r["node_id"] == uid(sub)]
        live_own = await take(ws, own, lambda i: i["sequence"] == own_rows[-1]["sequence"])
    finally:
        await ws.close()
    assert [i["sequence"] for i in replayed[:-1] + live] == [r["sequence"] for r in rows]
    assert [i["sequence"] for i in replayed_own[:-1] + live_own] == [r["sequence"] for r in own_rows]
    assert [uid(a["id"]) for a in streamed_activities] == [r["entity_id"] for r in activity_rows]
    made_later = {i["nodeId"] for i in live} - {i["nodeId"] for i in replayed}
    assert made_later and made_later <= under - {sub}  # the subagent's reply, made after the subscription began
    top = next(n for n, s in nodes.items() if s["kind"] == "TOOL_CALL" and n not in under)
    assert top not in {i["nodeId"] for i in replayed + live}


def _under(nodes: dict[str, dict[str, Any]], node: str | None, root: str) -> bool:
    while node is not None:
        if node == root:
            return True
        node = nodes[node]["parentNodeId"]
    return False


async def test_a_subagent_s_own_tool_call_is_in_its_subtree_in_replay(
    client: Client, server: ServerProcess, tmp_path: Path, database_url: str
) -> None:
    thread_id = await thread(client, await project(client, tmp_path))
    sent = await send(client, thread_id, "@tool echo top\n@subagent @write note.txt hello\n@reply done")
    run_id = sent["run"]["id"]
    assert (await finished(client, run_id))["status"] == "COMPLETED"
    nodes = await graph_nodes(client, run_id)
    sub = next(n for n, s in nodes.items() if s["kind"] == "SUBAGENT")
    ws = await WsClient.connect(server.url, client.token)
    try:
        items = await take(
            ws, await ws.subscribe(ACTIVITIES, {"n": sub, "d": True}), lambda i: i["kind"] == "subagent.completed"
        )
    finally:
        await ws.close()
    kinds = [(i["kind"], nodes[i["nodeId"]]["parentNodeId"] == sub) for i in items]
    assert ("tool.started", True) in kinds and ("file.changed", True) in kinds  # the subagent's own write
    assert all(i["nodeId"] == sub or nodes[i["nodeId"]]["parentNodeId"] == sub for i in items)


@pytest.mark.parametrize(
    ("document", "scope"),
    [
        (EVENTS, "p"),
        (EVENTS, "r"),
        (EVENTS, "n"),
        (ACTIVITIES, "r"),
        (GRAPH, "r"),
        (RUN_STATUS, "r"),
    ],
    ids=["events-by-project", "events-by-run", "events-by-node", "activities-by-run", "graph", "run-status"],
)
async def test_another_project_s_token_is_refused_at_subscribe_and_its_own_project_s_is_served(
    client: Client, server: ServerProcess, tmp_path: Path, database_url: str, document: str, scope: str
) -> None:
    mine = await project(client, tmp_path, "mine")
    other = await project(client, tmp_path, "other")
    thread_id = await thread(client, mine)
    sent = await send(client, thread_id, "@reply hi")
    done = await finished(client, sent["run"]["id"])
    ids = {"p": mine, "r": sent["run"]["id"], "n": done["rootNode"]["id"]}
    _, stranger = create_token(database_url, "read", other)
    _, member = create_token(database_url, "read", mine)
    ws = await WsClient.connect(server.url, stranger)
    try:
        assert await first_error(ws, await ws.subscribe(document, {scope: ids[scope]})) == "NOT_FOUND"
    finally:
        await ws.close()
    twin = await WsClient.connect(server.url, member)
    try:
        if scope == "p":  # a project stream starts at the head: give it something to carry
            op = await twin.subscribe(document, {scope: ids[scope]})
            await take(twin, op, synced)
            await client.gql(RENAME, {"t": thread_id, "n": "seen"})
        else:
            op = await twin.subscribe(document, {scope: ids[scope]})
        replays = document in (EVENTS, GRAPH) and scope != "p"  # read to the marker: nothing left unread
        items = await take(twin, op, synced if replays else lambda i: not synced(i))  # (take fails on an error)
    finally:
        await twin.close()
    assert [i for i in items if not synced(i) and (i.get("sequence") or i.get("run") or i.get("nodeId"))]


@pytest.mark.own_server  # a server of its own with THREADLOOM_MAX_REPLAY, on a database of its own
async def test_replays_past_the_bound_are_told_to_reload(database_url: str, tmp_path: Path) -> None:
    server = ServerProcess(database_url, tmp_path / "d", env={"THREADLOOM_MAX_REPLAY": "3"}).wait_ready()
    client = Client(server.url, server.admin_token)
    try:
        mine = await project(client, tmp_path)
        thread_id = await thread(client, mine)
        ws = await WsClient.connect(server.url, client.token)
        try:
            op = await ws.subscribe(EVENTS, {"p": mine})
            (head,) = await take(ws, op, synced)
            sent = await send(client, thread_id, "@tool echo a\n@reply b")
            await finished(client, sent["run"]["id"])
            rows = await log(database_url, thread_id=uid(thread_id))
            events = await take(ws, op, lambda i: position(i) == rows[-1]["position"])
            assert len(events) > 3  # live rows are never bounded
            cases = [
                (EVENTS, {"p": mine, "after": head["cursor"]}),
                (EVENTS, {"r": sent["run"]["id"]}),
                (ACTIVITIES, {"p": mine, "after": head["cursor"]}),
            ]
            for document, variables in cases:
                (item,) = await take(ws, await ws.subscribe(document, variables), lambda i: True)
                assert item.get("type") == "reload_required" or item.get("__typename") == "ReloadRequired", item
                if "p" in variables:
                    assert decode_feed_cursor(item["cursor"]) >= (rows[-1]["xid"], rows[-1]["position"])
            # The execution graph starts again from its snapshot instead.
            graph = await take(ws, await ws.subscribe(GRAPH, {"r": sent["run"]["id"], "after": 0}), synced)
            assert {i["type"] for i in graph[:-1]} == {"SNAPSHOT"} and len(graph) > 2
        finally:
            await ws.close()
    finally:
        server.stop()


COSTLY = {
    "executionGraph": """subscription($r: ID!) { executionGraph(runId: $r) { node {
        children { children { children { children { id } } } } } } }""",
    "threadEvents by project": """subscription($p: ID!) { threadEvents(projectId: $p) { entity { ... on Thread {
        runs(first: 100) { nodes { attempts { rootNode { children { children { id } } } } } } } } } }""",
}


@pytest.mark.parametrize("name", list(COSTLY))
async def test_the_cost_rule_prices_the_new_views_before_anything_is_streamed(
    client: Client, server: ServerProcess, tmp_path: Path, name: str
) -> None:
    mine = await project(client, tmp_path)
    sent = await send(client, await thread(client, mine), "@reply hi")
    ws = await WsClient.connect(server.url, client.token)
    try:
        op = await ws.subscribe(COSTLY[name], {"r": sent["run"]["id"], "p": mine})
        assert await first_error(ws, op) == "QUERY_TOO_COSTLY"
        # The twin: the same view with a shallow selection is served.
        cheap = GRAPH if name == "executionGraph" else EVENTS
        assert await take(ws, await ws.subscribe(cheap, {"r": sent["run"]["id"], "p": mine}), synced)
    finally:
        await ws.close()


async def test_a_project_marker_s_cursor_resumes_even_before_the_project_has_a_thread(
    client: Client, server: ServerProcess, tmp_path: Path, database_url: str
) -> None:
    """A fresh project's feed head is the project's own event, which no thread holds: its cursor still resumes.

    The thread's creation comes in the replay or, when a transaction still open elsewhere in the database holds
    the feed's horizon back (a project feed reads only events no in-flight writer can precede), live right after
    `synchronized`: either way once, and nothing from before the cursor."""
    mine = await project(client, tmp_path)
    ws = await WsClient.connect(server.url, client.token)
    try:
        (head,) = await take(ws, await ws.subscribe(EVENTS, {"p": mine}), synced)
        thread_id = await thread(client, mine)
        op = await ws.subscribe(EVENTS, {"p": mine, "after": head["cursor"]})
        items = await take(ws, op, lambda item: item["type"] == "thread.created")
        if not any(synced(i) for i in items):  # it came in the replay: the replay's end follows
            items += await take(ws, op, synced)
    finally:
        await ws.close()
    assert [i["type"] for i in items] in (["thread.created", "synchronized"], ["synchronized", "thread.created"])
    (created,) = await log(database_url, thread_id=uid(thread_id))
    [event] = [i for i in items if not synced(i)]
    assert position(event) == created["position"]


async def test_an_event_behind_an_open_writer_comes_live_after_the_replay_once(
    client: Client, server: ServerProcess, tmp_path: Path, database_url: str, pg: PgServer
) -> None:
    """The other order of the test above, made certain: a transaction open elsewhere (it holds an xid) keeps the
    thread's creation out of the replay, which ends without it; once the writer is gone the creation comes live,
    once, before what follows it."""
    mine = await project(client, tmp_path)
    ws = await WsClient.connect(server.url, client.token)
    writer = await pg.connect(database_url)
    try:
        (head,) = await take(ws, await ws.subscribe(EVENTS, {"p": mine}), synced)
        open_writer = writer.transaction()
        await open_writer.start()
        await writer.fetchval("SELECT txid_current()")  # an xid of its own, older than the thread's
        thread_id = await thread(client, mine)
        op = await ws.subscribe(EVENTS, {"p": mine, "after": head["cursor"]})
        assert [i["type"] for i in await take(ws, op, synced)] == ["synchronized"]
        await open_writer.rollback()
        await client.gql(RENAME, {"t": thread_id, "n": "after"})  # a wake-up for the feed
        live = await take(ws, op, lambda item: item["type"] == "thread.renamed")
    finally:
        await writer.close()
        await ws.close()
    assert [i["type"] for i in live] == ["thread.created", "thread.renamed"]


async def test_a_cursor_of_another_thread_is_refused_and_its_own_thread_s_is_taken(
    client: Client, server: ServerProcess, tmp_path: Path
) -> None:
    mine = await project(client, tmp_path)
    one, two = await thread(client, mine, "one"), await thread(client, mine, "two")
    ws = await WsClient.connect(server.url, client.token)
    try:
        (first,) = await take(ws, await ws.subscribe(EVENTS, {"t": one}), lambda i: True)
        refused = await ws.subscribe(EVENTS, {"t": two, "after": first["cursor"]})
        assert await first_error(ws, refused) == "INVALID_CURSOR"
        await client.gql(RENAME, {"t": one, "n": "renamed"})
        taken = await take(ws, await ws.subscribe(EVENTS, {"t": one, "after": first["cursor"]}), synced)
    finally:
        await ws.close()
    assert [i["type"] for i in taken] == ["thread.renamed", "synchronized"]

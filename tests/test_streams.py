"""Live subscriptions through real uvicorn processes, real websockets and real PostgreSQL."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.ws import WsClient
from threadloom.api.ids import decode
from threadloom.store import tables as t
from threadloom.store.db import Database

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

EVENTS = """subscription($t: ID!, $after: Int, $run: ID, $node: ID) {
  threadEvents(threadId: $t, afterSequence: $after, runId: $run, nodeId: $node) {
    sequence type runId nodeId entity { __typename ... on Run { status } }
  }
}"""
RENAME = "mutation($t: ID!, $n: String!) { renameThread(input: {threadId: $t, title: $n}) { userErrors { code } } }"


@pytest.fixture
async def thread_id(client: Client, tmp_path: Path) -> str:
    data = await client.gql(CREATE_PROJECT, {"name": "Live", "root": workspace(tmp_path)})
    return str((await make_thread(client, data["createProject"]["project"]["id"], "live"))["id"])


async def log_rows(database_url: str, thread_gid: str) -> list[sa.RowMapping]:
    found = decode(thread_gid)
    assert found is not None
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            return await r.rows(
                sa.select(*(t.events.c[c] for c in ("sequence", "event_type", "entity_type", "run_id", "node_id")))
                .where(t.events.c.thread_id == found[1])
                .order_by(t.events.c.sequence)
            )
    finally:
        await db.dispose()


async def collect(ws: WsClient, op: str, until_sequence: int, within: float = 30.0) -> list[dict[str, Any]]:
    """`next` payloads of one operation until an item reaches `until_sequence` (markers included)."""
    items: list[dict[str, Any]] = []
    while True:
        message = await ws.receive(within)
        if message.get("id") != op:
            continue
        assert message["type"] == "next", message
        item = next(iter(message["payload"]["data"].values()))
        items.append(item)
        if item["sequence"] >= until_sequence and item["type"] != "synchronized":
            return items


async def until_synchronized(ws: WsClient, op: str) -> list[dict[str, Any]]:
    """Replayed items of one operation, up to (not including) its `synchronized` marker."""
    items: list[dict[str, Any]] = []
    while True:
        message = await ws.receive()
        if message.get("id") != op:
            continue
        item = next(iter(message["payload"]["data"].values()))
        if item.get("type") == "synchronized":
            return items
        items.append(item)


async def latest(client: Client, thread_id: str) -> int:
    data = await client.gql("query($t: ID!) { thread(id: $t) { latestSequence } }", {"t": thread_id})
    return int(data["thread"]["latestSequence"])


async def test_replay_synchronized_then_live(client: Client, server: ServerProcess, thread_id: str) -> None:
    ws = await WsClient.connect(server.url, client.token)
    try:
        op = await ws.subscribe(EVENTS, {"t": thread_id})
        first = await ws.receive()
        assert first["payload"]["data"]["threadEvents"]["type"] == "thread.created"
        marker = await ws.receive()
        assert marker["payload"]["data"]["threadEvents"] == {
            "sequence": 1,
            "type": "synchronized",
            "runId": None,
            "nodeId": None,
            "entity": None,
        }
        await client.gql(RENAME, {"t": thread_id, "n": "renamed"})
        live = await ws.receive()
        assert live["id"] == op
        assert live["payload"]["data"]["threadEvents"]["sequence"] == 2
        assert live["payload"]["data"]["threadEvents"]["type"] == "thread.renamed"
        assert live["payload"]["data"]["threadEvents"]["entity"] == {"__typename": "Thread"}
    finally:
        await ws.close()


async def test_resume_gets_exactly_what_was_missed(
    client: Client, server: ServerProcess, thread_id: str, database_url: str
) -> None:
    ws = await WsClient.connect(server.url, client.token)
    sent = await send(client, thread_id, "@delay 40\n@reply one two three four five six seven eight")
    op = await ws.subscribe(EVENTS, {"t": thread_id})
    seen: list[int] = []
    while len(seen) < 6:  # part of the run, then drop the connection mid-run
        message = await ws.receive()
        item = message["payload"]["data"]["threadEvents"]
        if item["type"] != "synchronized":
            seen.append(item["sequence"])
    await ws.close()
    assert message["id"] == op
    await finished(client, sent["run"]["id"])
    await client.gql(RENAME, {"t": thread_id, "n": "after"})
    again = await WsClient.connect(server.url, client.token)
    try:
        op2 = await again.subscribe(EVENTS, {"t": thread_id, "after": seen[-1]})
        end = await latest(client, thread_id)
        replayed = [i["sequence"] for i in await until_synchronized(again, op2)]
        assert replayed[-1] == end
        await client.gql(RENAME, {"t": thread_id, "n": "live"})
        live = await collect(again, op2, end + 1)
    finally:
        await again.close()
    union = seen + replayed + [i["sequence"] for i in live]
    assert union == [r["sequence"] for r in await log_rows(database_url, thread_id)]  # exactly once, in order


async def test_filters_match_the_log_in_replay_and_live(
    client: Client, server: ServerProcess, thread_id: str, database_url: str
) -> None:
    first = await send(client, thread_id, "@tool echo a\n@reply done")
    await finished(client, first["run"]["id"])
    run = await client.gql(
        "query($r: ID!) { run(id: $r) { id rootNode { id children { id kind } } } }", {"r": first["run"]["id"]}
    )
    tool = next(c for c in run["run"]["rootNode"]["children"] if c["kind"] == "TOOL_CALL")
    ws = await WsClient.connect(server.url, client.token)
    try:
        by_run = await ws.subscribe(EVENTS, {"t": thread_id, "run": run["run"]["id"]})
        by_node = await ws.subscribe(EVENTS, {"t": thread_id, "node": tool["id"]})
        nothing = await ws.subscribe(EVENTS, {"t": thread_id, "run": thread_id})  # a Thread id: matches nothing
        got: dict[str, list[int]] = {by_run: [], by_node: [], nothing: []}
        synced: set[str] = set()
        while len(synced) < 3:
            message = await ws.receive()
            item = message["payload"]["data"]["threadEvents"]
            if item["type"] == "synchronized":
                synced.add(message["id"])
            else:
                got[message["id"]].append(item["sequence"])
    finally:
        await ws.close()
    rows = await log_rows(database_url, thread_id)
    run_uuid = decode(run["run"]["id"])[1]  # type: ignore[index]
    node_uuid = decode(tool["id"])[1]  # type: ignore[index]
    assert got[by_run] == [r["sequence"] for r in rows if r["run_id"] == run_uuid]
    assert got[by_node] == [r["sequence"] for r in rows if r["node_id"] == node_uuid]
    assert got[nothing] == []


async def test_live_filter_by_run(
    client: Client, server: ServerProcess, thread_id: str, database_url: str, tmp_path: Path
) -> None:
    ws = await WsClient.connect(server.url, client.token)
    try:
        # Held at a gate until the subscription has replayed and gone live: the reply is certainly filtered live.
        sent = await send(client, thread_id, "@await go\n@reply a b c d e")
        op = await ws.subscribe(EVENTS, {"t": thread_id, "run": sent["run"]["id"]})
        replayed = await until_synchronized(ws, op)
        (Path(workspace(tmp_path)) / "go").touch()
        done = await finished(client, sent["run"]["id"])
        assert done["status"] == "COMPLETED"
        rows = [r for r in await log_rows(database_url, thread_id) if r["run_id"] == decode(sent["run"]["id"])[1]]  # type: ignore[index]
        live = await collect(ws, op, rows[-1]["sequence"])
    finally:
        await ws.close()
    items = [i for i in replayed + live if i["type"] != "synchronized"]
    assert [i["sequence"] for i in items] == [r["sequence"] for r in rows]
    assert all(i["runId"] == sent["run"]["id"] for i in items)
    replayed_rows = len([i for i in replayed if i["type"] != "synchronized"])
    assert 0 < replayed_rows < len(rows)  # the run's start replayed, its reply and end came through the live filter


async def test_fanout_to_many_subscribers(client: Client, server: ServerProcess, thread_id: str) -> None:
    sockets = [await WsClient.connect(server.url, client.token) for _ in range(20)]
    try:
        ops = []
        for ws in sockets:  # 20 sockets x 10 subscriptions = 200 subscribers
            ops.append([await ws.subscribe(EVENTS, {"t": thread_id}) for _ in range(10)])
        for i in range(10):
            await client.gql(RENAME, {"t": thread_id, "n": f"n{i}"})
        end = await latest(client, thread_id)

        async def drain(ws: WsClient, wanted: list[str]) -> dict[str, list[int]]:
            got: dict[str, list[int]] = {op: [] for op in wanted}
            while any(not seqs or seqs[-1] < end for seqs in got.values()):
                message = await ws.receive()
                item = message["payload"]["data"]["threadEvents"]
                if item["type"] != "synchronized":
                    got[message["id"]].append(item["sequence"])
            return got

        results = await asyncio.gather(*(drain(ws, wanted) for ws, wanted in zip(sockets, ops, strict=True)))
    finally:
        for ws in sockets:
            await ws.close()
    sequences = [seqs for result in results for seqs in result.values()]
    assert len(sequences) == 200
    assert all(seqs == list(range(1, end + 1)) for seqs in sequences)


async def test_subscriptions_refuse_missing_wrong_or_other_project_tokens(
    client: Client, server: ServerProcess, thread_id: str, database_url: str, tmp_path: Path
) -> None:
    import websockets

    from tests.support.cli import create_token

    for payload in ({}, {"authorization": "Bearer tl_wrong"}):
        with pytest.raises(websockets.ConnectionClosed) as closed:
            ws = await WsClient.connect(server.url, None, payload=payload)
            await ws.receive()
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 4403
    other = await client.gql(CREATE_PROJECT, {"name": "other", "root": workspace(tmp_path, "o")})
    _, token = create_token(database_url, "read", other["createProject"]["project"]["id"])
    ws = await WsClient.connect(server.url, token)
    try:
        op = await ws.subscribe(EVENTS, {"t": thread_id})
        message = await ws.receive()
        assert message["id"] == op and message["type"] == "next"
        assert message["payload"]["data"] is None
        assert message["payload"]["errors"][0]["extensions"]["code"] == "NOT_FOUND"
    finally:
        await ws.close()


async def test_run_status_and_activity_streams(client: Client, server: ServerProcess, thread_id: str) -> None:
    ws = await WsClient.connect(server.url, client.token)
    try:
        status_op = await ws.subscribe(
            # From the start of the log: without a cursor runStatus starts from the current state, which
            # would race with the run this test sends.
            "subscription($t: ID!) { runStatus(threadId: $t, afterSequence: 0) { sequence status run { id ordinal } } }",  # noqa: E501
            {"t": thread_id},
        )
        activity_op = await ws.subscribe(
            "subscription($t: ID!) { activities(threadId: $t) { ... on Activity { sequence kind runId nodeId } } }",
            {"t": thread_id},
        )
        sent = await send(client, thread_id, "@tool echo hi\n@reply ok")
        statuses: list[str] = []
        kinds: list[dict[str, Any]] = []
        while statuses[-1:] != ["COMPLETED"] or not kinds or kinds[-1]["kind"] != "run.completed":
            message = await ws.receive()
            data = message["payload"]["data"]
            if message["id"] == status_op:
                assert data["runStatus"]["run"]["id"] == sent["run"]["id"]
                statuses.append(data["runStatus"]["status"])
            elif message["id"] == activity_op:
                kinds.append(data["activities"])
    finally:
        await ws.close()
    assert statuses[0] == "QUEUED" and statuses[-1] == "COMPLETED"
    assert "RUNNING" in statuses and len(statuses) == len(set(statuses))  # each change once
    assert [k["kind"] for k in kinds][:1] == ["run.preparing"]
    assert {"tool.started", "tool.completed", "checkpoint.captured"} <= {k["kind"] for k in kinds}
    assert all(k["runId"] == sent["run"]["id"] and k["nodeId"] for k in kinds)
    sequences = [k["sequence"] for k in kinds]
    assert sequences == sorted(sequences)


async def _spoil_event(database_url: str, thread_id: str, sequence: int) -> None:
    """The event's payload loses everything its entity needs (as an upgrade that forgot to rewrite it would)."""
    found = decode(thread_id)
    assert found is not None
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.transaction() as tx:
            await tx.execute(
                sa.update(t.events)
                .where(t.events.c.thread_id == found[1], t.events.c.sequence == sequence)
                .values(payload={"unexpected": True})
            )
    finally:
        await db.dispose()


async def _until_the_end(ws: WsClient, op: str) -> tuple[list[int], dict[str, Any]]:
    """Sequences delivered to one operation, and its last payload's error (it must end with one)."""
    delivered: list[int] = []
    while True:
        message = await ws.receive()
        if message.get("id") != op:
            continue
        assert message["type"] == "next", f"ended without saying why: {message}"
        if message["payload"].get("errors"):
            return delivered, message["payload"]["errors"][0]
        delivered.append(message["payload"]["data"]["threadEvents"]["sequence"])


async def test_an_event_that_cannot_be_read_ends_a_replay_with_its_code_not_a_quiet_complete(
    client: Client, server: ServerProcess, thread_id: str, database_url: str
) -> None:
    """A log row the server cannot turn into its entity must not end a replay as if the stream were done: the
    subscriber is told (EVENT_UNREADABLE) and where it got to. Before, the replay sent `complete`."""
    await client.gql(RENAME, {"t": thread_id, "n": "second"})
    await client.gql(RENAME, {"t": thread_id, "n": "third"})
    await _spoil_event(database_url, thread_id, 2)
    ws = await WsClient.connect(server.url, client.token)
    try:
        delivered, error = await _until_the_end(ws, await ws.subscribe(EVENTS, {"t": thread_id}))
    finally:
        await ws.close()
    assert delivered == [1]
    assert (error["extensions"]["code"], error["extensions"]["resumeFrom"]) == ("EVENT_UNREADABLE", 1)
    # the twin: a thread whose log reads replays to its end and stays open
    other = str((await make_thread(client, (await _project_of(client, thread_id)), "fine"))["id"])
    ws = await WsClient.connect(server.url, client.token)
    try:
        items = await until_synchronized(ws, await ws.subscribe(EVENTS, {"t": other}))
        assert [item["sequence"] for item in items] == [1]
    finally:
        await ws.close()


async def test_a_live_event_that_cannot_be_read_ends_the_stream_with_its_code(
    client: Client, server: ServerProcess, thread_id: str, database_url: str
) -> None:
    """Live, the same: the subscriber learns the next event could not be read instead of silently missing it
    (before, the feed skipped it and the subscription went on with a gap). The server writes only readable
    events, so the test appends an unreadable copy of the thread's first event itself, then renames the thread:
    the rename's wake-up makes the feed read on, and it meets the bad event first. (A rename of another thread
    wakes only that thread's feed: this one would then find the event at its 5 s poll.) The other thread's
    stream goes on."""
    other = str((await make_thread(client, await _project_of(client, thread_id), "other"))["id"])
    ws = await WsClient.connect(server.url, client.token)
    try:
        op = await ws.subscribe(EVENTS, {"t": thread_id})
        watching_other = await ws.subscribe(EVENTS, {"t": other})  # the twin: its stream goes on
        assert [item["sequence"] for item in await until_synchronized(ws, op)] == [1]
        found = decode(thread_id)
        assert found is not None
        db = Database.from_url(database_url, pool_size=1)
        try:
            async with db.transaction() as tx:
                first = (await tx.rows(sa.select(t.events).where(t.events.c.thread_id == found[1])))[0]
                copy = {k: v for k, v in dict(first).items() if k not in ("position", "xid")}
                await tx.execute(sa.insert(t.events).values({**copy, "sequence": 2, "payload": {"unexpected": True}}))
                # the thread's counter moves past it, as the server's own append would (the next event is 3)
                await tx.execute(sa.update(t.threads).where(t.threads.c.id == found[1]).values(last_sequence=2))
        finally:
            await db.dispose()
        await client.gql(RENAME, {"t": other, "n": "renamed"})
        await client.gql(RENAME, {"t": thread_id, "n": "woken"})  # its wake-up: read at once, not at the 5 s poll
        delivered, error = await _until_the_end(ws, op)
        assert delivered == []
        assert (error["extensions"]["code"], error["extensions"]["resumeFrom"]) == ("EVENT_UNREADABLE", 1)
        await client.gql(RENAME, {"t": other, "n": "again"})  # (its first rename went by while `op` ended)
        renamed = await collect(ws, watching_other, 3)
        assert renamed[-1]["type"] == "thread.renamed"
    finally:
        await ws.close()


async def _project_of(client: Client, thread_id: str) -> str:
    data = await client.gql("query($t: ID!) { thread(id: $t) { project { id } } }", {"t": thread_id})
    return str(data["thread"]["project"]["id"])

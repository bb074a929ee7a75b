"""Runs end to end through a real server and real scripted-agent processes.

Each scenario asserts what a user sees through GraphQL and what the log holds:
per-thread sequences exactly 1..n, and projections that match the story.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.db import sequences
from tests.support.graphql import CREATE_PROJECT, make_thread
from tests.support.runs import finished, run, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from threadloom.api.ids import decode
from threadloom.store import tables as t
from threadloom.store.db import Database

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)


@pytest.fixture
async def thread_id(client: Client, workspace: Path) -> str:
    data = await client.gql(CREATE_PROJECT, {"name": "Runs", "root": str(workspace)})
    project = data["createProject"]["project"]["id"]
    return str((await make_thread(client, project, "work"))["id"])


async def _db_rows(database_url: str, stmt: Any) -> list[Any]:
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            return await r.rows(stmt)
    finally:
        await db.dispose()


async def _db_scalar(database_url: str, stmt: Any) -> Any:
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            return await r.scalar(stmt)
    finally:
        await db.dispose()


async def _assert_gapless(database_url: str, thread_id: str) -> None:
    """The thread's log holds sequences exactly 1..n (other tests' threads share the database)."""
    db = Database.from_url(database_url, pool_size=1)
    try:
        seqs = (await sequences(db)).get(_uuid(thread_id), [])
        assert seqs and seqs == list(range(1, len(seqs) + 1))
    finally:
        await db.dispose()


def _runs_of(thread_id: str) -> Any:
    """How many runs the thread has, in the database."""
    return sa.select(sa.func.count()).select_from(t.runs).where(t.runs.c.thread_id == _uuid(thread_id))


def _sessions_of(thread_id: str) -> Any:
    """The statuses of the provider sessions the thread's provider threads were ever served by, oldest first:
    a session names no thread, so they are found through the thread's provider-thread events."""
    used = sa.select(t.events.c.payload["session_id"].astext.cast(sa.Uuid)).where(
        t.events.c.thread_id == _uuid(thread_id), t.events.c.entity_type == "provider_thread"
    )
    return (
        sa.select(t.provider_sessions.c.status)
        .where(t.provider_sessions.c.id.in_(used))
        .order_by(t.provider_sessions.c.created_at, t.provider_sessions.c.id)
    )


def _uuid(gid: str) -> Any:
    found = decode(gid)
    assert found is not None
    return found[1]


async def test_a_message_runs_to_completion_with_a_gapless_log(
    client: Client, thread_id: str, database_url: str
) -> None:
    sent = await send(client, thread_id, "hello there")
    assert sent["userErrors"] == []
    assert sent["appliedDispatch"] == "START_IMMEDIATELY"
    assert sent["message"] == {"id": sent["message"]["id"], "role": "USER", "text": "hello there"}
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "COMPLETED" and done["ordinal"] == 1
    assert done["rootNode"]["kind"] == "ROOT_TURN" and done["rootNode"]["countsForRun"] is True
    assert done["rootNode"]["status"] == "COMPLETED"
    assert len(done["attempts"]) == 1
    attempt = done["attempts"][0]
    assert attempt["reason"] == "INITIAL" and attempt["status"] == "COMPLETED"
    assert [pt["status"] for pt in attempt["providerTurns"]] == ["COMPLETED"]
    messages = await client.gql(
        """query($t: ID!) { thread(id: $t) { status activeRun { id } latestSequence
             messages { edges { node { role text streaming run { id } } } }
             activities(first: 100) { edges { node { kind runId nodeId sequence } } } } }""",
        {"t": thread_id},
    )
    thread = messages["thread"]
    assert thread["status"] == "IDLE" and thread["activeRun"] is None
    assert [(m["node"]["role"], m["node"]["text"], m["node"]["streaming"]) for m in thread["messages"]["edges"]] == [
        ("USER", "hello there", False),
        ("ASSISTANT", "You said: hello there", False),
    ]
    kinds = [a["node"]["kind"] for a in thread["activities"]["edges"]]
    assert kinds[0] == "run.preparing" and kinds[-1] == "run.completed"
    assert "checkpoint.captured" in kinds and kinds.index("checkpoint.captured") < kinds.index("run.completed")
    assert all(a["node"]["runId"] == sent["run"]["id"] for a in thread["activities"]["edges"])
    assert all(a["node"]["nodeId"] for a in thread["activities"]["edges"])
    await _assert_gapless(database_url, thread_id)
    last = await _db_scalar(
        database_url, sa.select(sa.func.max(t.events.c.sequence)).where(t.events.c.thread_id == _uuid(thread_id))
    )
    assert thread["latestSequence"] == last


async def test_multi_turn_reuses_the_provider_thread(client: Client, thread_id: str, database_url: str) -> None:
    ids = []
    for text in ("one", "two", "three"):
        sent = await send(client, thread_id, text)
        ids.append(sent["run"]["id"])
        await finished(client, sent["run"]["id"])
    runs = [await run(client, i) for i in ids]
    assert [r["ordinal"] for r in runs] == [1, 2, 3]
    assert all(r["status"] == "COMPLETED" for r in runs)
    native = {r["providerThread"]["nativeThreadRef"] for r in runs}
    provider_threads = {r["providerThread"]["id"] for r in runs}
    assert len(native) == 1 and len(provider_threads) == 1
    turns = [r["attempts"][0]["providerTurns"][0]["ordinal"] for r in runs]
    assert turns == [1, 2, 3]
    await _assert_gapless(database_url, thread_id)


async def test_a_queued_run_starts_after_the_active_one(client: Client, thread_id: str, workspace: Path) -> None:
    first = await send(client, thread_id, "@await go\n@reply one two three four")  # active until the gate opens
    second = await send(client, thread_id, "next", d={"queueAfterActive": True})
    assert first["appliedDispatch"] == "START_IMMEDIATELY"
    assert second["appliedDispatch"] == "QUEUE_AFTER_ACTIVE"
    assert second["run"]["status"] == "QUEUED" and second["run"]["queuePosition"] == 1
    queue = await client.gql(
        "query($t: ID!) { thread(id: $t) { queue { id queuePosition } activeRun { id } } }", {"t": thread_id}
    )
    assert queue["thread"]["queue"] == [{"id": second["run"]["id"], "queuePosition": 1}]
    assert queue["thread"]["activeRun"] == {"id": first["run"]["id"]}
    (workspace / "go").touch()
    one = await finished(client, first["run"]["id"])
    two = await finished(client, second["run"]["id"])
    assert one["status"] == two["status"] == "COMPLETED"
    assert two["startedAt"] >= one["completedAt"]
    assert two["queuePosition"] is None
    idle = await send(client, thread_id, "nothing runs", d={"queueAfterActive": True})
    assert idle["appliedDispatch"] == "START_IMMEDIATELY"  # nothing to queue behind
    assert (await finished(client, idle["run"]["id"]))["status"] == "COMPLETED"


async def test_tool_and_write_become_tool_nodes_with_activities(
    client: Client, thread_id: str, workspace: Path
) -> None:
    sent = await send(client, thread_id, "@tool echo hi from tool\n@write notes/a.txt hello file\n@reply done")
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "COMPLETED"
    children = done["rootNode"]["children"]
    tools = [c for c in children if c["kind"] == "TOOL_CALL"]
    assert len(tools) == 2 and all(c["status"] == "COMPLETED" for c in tools)
    assert tools[0]["title"] == "echo hi from tool"
    assert "hi from tool" in tools[0]["detail"]["output"] and tools[0]["detail"]["exitCode"] == 0
    assert (workspace / "notes" / "a.txt").read_text() == "hello file"
    graph = done["executionGraph"]
    root_id = done["rootNode"]["id"]
    assert {e["child"]["id"] for e in graph["edges"] if e["parent"]["id"] == root_id} == {c["id"] for c in children}
    filtered = await client.gql(
        """query($t: ID!, $r: ID!, $n: ID!) { thread(id: $t) {
             activities(runId: $r, nodeId: $n) { totalCount edges { node { kind runId nodeId } } } } }""",
        {"t": thread_id, "r": done["id"], "n": tools[0]["id"]},
    )
    acts = filtered["thread"]["activities"]
    assert [a["node"]["kind"] for a in acts["edges"]] == ["tool.started", "tool.completed"]
    assert all(a["node"]["runId"] == done["id"] and a["node"]["nodeId"] == tools[0]["id"] for a in acts["edges"])


async def test_failure_holds_the_queue(client: Client, thread_id: str, workspace: Path) -> None:
    failing = await send(client, thread_id, "@await go\n@reply trying\n@fail boom")  # fails once the gate opens
    queued = await send(client, thread_id, "after the failure", d={"queueAfterActive": True})
    assert queued["appliedDispatch"] == "QUEUE_AFTER_ACTIVE"
    (workspace / "go").touch()
    done = await finished(client, failing["run"]["id"])
    assert done["status"] == "FAILED" and done["statusReason"] == "boom"
    assert done["rootNode"]["status"] == "FAILED" and done["attempts"][0]["status"] == "FAILED"
    state = await client.gql(
        "query($t: ID!) { thread(id: $t) { queueHeld status queue { id status } } }", {"t": thread_id}
    )
    assert state["thread"]["queueHeld"] is True and state["thread"]["status"] == "IDLE"
    assert state["thread"]["queue"] == [{"id": queued["run"]["id"], "status": "QUEUED"}]
    reason = await client.gql("query($t: ID!) { thread(id: $t) { queueHoldReason } }", {"t": thread_id})
    assert "boom" in reason["thread"]["queueHoldReason"]
    resumed = await client.gql(
        "mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { thread { queueHeld } userErrors { code } } }",
        {"t": thread_id},
    )
    assert resumed["resumeQueue"] == {"thread": {"queueHeld": False}, "userErrors": []}
    assert (await finished(client, queued["run"]["id"]))["status"] == "COMPLETED"
    again = await client.gql(
        "mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { userErrors { code } } }", {"t": thread_id}
    )
    assert again["resumeQueue"]["userErrors"] == [{"code": "QUEUE_NOT_HELD"}]


async def test_agent_crash_then_resume(client: Client, thread_id: str, database_url: str) -> None:
    first = await send(client, thread_id, "remember me")
    remembered = await finished(client, first["run"]["id"])
    crashed = await send(client, thread_id, "@reply about to crash\n@crash")
    done = await finished(client, crashed["run"]["id"])
    assert done["status"] == "FAILED" and done["statusReason"] == "provider_crashed"
    after = await send(client, thread_id, "still there?")
    assert after["appliedDispatch"] == "START_IMMEDIATELY"
    resumed = await finished(client, after["run"]["id"])
    assert resumed["status"] == "COMPLETED"
    assert resumed["providerThread"]["id"] == remembered["providerThread"]["id"]
    assert resumed["providerThread"]["nativeThreadRef"] == remembered["providerThread"]["nativeThreadRef"]
    sessions = await _db_rows(database_url, _sessions_of(thread_id))
    assert [s["status"] for s in sessions] == ["error", "ready"]


async def test_subagent_completion_never_completes_the_run(client: Client, thread_id: str, workspace: Path) -> None:
    # After its child turn the run is held at a gate: the child's completion is recorded while the run is live.
    sent = await send(client, thread_id, "@subagent look around\n@await go\n@reply after the child")

    async def child_done() -> dict[str, Any] | None:
        found = await run(client, sent["run"]["id"])
        subagents = [c for c in found["rootNode"]["children"] if c["kind"] == "SUBAGENT"]
        return found if subagents and subagents[0]["status"] == "COMPLETED" else None

    held = await until(child_done)
    assert held["status"] == "RUNNING" and held["rootNode"]["status"] == "RUNNING"  # the child did not end it
    (workspace / "go").touch()
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "COMPLETED"
    subagents = [c for c in done["rootNode"]["children"] if c["kind"] == "SUBAGENT"]
    assert len(subagents) == 1 and subagents[0]["status"] == "COMPLETED"
    nested = [n for n in done["executionGraph"]["nodes"] if (n["parent"] or {}).get("id") == subagents[0]["id"]]
    assert [n["kind"] for n in nested] == ["ASSISTANT_MESSAGE"]  # the child turn's reply, under the subagent
    activities = await client.gql(
        """query($t: ID!) { thread(id: $t) { activities(first: 100) { edges { node { kind sequence } } } } }""",
        {"t": thread_id},
    )
    kinds = [a["node"]["kind"] for a in activities["thread"]["activities"]["edges"]]
    assert kinds.index("subagent.completed") < kinds.index("run.completed")
    assert kinds.count("run.completed") == 1


async def test_concurrent_sends_with_one_key_make_one_run(client: Client, thread_id: str, database_url: str) -> None:
    answers = await asyncio.gather(*(send(client, thread_id, "once", key="msg-1") for _ in range(10)))
    assert len({a["run"]["id"] for a in answers}) == 1
    await finished(client, answers[0]["run"]["id"])
    assert await _db_scalar(database_url, _runs_of(thread_id)) == 1


async def test_bad_send_input_is_refused_without_a_run(client: Client, thread_id: str, database_url: str) -> None:
    blank = await send(client, thread_id, "   ")
    assert blank["userErrors"][0]["code"] == "INVALID_INPUT" and blank["run"] is None
    two = await client.post(
        """mutation($t: ID!) { sendMessage(input: {threadId: $t, text: "x",
             dispatch: {auto: true, startImmediately: true}}) { userErrors { code } } }""",
        {"t": thread_id},
    )
    assert two.json()["errors"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"
    steer = await send(client, thread_id, "x", d={"steerActive": {"targetRunId": thread_id}})
    assert steer["userErrors"] == [
        {
            "code": "INVALID_ID",
            "field": "dispatch.steerActive.targetRunId",
            "message": "dispatch.steerActive.targetRunId is a Thread id; a Run id is needed",
        }
    ]
    assert await _db_scalar(database_url, _runs_of(thread_id)) == 0


@pytest.mark.own_server  # it kills its server and starts another on the database
async def test_server_crash_mid_run(
    server: ServerProcess, client: Client, thread_id: str, workspace: Path, database_url: str, data_dir: Path
) -> None:
    sent = await send(client, thread_id, "@tool echo once >> ran.txt\n@delay 20000\n@reply never")
    queued = await send(client, thread_id, "afterwards", d={"queueAfterActive": True})

    async def tool_done() -> bool:
        acts = await client.gql(
            "query($t: ID!) { thread(id: $t) { activities(first: 100) { edges { node { kind } } } } }", {"t": thread_id}
        )
        return any(a["node"]["kind"] == "tool.completed" for a in acts["thread"]["activities"]["edges"])

    await until(tool_done)
    server.kill()
    restarted = ServerProcess(database_url, data_dir).wait_ready()
    try:
        again = Client(restarted.url, client.token)
        lost = await finished(again, sent["run"]["id"])
        assert lost["status"] == "FAILED" and lost["statusReason"] == "provider_lost"
        # A crash holds the queue like any failure: a person decides what runs next.
        state = await again.gql(
            "query($t: ID!) { thread(id: $t) { queueHeld queueHoldReason queue { id status } } }", {"t": thread_id}
        )
        assert state["thread"]["queueHeld"] is True
        assert "server that held the turn is gone" in state["thread"]["queueHoldReason"]
        assert state["thread"]["queue"] == [{"id": queued["run"]["id"], "status": "QUEUED"}]
        await again.gql(
            "mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { userErrors { code } } }", {"t": thread_id}
        )
        assert (await finished(again, queued["run"]["id"]))["status"] == "COMPLETED"
        await again.aclose()
    finally:
        restarted.stop()
    assert (workspace / "ran.txt").read_text() == "once\n"  # nothing executed twice
    active = await _db_rows(
        database_url,
        sa.select(t.runs.c.status).where(t.runs.c.status.in_(["preparing", "starting", "running", "waiting"])),
    )
    assert active == []
    effects = await _db_rows(
        database_url, sa.select(t.effects.c.status).where(t.effects.c.status.in_(["pending", "running"]))
    )
    assert effects == []
    await _assert_gapless(database_url, thread_id)

"""Steering, restart attempts, interruption, Stop and queue management, through real agents."""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.acp_scripted import acp_instance
from tests.support.graphql import CREATE_PROJECT, threads_sharing_a_runtime, workspace
from tests.support.inproc import ADMIN, new_thread
from tests.support.inproc import send as send_inproc
from tests.support.runs import finished, run, running, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from threadloom.engine.services import Services
from threadloom.providers.child_process import descendants
from threadloom.store import tables as t

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)
PROVIDERS = (
    """
[instances.nosteer]
driver = "scripted"
supports_active_steering = false

[instances.newrun]
driver = "scripted"
supports_active_steering = false
restart_as = "new_run"

[instances.reject]
driver = "scripted"
supports_active_steering = false
supports_interrupt = false
interrupt_unsupported = "reject"

[instances.stopper]
driver = "scripted"
supports_active_steering = false
supports_interrupt = false
interrupt_unsupported = "stop_session"

"""
    + acp_instance("acp")
    + acp_instance("acp-nosteer", "--acp-without", "steering")
)
# The steering scenarios also run on `acp` instances over the scripted agent's ACP face: `_session/steering`
# where it is offered, else the restart fallback (session/cancel, then the whole input again).
INTERRUPT = """mutation($r: ID!, $hold: Boolean!) { interruptRun(input: {runId: $r, holdQueue: $hold}) {
  run { id status interruptRequestedAt } userErrors { code message } } }"""


async def _thread(client: Client, tmp_path: Path, instance: str = "scripted") -> str:
    data = await client.gql(CREATE_PROJECT, {"name": "steer", "root": workspace(tmp_path)})
    created = await client.gql(
        """mutation($p: ID!, $i: String!) { createThread(input: {projectId: $p, providerInstanceId: $i}) {
             thread { id } userErrors { code } } }""",
        {"p": data["createProject"]["project"]["id"], "i": instance},
    )
    return str(created["createThread"]["thread"]["id"])


@contextlib.contextmanager
def _agents_held(server: ServerProcess) -> Iterator[None]:
    """The server's scripted agent processes stopped (SIGSTOP) inside the block: a provider that has not yet
    answered anything, however fast the machine. They go on (SIGCONT) on the way out."""
    agents = []
    for pid, _ in descendants(server.proc.pid):
        with contextlib.suppress(OSError):
            if b"threadloom.agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                agents.append(pid)
    assert agents, "no scripted agent process under the server"
    for pid in agents:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        for pid in agents:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


def _open_gate(tmp_path: Path) -> None:
    """Lets a turn held at `@await go` go on (the thread's cwd is the workspace `_thread` made)."""
    (Path(workspace(tmp_path)) / "go").touch()


async def _assistant_texts(client: Client, thread: str, run_id: str) -> list[str]:
    return [m["text"] for m in await _messages(client, thread) if m["role"] == "ASSISTANT" and m["run"]["id"] == run_id]


async def _messages(client: Client, thread: str) -> list[dict[str, Any]]:
    data = await client.gql(
        """query($t: ID!) { thread(id: $t) { messages(first: 100) { edges { node { role text run { id } } } } } }""",
        {"t": thread},
    )
    return [e["node"] for e in data["thread"]["messages"]["edges"]]


@pytest.mark.parametrize("instance", ["scripted", "acp"])
async def test_a_steering_message_reaches_the_live_turn(client: Client, tmp_path: Path, instance: str) -> None:
    thread = await _thread(client, tmp_path, instance)
    # The turn holds until the steering message reaches it: however slow the machine, it arrives mid-turn.
    first = await send(client, thread, "@await-steer\n@reply one two three")
    await running(client, first["run"]["id"])
    steer = await send(client, thread, "@reply steered here")
    assert steer["userErrors"] == []
    assert steer["appliedDispatch"] == "STEER_ACTIVE"
    assert steer["run"]["id"] == first["run"]["id"]  # the same run
    done = await finished(client, first["run"]["id"])
    assert done["status"] == "COMPLETED" and len(done["attempts"]) == 1
    messages = await _messages(client, thread)
    assert [m["role"] for m in messages].count("USER") == 2
    assert all(m["run"]["id"] == first["run"]["id"] for m in messages), messages
    # The steer ran inside the live turn, before the rest of its script: it was not a late steer made a run.
    assert await _assistant_texts(client, thread, first["run"]["id"]) == ["steered here", "one two three"]
    runs = await client.gql("query($t: ID!) { thread(id: $t) { runs { totalCount } } }", {"t": thread})
    assert runs["thread"]["runs"]["totalCount"] == 1


@pytest.mark.parametrize("instance", ["nosteer", "acp-nosteer"])
async def test_steering_falls_back_to_a_restart_without_steer_support(
    client: Client, tmp_path: Path, instance: str
) -> None:
    thread = await _thread(client, tmp_path, instance)
    first = await send(client, thread, "@await go\n@reply one two three")  # held until the gate opens
    await running(client, first["run"]["id"])
    restart = await send(client, thread, "@reply after the restart")
    assert restart["appliedDispatch"] == "RESTART_ACTIVE"
    assert restart["run"]["id"] == first["run"]["id"]

    async def first_turn_interrupted() -> bool:
        attempts = (await run(client, first["run"]["id"]))["attempts"]
        return [pt["status"] for pt in attempts[0]["providerTurns"]] == ["INTERRUPTED"]

    await until(first_turn_interrupted)  # it never got past the gate: the restart interrupted a live turn
    _open_gate(tmp_path)  # the new turn runs the whole input again, the gate now open
    done = await finished(client, first["run"]["id"])
    assert done["status"] == "COMPLETED"
    attempts = done["attempts"]
    assert [(a["attemptOrdinal"], a["reason"], a["status"]) for a in attempts] == [
        (1, "INITIAL", "SUPERSEDED"),
        (2, "STEERING_RESTART", "COMPLETED"),
    ]
    assert done["activeAttempt"]["id"] == attempts[1]["id"]
    roots = [n for n in done["executionGraph"]["nodes"] if n["kind"] == "ROOT_TURN"]
    assert sorted(n["status"] for n in roots) == ["COMPLETED", "INTERRUPTED"]
    assert done["rootNode"]["id"] == attempts[1]["rootNode"]["id"]
    turns = [pt["status"] for a in attempts for pt in a["providerTurns"]]
    assert turns == ["INTERRUPTED", "COMPLETED"]
    assert await _assistant_texts(client, thread, first["run"]["id"]) == ["one two three", "after the restart"]


async def test_restart_as_a_new_run_linked_by_supersedes(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "newrun")
    first = await send(client, thread, "@delay 10000\n@reply one two three four five six seven eight")
    await running(client, first["run"]["id"])
    restart = await send(client, thread, "@reply instead")
    assert restart["appliedDispatch"] == "RESTART_ACTIVE"
    assert restart["run"]["id"] != first["run"]["id"]
    old = await finished(client, first["run"]["id"])
    assert old["status"] == "INTERRUPTED" and len(old["attempts"]) == 1
    new = await finished(client, restart["run"]["id"])
    assert new["status"] == "COMPLETED" and new["ordinal"] == 2
    # Queued behind the interrupted run, it started once that ended. (The answer's queuePosition is read after
    # the commit, when the interrupted run may already have ended and this one started: not asserted.)
    assert new["requestedAt"] <= old["completedAt"] <= new["startedAt"]
    linked = await client.gql("query($r: ID!) { run(id: $r) { supersedesRun { id } } }", {"r": new["id"]})
    assert linked["run"]["supersedesRun"] == {"id": first["run"]["id"]}


async def test_late_steer_becomes_a_run(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path)
    first = await send(client, thread, "quick")
    await finished(client, first["run"]["id"])
    late = await send(client, thread, "too late", d={"steerActive": {"targetRunId": first["run"]["id"]}})
    assert late["appliedDispatch"] == "START_IMMEDIATELY"
    assert late["run"]["id"] != first["run"]["id"] and late["run"]["ordinal"] == 2
    assert (await finished(client, late["run"]["id"]))["status"] == "COMPLETED"


async def test_a_stale_expected_attempt_refuses_the_steer(client: Client, tmp_path: Path, database_url: str) -> None:
    thread = await _thread(client, tmp_path)
    old = await send(client, thread, "first")
    old_run = await finished(client, old["run"]["id"])
    busy = await send(client, thread, "@await-steer\n@reply a b c")  # held until the accepted steer reaches it
    await running(client, busy["run"]["id"])
    stale = old_run["attempts"][0]["id"]
    before = [m for m in await _messages(client, thread) if m["role"] == "USER"]
    refused = await send(
        client, thread, "steer", d={"steerActive": {"targetRunId": busy["run"]["id"], "expectedAttemptId": stale}}
    )
    assert refused["userErrors"][0]["code"] == "EXPECTED_ATTEMPT_MISMATCH" and refused["run"] is None
    # nothing added (the busy run's own reply may appear meanwhile: only user messages are compared)
    assert [m for m in await _messages(client, thread) if m["role"] == "USER"] == before
    current = (await run(client, busy["run"]["id"]))["activeAttempt"]["id"]
    accepted = await send(
        client, thread, "steer", d={"steerActive": {"targetRunId": busy["run"]["id"], "expectedAttemptId": current}}
    )
    assert accepted["appliedDispatch"] == "STEER_ACTIVE"
    assert (await finished(client, busy["run"]["id"]))["status"] == "COMPLETED"
    # Only the accepted steer reached the turn (the refused one changed nothing), and it reached it live.
    assert await _assistant_texts(client, thread, busy["run"]["id"]) == ["Steered: steer", "a b c"]


async def test_turn_interrupt_ack_is_not_terminal(client: Client, server: ServerProcess, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path)
    sent = await send(client, thread, "@delay 60000\n@reply never")
    await running(client, sent["run"]["id"])
    # The agent is held while the interrupt is asked for: the answer is not the turn's end, which cannot have
    # happened yet (a fast agent could otherwise end the turn before the answer is read).
    with _agents_held(server):
        ack = (await client.gql(INTERRUPT, {"r": sent["run"]["id"], "hold": False}))["interruptRun"]
        assert ack["userErrors"] == []
        assert ack["run"]["status"] == "RUNNING" and ack["run"]["interruptRequestedAt"] is not None
        assert (await run(client, sent["run"]["id"]))["status"] == "RUNNING"  # until the provider says so
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "INTERRUPTED"
    assert done["attempts"][0]["status"] == "INTERRUPTED"
    assert done["rootNode"]["status"] == "INTERRUPTED"
    again = (await client.gql(INTERRUPT, {"r": sent["run"]["id"], "hold": False}))["interruptRun"]
    assert again["userErrors"][0]["code"] == "RUN_NOT_ACTIVE"


async def test_interrupt_mid_tool_interrupts_the_tool_node(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path)
    sent = await send(client, thread, "@tool sleep 30\n@reply never")

    async def tool_running() -> bool:
        found = await run(client, sent["run"]["id"])
        return any(c["kind"] == "TOOL_CALL" for c in found["rootNode"]["children"])

    await until(tool_running)
    await client.gql(INTERRUPT, {"r": sent["run"]["id"], "hold": False})
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "INTERRUPTED"
    tool = next(c for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL")
    assert tool["status"] == "INTERRUPTED"


async def test_unsupported_interrupt_is_refused_and_the_run_goes_on(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "reject")
    sent = await send(client, thread, "@await go\n@reply a b c d e")  # live until the test opens the gate
    await running(client, sent["run"]["id"])
    refused = (await client.gql(INTERRUPT, {"r": sent["run"]["id"], "hold": False}))["interruptRun"]
    assert refused["userErrors"][0]["code"] == "INTERRUPT_UNSUPPORTED"
    assert refused["run"] is None
    acts = await client.gql(
        """query($t: ID!) { thread(id: $t) { activities(last: 50) { edges { node { kind runId summary } } } } }""",
        {"t": thread},
    )
    recorded = [
        a["node"] for a in acts["thread"]["activities"]["edges"] if a["node"]["kind"] == "run.interrupt_unsupported"
    ]
    assert len(recorded) == 1 and recorded[0]["runId"] == sent["run"]["id"]  # the refusal is on record
    assert (await run(client, sent["run"]["id"]))["status"] == "RUNNING"
    _open_gate(tmp_path)
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"  # left to run


async def test_interrupt_unsupported_stop_session(client: Client, tmp_path: Path, database_url: str) -> None:
    thread = await _thread(client, tmp_path, "stopper")
    sent = await send(client, thread, "@delay 10000\n@reply never")
    await running(client, sent["run"]["id"])
    stopped = (await client.gql(INTERRUPT, {"r": sent["run"]["id"], "hold": False}))["interruptRun"]
    assert stopped["userErrors"] == []
    assert stopped["run"]["status"] == "INTERRUPTED"  # by policy, at once
    db_sessions: list[Any] = []

    async def session_stopped() -> bool:
        from threadloom.store.db import Database

        db = Database.from_url(database_url, pool_size=1)
        try:
            async with db.read() as r:
                sessions = sa.select(t.provider_sessions.c.status)  # this test's instance: the server is the module's
                db_sessions[:] = await r.rows(sessions.where(t.provider_sessions.c.provider_instance_id == "stopper"))
        finally:
            await db.dispose()
        return [s["status"] for s in db_sessions] == ["stopped"]

    await until(session_stopped)
    after = await send(client, thread, "hello again")  # a new session resumes the provider thread
    assert (await finished(client, after["run"]["id"]))["status"] == "COMPLETED"


async def test_queue_edit_reorder_cancel_promote(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path)
    busy = await send(client, thread, "@await-steer\n@reply a b c")  # active until the promoted message steers it
    queued = [
        (await send(client, thread, f"@reply queued {i}", d={"queueAfterActive": True}))["run"]["id"] for i in range(3)
    ]
    mutate = """mutation($r: ID!, $p: Int!, $text: String!) {
      reorderQueuedRun(input: {runId: $r, position: $p}) { userErrors { code } }
      editQueuedRun(input: {runId: $r, text: $text}) { run { userMessage { text } } userErrors { code } }
    }"""
    changed = await client.gql(mutate, {"r": queued[2], "p": 1, "text": "@reply edited"})
    assert changed["reorderQueuedRun"]["userErrors"] == []
    assert changed["editQueuedRun"]["run"]["userMessage"]["text"] == "@reply edited"
    cancel = await client.gql(
        "mutation($r: ID!) { cancelQueuedRun(input: {runId: $r}) { run { status } } }", {"r": queued[0]}
    )
    assert cancel["cancelQueuedRun"]["run"]["status"] == "CANCELLED"
    queue = await client.gql("query($t: ID!) { thread(id: $t) { queue { id queuePosition } } }", {"t": thread})
    assert queue["thread"]["queue"] == [
        {"id": queued[2], "queuePosition": 1},
        {"id": queued[1], "queuePosition": 2},
    ]
    bad = await client.gql(
        "mutation($r: ID!) { reorderQueuedRun(input: {runId: $r, position: 9}) { userErrors { code field } } }",
        {"r": queued[2]},
    )
    assert bad["reorderQueuedRun"]["userErrors"] == [{"code": "INVALID_INPUT", "field": "position"}]
    promoted = await client.gql(
        """mutation($r: ID!) { promoteQueuedRunToSteer(input: {runId: $r}) {
             run { status statusReason } userErrors { code } } }""",
        {"r": queued[1]},
    )
    assert promoted["promoteQueuedRunToSteer"]["run"]["status"] == "CANCELLED"
    not_queued = await client.gql(
        "mutation($r: ID!) { cancelQueuedRun(input: {runId: $r}) { userErrors { code } } }", {"r": busy["run"]["id"]}
    )
    assert not_queued["cancelQueuedRun"]["userErrors"] == [{"code": "RUN_NOT_QUEUED"}]
    done = await finished(client, busy["run"]["id"])
    assert done["status"] == "COMPLETED"
    edited = await finished(client, queued[2])
    assert edited["status"] == "COMPLETED" and edited["userMessage"]["text"] == "@reply edited"
    # The promoted message steered the busy run while it was live, before the rest of its script.
    assert await _assistant_texts(client, thread, busy["run"]["id"]) == ["queued 1", "a b c"]


async def test_stop_thread_holds_the_queue(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path)
    busy = await send(client, thread, "@delay 10000\n@reply never")
    waiting = await send(client, thread, "later", d={"queueAfterActive": True})
    await running(client, busy["run"]["id"])
    stopped = await client.gql(
        """mutation($t: ID!) { stopThread(input: {threadId: $t}) {
             thread { queueHeld queueHoldReason } userErrors { code } } }""",
        {"t": thread},
    )
    assert stopped["stopThread"]["thread"] == {"queueHeld": True, "queueHoldReason": "stopped by the user"}
    assert (await finished(client, busy["run"]["id"]))["status"] == "INTERRUPTED"
    assert (await run(client, waiting["run"]["id"]))["status"] == "QUEUED"  # nothing restarts on its own


async def test_interrupt_before_the_provider_starts(services: Services, tmp_path: Path) -> None:
    """With no effect worker running yet, the run is preparing and the provider has nothing: it ends at once."""
    (tmp_path / "ws").mkdir()
    thread = await new_thread(services, tmp_path / "ws")
    run_id = await send_inproc(services, thread, "hello")
    await services.interruption.interrupt_run(ADMIN, run_id, hold_queue=False, key=None)
    async with services.db.read() as db:
        status = await db.scalar(sa.select(t.runs.c.status).where(t.runs.c.id == run_id))
    assert status == "interrupted"
    await services.start()  # the start effect now finds nothing to start

    async def effects_done() -> bool:
        async with services.db.read() as db:
            return set(await db.scalars_all(sa.select(t.effects.c.status))) == {"done"}

    await until(effects_done)
    async with services.db.read() as db:
        turns = await db.scalar(sa.select(sa.func.count()).select_from(t.provider_turns))
        sessions = await db.scalar(sa.select(sa.func.count()).select_from(t.provider_sessions))
    assert turns == 0 and sessions == 0  # no agent was ever asked


async def test_a_steering_restart_expires_the_superseded_attempts_requests(client: Client, tmp_path: Path) -> None:
    """The superseded turn's callback is gone with it: its approval can no longer be answered."""
    thread = await _thread(client, tmp_path, "nosteer")
    first = await send(client, thread, "@approval echo x\n@reply approved")
    pending = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""

    async def asked() -> list[dict[str, Any]]:
        return list((await client.gql(pending, {"t": thread}))["thread"]["pendingRequests"])

    old = (await until(asked))[0]["id"]
    restart = await send(client, thread, "@reply after the restart")
    assert restart["appliedDispatch"] == "RESTART_ACTIVE" and restart["run"]["id"] == first["run"]["id"]
    request = await client.gql(
        """query($r: ID!) { node(id: $r) { ... on RuntimeRequest { status responseCapability notResumableReason
             node { status } } } }""",
        {"r": old},
    )
    assert request["node"]["status"] == "EXPIRED" and request["node"]["responseCapability"] == "NOT_RESUMABLE"
    assert request["node"]["node"]["status"] == "INTERRUPTED"
    refused = await client.gql(
        """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) {
             userErrors { code field } } }""",
        {"r": old},
    )
    assert refused["respondToApproval"]["userErrors"] == [{"code": "NOT_RESUMABLE", "field": "requestId"}]


async def test_stop_session_ends_only_the_interrupted_turn(client: Client, tmp_path: Path) -> None:
    """Two threads share the project's runtime; interrupting one by stopping its work leaves the other's turn be."""
    root = tmp_path / "shared"
    root.mkdir()
    threads = await threads_sharing_a_runtime(client, root, "stopper")
    interrupted = await send(client, threads[0], "@delay 10000\n@reply never")
    # Held at a gate: its turn is certainly live on the shared runtime when the other one is stopped.
    going_on = await send(client, threads[1], "@await go\n@reply b1 b2 b3")
    await running(client, interrupted["run"]["id"])
    await running(client, going_on["run"]["id"])
    stopped = (await client.gql(INTERRUPT, {"r": interrupted["run"]["id"], "hold": False}))["interruptRun"]
    assert stopped["userErrors"] == [] and stopped["run"]["status"] == "INTERRUPTED"
    assert (await run(client, going_on["run"]["id"]))["status"] == "RUNNING"
    (root / "go").touch()
    other = await finished(client, going_on["run"]["id"])
    assert (other["status"], other["statusReason"]) == ("COMPLETED", None)
    assert await _assistant_texts(client, threads[1], going_on["run"]["id"]) == ["b1 b2 b3"]  # its turn went on
    after = await send(client, threads[0], "hello again")  # the interrupted thread goes on
    assert (await finished(client, after["run"]["id"]))["status"] == "COMPLETED"

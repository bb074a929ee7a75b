"""A rollback killed with `kill -9` at every step boundary, and in the middle of its file restore, is
completed or taken back by the next server to start: files, conversation and log agree.

Each case starts a server with the test-only crash point `THREADLOOM_TEST_CRASH_AT` (src/threadloom/faults.py),
makes two runs on the scripted agent (run 1 writes `f.txt` "one"; run 2 rewrites it and adds `g.txt`), asks for
`rollbackToRun(1)` and loses the server at that point. A server started on the same database and data folder
finds the thread ROLLING_BACK and:

- carries the rollback on (every step can run again) when the process died before, between or after its
  steps, or in the middle of the file restore: run 2 ROLLED_BACK, the files those of run 1, the agent
  remembering run 1 and not run 2;
- takes it back when it died between the provider's undo fork and its in-place rollback (that rollback may or
  may not have happened: the undo fork holds the conversation as it was): runs and files as before the
  rollback, the agent remembering both runs, and `rollback.failed` saying why.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.db import assert_log_replays
from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess, providers_env
from tests.support.waiting import until

INSTANCES = """
[instances.a]
driver = "scripted"
"""
ROLLBACK = """mutation($t: ID!) { rollbackToRun(input: {threadId: $t, runOrdinal: 1}) {
  rolledBackRuns { ordinal } userErrors { code message } } }"""
STATE = """query($t: ID!) { thread(id: $t) { status runs(first: 10) { nodes { ordinal status } }
  activities(first: 100) { nodes { kind summary payload } } } }"""
SEND = """mutation($t: ID!) { sendMessage(input: {threadId: $t, text: "@reply hello"}) {
  userErrors { code } } }"""
RENAME = """mutation($t: ID!) { renameThread(input: {threadId: $t, title: "renamed meanwhile"}) {
  userErrors { code } } }"""

CARRIED_ON = ["rollback-begun", "rollback-captured", "rollback-provider", "restore-midway", "rollback-files"]


async def _history(client: Client, workspace: Path) -> ScriptedThread:
    thread = await ScriptedThread.create(client, workspace, "a")
    await thread.run("@write f.txt one")
    await thread.run("@write f.txt two\n@write g.txt new")
    assert (workspace / "g.txt").read_text() == "new"
    return thread


async def _crash_then_recover(
    database_url: str, tmp_path: Path, workspace: Path, point: str
) -> tuple[ServerProcess, Client, ScriptedThread, dict[str, Any]]:
    env = providers_env(tmp_path, INSTANCES)
    crashing = ServerProcess(database_url, tmp_path / "data", env={**env, "THREADLOOM_TEST_CRASH_AT": point})
    crashing.wait_ready()
    token = crashing.admin_token
    assert token is not None
    client = Client(crashing.url, token)
    thread = await _history(client, workspace)
    with pytest.raises(httpx.TransportError):  # the server died answering
        await client.gql(ROLLBACK, {"t": thread.id})
    assert crashing.proc.wait(30) != 0, "the crash point was not reached"
    await client.aclose()

    server = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
    client = Client(server.url, token)
    thread.client = client

    async def settled() -> dict[str, Any] | None:
        state = (await client.gql(STATE, {"t": thread.id}))["thread"]
        return None if state["status"] == "ROLLING_BACK" else state  # type: ignore[no-any-return]

    return server, client, thread, await until(settled, within=60.0)


@pytest.mark.parametrize("point", CARRIED_ON)
async def test_a_rollback_killed_at_a_step_boundary_is_carried_on_by_the_next_server(
    database_url: str, tmp_path: Path, workspace: Path, point: str
) -> None:
    server, client, thread, state = await _crash_then_recover(database_url, tmp_path, workspace, point)
    try:
        assert [(r["ordinal"], r["status"]) for r in state["runs"]["nodes"]] == [(1, "COMPLETED"), (2, "ROLLED_BACK")]
        kinds = [a["kind"] for a in state["activities"]["nodes"] if a["kind"].startswith("rollback.")]
        assert sorted(kinds) == ["rollback.completed", "rollback.started"], kinds
        started = next(a for a in state["activities"]["nodes"] if a["kind"] == "rollback.started")
        assert started["payload"]["status"] == "completed"
        assert (workspace / "f.txt").read_text() == "one" and not (workspace / "g.txt").exists()
        recalled = "\n".join(await thread.recall())
        assert "@write f.txt one" in recalled and "@write f.txt two" not in recalled, recalled
    finally:
        await client.aclose()
        server.stop()
    await assert_log_replays(database_url)


async def test_a_rollback_killed_between_its_undo_fork_and_the_provider_rollback_is_taken_back(
    database_url: str, tmp_path: Path, workspace: Path
) -> None:
    server, client, thread, state = await _crash_then_recover(database_url, tmp_path, workspace, "rollback-forked")
    try:
        assert [(r["ordinal"], r["status"]) for r in state["runs"]["nodes"]] == [(1, "COMPLETED"), (2, "COMPLETED")]
        failed = [a for a in state["activities"]["nodes"] if a["kind"] == "rollback.failed"]
        assert len(failed) == 1 and "the server stopped during the provider step" in failed[0]["payload"]["error"]
        assert (workspace / "f.txt").read_text() == "two" and (workspace / "g.txt").read_text() == "new"
        recalled = "\n".join(await thread.recall())
        assert "@write f.txt one" in recalled and "@write f.txt two" in recalled, recalled
    finally:
        await client.aclose()
        server.stop()
    await assert_log_replays(database_url)


async def test_a_thread_rolling_back_refuses_messages_and_a_second_rollback(
    database_url: str, tmp_path: Path, workspace: Path
) -> None:
    """While a rollback is under way (held after its plan is recorded), a message and another rollback are
    refused with THREAD_ROLLING_BACK and change nothing, and a rename (which cannot interfere) is taken. The
    twin: once the rollback is over, the same message is taken."""
    gate = tmp_path / "release"
    env = {**providers_env(tmp_path, INSTANCES), "THREADLOOM_TEST_HOLD_AT": f"rollback-begun:{gate}"}
    server = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
    assert server.admin_token is not None
    client = Client(server.url, server.admin_token)
    try:
        thread = await _history(client, workspace)
        rolling = asyncio.create_task(client.gql(ROLLBACK, {"t": thread.id}))

        async def marked() -> dict[str, Any] | None:
            state = (await client.gql(STATE, {"t": thread.id}))["thread"]
            return state if state["status"] == "ROLLING_BACK" else None  # type: ignore[no-any-return]

        before = await until(marked)
        refused = (await client.gql(SEND, {"t": thread.id}))["sendMessage"]["userErrors"]
        assert [e["code"] for e in refused] == ["THREAD_ROLLING_BACK"]
        again = (await client.gql(ROLLBACK, {"t": thread.id}))["rollbackToRun"]["userErrors"]
        assert [e["code"] for e in again] == ["THREAD_ROLLING_BACK"]
        renamed = (await client.gql(RENAME, {"t": thread.id}))["renameThread"]["userErrors"]
        assert renamed == []
        after = (await client.gql(STATE, {"t": thread.id}))["thread"]
        assert after["runs"] == before["runs"]

        gate.touch()
        done = (await rolling)["rollbackToRun"]
        assert done["userErrors"] == [] and done["rolledBackRuns"] == [{"ordinal": 2}]
        assert (await client.gql(STATE, {"t": thread.id}))["thread"]["status"] == "IDLE"
        assert (await client.gql(SEND, {"t": thread.id}))["sendMessage"]["userErrors"] == []
    finally:
        await client.aclose()
        server.stop()


STOP = """mutation($t: ID!) { stopThread(input: {threadId: $t}) { userErrors { code } } }"""
RESUME = """mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { userErrors { code } } }"""
QUEUE = """mutation($t: ID!) { sendMessage(input: {threadId: $t, text: "@write late.txt late",
  dispatch: {queueAfterActive: true}}) { run { id } userErrors { code } } }"""


async def test_a_run_that_ends_while_the_files_are_planned_is_rolled_back_too(
    database_url: str, tmp_path: Path, workspace: Path
) -> None:
    """The file plan is read before the lock is taken. A queued run that starts and ends in between (here: the
    rollback held after its file plan while the queue is resumed) changes the runs to undo: the rollback plans
    again and rolls that run back with its file, rather than recording a plan whose files miss it."""
    gate = tmp_path / "release"
    env = {**providers_env(tmp_path, INSTANCES), "THREADLOOM_TEST_HOLD_AT": f"rollback-planned:{gate}"}
    server = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
    assert server.admin_token is not None
    client = Client(server.url, server.admin_token)
    try:
        thread = await _history(client, workspace)
        held = await send(client, thread.id, "@await never\n@reply held")  # run 3, active until stopped
        queued = (await client.gql(QUEUE, {"t": thread.id}))["sendMessage"]  # run 4, queued behind it
        assert held["userErrors"] == [] and queued["userErrors"] == [], (held, queued)
        assert (await client.gql(STOP, {"t": thread.id}))["stopThread"]["userErrors"] == []  # holds the queue
        assert (await finished(client, held["run"]["id"]))["status"] == "INTERRUPTED"
        rolling = asyncio.create_task(client.gql(ROLLBACK, {"t": thread.id}))

        async def held_there() -> bool | None:
            return (tmp_path / "release.held").exists() or None

        await until(held_there)  # the files are planned; the record is not made yet
        assert (await client.gql(RESUME, {"t": thread.id}))["resumeQueue"]["userErrors"] == []
        assert (await finished(client, queued["run"]["id"]))["status"] == "COMPLETED"
        assert not rolling.done()
        assert (workspace / "late.txt").read_text() == "late"
        gate.touch()
        done = (await rolling)["rollbackToRun"]
        assert done["userErrors"] == [] and sorted(r["ordinal"] for r in done["rolledBackRuns"]) == [2, 3, 4]
        assert (workspace / "f.txt").read_text() == "one"
        assert not (workspace / "g.txt").exists() and not (workspace / "late.txt").exists()
    finally:
        await client.aclose()
        server.stop()

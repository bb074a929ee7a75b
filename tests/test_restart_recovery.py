"""Recovery after a restart or a lost server, against real servers, the real database and the scripted agent.

A run's turn is provably in flight (`@await gate`: the agent waits at the gate, nothing ran yet) when its server
gets `kill -9`. The next server on the same database (a restart, or another replica still running) finds the
lost turn: a run whose attempt recorded no command, file change or subagent gets a new attempt with reason
PROVIDER_RECOVERY on its provider thread, resumed in a new agent process, and completes; a run that ran a command
first fails with `provider_lost` (nothing runs twice); an instance with `recovery_retries = 0` fails it too.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import processes
from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess, providers_env
from tests.support.waiting import until

INSTANCES = """
[instances.no-recovery]
driver = "scripted"
recovery_retries = 0
"""  # `scripted` keeps the defaults: recovery on
RUN = """query($r: ID!) { run(id: $r) {
  id status statusReason
  providerThread { id nativeThreadRef }
  attempts { attemptOrdinal reason status statusReason rootNode { id }
             providerTurns { providerThread { id nativeThreadRef } } } } }"""
THREAD = """query($t: ID!) { thread(id: $t) {
  queueHeld
  messages(first: 50) { nodes { role text } }
  activities(first: 100) { nodes { kind runId nodeId payload } } } }"""
TOOL_DONE = """query($t: ID!) { thread(id: $t) { activities(first: 100) { nodes { kind } } } }"""


class Servers:
    """Servers on one database and one data folder; each can be killed (-9) and another started."""

    def __init__(self, database_url: str, folder: Path) -> None:
        self.database_url = database_url
        self.data_dir = folder / "data"
        self.env = providers_env(folder, INSTANCES)
        self.live: list[ServerProcess] = []
        self.dead: list[ServerProcess] = []
        first = self.start()
        assert first.admin_token is not None
        self.token: str = first.admin_token

    def start(self) -> ServerProcess:
        server = ServerProcess(self.database_url, self.data_dir, env=self.env).wait_ready()
        self.live.append(server)
        return server

    def kill(self, server: ServerProcess) -> None:
        server.kill()  # SIGKILL: no shutdown code runs; its agents die with it (pdeathsig)
        self.live.remove(server)
        self.dead.append(server)

    def client(self, server: ServerProcess) -> Client:
        return Client(server.url, self.token)


@pytest.fixture
def servers(database_url: str, tmp_path: Path) -> Iterator[Servers]:
    s = Servers(database_url, tmp_path)
    yield s
    for server in s.live:
        server.stop()
    for server in [*s.dead, *s.live]:
        print(server.report(40))  # shown by pytest only when the test fails


async def _run(client: Client, run_id: str) -> dict[str, Any]:
    return (await client.gql(RUN, {"r": run_id}))["run"]  # type: ignore[no-any-return]


async def _in_flight(client: Client, workspace: Path, text: str, instance: str = "scripted") -> tuple[str, str]:
    """A thread on `instance` and the id of its run of `text`, once the turn runs (the agent got it)."""
    thread = await ScriptedThread.create(client, workspace, instance)
    sent = await send(client, thread.id, text)
    assert sent["userErrors"] == [], sent
    run_id = str(sent["run"]["id"])

    async def running() -> bool:
        return (await _run(client, run_id))["status"] == "RUNNING"

    await until(running)
    return thread.id, run_id


async def _attempt_at_the_gate(client: Client, run_id: str, ordinal: int) -> dict[str, Any]:
    """The run once its attempt `ordinal` runs (its agent waits at the gate again)."""

    async def check() -> dict[str, Any] | None:
        found = await _run(client, run_id)
        attempts = found["attempts"]
        running = len(attempts) >= ordinal and attempts[ordinal - 1]["status"] == "RUNNING"
        return found if running and found["status"] == "RUNNING" else None

    return await until(check, within=45)


def _attempts(run: dict[str, Any]) -> list[tuple[int, str, str, str | None]]:
    return [(a["attemptOrdinal"], a["reason"], a["status"], a["statusReason"]) for a in run["attempts"]]


async def _completed_on_a_recovery_attempt(client: Client, thread_id: str, run_id: str, workspace: Path) -> None:
    """What a user sees after the loss: a second attempt (PROVIDER_RECOVERY) on the same provider thread, resumed,
    that completes the run once the gate opens; the lost attempt failed with `provider_lost`; one activity."""
    recovering = await _attempt_at_the_gate(client, run_id, 2)
    assert _attempts(recovering) == [
        (1, "INITIAL", "FAILED", "provider_lost"),
        (2, "PROVIDER_RECOVERY", "RUNNING", None),
    ]
    (workspace / "gate").touch()
    done = await finished(client, run_id)
    assert (done["status"], done["statusReason"]) == ("COMPLETED", None), done
    run = await _run(client, run_id)
    assert _attempts(run) == [(1, "INITIAL", "FAILED", "provider_lost"), (2, "PROVIDER_RECOVERY", "COMPLETED", None)]
    threads = {
        (t["providerThread"]["id"], t["providerThread"]["nativeThreadRef"])
        for a in run["attempts"]
        for t in a["providerTurns"]
    }
    assert len(threads) == 1, threads  # both turns on one provider thread: the lost one was resumed, not replaced

    state = (await client.gql(THREAD, {"t": thread_id}))["thread"]
    assert [m["text"] for m in state["messages"]["nodes"] if m["role"] == "ASSISTANT"] == ["back after the loss"]
    assert not state["queueHeld"]  # nothing failed: nothing holds the queue
    [retried] = [a for a in state["activities"]["nodes"] if a["kind"] == "run.retried"]
    assert (retried["runId"], retried["nodeId"]) == (run_id, run["attempts"][1]["rootNode"]["id"])
    assert {k: retried["payload"][k] for k in ("reason", "lost", "retry")} == {
        "reason": "PROVIDER_RECOVERY",
        "lost": "provider_lost",
        "retry": 1,
    }
    assert not [a for a in state["activities"]["nodes"] if a["kind"] == "run.failed"]


GATED = "@await gate\n@reply back after the loss"


async def test_a_turn_killed_before_any_tool_ran_completes_on_a_recovery_attempt_after_a_restart(
    servers: Servers, tmp_path: Path
) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    first = servers.live[0]
    client = servers.client(first)
    try:
        thread_id, run_id = await _in_flight(client, workspace, GATED)
        servers.kill(first)
        await client.aclose()
        client = servers.client(servers.start())  # a restart on the same database and data folder
        await _completed_on_a_recovery_attempt(client, thread_id, run_id, workspace)
    finally:
        await client.aclose()


async def test_a_turn_that_ran_a_command_fails_with_provider_lost_and_runs_nothing_twice(
    servers: Servers, tmp_path: Path
) -> None:
    """The twin of the test above: the same gated turn, but a command ran before the gate."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    first = servers.live[0]
    client = servers.client(first)
    try:
        thread_id, run_id = await _in_flight(client, workspace, "@tool echo once >> ran.txt\n" + GATED)

        async def tool_done() -> bool:
            acts = (await client.gql(TOOL_DONE, {"t": thread_id}))["thread"]["activities"]["nodes"]
            return any(a["kind"] == "tool.completed" for a in acts)

        await until(tool_done)
        servers.kill(first)
        await client.aclose()
        client = servers.client(servers.start())
        lost = await finished(client, run_id, within=45)
        assert (lost["status"], lost["statusReason"]) == ("FAILED", "provider_lost"), lost
        assert _attempts(await _run(client, run_id)) == [(1, "INITIAL", "FAILED", "provider_lost")]
        state = (await client.gql(THREAD, {"t": thread_id}))["thread"]
        assert state["queueHeld"]  # as every failure: a person decides what runs next
    finally:
        await client.aclose()
    assert (workspace / "ran.txt").read_text() == "once\n"  # the command never ran again


async def test_an_instance_with_recovery_off_fails_the_lost_turn(servers: Servers, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    first = servers.live[0]
    client = servers.client(first)
    try:
        _, run_id = await _in_flight(client, workspace, GATED, instance="no-recovery")
        servers.kill(first)
        await client.aclose()
        client = servers.client(servers.start())
        lost = await finished(client, run_id, within=45)
        assert (lost["status"], lost["statusReason"]) == ("FAILED", "provider_lost"), lost
        assert _attempts(await _run(client, run_id)) == [(1, "INITIAL", "FAILED", "provider_lost")]
    finally:
        await client.aclose()


def _holds_agents(server: ServerProcess) -> bool:
    """Whether the server runs an agent process (the scripted agent is `python -m threadloom.agent`)."""
    for pid in processes.running(processes.descendants(server.proc.pid)):
        try:
            if b"threadloom.agent" in Path(f"/proc/{pid}/cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False


async def test_a_lost_replicas_turn_completes_on_a_recovery_attempt_on_the_survivor(
    servers: Servers, tmp_path: Path
) -> None:
    """Two replicas on one database and data folder; the one whose agent holds the turn is killed; the other,
    never restarted, recovers the turn in its periodic pass."""
    workspace = tmp_path / "ws"
    workspace.mkdir()
    servers.start()
    client = servers.client(servers.live[0])
    survivor_client: Client | None = None
    try:
        thread_id, run_id = await _in_flight(client, workspace, GATED)  # either replica's worker may start it
        [victim] = [s for s in servers.live if _holds_agents(s)]
        [survivor] = [s for s in servers.live if s is not victim]
        servers.kill(victim)
        survivor_client = servers.client(survivor)
        await _completed_on_a_recovery_attempt(survivor_client, thread_id, run_id, workspace)
    finally:
        await client.aclose()
        if survivor_client is not None:
            await survivor_client.aclose()

"""The real ACP agents (claude-agent-acp, codex-acp, Qwen Code) THROUGH Threadloom: `acp` provider instances on
a real `threadloom serve`, driven over GraphQL, against the fake model server (offline, a fake key).

One server for the module with one `acp` instance per agent (command and environment as
tests/support/acp_agents.py starts them, `HOME` in a folder of the test owned by the agent user). Each agent
serves one project, so one agent process per agent for the module; each test makes its own thread in it.
Every lifecycle runs on every agent: native where tests/support/acp_profiles.py says the agent does it, the
driver's fallback where it does not, and each test asserts which of the two the user sees.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.acp_agents import AGENTS, BINS, FAKE_KEY, MODULES, launch
from tests.support.acp_profiles import PROBED, PROFILES, conformance
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.pg import PgServer
from tests.support.runs import finished, run, send
from tests.support.server import Client, ServerProcess, providers_env, serving
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(240)

AGENT_UID = 65534  # the server's default agent user (it runs as root in the suite)
WITHIN = 90.0  # one turn of a real agent on a loaded 2-core machine, its first one starting its children

CREATE_THREAD = """mutation($p: ID!, $i: String!, $m: RuntimeMode!) {
  createThread(input: {projectId: $p, providerInstanceId: $i, mode: $m}) { thread { id } userErrors { code } } }"""
MESSAGES = """query($t: ID!) { thread(id: $t) { messages(first: 100) { nodes { role text run { id } } } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id kind status payload } } }"""
APPROVE = """mutation($r: ID!, $d: Decision!) { respondToApproval(input: {requestId: $r, decision: $d}) {
  request { status } userErrors { code } } }"""
INTERRUPT = """mutation($r: ID!) { interruptRun(input: {runId: $r}) { userErrors { code } } }"""
FORK = """mutation($r: ID!) { forkThread(input: {source: {run: $r}, ownWorkspace: false}) {
  thread { id } transfer { id } userErrors { code message } } }"""
TRANSFER = """query($id: ID!) { node(id: $id) { ... on ContextTransfer { status handoff { text } } } }"""
ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) {
  userErrors { code message } } }"""
ACTIVITIES = """query($t: ID!) { thread(id: $t) { activities(first: 100) { nodes { kind payload } } } }"""


def _own(path: Path) -> None:
    """`path` and everything below it owned by the agent user, which the server runs the agents as."""
    for root, dirs, files in os.walk(path):
        os.chown(root, AGENT_UID, AGENT_UID)
        for name in dirs + files:
            os.chown(os.path.join(root, name), AGENT_UID, AGENT_UID)


def acp_real_instance(name: str, module_fake: FakeModel, home: Path) -> str:
    """The providers.toml text of the `acp` instance `acp-<name>`: the agent's command line and its environment
    (the fake key and the settings pointing at `fake`) as tests/support/acp_agents.py has them; the driver adds
    PATH and the locale from the server's own environment."""
    started = launch(name, module_fake, home)
    _own(home)
    env = {k: v for k, v in started.env.items() if k not in ("PATH", "LANG")}
    lines = [f"[instances.acp-{name}]", 'driver = "acp"', f"command = {json.dumps(started.argv)}"]
    lines.append("env = { " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in env.items()) + " }")
    lines.append(f"base_url = {json.dumps(module_fake.url)}")  # the agent's own network has only this loopback port
    return "\n".join(lines) + "\n\n"


@dataclass
class Agent:
    """One real agent behind its `acp` instance, with the project (so the agent process) it serves."""

    name: str
    client: Client
    project: str
    workspace: Path
    home: Path

    @property
    def instance(self) -> str:
        return f"acp-{self.name}"

    @property
    def profile(self) -> dict[str, Any]:
        return PROFILES[self.name]

    def native(self, lifecycle: str) -> bool:
        """What docs/providers.md's conformance table says Threadloom does natively on this agent."""
        return conformance(self.name)[lifecycle] == "native"

    async def thread(self, mode: str = "WORKSPACE_WRITE") -> str:
        made = await self.client.gql(CREATE_THREAD, {"p": self.project, "i": self.instance, "m": mode})
        assert made["createThread"]["userErrors"] == [], made
        return str(made["createThread"]["thread"]["id"])

    async def turn(self, thread: str, text: str) -> dict[str, Any]:
        sent = await send(self.client, thread, text)
        assert sent["userErrors"] == [], sent
        done = await finished(self.client, sent["run"]["id"], within=WITHIN)
        assert done["status"] == "COMPLETED", done
        return done

    async def texts(self, thread: str, run_id: str | None = None) -> str:
        nodes = (await self.client.gql(MESSAGES, {"t": thread}))["thread"]["messages"]["nodes"]
        return "\n".join(
            n["text"] for n in nodes if n["role"] == "ASSISTANT" and (run_id is None or n["run"]["id"] == run_id)
        )


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("acp-served")
    (folder / "data").mkdir()
    return folder


@pytest.fixture(scope="module")
def server(database_url: str, base: Path, module_fake: FakeModel) -> Iterator[ServerProcess]:
    providers = "".join(acp_real_instance(name, module_fake, base / f"home-{name}") for name in AGENTS)  # Agent.home
    with serving(database_url, base / "data", providers_env(base, providers)) as proc:
        yield proc


@pytest.fixture(scope="module")
async def client(server: ServerProcess) -> AsyncIterator[Client]:
    c = Client(server.url, server.admin_token)
    yield c
    await c.aclose()


@pytest.fixture(scope="module", params=AGENTS)
async def agent(request: pytest.FixtureRequest, client: Client, base: Path) -> Agent:
    name = str(request.param)
    workspace = base / f"ws-{name}"
    workspace.mkdir()
    made = await client.gql(CREATE_PROJECT, {"name": name, "root": str(workspace)})
    return Agent(name, client, made["createProject"]["project"]["id"], workspace, base / f"home-{name}")


async def model_request_with(module_fake: FakeModel, text: str) -> dict[str, Any]:
    """The first main-loop model request (one offering tools: not a title or other side request) mentioning
    `text`, waited for off the loop."""
    return await asyncio.to_thread(module_fake.wait_body, text, WITHIN, True)


async def running(agent: Agent, thread: str, module_fake: FakeModel, text: str) -> dict[str, Any]:
    """Sends `text` under HOLD: returns the run once the model holds its reply mid-stream (certainly RUNNING)."""
    module_fake.reset_hold()
    sent = await send(agent.client, thread, f"HOLD\n{text}")
    assert sent["userErrors"] == [], sent
    await model_request_with(module_fake, text)

    async def check() -> bool:  # the model has the turn; the run says RUNNING once the agent said it started
        return bool((await run(agent.client, sent["run"]["id"]))["status"] == "RUNNING")

    await until(check, within=WITHIN)
    return sent


def agent_pids(agent: Agent) -> list[int]:
    """The pids of `agent`'s main process (the adapter, or Qwen's cli.js): a node process running its script
    with this module's HOME for it (another test file may run the same agents at the same time)."""
    script = str(
        MODULES / "@qwen-code" / "qwen-code" / "cli.js" if agent.name == "qwen" else MODULES / ".bin" / BINS[agent.name]
    )
    home = f"HOME={agent.home}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
            env = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv[0].endswith(b"node") and script.encode() in argv and home in env:
            found.append(int(entry))
    return found


def described(pids: list[int]) -> str:
    """Each process's parent, age and command line, for a failure that finds more agent processes than one."""
    lines = []
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            lines.append(f"{pid}: gone")
            continue
        ticks = os.sysconf("SC_CLK_TCK")
        uptime = float(Path("/proc/uptime").read_text().split()[0])
        lines.append(f"{pid}: parent {fields[1]}, {uptime - int(fields[19]) / ticks:.1f} s old: {argv[:300]}")
    return "\n".join(lines)


async def pending(agent: Agent, thread: str) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        return (await agent.client.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"] or None

    return await until(check, within=WITHIN)


# ---- a conversation, resumed after the agent process is killed ---------------------------------------------


async def test_a_conversation_goes_on_in_a_new_agent_process_after_the_agent_is_killed(
    agent: Agent, module_fake: FakeModel
) -> None:
    thread = await agent.thread()
    first = await agent.turn(thread, f"{agent.name} first words")
    assert f"echo: {agent.name} first words" in await agent.texts(thread, first["id"])
    second = await agent.turn(thread, f"{agent.name} second words")
    assert f"echo: {agent.name} second words" in await agent.texts(thread, second["id"])
    held = await running(agent, thread, module_fake, f"{agent.name} a turn the kill ends")
    pids = agent_pids(agent)
    assert len(pids) == 1, pids  # one agent process serves the project
    os.kill(pids[0], signal.SIGKILL)
    crashed = await finished(agent.client, held["run"]["id"], within=WITHIN)
    assert (crashed["status"], crashed["statusReason"]) == ("FAILED", "provider_crashed"), crashed
    module_fake.release()
    words = f"{agent.name} words after the kill"
    after = await agent.turn(thread, words)
    assert f"echo: {words}" in await agent.texts(thread, after["id"])
    again = agent_pids(agent)
    assert len(again) == 1 and again != pids, described(again)  # a new process
    # The new process resumed the same session: the model is sent the turns before the kill.
    body = json.dumps(await model_request_with(module_fake, words))
    assert f"{agent.name} first words" in body and f"{agent.name} second words" in body
    assert after["providerThread"]["id"] == first["providerThread"]["id"]


# ---- steer ----------------------------------------------------------------------------------------------


async def test_a_steer_reaches_the_running_turn_natively_or_restarts_it(agent: Agent, module_fake: FakeModel) -> None:
    thread = await agent.thread()
    held = await running(agent, thread, module_fake, f"{agent.name} a turn to steer")
    steer_words = f"{agent.name} steered words"
    steer = await send(agent.client, thread, steer_words)
    assert steer["userErrors"] == [] and steer["run"]["id"] == held["run"]["id"], steer
    if agent.native("steer"):  # _session/steering into the live turn
        assert steer["appliedDispatch"] == "STEER_ACTIVE"
        await model_request_with(module_fake, steer_words)  # a request of the same turn carried it
        module_fake.release()
        done = await finished(agent.client, held["run"]["id"], within=WITHIN)
        assert done["status"] == "COMPLETED" and len(done["attempts"]) == 1, done
        return
    assert steer["appliedDispatch"] == "RESTART_ACTIVE"  # the fallback: interrupt, then the whole input again

    async def first_turn_interrupted() -> bool:
        attempts = (await run(agent.client, held["run"]["id"]))["attempts"]
        return [pt["status"] for pt in attempts[0]["providerTurns"]] == ["INTERRUPTED"]

    await until(first_turn_interrupted, within=WITHIN)
    module_fake.release()
    done = await finished(agent.client, held["run"]["id"], within=WITHIN)
    assert done["status"] == "COMPLETED", done
    assert [(a["reason"], a["status"]) for a in done["attempts"]] == [
        ("INITIAL", "SUPERSEDED"),
        ("STEERING_RESTART", "COMPLETED"),
    ]
    await model_request_with(module_fake, steer_words)


# ---- interrupt ------------------------------------------------------------------------------------------


async def test_interrupt_run_cancels_the_turn_and_the_thread_goes_on(agent: Agent, module_fake: FakeModel) -> None:
    thread = await agent.thread()
    held = await running(agent, thread, module_fake, f"{agent.name} a turn to interrupt")
    answer = await agent.client.gql(INTERRUPT, {"r": held["run"]["id"]})
    assert answer["interruptRun"]["userErrors"] == []
    done = await finished(agent.client, held["run"]["id"], within=WITHIN)
    module_fake.release()
    assert done["status"] == "INTERRUPTED", done
    after = await agent.turn(thread, f"{agent.name} after the interrupt")
    assert f"echo: {agent.name} after the interrupt" in await agent.texts(thread, after["id"])


# ---- approval -------------------------------------------------------------------------------------------


async def test_an_approval_is_a_runtime_request_and_accepting_it_lets_the_tool_run(agent: Agent) -> None:
    """claude-agent-acp and Qwen Code ask before a command in their `default` mode (APPROVAL_REQUIRED); codex-acp
    runs commands in its read-only sandbox without asking and asks before a file edit (READ_ONLY: `read-only`)."""
    edit = agent.profile["approval_asks_for"] == "edit"
    thread = await agent.thread("READ_ONLY" if edit else "APPROVAL_REQUIRED")
    target = agent.workspace / f"approved-{agent.name}.txt"
    prompt = f"WRITE: {target.name} approved" if edit else f"RUN: echo approved > {target.name}"
    sent = await send(agent.client, thread, prompt)
    [request] = await pending(agent, thread)
    assert request["kind"] == ("FILE_CHANGE_APPROVAL" if edit else "COMMAND_APPROVAL"), request
    assert not target.exists()  # held until answered
    answer = await agent.client.gql(APPROVE, {"r": request["id"], "d": "ACCEPT"})
    assert answer["respondToApproval"]["userErrors"] == []
    done = await finished(agent.client, sent["run"]["id"], within=WITHIN)
    assert done["status"] == "COMPLETED", done
    assert target.read_text().strip() == "approved"


# ---- fork -----------------------------------------------------------------------------------------------


async def test_a_fork_carries_the_conversation_natively_or_by_handoff(agent: Agent, module_fake: FakeModel) -> None:
    source = await agent.thread()
    await agent.turn(source, f"{agent.name} words before the fork")
    last = await agent.turn(source, f"{agent.name} more words before the fork")
    payload = (await agent.client.gql(FORK, {"r": last["id"]}))["forkThread"]
    assert payload["userErrors"] == [], payload
    fork = payload["thread"]["id"]
    words = f"{agent.name} words in the fork"
    done = await agent.turn(fork, words)  # the fork's first turn resolves its transfer
    assert words in await agent.texts(fork, done["id"])
    transfer = (await agent.client.gql(TRANSFER, {"id": payload["transfer"]["id"]}))["node"]
    if agent.native("fork"):  # session/fork, then the copy rewound to the run
        assert transfer["status"] == "RESOLVED_NATIVE" and transfer["handoff"] is None, transfer
    else:  # a new session seeded with a handoff of the conversation
        assert transfer["status"] == "RESOLVED_PORTABLE", transfer
        assert f"{agent.name} words before the fork" in transfer["handoff"]["text"]
    assert f"{agent.name} words before the fork" in json.dumps(await model_request_with(module_fake, words))
    assert words not in await agent.texts(source)  # the source thread did not see the fork's turn


# ---- rollback -------------------------------------------------------------------------------------------


async def test_a_rollback_undoes_the_later_runs_files_and_conversation(agent: Agent, module_fake: FakeModel) -> None:
    """No pinned agent serves `_session/rewind`: the files come back from Threadloom's checkpoints and the
    agent goes on in a new session from the kept conversation."""
    assert not agent.native("rollback")
    thread = await agent.thread()
    await agent.turn(thread, f"{agent.name} kept words")
    made = agent.workspace / f"undone-{agent.name}.txt"
    path = str(made) if agent.name == "qwen" else made.name  # Qwen's write_file takes absolute paths only
    await agent.turn(thread, f"WRITE: {path} undone")
    assert made.read_text().strip() == "undone"
    await agent.turn(thread, f"{agent.name} undone words")
    answer = (await agent.client.gql(ROLLBACK, {"t": thread, "n": 1}))["rollbackToRun"]
    assert answer["userErrors"] == [], answer
    nodes = (await agent.client.gql(ACTIVITIES, {"t": thread}))["thread"]["activities"]["nodes"]
    completed = [n["payload"] for n in nodes if n["kind"] == "rollback.completed"]
    assert completed and "native_rollback" not in [p["strategy"] for p in completed[-1]["providerThreads"]]
    assert not made.exists()
    words = f"{agent.name} words after the rollback"
    done = await agent.turn(thread, words)
    assert words in await agent.texts(thread, done["id"])
    body = json.dumps(await model_request_with(module_fake, words))
    assert f"{agent.name} kept words" in body and f"{agent.name} undone words" not in body


# ---- the probe ------------------------------------------------------------------------------------------


async def test_the_probe_of_each_real_agent_prints_what_its_profile_records(agent: Agent, base: Path) -> None:
    env = {**os.environ, "THREADLOOM_PROVIDERS": str(base / "providers.toml")}
    argv = [sys.executable, "-m", "threadloom", "--data-dir", str(base / "data"), "providers", "probe", agent.instance]
    out = await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"agent {agent.profile['agent_name']} {agent.profile['version']} (ACP v1)"), lines
    printed = {line.split()[0]: line.split()[1] for line in lines[1:] if not line.strip().startswith("plan:")}
    assert printed == PROBED[agent.name], out.stdout
    plans = dict(line.strip().removeprefix("plan: ").split(" = ", 1) for line in lines if "plan: " in line)
    expected = conformance(agent.name)
    for lifecycle in ("steer", "fork", "rollback"):  # the plan printed is the table's
        assert plans[lifecycle].startswith("native") == (expected[lifecycle] == "native"), plans
    assert FAKE_KEY not in out.stdout + out.stderr

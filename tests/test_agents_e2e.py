"""The real Codex and Claude CLIs driven through the whole service: GraphQL in, runs out.

The module starts a fake model server (the only replaced part) and one real `threadloom serve` configured with
a `codex` and a `claude` instance pointing at it (conftest's module_server); each test talks GraphQL in a
project of its own and reads only the model requests its own runs made. The driver-level protocol cases live
in test_codex_driver.py and test_claude_driver.py.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.agents import MODEL_PATH, cli_providers_env
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import TERMINAL, finished, run, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from threadloom.api.ids import decode
from threadloom.store import tables as t
from threadloom.store.db import Database

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)
PROVIDERS = ["codex", "claude"]
KEYS = {"openai_key": "sk-fake-openai-SECRET", "anthropic_key": "sk-fake-anthropic-SECRET"}
THREAD = """mutation($p: ID!, $i: String!, $m: String!) {
  createThread(input: {projectId: $p, providerInstanceId: $i, runtimeMode: $m, title: "t"}) {
    thread { id providerInstanceId runtimeMode } userErrors { code message } } }"""
MESSAGES = """query($t: ID!) { thread(id: $t) {
  messages(first: 50) { edges { node { role text run { id } } } }
  providerThreads { nativeThreadRef status providerInstanceId } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { status pendingRequests { id kind status payload } } }"""
APPROVE = """mutation($r: ID!, $d: Decision!) { respondToApproval(input: {requestId: $r, decision: $d}) {
  request { id status } userErrors { code message } } }"""
INTERRUPT = """mutation($r: ID!) { interruptRun(input: {runId: $r, holdQueue: false}) {
  run { id status } userErrors { code message } } }"""
STEER_STATE = """query($t: ID!, $m: ID!) { node(id: $m) { ... on ConversationMessage { run { id status } } }
  thread(id: $t) { messages(first: 50) { nodes { role text run { id } } }
    activities(last: 100) { nodes { kind run { id } } } } }"""
INSTANCES = """{ providerInstances { id driver isDefault capabilities {
  supportsActiveSteering supportsInterrupt supportsSteeringByInterruptRestart canForkThread canRollbackThread
  canReadThreadSnapshot pendingRequestsSurviveRestart } } }"""


@pytest.fixture(scope="module")
def fake(module_fake: FakeModel) -> FakeModel:
    """conftest's module_fake, the model of the module's server (its HOLD replies held until a test releases
    them)."""
    return module_fake


@pytest.fixture(scope="module")
def module_server_env(fake: FakeModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return cli_providers_env(tmp_path_factory.mktemp("providers"), fake, **KEYS)


@pytest.fixture(scope="module")
def module_server(module_server: ServerProcess) -> Iterator[ServerProcess]:
    """The module's server; once stopped, no line of its whole log holds an API key."""
    yield module_server
    module_server.stop()
    assert not any("SECRET" in line for line in module_server.log), "an API key reached the server log"


@pytest.fixture
def agents_server(database_url: str, tmp_path: Path, fake: FakeModel) -> Iterator[ServerProcess]:
    """A server of the test's own (on its own database: the test says `own_server`) with the same instances."""
    proc = ServerProcess(database_url, tmp_path / "data", env=cli_providers_env(tmp_path, fake, **KEYS)).wait_ready()
    yield proc
    proc.stop()
    assert not any("SECRET" in line for line in proc.log), "an API key reached the server log"
    print(proc.report(80))


async def _thread(client: Client, tmp_path: Path, provider: str, mode: str = "workspace_write") -> tuple[str, Path]:
    workspace = tmp_path / f"ws-{provider}"
    workspace.mkdir(exist_ok=True)
    project = (await client.gql(CREATE_PROJECT, {"name": provider, "root": str(workspace)}))["createProject"]
    made = (await client.gql(THREAD, {"p": project["project"]["id"], "i": provider, "m": mode}))["createThread"]
    assert made["userErrors"] == []
    return str(made["thread"]["id"]), workspace


async def _project_uuid(client: Client, thread: str) -> str:
    found = decode(
        (await client.gql("query($t: ID!) { thread(id: $t) { project { id } } }", {"t": thread}))["thread"]["project"][
            "id"
        ]
    )
    assert found is not None
    return str(found[1])


async def _messages(client: Client, thread: str) -> dict[str, Any]:
    return (await client.gql(MESSAGES, {"t": thread}))["thread"]  # type: ignore[no-any-return]


def _assistant_texts(state: dict[str, Any]) -> list[str]:
    return [e["node"]["text"] for e in state["messages"]["edges"] if e["node"]["role"] == "ASSISTANT"]


def _said(fake: FakeModel, provider: str, text: str) -> bool:
    """Did any model request of this provider carry `text` (anywhere in its conversation)?"""
    return any(text in str(body) for body in fake.bodies(MODEL_PATH[provider]))


async def _model_saw(fake: FakeModel, provider: str, text: str) -> None:
    async def check() -> bool:
        return _said(fake, provider, text)

    await until(check, within=60)


async def _model_requests_beyond(fake: FakeModel, provider: str, seen: int) -> None:
    async def check() -> bool:
        return len(fake.bodies(MODEL_PATH[provider])) > seen

    await until(check, within=60)


async def _steer_answered(client: Client, thread: str, message: str, answer: str) -> dict[str, Any]:
    """Wait until the run that carries the steer `message` has ended with `answer` among its assistant messages
    (the steered run, or the run the steer became when it came too late); the thread's state then."""

    async def check() -> dict[str, Any] | None:
        state = await client.gql(STEER_STATE, {"t": thread, "m": message})
        carrier = state["node"]["run"]
        texts = [m["text"] for m in state["thread"]["messages"]["nodes"] if m["run"] == {"id": carrier["id"]}]
        return state if carrier["status"] in TERMINAL and answer in texts else None

    return await until(check, within=90)


async def _running(client: Client, run_id: str) -> None:
    async def check() -> bool:
        return (await run(client, run_id))["status"] == "RUNNING"

    await until(check, within=60)


async def test_provider_instances_report_their_capabilities(api: Client) -> None:
    found = {i["id"]: i for i in (await api.gql(INSTANCES))["providerInstances"]}
    assert set(found) == {"scripted", "codex", "claude"}
    assert found["scripted"]["isDefault"] and found["codex"]["driver"] == "codex"
    codex, claude = found["codex"]["capabilities"], found["claude"]["capabilities"]
    assert codex["supportsSteeringByInterruptRestart"] and not claude["supportsSteeringByInterruptRestart"]
    assert codex["canRollbackThread"] and not claude["canRollbackThread"]
    assert codex["canReadThreadSnapshot"] and not claude["canReadThreadSnapshot"]
    for caps in (codex, claude):
        assert caps["supportsActiveSteering"] and caps["supportsInterrupt"] and caps["canForkThread"]
        assert not caps["pendingRequestsSurviveRestart"]


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_conversation_on_one_provider_thread(
    api: Client, fake: FakeModel, tmp_path: Path, database_url: str, provider: str
) -> None:
    thread, _ = await _thread(api, tmp_path, provider)
    first = await send(api, thread, "first words")
    assert (await finished(api, first["run"]["id"], within=90))["status"] == "COMPLETED"
    second = await send(api, thread, "second words")
    done = await finished(api, second["run"]["id"], within=90)
    assert done["status"] == "COMPLETED"
    state = await _messages(api, thread)
    assert _assistant_texts(state) == ["echo: first words", "echo: second words"]
    assert [p["status"] for p in state["providerThreads"]] == ["IDLE"]  # one provider thread, between turns
    native = state["providerThreads"][0]["nativeThreadRef"]
    assert done["providerThread"]["nativeThreadRef"] == native
    last = fake.bodies(MODEL_PATH[provider])[-1]
    assert "first words" in str(last) and "echo: first words" in str(last)  # the history went along
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            logged = await r.rows(sa.select(t.events.c.payload))
    finally:
        await db.dispose()
    assert logged and not any("SECRET" in str(row["payload"]) for row in logged)  # no key in the log


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_approvals_decide_whether_the_command_runs(
    api: Client, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    thread, workspace = await _thread(api, tmp_path, provider, "approval_required")
    for decision, name in (("ACCEPT", "yes.txt"), ("DECLINE", "no.txt")):
        sent = await send(api, thread, f"RUN: echo {decision} > {name}")

        async def pending() -> dict[str, Any] | None:
            state = (await api.gql(PENDING, {"t": thread}))["thread"]
            return state if state["pendingRequests"] else None

        state = await until(pending, within=90)
        request = state["pendingRequests"][0]
        assert request["kind"] == "COMMAND_APPROVAL" and f"echo {decision}" in request["payload"]["command"]
        answer = (await api.gql(APPROVE, {"r": request["id"], "d": decision}))["respondToApproval"]
        assert answer["userErrors"] == [] and answer["request"]["status"] == "RESOLVED"
        done = await finished(api, sent["run"]["id"], within=90)
        assert done["status"] == "COMPLETED"
        tools = [c for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]
        assert tools, done["rootNode"]["children"]
    assert (workspace / "yes.txt").read_text().strip() == "ACCEPT"
    assert not (workspace / "no.txt").exists()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_real_cli_takes_a_steer_mid_turn_then_an_interrupt(
    api: Client, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    fake.reset_hold()  # the module's fake model: an earlier test may have released its HOLD replies
    thread, _ = await _thread(api, tmp_path, provider)
    held = await send(api, thread, "HOLD")
    await _running(api, held["run"]["id"])
    await _model_saw(fake, provider, "HOLD")
    steer = await send(api, thread, "STEERED-7731")
    assert steer["appliedDispatch"] == "STEER_ACTIVE", steer
    # The steer is handed to the agent by an effect after `sendMessage` answers, so two outcomes are legal
    # (docs/steering.md): it reaches the live turn, which answers it before it ends, or the turn has ended first
    # and the message becomes a run of its own (`steer.became_run` on the run it was meant for). Codex drops a
    # held reply to ask again with the steer, so waiting until the model saw it makes the first outcome certain.
    # Claude Code queues a steer behind the reply it is streaming and says nothing until that reply ends (no
    # echo, no model request, no event of ours), so nothing shows the delivery before the release; its case
    # takes whichever outcome happened and checks that one fully.
    if provider == "codex":
        await _model_saw(fake, provider, "STEERED-7731")
    fake.release()
    done = await finished(api, held["run"]["id"], within=90)
    assert done["status"] == "COMPLETED"
    state = await _steer_answered(api, thread, steer["message"]["id"], "echo: STEERED-7731")
    answered_by = state["node"]["run"]["id"]
    became = [a["run"]["id"] for a in state["thread"]["activities"]["nodes"] if a["kind"] == "steer.became_run"]
    if answered_by == held["run"]["id"]:  # delivered into the live turn: it was answered there
        assert became == []
    else:  # the turn had ended: a run of its own answered it, and the steered run says so
        assert provider == "claude", "Codex saw the steer before its turn could end"
        assert became == [held["run"]["id"]]
    assert _said(fake, provider, "STEERED-7731")

    fake.reset_hold()
    seen = len(fake.bodies(MODEL_PATH[provider]))
    stopped = await send(api, thread, "HOLD")
    await _model_requests_beyond(fake, provider, seen)
    await _running(api, stopped["run"]["id"])
    ack = (await api.gql(INTERRUPT, {"r": stopped["run"]["id"]}))["interruptRun"]
    assert ack["userErrors"] == []
    assert (await finished(api, stopped["run"]["id"], within=60))["status"] == "INTERRUPTED"
    fake.release()
    after = await send(api, thread, "after the stop")
    assert (await finished(api, after["run"]["id"], within=90))["status"] == "COMPLETED"


def _agent_process_groups(server: ServerProcess, project: str | None = None) -> list[int]:
    """Process groups of the agent CLIs the server started (each driver starts its own session); with
    `project` (a project's uuid), only those of that project (its state folder is in their environment)."""
    groups = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            cmdline = (entry / "cmdline").read_bytes()
            environ = (entry / "environ").read_bytes() if project is not None else b""
        except OSError:
            continue
        ppid = int(stat[1])
        mine = project is None or project.encode() in environ
        if ppid == server.proc.pid and (b"codex" in cmdline or b"claude" in cmdline) and mine:
            groups.add(os.getpgid(int(entry.name)))
    return sorted(groups)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_killed_agent_is_resumed_with_its_history(
    api: Client, server: ServerProcess, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    thread, _ = await _thread(api, tmp_path, provider)
    first = await send(api, thread, "remember ALPHA-42")
    assert (await finished(api, first["run"]["id"], within=90))["status"] == "COMPLETED"
    groups = _agent_process_groups(server, await _project_uuid(api, thread))  # not other tests' agents
    assert groups, "no agent process found"
    for group in groups:
        os.killpg(group, signal.SIGKILL)
    second = await send(api, thread, "what did I say?")
    done = await finished(api, second["run"]["id"], within=90)
    assert done["status"] == "COMPLETED", done
    state = await _messages(api, thread)
    assert [p["status"] for p in state["providerThreads"]] == ["IDLE"]  # one provider thread, between turns
    before = (await run(api, first["run"]["id"]))["providerThread"]["nativeThreadRef"]
    assert done["providerThread"]["nativeThreadRef"] == before  # the same native thread, resumed
    last = fake.bodies(MODEL_PATH[provider])[-1]
    assert "remember ALPHA-42" in str(last) and "what did I say?" in str(last)


@pytest.mark.own_server  # a server of its own with other instances, on a database of its own
async def test_a_missing_cli_fails_the_run_with_the_install_command(
    database_url: str, tmp_path: Path, fake: FakeModel
) -> None:
    config = tmp_path / "providers.toml"
    config.write_text(
        '[instances.nocodex]\ndriver = "codex"\nbinary = "codex-not-installed-here"\napi_key_env = "K"\n'
        '[instances.nokey]\ndriver = "claude"\napi_key_env = "THREADLOOM_TEST_UNSET_KEY"\n'
    )
    server = ServerProcess(database_url, tmp_path / "d", env={"THREADLOOM_PROVIDERS": str(config), "K": "x"})
    client = Client(server.wait_ready().url, server.admin_token)
    try:
        for instance, expected in (("nocodex", "codex-not-installed-here"), ("nokey", "THREADLOOM_TEST_UNSET_KEY")):
            thread, _ = await _thread(client, tmp_path, instance)
            sent = await send(client, thread, "hello")
            done = await finished(client, sent["run"]["id"])
            assert (done["status"], done["statusReason"]) == ("FAILED", "provider_error")
            state = await client.gql("query($t: ID!) { thread(id: $t) { queueHeld queueHoldReason } }", {"t": thread})
            assert state["thread"]["queueHeld"] and expected in state["thread"]["queueHoldReason"]
    finally:
        await client.aclose()
        server.stop()


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_the_model_a_message_asks_for_reaches_the_model(
    api: Client, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    """sendMessage's `model` is the model of that run's turn, on a native thread already loaded with another."""
    thread, _ = await _thread(api, tmp_path, provider, "workspace_write")
    assert (await finished(api, (await send(api, thread, "default"))["run"]["id"], within=90))["status"] == "COMPLETED"
    seen = len(fake.bodies(MODEL_PATH[provider]))
    asked = f"{provider}-asked-model-7"
    sent = await api.gql(
        """mutation($t: ID!, $m: String!) { sendMessage(input: {threadId: $t, text: "chosen", model: $m}) {
             run { id } userErrors { code } } }""",
        {"t": thread, "m": asked},
    )
    done = await finished(api, sent["sendMessage"]["run"]["id"], within=90)
    assert done["status"] == "COMPLETED"
    bodies = fake.bodies(MODEL_PATH[provider])[seen:]
    assert bodies and {body.get("model") for body in bodies} == {asked}


def _alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.parametrize("provider", PROVIDERS)
@pytest.mark.own_server  # it kills its server, on a database of its own
async def test_another_replica_resumes_the_native_thread_of_a_killed_one(
    agents_server: ServerProcess, database_url: str, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    """Two replicas on one database and one data folder (the agents' state on the shared volume): the replica that
    ran a thread's turn is killed with -9, its agent goes with it, and the next message, sent to the other replica,
    continues the same native thread with the conversation from before."""
    env = cli_providers_env(tmp_path, fake, **KEYS)
    api = Client(agents_server.url, agents_server.admin_token)
    thread, _ = await _thread(api, tmp_path, provider)
    first = await send(api, thread, "remember BRAVO-7")
    assert (await finished(api, first["run"]["id"], within=90))["status"] == "COMPLETED"
    # Started only now, so the first turn ran on the first replica (any replica's worker may claim a turn).
    other = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
    survivor = Client(other.url, agents_server.admin_token)
    try:
        groups = _agent_process_groups(agents_server)
        assert groups, "the first replica started no agent"
        agents_server.kill()

        async def agents_gone() -> bool:
            return not any(_alive(group) for group in groups)

        await until(agents_gone, within=30)  # nothing goes on working beside the replica that resumes
        second = await send(survivor, thread, "what did I say?")
        done = await finished(survivor, second["run"]["id"], within=120)
        assert done["status"] == "COMPLETED", done
        before = (await run(survivor, first["run"]["id"]))["providerThread"]["nativeThreadRef"]
        assert done["providerThread"]["nativeThreadRef"] == before
        last = fake.bodies(MODEL_PATH[provider])[-1]
        assert "remember BRAVO-7" in str(last) and "what did I say?" in str(last)
    finally:
        await api.aclose()
        await survivor.aclose()
        other.stop()
    assert not any("SECRET" in line for line in other.log), "an API key reached the server log"

"""full_access widens an agent's network, never to Threadloom itself.

A real `threadloom serve` with its token-less metrics port (THREADLOOM_METRICS_PORT, 127.0.0.1) and a scripted
instance allowed `full_access`. The agent's commands run the same probe (`probe.py`, written into the workspace
by the test): a TCP connect to the server's main port, to its metrics port, and to a listener the probe opens
itself on its own loopback, plus whether the namespace has a default route. From a full_access thread the
server's ports are shut while the probe's own listener answers and a default route exists (the command has a
network, pasta's, just not the host's loopback). The twin: the very same probe run by the test on the host
reaches both of the server's ports. Real bwrap and real pasta; no traffic leaves 127.0.0.0/8 or the namespaces
these commands create (the probe only connects to 127.0.0.1).
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.agents import full_access_turn
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, free_port
from threadloom.agent.sandbox import Sandbox, SandboxUnavailable
from threadloom.providers import netns
from threadloom.providers.claude import ClaudeDriver
from threadloom.providers.codex import CodexDriver
from threadloom.providers.contract import SessionScope

PROBE = """\
import socket, sys

def probe(port):
    try:
        socket.create_connection(("127.0.0.1", port), timeout=10).close()
        return "open"
    except OSError:
        return "shut"

own = socket.socket()
own.bind(("127.0.0.1", 0))
own.listen()
with open("/proc/net/route") as routes:
    default = any(line.split()[1] == "00000000" for line in routes.read().splitlines()[1:])
print(f"main={probe(int(sys.argv[1]))} metrics={probe(int(sys.argv[2]))} "
      f"own={probe(own.getsockname()[1])} route={'default' if default else 'none'}")
"""

CREATE_WITH_MODE = """mutation($p: ID!, $m: String!, $i: String) {
  createThread(input: {projectId: $p, title: "t", runtimeMode: $m, providerInstanceId: $i}) {
    thread { id runtimeMode } userErrors { code field message } } }"""


@dataclass
class World:
    server: ServerProcess
    admin: Client
    metrics_port: int
    workspace: Path
    project: str

    async def probe_in(self, mode: str) -> str:
        """The probe's line from a `mode` thread of the full_access-allowed instance."""
        data = await self.admin.gql(CREATE_WITH_MODE, {"p": self.project, "m": mode, "i": "open"})
        payload = data["createThread"]
        assert payload["userErrors"] == [], payload
        command = f"@tool python3 probe.py {self.server.port} {self.metrics_port}\n@reply done"
        sent = await send(self.admin, payload["thread"]["id"], command)
        assert sent["userErrors"] == [], sent
        done = await finished(self.admin, sent["run"]["id"])
        tools = [c for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]
        assert [tool["status"] for tool in tools] == ["COMPLETED"], tools
        return str((tools[0].get("detail") or {}).get("output") or "").strip()


def test_pasta_is_installed_for_networked_agents() -> None:
    """Networked agents need pasta (passt): without it their commands are refused (scripts/test installs it)."""
    assert netns.find_pasta(), "install passt (scripts/test does)"


@pytest.fixture
def metrics_port() -> int:
    return free_port()


@pytest.fixture
def server(database_url: str, data_dir: Path, tmp_path: Path, metrics_port: int) -> Iterator[ServerProcess]:
    config = tmp_path / "providers.toml"
    config.write_text('[instances.open]\ndriver = "scripted"\nallow_full_access = true\n')
    env = {"THREADLOOM_PROVIDERS": str(config), "THREADLOOM_METRICS_PORT": str(metrics_port)}
    proc = ServerProcess(database_url, data_dir, env=env).wait_ready()
    yield proc
    proc.stop()
    print(proc.report(60))  # shown by pytest only when the test fails


@pytest.fixture
async def world(server: ServerProcess, metrics_port: int, tmp_path: Path) -> AsyncIterator[World]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "probe.py").write_text(PROBE)
    admin = Client(server.url, server.admin_token)
    data = await admin.gql(CREATE_PROJECT, {"name": "P", "root": str(workspace)})
    assert data["createProject"]["userErrors"] == []
    yield World(server, admin, metrics_port, workspace, data["createProject"]["project"]["id"])
    await admin.aclose()


async def host_probe(workspace: Path, main: int, metrics: int) -> str:
    """The same probe, run by the test on the host's network."""
    argv = [sys.executable, str(workspace / "probe.py"), str(main), str(metrics)]
    done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, check=True)
    return done.stdout.strip()


async def test_full_access_commands_have_a_network_but_not_threadloom_s_ports(world: World) -> None:
    # The twin first: the probe reaches both ports from the host, so "shut" below is the sandbox's doing.
    on_host = await host_probe(world.workspace, world.server.port, world.metrics_port)
    assert on_host.startswith("main=open metrics=open own=open")
    assert await world.probe_in("full_access") == "main=shut metrics=shut own=open route=default"


async def test_other_modes_have_no_network_at_all(world: World) -> None:
    """The instance's other threads keep bwrap's empty network namespace: a loopback of their own, no route.
    The twin: the same probe on the host reaches both ports and sees a route."""
    assert await host_probe(world.workspace, world.server.port, world.metrics_port) == (
        "main=open metrics=open own=open route=default"
    )
    assert await world.probe_in("workspace_write") == "main=shut metrics=shut own=open route=none"


def test_without_pasta_a_networked_command_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No pasta: the command is refused with the install hint, never run on the host's network; the same
    sandbox without the network still builds."""
    monkeypatch.setattr(netns, "find_pasta", lambda: None)
    with pytest.raises(SandboxUnavailable, match="passt"):
        Sandbox(tmp_path, network=True).argv(["true"], str(tmp_path))
    assert "--share-net" not in Sandbox(tmp_path).argv(["true"], str(tmp_path))


def test_networked_bwrap_runs_under_pasta(tmp_path: Path) -> None:
    """The networked sandbox keeps --share-net, of the launcher's namespace (shutil.which: real pasta)."""
    argv: list[str] = Sandbox(tmp_path, network=True).argv(["true"], str(tmp_path))
    assert argv[:3] == [sys.executable, "-m", "threadloom.providers.netns"]
    assert argv[3] == shutil.which("pasta") and argv[4] == "none" and "--share-net" in argv


@pytest.mark.parametrize(
    ("url", "ports"),
    [
        ("http://127.0.0.1:8123/v1", (8123,)),
        ("http://localhost/v1", (80,)),
        ("https://[::1]/v1", (443,)),
        ("https://api.openai.com/v1", ()),
        ("http://192.0.2.7:9000", ()),
        (None, ()),
    ],
)
def test_only_a_loopback_model_endpoint_is_forwarded(url: str | None, ports: tuple[int, ...]) -> None:
    assert netns.loopback_ports(url) == ports


def test_the_launcher_returns_the_command_s_status_and_forwards_only_what_it_is_told(tmp_path: Path) -> None:
    """Direct: a listener on the host's loopback is reached through -T and not without it."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        port = listener.getsockname()[1]
        probe = f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=10).close()"
        forwarded = subprocess.run(netns.isolated([sys.executable, "-c", probe], [port]), capture_output=True)
        closed = subprocess.run(netns.isolated([sys.executable, "-c", probe]), capture_output=True)
    assert forwarded.returncode == 0, forwarded.stderr
    assert closed.returncode == 1 and b"ConnectionRefusedError" in closed.stderr
    assert subprocess.run(netns.isolated(["sh", "-c", "exit 7"])).returncode == 7


async def test_codex_full_access_reaches_its_loopback_model_but_not_the_host_s_loopback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real Codex CLI of an allow_full_access instance runs whole in a pasta namespace: its turn completes
    (the fake model on 127.0.0.1 is reached through the one forwarded port), while a command of a full_access
    thread cannot reach a listener on the host's loopback (a stand-in for the metrics port) that the same
    probe reaches from the host."""
    monkeypatch.setenv("FAKE_OPENAI_API_KEY", "sk-fake-net-1")
    fake = FakeModel().start()
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "probe.py").write_text(PROBE)
    options = {"base_url": fake.url + "/v1", "api_key_env": "FAKE_OPENAI_API_KEY", "allow_full_access": True}
    driver = CodexDriver("codex-net", tmp_path / "agent", options)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        on_host = await host_probe(cwd, port, port)
        assert on_host.startswith("main=open metrics=open")  # the twin: the probe reaches the port from the host
        runtime = await driver.open_session(SessionScope("p1", str(cwd), driver.state_dir / "p1"))
        try:
            done, tools = await full_access_turn(runtime, cwd, f"RUN: python3 probe.py {port} {port}")
        finally:
            fake.release()
            await runtime.close()
            fake.stop()
    assert done.status == "completed" and done.error is None  # the model was reached: two requests
    assert len(fake.bodies("/v1/responses")) == 2
    assert len(tools) == 1 and tools[0].detail["exitCode"] == 0, tools
    assert tools[0].detail["aggregatedOutput"].strip() == "main=shut metrics=shut own=open route=default"


async def test_claude_full_access_reaches_its_loopback_model_but_not_the_host_s_loopback(
    tmp_path: Path, fake: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Claude twin of the Codex test above: a full_access thread's real Claude Code process runs in a pasta
    namespace; its turn completes (the fake model on 127.0.0.1 reached through the one forwarded port), while
    its command cannot reach a listener on the host's loopback that the same probe reaches from the host."""
    monkeypatch.setenv("FAKE_ANTHROPIC_API_KEY", "sk-fake-net-claude")
    cwd = tmp_path / "work"
    cwd.mkdir()
    (cwd / "probe.py").write_text(PROBE)
    options = {"base_url": fake.url, "api_key_env": "FAKE_ANTHROPIC_API_KEY", "allow_full_access": True}
    driver = ClaudeDriver("claude-net", tmp_path / "agents" / "claude-net", options)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        on_host = await host_probe(cwd, port, port)
        assert on_host.startswith("main=open metrics=open")  # the twin: the probe reaches the port from the host
        runtime = await driver.open_session(SessionScope("p1", str(cwd), driver.state_dir / "p1"))
        try:
            done, tools = await full_access_turn(runtime, cwd, f"RUN: python3 probe.py {port} {port}")
        finally:
            await runtime.close()
    assert done.status == "completed" and done.error is None  # the model was reached
    assert [body for body in fake.bodies("/v1/messages") if body.get("tools")], "no main-loop request"
    assert len(tools) == 1 and tools[0].detail["exitCode"] == 0, tools
    assert tools[0].detail["output"].strip() == "main=shut metrics=shut own=open route=default"

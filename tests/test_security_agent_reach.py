"""What no agent reaches, whatever its mode: the server's ports, its database, and anything through a link.

One real root `threadloom serve` on its own embedded PostgreSQL (the socket under its data dir, as deployed),
with its token-less metrics port, a scripted instance allowed `full_access`, and two `acp` instances over the
scripted agent's ACP face: `acp` as is, and `acp-probe`, whose command first runs `tests/support/reach_probe.py`
as the agent process itself (an ACP agent may run commands itself, unsandboxed, like Qwen Code), then becomes
the agent. Its `base_url` names a listener of the test on 127.0.0.1, standing for a local model server.

Every denial has its twin: the same probe run by the test (the server's user, on the host) reaches the main
and metrics ports, connects to the database socket and mints a token with `threadloom token create`.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import struct
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support import reach_probe
from tests.support.acp_scripted import acp_command, acp_instance
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, free_port
from threadloom.cli import _project_id
from threadloom.unprivileged import ACCESS_ACL, DEFAULT_UID, AgentUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only a root server switches agents to another user")

AGENT = AgentUser(DEFAULT_UID, DEFAULT_UID)
PROBE = Path(reach_probe.__file__)
THREADLOOM = str(Path(sys.executable).parent / "threadloom")
CREATE_THREAD = """mutation($p: ID!, $i: String!, $m: RuntimeMode) {
  createThread(input: {projectId: $p, title: "t", providerInstanceId: $i, mode: $m}) {
    thread { id } userErrors { code message } } }"""
SHUT = "main=shut metrics=shut"
OPEN = "main=open metrics=open"


@dataclass
class World:
    server: ServerProcess
    client: Client
    base: Path
    data: Path
    metrics: int
    model: int
    socket: str  # the embedded PostgreSQL's socket
    database_url: str

    async def thread(self, instance: str, workspace: Path, mode: str = "WORKSPACE_WRITE") -> tuple[str, str]:
        """(project uuid, thread id) of a new project over `workspace` and a thread on `instance`."""
        made = (await self.client.gql(CREATE_PROJECT, {"name": workspace.name, "root": str(workspace)}))
        assert made["createProject"]["userErrors"] == [], made
        project = made["createProject"]["project"]["id"]
        data = await self.client.gql(CREATE_THREAD, {"p": project, "i": instance, "m": mode})
        assert data["createThread"]["userErrors"] == [], data
        return _project_id(project), data["createThread"]["thread"]["id"]

    async def run(self, thread: str, text: str) -> dict[str, object]:
        sent = await send(self.client, thread, text)
        assert sent["userErrors"] == [], sent
        done = await finished(self.client, sent["run"]["id"])
        assert done["status"] == "COMPLETED", (done["statusReason"], done["rootNode"])
        return done

    def workspace(self, name: str) -> Path:
        folder = self.base / name
        folder.mkdir()
        return folder

    def probe_args(self, mint_name: str) -> list[str]:
        return [
            "--tcp", f"main={self.server.port}", "--tcp", f"metrics={self.metrics}",
            "--unix", f"pg={self.socket}", "--mint", f"{mint_name}={THREADLOOM}={self.database_url}",
        ]  # fmt: skip

    async def from_host(self, mint_name: str, *extra: str) -> str:
        """The twin: the probe run by the test itself (root, the host's network)."""
        argv = [sys.executable, str(PROBE), *extra, *self.probe_args(mint_name)]
        done = await asyncio.to_thread(subprocess.run, argv, capture_output=True, text=True, timeout=90)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def token_names(self) -> list[str]:
        listed = subprocess.run(
            [THREADLOOM, "token", "list"], env={**os.environ, "DATABASE_URL": self.database_url},
            capture_output=True, text=True, timeout=60, check=True,
        )  # fmt: skip
        return [line.split()[-1] for line in listed.stdout.splitlines() if line.strip()]


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("reach")
    folder.chmod(0o711)  # the agent user passes through to the workspaces
    return folder


@dataclass(frozen=True)
class Ports:
    main: int
    metrics: int
    model: int


@pytest.fixture(scope="module")
def ports() -> Iterator[Ports]:
    """The server's main and metrics ports, and a listener on the host's loopback standing for a local model
    server (the `acp-probe` instance's base_url)."""
    with socket.socket() as model:
        model.bind(("127.0.0.1", 0))
        model.listen(64)
        yield Ports(free_port(), free_port(), model.getsockname()[1])


@pytest.fixture(scope="module")
def server(base: Path, ports: Ports) -> Iterator[ServerProcess]:
    probe = [
        sys.executable, str(PROBE), "--out", "{state_dir}/reach.txt",
        "--tcp", f"main={ports.main}", "--tcp", f"metrics={ports.metrics}", "--tcp", f"model={ports.model}",
        "--unix", f"pg=@{base}/pg-socket.txt", "--mint", f"mint-acp={THREADLOOM}=@{base}/database-url.txt",
        "--", *acp_command(),
    ]  # fmt: skip
    providers = (
        '[instances.scripted]\ndriver = "scripted"\nallow_full_access = true\n\n'
        + acp_instance("acp")
        + f'[instances.acp-probe]\ndriver = "acp"\ncommand = {json.dumps(probe)}\n'
        + f'base_url = "http://127.0.0.1:{ports.model}/v1"\n'
    )
    (base / "providers.toml").write_text(providers)
    env = {"THREADLOOM_PROVIDERS": str(base / "providers.toml"), "THREADLOOM_METRICS_PORT": str(ports.metrics)}
    proc = ServerProcess(None, base / "data", env=env, port=ports.main).wait_ready(timeout=90)
    yield proc
    proc.stop()
    print(proc.report(60))  # shown by pytest only when a test failed


@pytest.fixture(scope="module")
async def world(server: ServerProcess, base: Path, ports: Ports) -> AsyncIterator[World]:
    data = base / "data"
    socket_dir = (data / "pg" / "postmaster.pid").read_text().splitlines()[4]
    path = f"{socket_dir}/.s.PGSQL.5432"
    url = f"postgresql+asyncpg://postgres:@/postgres?host={socket_dir}"
    for name, value in (("pg-socket.txt", path), ("database-url.txt", url)):
        (base / name).write_text(value)
        (base / name).chmod(0o644)  # the ACP probe reads them as the agent user: not what it tests
    client = Client(server.url, server.admin_token)
    yield World(server, client, base, data, ports.metrics, ports.model, path, url)
    await client.aclose()


def as_agent(*argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` as the agent user, dropped to as `contained()` drops an agent."""
    return subprocess.run(
        ["setpriv", *AGENT.setpriv_args(), "--", "/usr/bin/env", *argv], capture_output=True, text=True, timeout=60
    )


def tool_output(done: dict[str, object]) -> str:
    root = done["rootNode"]
    assert isinstance(root, dict)
    tools = [c for c in root["children"] if c["kind"] == "TOOL_CALL"]
    assert [t["status"] for t in tools] == ["COMPLETED"], tools
    return str((tools[0].get("detail") or {}).get("output") or "").strip()


# ---- the network and the database ------------------------------------------------------------------------


async def test_an_acp_agent_without_full_access_reaches_its_model_but_not_the_server(world: World) -> None:
    """The `acp-probe` agent process itself (no full_access on its instance), as the agent user: the server's
    main and metrics ports are shut, the one forwarded port (its loopback model endpoint) is open, the
    database socket refuses it and `threadloom token create` mints nothing. The twin: the same probe from the
    host reaches all of it and mints a token."""
    project, thread = await world.thread("acp-probe", world.workspace("ws-acp-probe"))
    await world.run(thread, "@reply probed")
    seen = (world.data / "agents" / "acp-probe" / project / "reach.txt").read_text().strip()
    assert seen == f"{SHUT} model=open pg=shut mint-acp=refused"
    assert "mint-acp" not in world.token_names()
    on_host = await world.from_host("mint-host-acp", "--tcp", f"model={world.model}")
    assert on_host == f"model=open {OPEN} pg=open mint-host-acp=minted"
    assert "mint-host-acp" in world.token_names()


@pytest.mark.parametrize("mode", ["FULL_ACCESS", "WORKSPACE_WRITE"])
async def test_scripted_commands_reach_neither_the_database_nor_the_server_s_ports(world: World, mode: str) -> None:
    """A scripted agent's command, full_access (network, on an instance allowed it) or not: the main and metrics
    ports are shut, the database socket cannot be connected to, `threadloom token create` against it mints
    nothing. The twin: the very same probe run by the test on the host does all three."""
    workspace = world.workspace(f"ws-scripted-{mode.lower()}")
    shutil.copy(PROBE, workspace / "probe.py")
    _, thread = await world.thread("scripted", workspace, mode)
    name = f"mint-{mode.lower()}"
    command = " ".join(["python3", "probe.py", *world.probe_args(name)])
    done = await world.run(thread, f"@tool {command}\n@reply done")
    assert tool_output(done) == f"{SHUT} pg=shut {name}=refused"
    assert name not in world.token_names()
    assert await world.from_host(f"{name}-host") == f"{OPEN} pg=open {name}-host=minted"
    assert f"{name}-host" in world.token_names()


# ---- the ACP driver's session records ----------------------------------------------------------------------


async def test_acp_session_records_are_kept_where_the_agent_cannot_plant_a_link(world: World) -> None:
    """The records (session ids) are the server's, beside the agent's state folder. The agent plants a link
    where older code kept them (`<state>/acp-sessions`, its own folder: the twin, it can) and cannot touch the
    server's folder (rename it, put a link in it, read a record). Turns save the record, a crash makes the
    next turn load it: it lands in the server's folder, and the link's target stays empty."""
    outside = world.base / "outside-records"
    outside.mkdir()
    outside.chmod(0o777)
    project, thread = await world.thread("acp", world.workspace("ws-records"))
    await world.run(thread, "@reply one")
    instance = world.data / "agents" / "acp"
    state, records = instance / project, instance / "acp-sessions" / project
    (record,) = records.iterdir()

    planted = as_agent("ln", "-s", str(outside), str(state / "acp-sessions"))
    assert planted.returncode == 0, planted.stderr  # its own folder: the agent can plant links there
    for attempt in (
        ("mv", str(records), str(state / "taken")),
        ("ln", "-s", str(outside), str(records / "acp-0123456789abcdef0123456789abcdef.json")),
        ("cat", str(record)),
    ):
        refused = as_agent(*attempt)
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, (attempt, refused)

    await world.run(thread, "@reply two")
    crashed = await send(world.client, thread, "@crash")
    assert (await finished(world.client, crashed["run"]["id"]))["statusReason"] == "provider_crashed"
    await world.run(thread, "@reply three")  # a new process: the record is loaded, the session resumed
    assert list(outside.iterdir()) == []
    assert [p.name for p in records.iterdir()] == [record.name]
    saved = json.loads(record.read_text())
    assert len(saved["turns"]) >= 3 and (record.stat().st_mode & 0o777, record.stat().st_uid) == (0o600, 0)
    assert (records.stat().st_mode & 0o777, records.stat().st_uid) == (0o700, 0)


# ---- the workspace's ACL walk ------------------------------------------------------------------------------


def agent_entry(path: Path) -> bool:
    """Whether the access ACL of `path` (itself, never a link's target) names the agent user."""
    try:
        acl = os.getxattr(path, ACCESS_ACL, follow_symlinks=False)
    except OSError:
        return False
    entries = [struct.unpack_from("<HHI", acl, at) for at in range(4, len(acl), 8)]
    return any(tag == 0x02 and uid == AGENT.uid for tag, _, uid in entries)


async def test_the_workspace_grant_stops_at_links(world: World) -> None:
    """At the agent's start the workspace is granted to the agent user: links planted in it (to a folder and
    to a file outside) and a folder the agent swapped for a link to where it moved it get no ACL entry on
    their targets, so the agent user still cannot write them; the twin: the real files inside get the entry
    and the agent user writes them."""
    outside = world.base / "outside-acl"
    (outside / "dir").mkdir(parents=True)
    (outside / "dir" / "in-dir.txt").write_text("outside\n")
    (outside / "file.txt").write_text("outside\n")
    workspace = world.workspace("ws-acl")
    (workspace / "real").mkdir()
    (workspace / "real" / "inside.txt").write_text("inside\n")
    (workspace / "sub").mkdir()
    (workspace / "sub" / "f.txt").write_text("moved\n")
    (workspace / "sub").rename(outside / "moved")  # the folder swapped for a link to where it went
    (workspace / "sub").symlink_to(outside / "moved")
    (workspace / "link-dir").symlink_to(outside / "dir")
    (workspace / "link-file").symlink_to(outside / "file.txt")

    _, thread = await world.thread("scripted", workspace)
    await world.run(thread, "@reply started")  # the agent's start grants the workspace

    targets = [outside, outside / "dir", outside / "dir" / "in-dir.txt", outside / "file.txt", outside / "moved",
               outside / "moved" / "f.txt"]  # fmt: skip
    assert [t for t in targets if agent_entry(t)] == []
    assert all(agent_entry(p) for p in (workspace, workspace / "real", workspace / "real" / "inside.txt"))
    for link in ("link-file", "link-dir/in-dir.txt", "sub/f.txt"):
        refused = as_agent("sh", "-c", f"echo x >> {workspace / link}")
        assert refused.returncode != 0 and "Permission denied" in refused.stderr, (link, refused)
    wrote = as_agent("sh", "-c", f"echo x >> {workspace / 'real' / 'inside.txt'}")
    assert wrote.returncode == 0, wrote.stderr
    # Hard links are no links to the walk: it relies on fs.protected_hardlinks, under which the agent user
    # cannot hard-link a file outside it may not write; the twin, a file of its own, it can.
    refused = as_agent("ln", str(outside / "file.txt"), str(workspace / "hard"))
    assert refused.returncode != 0 and "Operation not permitted" in refused.stderr, refused
    made = as_agent("sh", "-c", f"cd {workspace / 'real'} && echo mine > own.txt && ln own.txt own-hard.txt")
    assert made.returncode == 0, made.stderr
    assert (outside / "file.txt").read_text() == "outside\n" and (outside / "moved" / "f.txt").read_text() == "moved\n"

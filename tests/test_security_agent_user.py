"""Agents run as an unprivileged user, so even an escape from their sandbox cannot reach the server's files.

A real `threadloom serve` running as root (as the tests do) with the scripted agent under the real bubblewrap.
The agent process and its commands must run as the agent user (65534 by default), and that user must fail
to write the server's package, list the data dir or its checkpoints, and connect to PostgreSQL's socket --
each probe run as the agent user exactly as `contained()` drops to it, each with its twin run as root that
succeeds. And the agent user must still do its work: write files the operator (root) put in the workspace
and files a rollback restored.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import threadloom
from tests.support.graphql import CREATE_PROJECT
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from threadloom.unprivileged import DEFAULT_UID, AgentUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only a root server switches agents to another user")

AGENT = AgentUser(DEFAULT_UID, DEFAULT_UID)
CREATE_THREAD = """mutation($p: ID!) { createThread(input: {projectId: $p, title: "t"}) {
  thread { id } userErrors { code } } }"""
ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n, restoreFiles: true}) {
  userErrors { code message } } }"""


@dataclass
class World:
    server: ServerProcess
    client: Client
    data_dir: Path
    workspace: Path
    project: str

    async def thread(self) -> str:
        created = (await self.client.gql(CREATE_THREAD, {"p": self.project}))["createThread"]
        assert created["userErrors"] == []
        return str(created["thread"]["id"])

    async def run(self, thread: str, text: str) -> list[dict[str, Any]]:
        """Send `text`; the finished run's tool calls (its commands and writes)."""
        sent = await send(self.client, thread, text)
        assert sent["userErrors"] == [], sent
        done = await finished(self.client, sent["run"]["id"])
        assert done["status"] == "COMPLETED", (done["statusReason"], done["rootNode"])
        return [c for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]


def output(node: dict[str, Any]) -> str:
    return str((node.get("detail") or {}).get("output") or "")


@pytest.fixture
def serving(database_url: str, data_dir: Path) -> Iterator[ServerProcess]:
    proc = ServerProcess(database_url, data_dir).wait_ready()
    yield proc
    proc.stop()
    print(proc.report(60))  # shown by pytest only when the test fails


@pytest.fixture
async def world(serving: ServerProcess, data_dir: Path, tmp_path: Path) -> AsyncIterator[World]:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    (workspace / "operator.txt").write_text("from the operator\n")  # root's, 0644
    (workspace / "sub").mkdir()
    (workspace / "sub" / "deep.txt").write_text("deep\n")
    client = Client(serving.url, serving.admin_token)
    data = await client.gql(CREATE_PROJECT, {"name": "p", "root": str(workspace)})
    assert data["createProject"]["userErrors"] == []
    yield World(serving, client, data_dir, workspace, data["createProject"]["project"]["id"])
    await client.aclose()


def agent_processes(data_dir: Path) -> list[int]:
    """The scripted agent processes of this server (their state dir is in its data dir)."""
    found = []
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            argv = Path(entry.path, "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"threadloom.agent" in argv and any(a.startswith(str(data_dir).encode()) for a in argv):
            found.append(int(entry.name))
    return found


def real_uid(pid: int) -> int:
    line = next(x for x in Path(f"/proc/{pid}/status").read_text().splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


def as_agent(*argv: str) -> subprocess.CompletedProcess[str]:
    """`argv` as the agent user, dropped to exactly as `contained()` drops an agent, then started by `env`:
    `setpriv` keeps root's capabilities until its own exec, so a program it starts directly is found even
    in folders that user cannot search (in `contained()` a second `setpriv` and `unshare` come between)."""
    return subprocess.run(
        ["setpriv", *AGENT.setpriv_args(), "--", "/usr/bin/env", *argv], capture_output=True, text=True
    )


def as_root(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), capture_output=True, text=True)


async def test_the_agent_and_its_commands_run_as_the_agent_user(world: World) -> None:
    thread = await world.thread()
    (uid,) = await world.run(thread, "@tool id -u\n@reply done")
    assert output(uid).split() == [str(AGENT.uid)]  # inside bwrap's user namespace too
    pids = agent_processes(world.data_dir)
    assert pids and {real_uid(pid) for pid in pids} == {AGENT.uid}  # and seen from outside
    assert os.getuid() == 0  # the server (this test's user) is root: the drop is real


async def test_the_agent_user_writes_what_the_operator_put_in_the_workspace(world: World) -> None:
    thread = await world.thread()
    appended, deep, new = await world.run(
        thread,
        "@tool echo by-agent >> operator.txt\n@tool echo by-agent >> sub/deep.txt\n@write sub/new.txt made\n"
        "@reply done",
    )
    assert [n["status"] for n in (appended, deep, new)] == ["COMPLETED"] * 3, [output(n) for n in (appended, deep)]
    assert (world.workspace / "operator.txt").read_text() == "from the operator\nby-agent\n"
    assert (world.workspace / "sub" / "deep.txt").read_text() == "deep\nby-agent\n"
    assert (world.workspace / "operator.txt").stat().st_uid == 0  # still the operator's file
    assert (world.workspace / "sub" / "new.txt").stat().st_uid == AGENT.uid


async def test_files_a_rollback_restored_stay_writable(world: World) -> None:
    thread = await world.thread()
    await world.run(thread, "@write kept/f.txt one\n@reply one")
    await world.run(thread, "@tool rm -r kept\n@reply two")
    assert not (world.workspace / "kept").exists()
    answer = (await world.client.gql(ROLLBACK, {"t": thread, "n": 1}))["rollbackToRun"]
    assert answer["userErrors"] == [], answer
    restored = world.workspace / "kept" / "f.txt"
    assert restored.read_text() == "one"  # made by the server (root) in a restore
    (edit,) = await world.run(thread, "@tool echo more >> kept/f.txt && touch kept/g.txt\n@reply three")
    assert edit["status"] == "COMPLETED", output(edit)
    assert restored.read_text() == "onemore\n"


async def test_the_agent_user_cannot_reach_the_servers_files(world: World, pg: PgServer) -> None:
    thread = await world.thread()
    await world.run(thread, "@write a.txt x\n@reply done")  # the data dir now has checkpoints and agents' state
    package = Path(threadloom.__file__).parent
    planted = package / f"planted_{os.getpid()}.py"
    checkpoints = world.data_dir / "checkpoints"
    assert checkpoints.is_dir()

    # The package: the agent user cannot plant a file; root can (the twin), removed again.
    denied = as_agent("touch", str(planted))
    assert denied.returncode != 0 and "Permission denied" in denied.stderr and not planted.exists()
    assert as_root("touch", str(planted)).returncode == 0
    planted.unlink()
    # The data dir: not listable, its checkpoints not even enterable; root lists both.
    for folder in (world.data_dir, checkpoints):
        denied = as_agent("ls", str(folder))
        assert denied.returncode != 0 and "Permission denied" in denied.stderr
        assert as_root("ls", str(folder)).returncode == 0
    # Its own state folder it reaches (the positive twin of the same user).
    state = next(p for p in (world.data_dir / "agents" / "scripted").iterdir())
    assert as_agent("ls", str(state)).returncode == 0
    # PostgreSQL's socket: refused to the agent user, accepted for root.
    probe = f"import socket; socket.socket(socket.AF_UNIX).connect({pg.socket_dir + '/.s.PGSQL.5432'!r})"
    denied = as_agent(sys.executable, "-c", probe)
    assert denied.returncode != 0 and "PermissionError" in denied.stderr
    assert as_root(sys.executable, "-c", probe).returncode == 0
    with socket.socket(socket.AF_UNIX) as sock:  # the path is right: root's own connect works here too
        sock.connect(pg.socket_dir + "/.s.PGSQL.5432")


THREAD_HOLD = """query($id: ID!) { thread(id: $id) { queueHeld queueHoldReason } }"""


async def test_a_workspace_the_agent_user_cannot_reach_fails_the_start_naming_it(
    serving: ServerProcess, tmp_path: Path
) -> None:
    client = Client(serving.url, serving.admin_token)
    try:
        for mode in (0o700, 0o711):  # closed to others, then its twin: only traversable
            folder = tmp_path / f"mode-{mode:o}"
            (folder / "ws").mkdir(parents=True)
            folder.chmod(mode)
            data = await client.gql(CREATE_PROJECT, {"name": f"p{mode:o}", "root": str(folder / "ws")})
            assert data["createProject"]["userErrors"] == []
            created = await client.gql(CREATE_THREAD, {"p": data["createProject"]["project"]["id"]})
            thread = created["createThread"]["thread"]["id"]
            sent = await send(client, thread, "@tool pwd\n@reply done")
            done = await finished(client, sent["run"]["id"])
            hold = (await client.gql(THREAD_HOLD, {"id": thread}))["thread"]
            if mode == 0o700:
                assert (done["status"], done["statusReason"]) == ("FAILED", "provider_error")
                assert hold["queueHeld"] and f"cannot reach {folder} on the way to {folder / 'ws'}" in str(
                    hold["queueHoldReason"]
                ), hold
            else:
                assert done["status"] == "COMPLETED", done["statusReason"]
                assert not hold["queueHeld"], hold
    finally:
        await client.aclose()


def test_a_program_the_agent_user_cannot_reach_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from threadloom import unprivileged

    monkeypatch.setattr(unprivileged, "_current", AGENT)
    for mode in (0o700, 0o711):  # a virtualenv under root's 0700 home, then its twin: only traversable
        home = tmp_path / f"home-{mode:o}"
        (home / "bin").mkdir(parents=True)
        program = home / "bin" / "agent"
        program.write_text("#!/bin/sh\n")
        program.chmod(0o755)
        home.chmod(mode)
        if mode == 0o700:
            with pytest.raises(unprivileged.CannotReach) as raised:
                unprivileged.check_reach([str(program)])
            assert raised.value.blocked == str(home) and raised.value.path == str(program)
            assert as_agent(str(program)).returncode != 0  # what the check spares: an exec failing as is
        else:
            unprivileged.check_reach([str(program)])
            assert as_agent(str(program)).returncode == 0


def test_the_embedded_databases_socket_in_a_runtime_folder_is_closed_to_the_agent_user(tmp_path: Path) -> None:
    from threadloom.store.embedded import start_embedded, stop_embedded

    data_dir = tmp_path / ("d" * 120)  # too long a path for a unix socket: pgserver puts it elsewhere
    server = start_embedded(data_dir)
    try:
        socket_dir = server.get_postmaster_info().socket_dir
        assert socket_dir is not None and not Path(socket_dir).is_relative_to(data_dir)
        probe = f"import socket; socket.socket(socket.AF_UNIX).connect({str(socket_dir) + '/.s.PGSQL.5432'!r})"
        denied = as_agent(sys.executable, "-c", probe)
        assert denied.returncode != 0 and "PermissionError" in denied.stderr
        assert as_root(sys.executable, "-c", probe).returncode == 0  # the twin: the server's user connects
    finally:
        stop_embedded(server)

"""Security review: what an `operate` token of project B can make the scripted agent reach, beyond the
cases of test_security_agents.py (variants: the server's own /proc entry, the checkout and install, a
`@write` through a symlink the attacker planted, python instead of cat, the database socket, loopback ports,
server secrets typed over several output chunks, delegated threads' modes).

Real `threadloom serve`, real bubblewrap, two projects; B's token is the only credential the attacker uses.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import threadloom
from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess

SERVER_SECRET = "sk-review-5c1e0a77-server-only"
A_SECRET = "project-A-review-secret-9931"
CHECKOUT = Path(threadloom.__file__).resolve().parents[2]  # the server's source checkout
SHARED_SERVER = True  # each test works in projects of its own (conftest's module_server)
SERVER_EXEC = True  # a real exec (not a fork): a test reads the server's own /proc/<pid>/environ
PROVIDERS = '[instances.open]\ndriver = "scripted"\nallow_full_access = true\n'
SERVER_ENV = {"THREADLOOM_REVIEW_SECRET": SERVER_SECRET}

CREATE = """mutation($p: ID!, $m: String!, $i: String) {
  createThread(input: {projectId: $p, title: "t", runtimeMode: $m, providerInstanceId: $i}) {
    thread { id runtimeMode } userErrors { code field message } } }"""
DELEGATE = """mutation($t: ID!, $text: String!) { delegateTask(input: {threadId: $t, text: $text}) {
  thread { id runtimeMode runs(first: 1) { edges { node { id } } } } userErrors { code field } } }"""


@dataclass
class World:
    server: ServerProcess
    admin: Client
    attacker: Client
    database_url: str
    data_dir: Path
    ws_a: Path
    ws_b: Path
    project_a: str
    project_b: str

    async def thread(self, mode: str = "workspace_write", instance: str | None = None) -> str:
        data = await self.attacker.gql(CREATE, {"p": self.project_b, "m": mode, "i": instance})
        assert data["createThread"]["userErrors"] == [], data
        return str(data["createThread"]["thread"]["id"])

    async def tools(self, thread: str, text: str) -> list[dict[str, Any]]:
        """B sends `text`; the tool-call nodes of the finished run, as B's thread shows them."""
        sent = await send(self.attacker, thread, text)
        assert sent["userErrors"] == [], sent
        done = await finished(self.attacker, sent["run"]["id"])
        return [c for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]


def output(node: dict[str, Any]) -> str:
    return str((node.get("detail") or {}).get("output") or "")


def environ_of(pid: int) -> str:
    """A process's environment as the test (root, on the host) reads it."""
    return Path(f"/proc/{pid}/environ").read_bytes().decode()


@pytest.fixture
async def world(server: ServerProcess, database_url: str, data_dir: Path, tmp_path: Path) -> AsyncIterator[World]:
    ws_a, ws_b = tmp_path / "ws-a", tmp_path / "ws-b"
    ws_a.mkdir()
    ws_b.mkdir()
    (ws_a / "secret.txt").write_text(A_SECRET)
    admin = Client(server.url, server.admin_token)
    ids = []
    for name, root in (("A", ws_a), ("B", ws_b)):
        data = await admin.gql(CREATE_PROJECT, {"name": name, "root": str(root)})
        assert data["createProject"]["userErrors"] == []
        ids.append(data["createProject"]["project"]["id"])
    attacker = Client(server.url, create_token(database_url, "operate", ids[1])[1])
    yield World(server, admin, attacker, database_url, data_dir, ws_a, ws_b, ids[0], ids[1])
    await attacker.aclose()
    await admin.aclose()


async def test_the_server_process_checkout_and_install_are_out_of_reach(world: World) -> None:
    """Each denial next to its twin in the same turn: the same command aimed at B's own workspace succeeds
    (and the server's environ, read by the test, does hold the secret)."""
    pid = world.server.proc.pid
    (world.ws_b / "own.txt").write_text("B-OWN")
    thread = await world.thread()
    tools = await world.tools(
        thread,
        f"@tool cat /proc/{pid}/environ\n"
        "@tool cat /proc/self/environ\n"
        "@tool ls /proc\n"
        f"@tool ls {CHECKOUT}\n"
        f"@tool ls {sys.prefix}\n"
        f"@tool ls {world.ws_b}\n"
        f"@tool python3 -c \"print(open('{world.ws_a}/secret.txt').read())\"\n"
        f"@tool python3 -c \"print(open('{world.ws_b}/own.txt').read())\"\n"
        f"@tool python3 -c \"import os; print(os.listdir('{world.data_dir}'))\"\n"
        f"@tool python3 -c \"import os; print(os.listdir('{world.ws_b}'))\"\n"
        "@tool cat /proc/self/mountinfo\n"
        "@reply done",
    )
    environ, own_environ, procs, checkout, install, own_listing, py_secret, py_own, py_data, py_listing, mountinfo = (
        tools
    )
    assert environ["status"] == "FAILED" and SERVER_SECRET not in output(environ)
    assert own_environ["status"] == "COMPLETED" and "PATH=" in output(own_environ)  # the twin: its own environ
    assert SERVER_SECRET in environ_of(pid)  # and the server's, read by the test
    assert all(name.isdigit() is False or int(name) < 100 for name in output(procs).split())  # own pid namespace
    assert str(pid) not in output(procs).split()
    for listing in (checkout, install):
        assert listing["status"] == "FAILED" and "No such file" in output(listing)
    assert own_listing["status"] == "COMPLETED" and output(own_listing).split() == ["own.txt"]
    assert py_secret["status"] == "FAILED" and A_SECRET not in output(py_secret)
    assert "FileNotFoundError" in output(py_secret)
    assert py_own["status"] == "COMPLETED" and output(py_own).strip() == "B-OWN"
    assert py_data["status"] == "FAILED" and "No such file" in output(py_data)
    assert py_listing["status"] == "COMPLETED" and output(py_listing).strip() == "['own.txt']"
    # The mount table names only the sandbox's own mounts: never A's workspace or the data dir; B's it does.
    assert str(world.ws_a) not in output(mountinfo) and str(world.data_dir) not in output(mountinfo)
    assert str(world.ws_b) in output(mountinfo)


async def test_write_through_planted_symlinks_stays_in_the_workspace(world: World) -> None:
    """Links that escape (to A, to /, to the data dir) lead nowhere; the twin in the same turn: a link that
    stays inside the workspace is written and read through, by `@write` and by a command alike."""
    (world.ws_b / "sub").mkdir()
    (world.ws_b / "sub" / "own.txt").write_text("B-OWN")
    thread = await world.thread()
    tools = await world.tools(
        thread,
        f"@tool ln -s {world.ws_a} to-a && ln -s / to-root && ln -s {world.data_dir} to-data && ln -s sub to-sub\n"
        "@write ../escaped.txt x\n"
        "@write to-a/planted.txt x\n"
        f"@write to-root{world.ws_a}/planted2.txt x\n"
        "@write to-data/planted3.txt x\n"
        "@write to-sub/written.txt x\n"
        "@tool cat to-a/secret.txt; ls to-data; echo x > to-a/planted4.txt\n"
        "@tool cat to-sub/own.txt; ls to-sub; echo y > to-sub/echoed.txt\n"
        "@reply done",
    )
    link, *writes, inside, reads, inside_reads = tools
    assert link["status"] == "COMPLETED", output(link)
    for write in writes:
        assert write["status"] == "FAILED" and "outside" in output(write), write
    assert reads["status"] == "FAILED" and A_SECRET not in output(reads)
    assert "No such file" in output(reads)
    assert sorted(p.name for p in world.ws_a.iterdir()) == ["secret.txt"]
    assert not (world.ws_b.parent / "escaped.txt").exists()
    assert not any(p.name.startswith("planted") for p in world.data_dir.iterdir())
    assert inside["status"] == "COMPLETED" and (world.ws_b / "sub" / "written.txt").read_text() == "x"
    assert inside_reads["status"] == "COMPLETED", output(inside_reads)
    assert output(inside_reads) == "B-OWNown.txt\nwritten.txt\n"  # the file read, then the folder listed
    assert (world.ws_b / "sub" / "echoed.txt").read_text() == "y\n"


def on_host(command: str) -> str:
    """A probe's output when the test runs it on the host: the twin of the same command in the sandbox."""
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    return done.stdout + done.stderr


async def test_no_database_socket_and_no_loopback_without_full_access(world: World) -> None:
    socket_dir = world.database_url.split("host=")[1]
    port = world.server.port
    listing = f"ls -a {socket_dir}"
    connect = f"timeout 5 bash -c 'echo > /dev/tcp/127.0.0.1/{port}' && echo CONNECTED"
    # The twins: the same commands on the host list the socket and reach the server's port.
    assert ".s.PGSQL" in on_host(listing) and "CONNECTED" in on_host(connect)
    thread = await world.thread()
    tools = await world.tools(thread, f"@tool {listing}\n@tool {connect}\n@reply done")
    sock, loopback = tools
    assert sock["status"] == "FAILED" and ".s.PGSQL" not in output(sock) and "No such file" in output(sock)
    assert loopback["status"] == "FAILED" and "CONNECTED" not in output(loopback)
    assert "Connection refused" in output(loopback), output(loopback)  # bwrap's own empty loopback


async def test_full_access_threads_do_not_reach_the_database_socket(world: World) -> None:
    socket_dir = world.database_url.split("host=")[1]
    assert ".s.PGSQL" in on_host(f"ls -a {socket_dir}")  # the twin: the same listing on the host shows it
    thread = await world.thread("full_access", "open")
    [sock] = await world.tools(thread, f"@tool ls -a {socket_dir}\n@reply done")
    assert sock["status"] == "FAILED" and ".s.PGSQL" not in output(sock) and "No such file" in output(sock)


async def test_delegated_threads_keep_the_parents_mode(world: World) -> None:
    """A read_only parent's child is read_only and its write fails; the twin: a workspace_write parent's child
    makes the same write."""
    for mode, name in (("read_only", "from-read-only.txt"), ("workspace_write", "from-workspace-write.txt")):
        parent = await world.thread(mode)
        data = await world.attacker.gql(DELEGATE, {"t": parent, "text": f"@write {name} x\n@reply done"})
        assert data["delegateTask"]["userErrors"] == []
        child = data["delegateTask"]["thread"]
        assert child["runtimeMode"] == mode
        done = await finished(world.attacker, child["runs"]["edges"][0]["node"]["id"])
        [write] = [c for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]
        if mode == "read_only":
            assert write["status"] == "FAILED" and "read-only" in output(write)
            assert not (world.ws_b / name).exists()
        else:
            assert write["status"] == "COMPLETED" and (world.ws_b / name).read_text() == "x"


async def test_a_server_secret_split_over_output_chunks_is_shown_as_typed(world: World) -> None:
    """Not redacted: the agent holds no secret, and redacting one it cannot know would make its output an
    oracle of the server's secrets (tests/test_redaction.py)."""
    half = len(SERVER_SECRET) // 2
    head, tail = SERVER_SECRET[:half], SERVER_SECRET[half:]
    thread = await world.thread()
    # Two writes with a pause between them reach the agent as two output chunks.
    [tool] = await world.tools(thread, f"@tool printf %s {head}; sleep 0.5; printf %s {tail}\n@reply done")
    assert tool["status"] == "COMPLETED"
    assert SERVER_SECRET in output(tool), output(tool)

"""The project is the boundary for agents, tried as a hostile tenant would.

The attacker holds a project-bound `operate` token of project B and nothing else. The server is a real
`threadloom serve` with a secret in its environment and the database URL; projects A and B have their own
workspaces, and A's holds a secret file. Every attempt goes through the API with B's token and the test
asserts what B gets to see: the tool output in B's own thread, the files left behind, the tokens that exist.
Commands run under the real bubblewrap sandbox (a missing `bwrap` fails these tests; it does not skip them).
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.db import count
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from threadloom.store import tables as t
from threadloom.store.db import Database

SERVER_SECRET = "sk-test-9f27c1d0-server-only"
SHARED_SERVER = True  # each test works in projects of its own (conftest's module_server)
SERVER_EXEC = True  # a real exec (not a fork): a test reads the server's own /proc/<pid>/environ
PROVIDERS = '[instances.open]\ndriver = "scripted"\nallow_full_access = true\n'
SERVER_ENV = {"THREADLOOM_TEST_SECRET": SERVER_SECRET}
A_SECRET = "project-A-private-4411"

CREATE = """mutation($p: ID!, $i: String) {
  createThread(input: {projectId: $p, title: "t", providerInstanceId: $i}) {
    thread { id runtimeMode } userErrors { code field message } } }"""
CREATE_WITH_MODE = """mutation($p: ID!, $m: String!, $i: String) {
  createThread(input: {projectId: $p, title: "t", runtimeMode: $m, providerInstanceId: $i}) {
    thread { id runtimeMode } userErrors { code field message } } }"""


async def create_thread(client: Client, project: str, mode: str | None, instance: str | None = None) -> dict[str, Any]:
    """createThread's payload; no `mode` leaves runtimeMode to its default."""
    if mode is None:
        data = await client.gql(CREATE, {"p": project, "i": instance})
    else:
        data = await client.gql(CREATE_WITH_MODE, {"p": project, "m": mode, "i": instance})
    return data["createThread"]  # type: ignore[no-any-return]


PENDING = """query($t: ID!) { thread(id: $t) { status pendingRequests { id kind payload } } }"""
APPROVE = """mutation($r: ID!, $d: Decision!) { respondToApproval(input: {requestId: $r, decision: $d}) {
  userErrors { code } } }"""
COUNT_THREADS = "query($p: ID!) { threads(projectId: $p) { totalCount } }"


@dataclass
class World:
    server: ServerProcess
    admin: Client
    attacker: Client  # operate token of project B
    database_url: str
    data_dir: Path
    ws_a: Path
    ws_b: Path
    project_a: str
    project_b: str

    async def thread(self, client: Client, project: str, mode: str | None = None, instance: str | None = None) -> str:
        payload = await create_thread(client, project, mode, instance)
        assert payload["userErrors"] == [], payload
        return str(payload["thread"]["id"])


def test_bwrap_is_installed_for_the_sandbox() -> None:
    """The sandbox is not optional: without bubblewrap, agent commands would be refused."""
    assert shutil.which("bwrap") or Path("/usr/bin/bwrap").exists(), "install bubblewrap (scripts/test does)"


@pytest.fixture
async def world(server: ServerProcess, database_url: str, data_dir: Path, tmp_path: Path) -> AsyncIterator[World]:
    ws_a, ws_b = tmp_path / "ws-a", tmp_path / "ws-b"
    ws_a.mkdir()
    ws_b.mkdir()
    (ws_a / "secret.txt").write_text(A_SECRET)
    admin = Client(server.url, server.admin_token)
    projects = []
    for name, root in (("A", ws_a), ("B", ws_b)):
        data = await admin.gql(CREATE_PROJECT, {"name": name, "root": str(root)})
        assert data["createProject"]["userErrors"] == []
        projects.append(data["createProject"]["project"]["id"])
    _, token = create_token(database_url, "operate", projects[1])
    attacker = Client(server.url, token)
    yield World(server, admin, attacker, database_url, data_dir, ws_a, ws_b, projects[0], projects[1])
    await attacker.aclose()
    await admin.aclose()


async def run_tools(world: World, thread: str, text: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """B sends `text`; the finished run and its tool-call nodes, commands and file writes (what B's thread shows)."""
    sent = await send(world.attacker, thread, text)
    assert sent["userErrors"] == [], sent
    done = await finished(world.attacker, sent["run"]["id"])
    return done, [c for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]


def output(node: dict[str, Any]) -> str:
    return str((node.get("detail") or {}).get("output") or "")


def environ_of(pid: int) -> str:
    """A process's environment as the test (root, on the host) reads it."""
    return Path(f"/proc/{pid}/environ").read_bytes().decode()


async def test_the_server_environment_is_out_of_reach(world: World) -> None:
    thread = await world.thread(world.attacker, world.project_b)
    done, tools = await run_tools(
        world, thread, f"@tool env\n@tool cat /proc/1/environ; echo\n@tool echo {SERVER_SECRET}\n@reply done"
    )
    assert done["status"] == "COMPLETED"
    env, pid1, echoed = (output(node) for node in tools)
    assert "PATH=" in env and "HOME=/tmp" in env  # the command did run, with its own small environment
    assert "PATH=" in pid1  # and pid 1's environment (bwrap's, handed down by the agent) was read
    for seen in (env, pid1):
        assert SERVER_SECRET not in seen
        assert "DATABASE_URL" not in seen and world.database_url not in seen
        assert "THREADLOOM" not in seen
    # The twin: the server's own environment, read by the test, does hold what the commands never see.
    server_env = environ_of(world.server.proc.pid)
    assert SERVER_SECRET in server_env and "DATABASE_URL=" in server_env and "THREADLOOM_" in server_env
    # The server's secret typed into the output by the attacker is shown as typed: the agent cannot know it,
    # and redacting it would confirm the attacker's guesses of it (tests/test_redaction.py).
    assert SERVER_SECRET in echoed and "***" not in echoed


async def test_another_projects_workspace_is_invisible_to_b_and_open_to_a(world: World) -> None:
    """B's agent cannot read, list or write A's workspace; the twin: A's own agent runs the very same
    commands and they succeed, so the paths and the commands are right."""
    probe = (
        f"@tool cat {world.ws_a}/secret.txt\n@tool ls -a {world.ws_a.parent}\n"
        f"@write {world.ws_a}/planted.txt gotcha\n@reply done"
    )
    thread = await world.thread(world.attacker, world.project_b)
    _, tools = await run_tools(world, thread, probe)
    cat, ls, write = tools
    assert cat["status"] == "FAILED" and A_SECRET not in output(cat)
    assert "No such file" in output(cat)
    assert output(ls).split() == [".", "..", "ws-b"]  # only B's own workspace exists in that folder
    assert write["status"] == "FAILED" and "outside" in output(write)
    assert not (world.ws_a / "planted.txt").exists()

    own = await world.thread(world.admin, world.project_a)
    sent = await send(world.admin, own, probe)
    assert sent["userErrors"] == [], sent
    done = await finished(world.admin, sent["run"]["id"])
    cat, ls, write = [c for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]
    assert cat["status"] == "COMPLETED" and output(cat) == A_SECRET
    assert output(ls).split() == [".", "..", "ws-a"]
    assert write["status"] == "COMPLETED" and (world.ws_a / "planted.txt").read_text() == "gotcha"


async def test_no_admin_token_can_be_minted_and_the_data_dir_is_invisible(world: World) -> None:
    db = Database.from_url(world.database_url)
    try:
        before = await count(db, t.api_tokens)
        thread = await world.thread(world.attacker, world.project_b)
        _, tools = await run_tools(
            world,
            thread,
            f"@tool threadloom --data-dir {world.data_dir} token create --scope admin\n"
            f"@tool python3 -m threadloom --data-dir {world.data_dir} token create --scope admin\n"
            "@tool python3 -m json.tool --help\n"
            f"@tool ls -a {world.data_dir}\n@tool ls -a {world.ws_b}\n@tool ls /\n@reply done",
        )
        assert await count(db, t.api_tokens) == before  # nothing was minted
    finally:
        await db.dispose()
    cli, module, stdlib, data, own, root = tools
    assert cli["status"] == module["status"] == data["status"] == "FAILED"
    assert "tl_" not in output(cli) + output(module)
    # Each for its specific reason: neither the server's scripts nor its package exist in the sandbox ...
    assert "threadloom: not found" in output(cli) or "command not found" in output(cli), output(cli)
    assert "No module named threadloom" in output(module), output(module)
    assert "No such file" in output(data)
    # ... while the same interpreter runs a module it can see, and the same listing of B's folder works.
    assert stdlib["status"] == "COMPLETED" and "usage:" in output(stdlib)
    assert own["status"] == "COMPLETED" and output(own).split() == [".", ".."]
    assert set(output(root).split()) <= {"bin", "dev", "etc", "lib", "lib64", "proc", "sbin", "tmp", "usr"}


async def test_read_only_threads_write_nothing_that_workspace_write_threads_write(world: World) -> None:
    probe = "@write notes.txt hello\n@tool echo x > tool.txt\n@tool cat /dev/null\n@reply done"
    thread = await world.thread(world.attacker, world.project_b, "read_only")
    _, tools = await run_tools(world, thread, probe)
    write, tool, reading = tools
    assert write["status"] == "FAILED" and "read-only" in output(write)
    assert tool["status"] == "FAILED" and "Read-only file system" in output(tool)
    assert reading["status"] == "COMPLETED"  # reading still works
    assert not (world.ws_b / "notes.txt").exists() and not (world.ws_b / "tool.txt").exists()
    # The twin: the same writes from a workspace_write thread of the same project land.
    writer = await world.thread(world.attacker, world.project_b, "workspace_write")
    _, tools = await run_tools(world, writer, probe)
    assert [tool["status"] for tool in tools] == ["COMPLETED"] * 3, [output(tool) for tool in tools]
    assert (world.ws_b / "notes.txt").read_text() == "hello" and (world.ws_b / "tool.txt").read_text() == "x\n"


async def test_approval_required_asks_before_every_command_and_write(world: World) -> None:
    thread = await world.thread(world.attacker, world.project_b, "approval_required")
    sent = await send(world.attacker, thread, "@tool echo yes > asked.txt\n@write declined.txt no\n@reply done")

    async def pending(kind: str) -> dict[str, Any]:  # empty while none is pending
        state = (await world.attacker.gql(PENDING, {"t": thread}))["thread"]
        return next((r for r in state["pendingRequests"] if r["kind"] == kind), {})

    command = await until(lambda: pending("COMMAND_APPROVAL"))
    assert not (world.ws_b / "asked.txt").exists()  # nothing ran before the answer
    assert command["payload"]["command"] == "echo yes > asked.txt"
    accepted = await world.attacker.gql(APPROVE, {"r": command["id"], "d": "ACCEPT"})
    assert accepted["respondToApproval"]["userErrors"] == []
    change = await until(lambda: pending("FILE_CHANGE_APPROVAL"))
    assert (world.ws_b / "asked.txt").read_text() == "yes\n"
    declined = await world.attacker.gql(APPROVE, {"r": change["id"], "d": "DECLINE"})
    assert declined["respondToApproval"]["userErrors"] == []
    done = await finished(world.attacker, sent["run"]["id"])
    assert done["status"] == "COMPLETED"
    assert not (world.ws_b / "declined.txt").exists()


async def test_the_default_mode_is_sandboxed_and_full_access_needs_the_instance(world: World) -> None:
    thread = (await create_thread(world.attacker, world.project_b, None))["thread"]
    assert thread["runtimeMode"] == "workspace_write"
    _, tools = await run_tools(world, thread["id"], "@tool echo mine > mine.txt\n@reply done")
    assert [tool["status"] for tool in tools] == ["COMPLETED"]  # no prompt, inside the workspace
    assert (world.ws_b / "mine.txt").read_text() == "mine\n"

    before = (await world.attacker.gql(COUNT_THREADS, {"p": world.project_b}))["threads"]["totalCount"]
    refused = await create_thread(world.attacker, world.project_b, "full_access")
    assert refused["thread"] is None
    assert [(e["code"], e["field"]) for e in refused["userErrors"]] == [("RUNTIME_MODE_NOT_ALLOWED", "runtimeMode")]
    after = (await world.attacker.gql(COUNT_THREADS, {"p": world.project_b}))["threads"]["totalCount"]
    assert after == before  # refused input changed nothing
    # An instance whose admin allowed it accepts full_access, still confined to the workspace.
    allowed = await world.thread(world.attacker, world.project_b, "full_access", "open")
    _, tools = await run_tools(
        world, allowed, f"@tool cat {world.ws_a}/secret.txt\n@tool cat {world.ws_b}/mine.txt\n@reply done"
    )
    theirs, mine = tools
    assert theirs["status"] == "FAILED" and A_SECRET not in output(theirs) and "No such file" in output(theirs)
    assert mine["status"] == "COMPLETED" and output(mine) == "mine\n"  # the twin: the same read of B's own file


async def test_a_crash_in_project_b_leaves_project_a_running(world: World) -> None:
    a_thread = await world.thread(world.admin, world.project_a)
    a_run = await send(world.admin, a_thread, "@approval echo a > a.txt\n@reply A finished")

    async def a_waiting() -> dict[str, Any]:  # empty while none is pending
        state = (await world.admin.gql(PENDING, {"t": a_thread}))["thread"]
        return state["pendingRequests"][0] if state["pendingRequests"] else {}

    request = await until(a_waiting)  # A's agent is mid-turn, waiting for its approval
    b_thread = await world.thread(world.attacker, world.project_b)
    crash = await send(world.attacker, b_thread, "@crash")
    crashed = await finished(world.attacker, crash["run"]["id"])
    assert crashed["status"] == "FAILED"

    state = (await world.admin.gql(PENDING, {"t": a_thread}))["thread"]
    assert state["status"] == "WAITING" and [r["id"] for r in state["pendingRequests"]] == [request["id"]]
    answer = await world.admin.gql(APPROVE, {"r": request["id"], "d": "ACCEPT"})
    assert answer["respondToApproval"]["userErrors"] == []
    done = await finished(world.admin, a_run["run"]["id"])
    assert done["status"] == "COMPLETED"
    assert (world.ws_a / "a.txt").read_text() == "a\n"

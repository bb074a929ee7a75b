"""A chain: one Threadloom server drives another through `threadloom acp`, as it drives any ACP agent.

The inner server runs the scripted agent. The outer server has an `acp` provider instance whose command is
`threadloom acp --url <inner>` with an operate token of the inner project, so a thread on the outer server is
served by a thread on the inner one: the reply comes back, and an approval the inner agent asks for becomes
a runtime request on the outer thread that a person answers there. Both servers share one workspace folder
(the inner project's, which the bridge finds from the session's cwd).
"""

from __future__ import annotations

import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import make_project
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, providers_env, serving
from tests.support.waiting import until

CREATE_THREAD = """mutation($p: ID!, $i: String!) { createThread(input: {projectId: $p, providerInstanceId: $i}) {
  thread { id } userErrors { code } } }"""
MESSAGES = """query($t: ID!) { thread(id: $t) { messages(first: 100) { nodes { role text } } } }"""
THREADS = """query($p: ID!) { project(id: $p) { threads(first: 10) { nodes { id runs(first: 10) {
  nodes { ordinal status } } } } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id kind payload } } }"""
APPROVE = """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) {
  request { status } userErrors { code } } }"""


@pytest.fixture(scope="module")
def base(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("acp-chain")
    folder.chmod(0o711)  # the agent user passes through to the shared workspace
    for name in ("inner", "outer", "ws"):
        (folder / name).mkdir()
    (folder / "ws").chmod(0o777)
    return folder


@pytest.fixture(scope="module")
async def inner_db(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
async def outer_db(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
def inner(inner_db: str, base: Path) -> Iterator[ServerProcess]:
    with serving(inner_db, base / "inner" / "data") as proc:
        yield proc


@pytest.fixture(scope="module")
async def inner_project(inner: ServerProcess, inner_db: str, base: Path) -> tuple[str, str]:
    """(project id, operate token) on the inner server."""
    client = Client(inner.url, inner.admin_token)
    try:
        project = await make_project(client, "Inner", str(base / "ws"))
    finally:
        await client.aclose()
    return project, create_token(inner_db, "operate", project)[1]


@pytest.fixture(scope="module")
def outer(outer_db: str, base: Path, inner: ServerProcess, inner_project: tuple[str, str]) -> Iterator[ServerProcess]:
    command = [sys.executable, "-m", "threadloom", "acp", "--url", inner.url]
    providers = (
        "[instances.chained]\n"
        'driver = "acp"\n'
        f"command = {json.dumps(command)}\n"
        f"env = {{ THREADLOOM_TOKEN = {json.dumps(inner_project[1])} }}\n"
        f"base_url = {json.dumps(inner.url)}\n"  # the agent's own network has only this loopback port
    )
    with serving(outer_db, base / "outer" / "data", providers_env(base / "outer", providers)) as proc:
        yield proc


@pytest.fixture
async def clients(inner: ServerProcess, outer: ServerProcess) -> AsyncIterator[tuple[Client, Client]]:
    a, b = Client(outer.url, outer.admin_token), Client(inner.url, inner.admin_token)
    yield a, b
    await a.aclose()
    await b.aclose()


async def _outer_thread(client: Client, base: Path) -> str:
    project = await make_project(client, "Outer", str(base / "ws"))
    made = (await client.gql(CREATE_THREAD, {"p": project, "i": "chained"}))["createThread"]
    assert made["userErrors"] == [], made
    return made["thread"]["id"]  # type: ignore[no-any-return]


async def _replies(client: Client, thread: str) -> list[str]:
    nodes = (await client.gql(MESSAGES, {"t": thread}))["thread"]["messages"]["nodes"]
    return [n["text"] for n in nodes if n["role"] == "ASSISTANT"]


async def _inner_runs(client: Client, project: str) -> list[list[tuple[int, str]]]:
    threads = (await client.gql(THREADS, {"p": project}))["project"]["threads"]["nodes"]
    return [[(r["ordinal"], r["status"]) for r in t["runs"]["nodes"]] for t in threads]


async def test_a_thread_served_by_another_threadloom_gets_its_replies_and_answers_its_approvals(
    clients: tuple[Client, Client], base: Path, inner_project: tuple[str, str]
) -> None:
    outer, inner = clients
    thread = await _outer_thread(outer, base)

    sent = await send(outer, thread, "@reply hello from the inner server")
    assert (await finished(outer, sent["run"]["id"]))["status"] == "COMPLETED"
    assert "hello from the inner server" in "".join(await _replies(outer, thread))
    assert await _inner_runs(inner, inner_project[0]) == [[(1, "COMPLETED")]]  # one inner thread serves it

    # The inner agent asks before a command: the question reaches the outer thread, answered there.
    sent = await send(outer, thread, "@approval echo chained > chained.txt\n@reply written")

    async def asked() -> list[dict[str, Any]] | None:
        found: list[dict[str, Any]] = (await outer.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"]
        return found or None

    [request] = await until(asked, within=60.0)
    assert request["kind"] == "COMMAND_APPROVAL"
    assert "echo chained" in json.dumps(request["payload"])
    answered = (await outer.gql(APPROVE, {"r": request["id"]}))["respondToApproval"]
    assert answered["userErrors"] == [] and answered["request"]["status"] != "PENDING"
    assert (await finished(outer, sent["run"]["id"]))["status"] == "COMPLETED"
    assert (base / "ws" / "chained.txt").read_text() == "chained\n"  # the inner agent ran it
    assert await _inner_runs(inner, inner_project[0]) == [[(1, "COMPLETED"), (2, "COMPLETED")]]

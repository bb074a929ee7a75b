"""Input the server cannot take gets a typed error naming the field, changes nothing and logs no traceback.

Three kinds, each with its twin that succeeds:
- strings PostgreSQL cannot store (U+0000, a lone surrogate) in any argument, written in the document or
  sent as a variable, over HTTP and over WebSocket: `INVALID_INPUT` with `field`, before anything runs;
- `Checkpoint.diff(path:)` with a path no checkpoint can list: `INVALID_INPUT` on `path`;
- `createProject.workspaceRoot` in, around, or reaching through a symlink or `..` into the server's data
  dir or the agents' state dir: `INVALID_WORKSPACE_ROOT`.

One real server for the module; every test checks the server's log afterwards.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.graphql import CREATE_PROJECT, CREATE_THREAD, make_project, make_thread, workspace
from tests.support.pg import PgServer
from tests.support.runs import SEND, finished, send
from tests.support.server import Client, ServerProcess, serving
from tests.support.ws import WsClient
from threadloom.config import Settings
from threadloom.domain import projects as project_rules
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.engine.catalog import Catalog


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    """One database for the module's server; each test makes its own project."""
    return await pg.fresh()


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The server's data dir and agent state dir (apart, so each is checked on its own) and a folder beside them."""
    base = tmp_path_factory.mktemp("bad-input")
    found = {"data": base / "data", "agents": base / "agents", "beside": base / "beside"}
    for folder in found.values():
        folder.mkdir()
    return found


@pytest.fixture(scope="module")
def server(database_url: str, dirs: dict[str, Path]) -> Iterator[ServerProcess]:
    env = {"THREADLOOM_AGENT_STATE_DIR": str(dirs["agents"])}
    with serving(database_url, dirs["data"], env) as proc:
        yield proc


@pytest.fixture(autouse=True)
def no_traceback(server: ServerProcess) -> Iterator[None]:
    """Whatever a test sent, the server logged no traceback for it (nothing was an unexpected error)."""
    start = len(server.log)
    yield
    logged = "\n".join(server.log[start:])
    assert "Traceback" not in logged and "unexpected error" not in logged, logged


async def raw_post(client: Client, query: str, variables: dict[str, Any] | None = None) -> tuple[int, dict[str, Any]]:
    """POST with the body as ASCII JSON: a lone surrogate travels as the `\\ud800` escape a client would send."""
    body = json.dumps({"query": query, "variables": variables or {}}, ensure_ascii=True)
    headers = {**client.headers(), "content-type": "application/json"}
    response = await client.http.post("/graphql", content=body.encode(), headers=headers)
    return response.status_code, response.json()


def refused(body: dict[str, Any], field: str, code: str = "INVALID_INPUT") -> None:
    """The request was refused before execution with `code` on `field`: no data, one coded error."""
    assert body.get("data") is None, body
    assert [(e["extensions"]["code"], e["extensions"]["field"]) for e in body["errors"]] == [(code, field)], body


STATE = """query($p: ID!, $t: ID!) {
  projects(first: 100) { totalCount }
  project(id: $p) { name threads(first: 100) { totalCount } }
  thread(id: $t) { title latestSequence messages(first: 10) { totalCount } runs(first: 10) { totalCount } }
}"""


async def state(client: Client, project: str, thread: str) -> dict[str, Any]:
    """What a user sees of the server, the test's project and thread: a refused request changes none of it
    (the thread's `latestSequence` counts every event written for it)."""
    return await client.gql(STATE, {"p": project, "t": thread})


RENAME = """mutation($t: ID!, $title: String!) { renameThread(input: {threadId: $t, title: $title}) {
  thread { title } userErrors { code field } } }"""
SEND_INPUT = """mutation($in: SendMessageInput!) { sendMessage(input: $in) { run { id } userErrors { code field } } }"""
THREAD = (
    """query($t: ID!) { thread(id: $t) { title messages(first: 10) { totalCount } runs(first: 10) { totalCount } } }"""
)
PROJECTS = "{ projects(first: 100) { totalCount } }"


def cases(project: str, thread: str, bad: str, in_path: str | None = None) -> list[tuple[str, dict[str, Any], str]]:
    """(document, variables, field at fault) with `bad` (a string holding the unstorable character) in one
    string argument each: variables, input objects given whole, literals, a query's argument. `in_path` is
    what goes into the workspace root (default `bad`; the twin adds nothing to a path that must exist)."""
    literal = json.dumps(bad)  # a GraphQL string literal with the character as a `\\u` escape
    suffix = bad if in_path is None else in_path
    return [
        (SEND, {"t": thread, "text": f"hello {bad} there"}, "text"),
        (SEND_INPUT, {"in": {"threadId": thread, "text": "fine", "clientMessageId": bad}}, "clientMessageId"),
        (
            f"mutation($t: ID!) {{ sendMessage(input: {{threadId: $t, text: {literal}}}) {{ run {{ id }} }} }}",
            {"t": thread},
            "text",
        ),
        (CREATE_THREAD, {"projectId": project, "title": bad}, "title"),
        (RENAME, {"t": thread, "title": f"renamed{bad}"}, "title"),
        (
            f"mutation($t: ID!) {{ renameThread(input: {{threadId: $t, title: {literal}}}) {{ thread {{ id }} }} }}",
            {"t": thread},
            "title",
        ),
        (CREATE_PROJECT, {"name": f"p{bad}", "root": workspace()}, "name"),
        (CREATE_PROJECT, {"name": "p", "root": workspace() + suffix}, "workspaceRoot"),
        (
            f"mutation($r: String!) {{ "
            f"createProject(input: {{name: {literal}, workspaceRoot: $r}}) {{ project {{ id }} }} }}",
            {"r": workspace()},
            "name",
        ),
        (f"query {{ node(id: {literal}) {{ id }} }}", {}, "id"),
        ("query($id: ID!) { node(id: $id) { id } }", {"id": bad}, "id"),
    ]


@pytest.mark.parametrize("bad", ["\x00", "\ud800"], ids=["nul", "lone-surrogate"])
async def test_unstorable_text_over_http(client: Client, bad: str) -> None:
    project = await make_project(client)
    thread = (await make_thread(client, project, "before"))["id"]
    before = await state(client, project, thread)
    for document, variables, field in cases(project, thread, bad):
        status, body = await raw_post(client, document, variables)
        if '"\\ud800"' in document or "\\ud800" in document:  # a lone surrogate escape the lexer refuses
            assert body["errors"][0]["extensions"]["code"] == "GRAPHQL_PARSE_FAILED", body
            continue
        assert status == 200, body
        refused(body, field)
    assert await state(client, project, thread) == before
    assert before["thread"]["title"] == "before" and before["thread"]["messages"]["totalCount"] == 0


async def test_same_inputs_without_the_character_succeed(client: Client) -> None:
    """The twin: every case above with the character taken out (tabs and newlines kept) is carried out."""
    project = await make_project(client)
    thread = (await make_thread(client, project, "before"))["id"]
    for document, variables, field in cases(project, thread, "\tok\n", in_path=""):
        status, body = await raw_post(client, document, variables)
        assert status == 200 and "errors" not in body, (field, body)
        for payload in body["data"].values():
            assert payload is None or not payload.get("userErrors"), (field, payload)
    shown = await client.gql(THREAD, {"t": thread})
    assert shown["thread"]["title"] == "ok"  # the last rename, a literal; a title's white space folds, as ever
    assert shown["thread"]["messages"]["totalCount"] >= 3


async def test_unstorable_text_over_websocket(client: Client, server: ServerProcess) -> None:
    project = await make_project(client)
    thread = (await make_thread(client, project, "before"))["id"]
    before = await state(client, project, thread)
    ws = await WsClient.connect(server.url, server.admin_token)
    try:
        for n, (document, variables, field) in enumerate(cases(project, thread, "\x00")):
            await ws.ws.send(
                orjson.dumps(
                    {"id": f"bad{n}", "type": "subscribe", "payload": {"query": document, "variables": variables}}
                ).decode()
            )
            message = await ws.receive()
            assert message["id"] == f"bad{n}", message
            assert message["type"] == "error", message
            assert [(e["extensions"]["code"], e["extensions"]["field"]) for e in message["payload"]] == [
                ("INVALID_INPUT", field)
            ], message
        # A lone surrogate, as the JSON escape a client sends on the socket.
        lone = {
            "id": "lone",
            "type": "subscribe",
            "payload": {"query": RENAME, "variables": {"t": thread, "title": "\ud800"}},
        }
        await ws.ws.send(json.dumps(lone, ensure_ascii=True))
        message = await ws.receive()
        assert message["type"] == "error" and message["payload"][0]["extensions"] == {
            "code": "INVALID_INPUT",
            "field": "title",
        }, message
        # A subscription's argument: refused the same way, the socket stays open for the next operation.
        events = "subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) { sequence } }"
        await ws.subscribe(events, {"t": thread + "\x00", "after": 0})
        message = await ws.receive()
        assert message["type"] == "error", message
        assert [e["extensions"].get("code") for e in message["payload"]] == ["INVALID_INPUT"], message
        assert await state(client, project, thread) == before
        # The twin on the same socket: the clean rename is carried out.
        clean = {
            "id": "ok",
            "type": "subscribe",
            "payload": {"query": RENAME, "variables": {"t": thread, "title": "after"}},
        }
        await ws.ws.send(orjson.dumps(clean).decode())
        message = await ws.receive()
        assert message["type"] == "next", message
        assert message["payload"]["data"]["renameThread"] == {"thread": {"title": "after"}, "userErrors": []}
    finally:
        await ws.close()
    shown = await client.gql(THREAD, {"t": thread})
    assert shown["thread"] == {"title": "after", "messages": {"totalCount": 0}, "runs": {"totalCount": 0}}


DIFF = """query($id: ID!, $path: String!) { run(id: $id) { checkpoint { diff(path: $path) } } }"""

BAD_PATHS = [
    "",
    "/etc/passwd",
    "/notes.md",
    "../notes.md",
    "a/../notes.md",
    "./notes.md",
    "a//notes.md",
    "notes.md/",
    ".git/config",
    "sub/.GIT/HEAD",
    ".git",
    "notes\x00.md",
    "a/" * 3000 + "notes.md",
]


async def test_checkpoint_diff_with_a_bad_path_is_typed(client: Client) -> None:
    project = await make_project(client)
    thread = (await make_thread(client, project))["id"]
    sent = await send(client, thread, "@write notes.md hello")
    assert sent["userErrors"] == []
    run = await finished(client, sent["run"]["id"])
    assert run["status"] == "COMPLETED", run
    good = await client.gql(DIFF, {"id": run["id"], "path": "notes.md"})
    assert "+hello" in good["run"]["checkpoint"]["diff"]
    for path in BAD_PATHS:
        status, body = await raw_post(client, DIFF, {"id": run["id"], "path": path})
        assert status == 200, body
        errors = body["errors"]
        assert [(e["extensions"]["code"], e["extensions"]["field"]) for e in errors] == [("INVALID_INPUT", "path")], (
            path[:40],
            body,
        )
        if "\x00" not in path:  # refused while resolving: the rest of the answer stands
            assert body["data"] == {"run": {"checkpoint": {"diff": None}}}, body


def _root_answer(data: dict[str, Any]) -> tuple[str | None, str | None]:
    payload = data["createProject"]
    errors = payload["userErrors"]
    return (errors[0]["code"], errors[0]["field"]) if errors else (None, None)


async def test_workspace_roots_reaching_server_folders_are_refused(client: Client, dirs: dict[str, Path]) -> None:
    data, agents, beside = dirs["data"], dirs["agents"], dirs["beside"]
    (data / "inside").mkdir(exist_ok=True)
    (data / "workspaces" / "p" / "forks" / "f").mkdir(parents=True, exist_ok=True)
    (agents / "inside").mkdir(exist_ok=True)
    link = beside / "link-to-data"
    if not link.exists():
        os.symlink(data / "inside", link)
    refused_roots = [
        data,
        data / "inside",
        data.parent,  # holds the data dir
        data / "workspaces" / "p" / "forks",
        data / "workspaces" / "p" / "forks" / "f",
        link,
        f"{beside}/../{data.name}/inside",
        agents,
        agents / "inside",
    ]
    projects = (await client.gql(PROJECTS))["projects"]["totalCount"]
    for root in refused_roots:
        answer = await client.gql(CREATE_PROJECT, {"name": "p", "root": str(root)})
        assert answer["createProject"]["project"] is None, root
        assert _root_answer(answer) == ("INVALID_WORKSPACE_ROOT", "workspaceRoot"), (root, answer)
    assert (await client.gql(PROJECTS))["projects"]["totalCount"] == projects
    # The twin: a folder beside the data dir, holding neither server folder, is a workspace.
    sibling = beside / "project"
    sibling.mkdir(exist_ok=True)
    accepted = await client.gql(CREATE_PROJECT, {"name": "beside", "root": str(sibling)})
    assert accepted["createProject"]["userErrors"] == []
    assert accepted["createProject"]["project"]["workspaceRoot"] == str(sibling.resolve())


def test_a_relative_data_dir_is_guarded_where_it_really_is(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default data dir is `./.threadloom`: the server resolves it against its working folder at start,
    so the folder it runs in (which holds the data dir) and a link into the data dir are refused; a folder
    beside it is not."""
    monkeypatch.chdir(tmp_path)
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "cwd").symlink_to(real)  # the server started in a folder reached through a symlink
    monkeypatch.chdir(tmp_path / "cwd")
    settings = Settings.from_env(data_dir=".threadloom")
    catalog = Catalog(
        None,  # type: ignore[arg-type]  # the workspace checks read no database
        provider_instances=["scripted"],
        default_instance="scripted",
        data_dir=settings.data_dir,
        agents_dir=settings.agents_dir,
    )
    (real / ".threadloom" / "agents").mkdir(parents=True)

    def check(path: Path) -> None:
        project_rules.check_workspace_root(
            os.path.realpath(path), existing=[], data_dir=catalog.data_dir, agents_dir=catalog.agents_dir
        )

    for path in (real, tmp_path / "cwd", real / ".threadloom", real / ".threadloom" / "agents" / "x"):
        with pytest.raises(DomainError) as refused:
            check(path)
        assert refused.value.code == ErrorCode.INVALID_WORKSPACE_ROOT and refused.value.field == "workspaceRoot"
    (real / "beside").mkdir()
    check(tmp_path / "cwd" / "beside")

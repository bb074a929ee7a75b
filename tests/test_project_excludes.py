"""A project's own checkpoint exclude list (`updateProject(excludes:)`), against a real server.

A project whose list names `build/` leaves a run's build output out of the run's checkpoint while a project
without a list of its own (the server's default) captures it; the list is set only by the project's admin
(another project's admin: NOT_FOUND, an operate token: FORBIDDEN, each beside the admin's twin that works),
a bad pattern changes nothing, and `[]` gives the project the server's list back.
"""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import make_project, make_thread, workspace
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

UPDATE = """mutation($p: ID!, $n: String, $x: [String!]) {
  updateProject(input: {projectId: $p, name: $n, excludes: $x}) {
    project { id name excludes } userErrors { code field } } }"""
PROJECT = "query($p: ID!) { project(id: $p) { name excludes } }"
CHECKPOINT_FILES = "query($r: ID!) { run(id: $r) { checkpoint { status files { path status } } } }"
# Build output and a source file, written by the run's agent (the scripted agent runs the commands).
BUILD = "@tool sh -c 'mkdir -p build src && printf \"\\000\\001\" > build/out.bin && echo a > src/a.txt'"


async def _run_files(client: Client, thread: str, text: str) -> dict[str, str]:
    """The paths the run's checkpoint holds as changed, with their status."""
    sent = await send(client, thread, text)
    assert sent["userErrors"] == []
    run = await finished(client, sent["run"]["id"])
    assert run["status"] == "COMPLETED"
    checkpoint = (await client.gql(CHECKPOINT_FILES, {"r": run["id"]}))["run"]["checkpoint"]
    assert checkpoint["status"] == "READY"
    return {f["path"]: f["status"] for f in checkpoint["files"]}


async def _update(client: Client, project: str, excludes: list[str] | None, token: str | None = None) -> Any:
    return (await client.gql(UPDATE, {"p": project, "x": excludes}, token=token))["updateProject"]


async def _project(client: Client, project: str) -> dict[str, Any]:
    return (await client.gql(PROJECT, {"p": project}))["project"]  # type: ignore[no-any-return]


async def test_a_project_excluding_build_leaves_build_output_out_while_another_project_captures_it(
    client: Client, tmp_path: Path
) -> None:
    own = await make_project(client, "Own list", workspace(tmp_path, "own"))
    default = await make_project(client, "Server list", workspace(tmp_path, "default"))
    done = await _update(client, own, ["build/"])
    assert done == {"project": {"id": own, "name": "Own list", "excludes": ["build/"]}, "userErrors": []}
    assert (await _project(client, default))["excludes"] is None

    own_thread = (await make_thread(client, own))["id"]
    default_thread = (await make_thread(client, default))["id"]
    assert await _run_files(client, own_thread, BUILD) == {"src/a.txt": "ADDED"}
    assert await _run_files(client, default_thread, BUILD) == {"build/out.bin": "ADDED", "src/a.txt": "ADDED"}

    # [] gives the project the server's list back: the next run's checkpoint holds build output again.
    cleared = await _update(client, own, [])
    assert cleared["userErrors"] == [] and cleared["project"]["excludes"] is None
    again = "@tool sh -c 'echo b > build/next.bin && echo b >> src/a.txt'"
    assert await _run_files(client, own_thread, again) == {
        "build/next.bin": "ADDED",
        "build/out.bin": "ADDED",  # never captured before: it appears now, as the server's list lets it in
        "src/a.txt": "MODIFIED",
    }


@pytest.mark.own_server  # it stops the server and starts another on the database
async def test_a_restarted_server_applies_the_projects_list_from_its_first_capture(
    server: ServerProcess, client: Client, database_url: str, data_dir: Path, tmp_path: Path
) -> None:
    """The list lives in the database: a new server process applies it without being told again."""
    own = await make_project(client, "Own list", workspace(tmp_path, "own"))
    assert (await _update(client, own, ["build/"]))["userErrors"] == []
    thread = (await make_thread(client, own))["id"]
    server.stop()

    restarted = ServerProcess(database_url, data_dir).wait_ready()
    again = Client(restarted.url, server.admin_token)
    try:
        assert (await _project(again, own))["excludes"] == ["build/"]
        assert await _run_files(again, thread, BUILD) == {"src/a.txt": "ADDED"}  # the first capture after start
    finally:
        await again.aclose()
        restarted.stop()


def _unknown_project() -> str:
    return base64.urlsafe_b64encode(f"Project:{uuid.uuid4()}".encode()).decode().rstrip("=")


async def test_only_the_projects_admin_sets_its_excludes_and_a_bad_pattern_changes_nothing(
    client: Client, database_url: str, tmp_path: Path
) -> None:
    a = await make_project(client, "A", workspace(tmp_path, "a"))
    b = await make_project(client, "B", workspace(tmp_path, "b"))
    a_admin = create_token(database_url, "admin", a)[1]
    a_operate = create_token(database_url, "operate", a)[1]
    b_admin = create_token(database_url, "admin", b)[1]

    other = await _update(client, a, ["build/"], token=b_admin)
    missing = await _update(client, _unknown_project(), ["build/"], token=b_admin)
    assert other == missing == {"project": None, "userErrors": [{"code": "NOT_FOUND", "field": "projectId"}]}
    under = await _update(client, a, ["build/"], token=a_operate)
    assert under["project"] is None and [e["code"] for e in under["userErrors"]] == ["FORBIDDEN"]
    assert (await _project(client, a))["excludes"] is None  # the refusals changed nothing

    twin = await _update(client, a, ["  build/ ", "*.log", "build/"], token=a_admin)
    assert twin["userErrors"] == [] and twin["project"]["excludes"] == ["build/", "*.log"]  # trimmed, once each
    twin_b = await _update(client, b, ["dist/"], token=b_admin)
    assert twin_b["userErrors"] == [] and twin_b["project"]["excludes"] == ["dist/"]

    for bad in (["ok/", "two\nlines"], ["-node_modules/"], ["x" * 1001], [f"p{i}" for i in range(201)]):
        refused = await _update(client, a, bad, token=a_admin)
        assert refused == {"project": None, "userErrors": [{"code": "INVALID_INPUT", "field": "excludes"}]}, bad
    assert await _project(client, a) == {"name": "A", "excludes": ["build/", "*.log"]}

    renamed = (await client.gql(UPDATE, {"p": a, "n": "A2"}, token=a_admin))["updateProject"]
    assert renamed["project"] == {"id": a, "name": "A2", "excludes": ["build/", "*.log"]}  # absent: kept


ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n, restoreFiles: true}) {
  rolledBackRuns { ordinal } userErrors { code message } } }"""


async def test_a_rollback_keeps_the_projects_excluded_output_and_undoes_the_rest(
    client: Client, tmp_path: Path
) -> None:
    """Run 2 writes build output (excluded, so never captured) and a source file; rolling back to run 1
    with its files removes the source file and leaves `build/` alone. Under the server's list the build
    output would be part of run 2's checkpoint, and the rollback would remove it too."""
    root = Path(workspace(tmp_path, "rb"))
    project = await make_project(client, "Rolled back", str(root))
    assert (await _update(client, project, ["build/"]))["userErrors"] == []
    thread = (await make_thread(client, project))["id"]
    first = "@tool sh -c 'mkdir -p src && echo a > src/a.txt'"
    assert await _run_files(client, thread, first) == {"src/a.txt": "ADDED"}
    second = "@tool sh -c 'mkdir -p build && echo out > build/out.bin && echo b > src/b.txt'"
    assert await _run_files(client, thread, second) == {"src/b.txt": "ADDED"}

    answer = (await client.gql(ROLLBACK, {"t": thread, "n": 1}))["rollbackToRun"]
    assert answer == {"rolledBackRuns": [{"ordinal": 2}], "userErrors": []}
    assert (root / "src" / "a.txt").read_text() == "a\n"
    assert not (root / "src" / "b.txt").exists()  # the run it undid made it
    assert (root / "build" / "out.bin").read_text() == "out\n"  # excluded: never captured, never touched

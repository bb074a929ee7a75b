"""`createThread` and `setRuntimeMode` take the runtime mode as `mode: RuntimeMode` beside the older, deprecated
`runtimeMode` string, through a real server.

`mode` works inline and through a variable (Strawberry hands a variable's enum over as its value string, an
inline one as the member: `api.mutations.threads.mode_of` reads both); the string still works alone; both given
and naming different modes is INVALID_INPUT on `runtimeMode` and changes nothing; neither keeps the default
(WORKSPACE_WRITE for createThread; setRuntimeMode, with nothing to keep, refuses with INVALID_INPUT on `mode`).
What a client reads back is the thread's `mode`, and the provider thread of its next run.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.graphql import make_project, workspace
from tests.support.runs import finished, send
from tests.support.server import Client

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

CREATE_INLINE = """mutation($p: ID!) { createThread(input: {projectId: $p, mode: READ_ONLY}) {
  thread { id mode runtimeMode } userErrors { code field } } }"""
CREATE_WITH = """mutation($p: ID!, $mode: RuntimeMode, $s: String) {
  createThread(input: {projectId: $p, mode: $mode, runtimeMode: $s}) {
  thread { id mode runtimeMode } userErrors { code field } } }"""
SET_INLINE = """mutation($t: ID!) { setRuntimeMode(input: {threadId: $t, mode: APPROVAL_REQUIRED}) {
  thread { mode runtimeMode } userErrors { code field } } }"""
SET_WITH = """mutation($t: ID!, $mode: RuntimeMode, $s: String) {
  setRuntimeMode(input: {threadId: $t, mode: $mode, runtimeMode: $s}) {
  thread { mode runtimeMode } userErrors { code field } } }"""
READ = """query($t: ID!) { thread(id: $t) { mode runtimeMode providerThreads { mode } } }"""
THREADS = """query($p: ID!) { project(id: $p) { threads { totalCount } } }"""


async def _project(api: Client, tmp_path: Path) -> str:
    return await make_project(api, f"p-{tmp_path.name}", workspace(tmp_path))


async def _create(api: Client, project: str, **variables: Any) -> dict[str, Any]:
    created: dict[str, Any] = (await api.gql(CREATE_WITH, {"p": project, **variables}))["createThread"]
    return created


async def _read(api: Client, thread: str) -> dict[str, Any]:
    found: dict[str, Any] = (await api.gql(READ, {"t": thread}))["thread"]
    return found


async def test_create_thread_takes_mode_inline_and_through_a_variable(api: Client, tmp_path: Path) -> None:
    project = await _project(api, tmp_path)
    inline = (await api.gql(CREATE_INLINE, {"p": project}))["createThread"]
    assert inline["userErrors"] == []
    assert (inline["thread"]["mode"], inline["thread"]["runtimeMode"]) == ("READ_ONLY", "read_only")

    variable = await _create(api, project, mode="APPROVAL_REQUIRED")
    assert variable["userErrors"] == []
    assert (variable["thread"]["mode"], variable["thread"]["runtimeMode"]) == ("APPROVAL_REQUIRED", "approval_required")
    assert (await _read(api, variable["thread"]["id"]))["mode"] == "APPROVAL_REQUIRED"


async def test_create_thread_without_either_field_is_workspace_write(api: Client, tmp_path: Path) -> None:
    created = await _create(api, await _project(api, tmp_path))
    assert created["userErrors"] == []
    assert (created["thread"]["mode"], created["thread"]["runtimeMode"]) == ("WORKSPACE_WRITE", "workspace_write")


async def test_the_deprecated_runtime_mode_string_still_works_alone(api: Client, tmp_path: Path) -> None:
    project = await _project(api, tmp_path)
    created = await _create(api, project, s="read_only")
    assert created["userErrors"] == []
    thread = created["thread"]["id"]
    assert created["thread"]["mode"] == "READ_ONLY"

    changed = (await api.gql(SET_WITH, {"t": thread, "s": "approval_required"}))["setRuntimeMode"]
    assert changed["userErrors"] == []
    assert changed["thread"]["mode"] == "APPROVAL_REQUIRED"
    # an unknown string is refused as before, naming the string field
    unknown = (await api.gql(SET_WITH, {"t": thread, "s": "anything_goes"}))["setRuntimeMode"]
    assert unknown["userErrors"] == [{"code": "INVALID_INPUT", "field": "runtimeMode"}]
    assert (await _read(api, thread))["mode"] == "APPROVAL_REQUIRED"


async def test_both_fields_naming_the_same_mode_are_accepted(api: Client, tmp_path: Path) -> None:
    created = await _create(api, await _project(api, tmp_path), mode="READ_ONLY", s="read_only")
    assert created["userErrors"] == []
    thread = created["thread"]["id"]
    changed = await api.gql(SET_WITH, {"t": thread, "mode": "WORKSPACE_WRITE", "s": "workspace_write"})
    assert changed["setRuntimeMode"]["userErrors"] == []
    assert (await _read(api, thread))["mode"] == "WORKSPACE_WRITE"


async def test_create_thread_with_disagreeing_fields_is_refused_and_makes_no_thread(
    api: Client, tmp_path: Path
) -> None:
    project = await _project(api, tmp_path)
    refused = await _create(api, project, mode="READ_ONLY", s="workspace_write")
    assert refused == {"thread": None, "userErrors": [{"code": "INVALID_INPUT", "field": "runtimeMode"}]}
    assert (await api.gql(THREADS, {"p": project}))["project"]["threads"]["totalCount"] == 0


async def test_set_runtime_mode_with_disagreeing_fields_or_neither_is_refused_and_changes_nothing(
    api: Client, tmp_path: Path
) -> None:
    thread = (await _create(api, await _project(api, tmp_path), mode="READ_ONLY"))["thread"]["id"]
    disagreeing = await api.gql(SET_WITH, {"t": thread, "mode": "APPROVAL_REQUIRED", "s": "workspace_write"})
    assert disagreeing["setRuntimeMode"] == {
        "thread": None,
        "userErrors": [{"code": "INVALID_INPUT", "field": "runtimeMode"}],
    }
    neither = (await api.gql(SET_WITH, {"t": thread}))["setRuntimeMode"]
    assert neither == {"thread": None, "userErrors": [{"code": "INVALID_INPUT", "field": "mode"}]}
    assert (await _read(api, thread))["mode"] == "READ_ONLY"


async def test_set_runtime_mode_by_mode_reaches_the_thread_and_its_next_run(api: Client, tmp_path: Path) -> None:
    thread = (await _create(api, await _project(api, tmp_path)))["thread"]["id"]
    inline = (await api.gql(SET_INLINE, {"t": thread}))["setRuntimeMode"]
    assert inline["userErrors"] == []
    assert (inline["thread"]["mode"], inline["thread"]["runtimeMode"]) == ("APPROVAL_REQUIRED", "approval_required")

    variable = (await api.gql(SET_WITH, {"t": thread, "mode": "READ_ONLY"}))["setRuntimeMode"]
    assert variable["userErrors"] == []
    sent = await send(api, thread, "@reply done")
    assert sent["userErrors"] == [], sent
    assert (await finished(api, sent["run"]["id"]))["status"] == "COMPLETED"
    read = await _read(api, thread)
    assert (read["mode"], read["runtimeMode"]) == ("READ_ONLY", "read_only")
    assert [pt["mode"] for pt in read["providerThreads"]] == ["READ_ONLY"]

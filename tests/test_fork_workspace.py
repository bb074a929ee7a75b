"""A fork's files: by default a folder of its own holding the fork point's files; sharing the source's folder is
the explicit `workspace: SHARED` (real server, real git, the scripted agent under its real sandbox).

Every check reads what a user sees: the files the fork's agent reads and writes with `@tool` commands, the
fork's `workspacePath`, and the files on disk in the project's workspace and outside it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from tests.support.cli import create_token
from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess
from threadloom.api.ids import decode

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

FORK = """mutation($source: ForkSourceInput!, $ws: ForkWorkspace! = OWN, $own: Boolean) {
  forkThread(input: {source: $source, workspace: $ws, ownWorkspace: $own}) {
    thread { id workspacePath } userErrors { code message field } } }"""
PROJECT_OF = """query($t: ID!) { thread(id: $t) { project { id } } }"""
CHECKPOINT = """query($r: ID!) { run(id: $r) { checkpoint { id files { path } } } }"""
DIFF = """query($c: ID!, $p: String!) { node(id: $c) { ... on Checkpoint { diff(path: $p) } } }"""
SECRET = "outside-secret-4f1a"


def _folder(path: Path) -> Path:
    path.mkdir()
    return path


async def fork(source: ScriptedThread, run: dict[str, Any], **kw: Any) -> dict[str, Any]:
    data = await source.client.gql(FORK, {"source": {"run": run["id"]}, **kw})
    return data["forkThread"]  # type: ignore[no-any-return]


async def forked(source: ScriptedThread, run: dict[str, Any], **kw: Any) -> ScriptedThread:
    payload = await fork(source, run, **kw)
    assert payload["userErrors"] == [], payload
    return ScriptedThread(source.client, payload["thread"]["id"], source.workspace)


async def outputs(thread: ScriptedThread, text: str) -> list[str]:
    """The outputs of the `@tool` commands of a message (it must complete)."""
    sent = await send(thread.client, thread.id, text)
    assert sent["userErrors"] == [], sent
    done = await finished(thread.client, sent["run"]["id"])
    assert done["status"] == "COMPLETED", done
    details = [c["detail"] or {} for c in done["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]
    return [str(d["output"]) for d in details if "output" in d]


def uuid_of(global_id: str) -> str:
    decoded = decode(global_id)
    assert decoded is not None, global_id
    return str(decoded[1])


async def test_a_default_fork_works_on_the_fork_points_files_and_not_on_what_the_source_writes_later(
    api: Client, tmp_path: Path
) -> None:
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    first = await source.run("@write a.txt one")
    payload = await fork(source, first)
    assert (
        payload["userErrors"] == []
        and payload["thread"]["workspacePath"] == f"forks/{uuid_of(payload['thread']['id'])}"
    )
    own = ScriptedThread(api, payload["thread"]["id"], source.workspace)
    await source.run("@write a.txt two\n@write later.txt source")

    assert await outputs(own, "@tool cat a.txt\n@tool ls\n@write mine.txt fork") == ["one", "a.txt\n"]
    assert not (source.workspace / "mine.txt").exists()  # and what the fork writes stays in its folder
    assert await outputs(source, "@tool cat a.txt\n@tool ls") == ["two", "a.txt\nlater.txt\n"]


async def test_a_shared_fork_works_on_the_sources_current_files(api: Client, tmp_path: Path) -> None:
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    first = await source.run("@write a.txt one")
    payload = await fork(source, first, ws="SHARED")
    assert payload["userErrors"] == [] and payload["thread"]["workspacePath"] is None
    shared = ScriptedThread(api, payload["thread"]["id"], source.workspace)
    await source.run("@write a.txt two\n@write later.txt source")

    assert await outputs(shared, "@tool cat a.txt\n@tool ls\n@write mine.txt fork") == ["two", "a.txt\nlater.txt\n"]
    assert (source.workspace / "mine.txt").read_text() == "fork"  # one folder for both


async def test_the_older_own_workspace_flag_still_chooses_and_cannot_contradict_workspace(
    api: Client, tmp_path: Path
) -> None:
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    first = await source.run("@write a.txt one")
    assert (await fork(source, first, own=False))["thread"]["workspacePath"] is None
    assert (await fork(source, first, own=True))["thread"]["workspacePath"] is not None
    refused = await fork(source, first, own=True, ws="SHARED")
    assert refused["thread"] is None
    assert [(e["code"], e["field"]) for e in refused["userErrors"]] == [("INVALID_INPUT", "ownWorkspace")]


async def test_a_fork_of_an_own_folder_cannot_share_it_and_another_projects_token_learns_nothing(
    api: Client, tmp_path: Path, server: ServerProcess, database_url: str
) -> None:
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    first = await source.run("@write a.txt one")
    child = await forked(source, first)  # a folder of its own
    on_child = await child.run("@write b.txt two")

    other = await ScriptedThread.create(api, _folder(tmp_path / "other"))
    project = (await api.gql(PROJECT_OF, {"t": other.id}))["thread"]["project"]["id"]
    stranger = Client(server.url, create_token(database_url, "operate", project)[1])
    try:
        for run, workspace in ((on_child, "SHARED"), (on_child, "OWN"), (first, "SHARED"), (first, "OWN")):
            asked = {"source": {"run": run["id"]}, "ws": workspace}
            refused = (await stranger.gql(FORK, asked))["forkThread"]
            assert refused["thread"] is None, refused
            assert [(e["code"], e["message"], e["field"]) for e in refused["userErrors"]] == [
                ("NOT_FOUND", "not found", "source.run")
            ]
    finally:
        await stranger.aclose()
    # The twins, with the project's own token: sharing a fork's own folder is refused, the rest is made.
    shared = await fork(child, on_child, ws="SHARED")
    assert [(e["code"], e["field"]) for e in shared["userErrors"]] == [("INVALID_INPUT", "workspace")]
    assert shared["thread"] is None
    grandchild = await forked(child, on_child)
    assert await outputs(grandchild, "@tool cat a.txt b.txt") == ["onetwo"]
    assert (await fork(source, first, ws="SHARED"))["userErrors"] == []


async def test_a_link_out_of_the_source_workspace_comes_to_the_fork_as_a_link_and_nothing_outside_is_read(
    api: Client, tmp_path: Path
) -> None:
    outside = _folder(tmp_path / "outside")
    (outside / "secret.txt").write_text(SECRET)
    before = sorted(os.listdir(outside)), (outside / "secret.txt").stat().st_mtime_ns
    source = await ScriptedThread.create(api, _folder(tmp_path / "ws"))
    # The agent leaves links: out of the workspace (to a file and to a folder) and, the twin, inside it.
    first = await source.run(
        f"@write inside.txt {'kept-' + 'inside'}\n@tool ln -s inside.txt near\n"
        f"@tool ln -s {outside}/secret.txt far\n@tool ln -s {outside} far-folder"
    )
    fork_thread = await forked(source, first)
    assert await outputs(fork_thread, "@tool cat near\n@tool readlink far far-folder\n@tool cat far 2>&1; true") == [
        "kept-inside",  # the link inside the workspace works in the fork's folder
        f"{outside}/secret.txt\n{outside}\n",  # the links out are links: their target text only
        "cat: far: No such file or directory\n",  # what they name is not in the fork's sandbox
    ]
    assert await outputs(fork_thread, "@tool ls") == ["far\nfar-folder\ninside.txt\nnear\n"]
    assert (sorted(os.listdir(outside)), (outside / "secret.txt").stat().st_mtime_ns) == before
    # What the fork was made from, as a reader sees it: the links' text, never what they point at.
    checkpoint = (await api.gql(CHECKPOINT, {"r": first["id"]}))["run"]["checkpoint"]
    far = (await api.gql(DIFF, {"c": checkpoint["id"], "p": "far"}))["node"]["diff"]
    assert f"{outside}/secret.txt" in far and SECRET not in far
    inside = (await api.gql(DIFF, {"c": checkpoint["id"], "p": "inside.txt"}))["node"]["diff"]
    assert "kept-inside" in inside

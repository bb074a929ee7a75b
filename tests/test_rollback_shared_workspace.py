"""Rollback in a workspace two threads write in (real server, real git, the scripted agent).

Threads A and B of one project share its folder. A rollback of A puts back only the paths A's undone runs
changed; a path someone else changed since is a conflict (WORKSPACE_CONFLICT naming the path and who), unless
`onConflict: OVERWRITE`; B's active run refuses it (WORKSPACE_BUSY); a dry run shows the plan and a token that
refuses the real call once the plan changed (STALE_PREVIEW). Each refusal changes nothing and has its twin.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.runs import finished, run, send
from tests.support.scripted import CREATE_THREAD, ScriptedThread
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

ROLLBACK = """mutation($t: ID!, $n: Int!, $dry: Boolean, $token: String, $on: RollbackConflictPolicy) {
  rollbackToRun(input: {threadId: $t, runOrdinal: $n, dryRun: $dry, previewToken: $token, onConflict: $on}) {
    rolledBackRuns { ordinal }
    preview { rolledBackRunOrdinals restorePaths deletePaths previewToken
              conflicts { path thread { id } run { ordinal } }
              providerSteps { strategy providerThreadId providerThread { id thread { id } } } }
    userErrors { code message field } } }"""
RUNS = """query($t: ID!) { thread(id: $t) { status runs(first: 20) { nodes { ordinal status } } } }"""
PROJECT_OF = """query($t: ID!) { thread(id: $t) { project { id } } }"""


async def _pair(client: Client, workspace: Path) -> tuple[ScriptedThread, ScriptedThread]:
    a = await ScriptedThread.create(client, workspace)
    project = (await client.gql(PROJECT_OF, {"t": a.id}))["thread"]["project"]["id"]
    made = (await client.gql(CREATE_THREAD, {"p": project, "i": "scripted"}))["createThread"]
    assert made["userErrors"] == [], made
    return a, ScriptedThread(client, made["thread"]["id"], workspace)


async def _rollback(client: Client, thread: ScriptedThread, ordinal: int, **kw: Any) -> dict[str, Any]:
    answer = await client.gql(ROLLBACK, {"t": thread.id, "n": ordinal, **kw})
    return answer["rollbackToRun"]  # type: ignore[no-any-return]


async def _runs(client: Client, thread: ScriptedThread) -> list[tuple[int, str]]:
    nodes = (await client.gql(RUNS, {"t": thread.id}))["thread"]["runs"]["nodes"]
    return [(n["ordinal"], n["status"]) for n in nodes]


def _files(workspace: Path) -> dict[str, str]:
    return {p.name: p.read_text() for p in sorted(workspace.iterdir()) if p.is_file()}


async def test_a_rollback_puts_back_only_what_its_own_runs_changed(client: Client, workspace: Path) -> None:
    a, b = await _pair(client, workspace)
    await a.run("@write a.txt one")
    await b.run("@write b.txt bee")  # B's work, after A's run 1 and before its run 2
    await a.run("@write a.txt two\n@write a2.txt new")
    done = await _rollback(client, a, 1)
    assert done["userErrors"] == [] and done["rolledBackRuns"] == [{"ordinal": 2}]
    assert _files(workspace) == {"a.txt": "one", "b.txt": "bee"}  # B's file stays


async def test_a_path_another_thread_changed_since_is_a_conflict_unless_overwritten(
    client: Client, workspace: Path
) -> None:
    a, b = await _pair(client, workspace)
    await a.run("@write s.txt one")
    await a.run("@write s.txt two\n@write mine.txt a")
    await b.run("@write s.txt bee")
    before = (_files(workspace), await _runs(client, a))
    refused = await _rollback(client, a, 1)
    [error] = refused["userErrors"]
    assert error["code"] == "WORKSPACE_CONFLICT" and "s.txt" in error["message"] and "run 1" in error["message"]
    assert (_files(workspace), await _runs(client, a)) == before  # nothing changed
    preview = (await _rollback(client, a, 1, dry=True))["preview"]
    assert [(c["path"], c["thread"]["id"], c["run"]["ordinal"]) for c in preview["conflicts"]] == [("s.txt", b.id, 1)]
    assert (preview["restorePaths"], preview["deletePaths"]) == (["s.txt"], ["mine.txt"])

    done = await _rollback(client, a, 1, on="OVERWRITE")
    assert done["userErrors"] == [] and done["rolledBackRuns"] == [{"ordinal": 2}]
    assert _files(workspace) == {"s.txt": "one"}


async def test_a_change_no_run_made_is_a_conflict_and_one_elsewhere_is_not(client: Client, workspace: Path) -> None:
    a, _ = await _pair(client, workspace)
    await a.run("@write s.txt one")
    await a.run("@write s.txt two")
    (workspace / "notes.txt").write_text("the user's own file")  # not a path A's runs changed: no conflict
    (workspace / "s.txt").write_text("edited by hand")
    [error] = (await _rollback(client, a, 1))["userErrors"]
    assert error["code"] == "WORKSPACE_CONFLICT" and "s.txt (changed outside any run)" in error["message"]
    assert (workspace / "s.txt").read_text() == "edited by hand"
    (workspace / "s.txt").write_text("two")  # back as A's run 2 left it: nothing stands in the way
    assert (await _rollback(client, a, 1))["userErrors"] == []
    assert _files(workspace) == {"notes.txt": "the user's own file", "s.txt": "one"}


async def test_another_threads_active_run_in_the_workspace_refuses_the_rollback(
    client: Client, workspace: Path
) -> None:
    a, b = await _pair(client, workspace)
    await a.run("@write a.txt one")
    await a.run("@write a.txt two")
    sent = await send(client, b.id, "@await gate\n@reply done")
    assert sent["userErrors"] == []

    async def running() -> bool | None:
        return (await client.gql(RUNS, {"t": b.id}))["thread"]["status"] == "RUNNING" or None

    await until(running)
    [error] = (await _rollback(client, a, 1))["userErrors"]
    assert error["code"] == "WORKSPACE_BUSY" and "another thread's run is active" in error["message"]
    assert (workspace / "a.txt").read_text() == "two"
    (workspace / "gate").touch()
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    assert (await _rollback(client, a, 1))["userErrors"] == []  # the twin: once B's run is over
    assert (workspace / "a.txt").read_text() == "one"


async def test_a_dry_run_changes_nothing_and_its_token_refuses_a_changed_plan(client: Client, workspace: Path) -> None:
    a, b = await _pair(client, workspace)
    await a.run("@write a.txt one")
    await a.run("@write a.txt two\n@write t.txt new")
    before = (_files(workspace), await _runs(client, a))
    dry = await _rollback(client, a, 1, dry=True)
    assert dry["userErrors"] == [] and dry["rolledBackRuns"] == []
    preview = dry["preview"]
    assert preview["rolledBackRunOrdinals"] == [2]
    assert (preview["restorePaths"], preview["deletePaths"], preview["conflicts"]) == (["a.txt"], ["t.txt"], [])
    [step] = preview["providerSteps"]
    assert step["strategy"] == "native_rollback"
    assert step["providerThread"] == {"id": step["providerThreadId"], "thread": {"id": a.id}}  # the link, not a string
    assert (_files(workspace), await _runs(client, a)) == before
    again = (await _rollback(client, a, 1, dry=True))["preview"]["previewToken"]
    assert again == preview["previewToken"]  # the same plan, the same token

    await b.run("@write a.txt bee")  # the plan changes: a.txt is now a conflict
    stale = await _rollback(client, a, 1, token=preview["previewToken"], on="OVERWRITE")
    assert [e["code"] for e in stale["userErrors"]] == ["STALE_PREVIEW"]
    assert (workspace / "a.txt").read_text() == "bee"
    fresh = (await _rollback(client, a, 1, dry=True))["preview"]
    done = await _rollback(client, a, 1, token=fresh["previewToken"], on="OVERWRITE")
    assert done["userErrors"] == [] and done["rolledBackRuns"] == [{"ordinal": 2}]
    assert _files(workspace) == {"a.txt": "one"}


async def test_a_dry_run_with_another_projects_token_finds_nothing(
    client: Client, server: ServerProcess, database_url: str, workspace: Path, tmp_path: Path
) -> None:
    a, _ = await _pair(client, workspace)
    await a.run("@write a.txt one")
    other = tmp_path / "other"
    other.mkdir()
    elsewhere = await ScriptedThread.create(client, other)
    project = (await client.gql(PROJECT_OF, {"t": elsewhere.id}))["thread"]["project"]["id"]
    own = (await client.gql(PROJECT_OF, {"t": a.id}))["thread"]["project"]["id"]
    for project_id, expected in ((project, ["NOT_FOUND"]), (own, [])):
        _, secret = create_token(database_url, "operate", project_id)
        scoped = Client(server.url, secret)
        try:
            answer = await _rollback(scoped, a, 0, dry=True)
            assert [e["code"] for e in answer["userErrors"]] == expected, answer
            assert (answer["preview"] is None) == bool(expected)
        finally:
            await scoped.aclose()


REORDER = """mutation($r: ID!, $p: Int!) {
  reorderQueuedRun(input: {runId: $r, position: $p}) { userErrors { code } } }"""


@pytest.mark.parametrize("order", ["in-order", "reordered"])
async def test_a_file_another_thread_wrote_after_the_target_stays_when_its_runs_ran_out_of_order(
    client: Client, workspace: Path, order: str
) -> None:
    """B's run 2 writes f.txt after A's run 1; A's run 2 only sees it there. Rolling A back to run 1 must
    leave f.txt as B wrote it. When B's run 3 ran ahead of its run 2 (`reordered`), run 2's checkpoint record
    was made at run 3's start, before A's run 1 ended; ordered by record, B's capture fell before the target,
    out of sight, A's run 2 seemed to have written f.txt, and the rollback put A's version back over B's.
    The twin runs B's queue in order."""
    a, b = await _pair(client, workspace)
    held = await send(client, b.id, "@await go-one\n@reply one")
    second = await send(client, b.id, "@await go-two\n@write f.txt bee\n@reply two", d={"queueAfterActive": True})
    third = await send(client, b.id, "@reply three", d={"queueAfterActive": True})
    if order == "reordered":
        assert (await client.gql(REORDER, {"r": third["run"]["id"], "p": 1}))["reorderQueuedRun"]["userErrors"] == []
    (workspace / "go-one").touch()
    ahead = third if order == "reordered" else held

    async def running(sent: dict[str, Any] = second) -> bool:
        return (await run(client, sent["run"]["id"]))["status"] == "RUNNING"

    assert (await finished(client, ahead["run"]["id"]))["status"] == "COMPLETED"
    await until(running)  # B's run 2 waits for its gate
    await a.run("@write f.txt one")  # A's run 1, the target
    (workspace / "go-two").touch()
    assert (await finished(client, second["run"]["id"]))["status"] == "COMPLETED"  # B writes f.txt
    if order == "in-order":
        assert (await finished(client, third["run"]["id"]))["status"] == "COMPLETED"
    await a.run("@reply looking")  # A's run 2: its checkpoint sees B's f.txt

    done = await _rollback(client, a, 1)
    assert done["userErrors"] == [] and done["rolledBackRuns"] == [{"ordinal": 2}], done
    assert (workspace / "f.txt").read_text() == "bee"  # the old order: "one", B's work gone

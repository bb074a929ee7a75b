"""rollbackToRun, rollbackNode and undoRollback against real servers, real git and the scripted agent.

What a user sees is asserted: the runs' statuses, the files on disk, and what the agent remembers (`@recall`,
which lists every user message and handoff the agent's conversation holds). Failures are injected with the
test-only `THREADLOOM_TEST_FAIL_ROLLBACK_STEP`; after each, files and conversation are as they were.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess, providers_env
from tests.support.waiting import until

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)
PROVIDERS = """
[instances.scripted]
driver = "scripted"

[instances.forking]
driver = "scripted"
supports_native_rollback = false

[instances.reverting]
driver = "scripted"
supports_native_fork = false

[instances.plain]
driver = "scripted"
supports_native_rollback = false
supports_native_fork = false
"""

ROLLBACK = """mutation($t: ID!, $n: Int!, $files: Boolean, $key: String) {
  rollbackToRun(input: {threadId: $t, runOrdinal: $n, restoreFiles: $files, clientMutationId: $key}) {
    thread { id } rolledBackRuns { ordinal status } preRollbackRef userErrors { code message field }
    clientMutationId } }"""
UNDO = """mutation($t: ID!) { undoRollback(input: {threadId: $t}) { thread { id } userErrors { code message } } }"""
RUNS = """query($t: ID!) { thread(id: $t) { runs(first: 50) { edges { node { ordinal status } } } } }"""
ACTIVITIES = (
    """query($t: ID!) { thread(id: $t) { activities(first: 100) { edges { node { kind summary payload } } } } }"""
)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


@contextlib.contextmanager
def _server(database_url: str, tmp_path: Path, **env: str) -> Iterator[ServerProcess]:
    proc = ServerProcess(database_url, tmp_path / "data", env=providers_env(tmp_path, PROVIDERS, **env)).wait_ready()
    try:
        yield proc
    finally:
        proc.stop()
        print(proc.report(60))


class Thread(ScriptedThread):
    async def rollback(self, ordinal: int, files: bool = True, key: str | None = None) -> dict[str, Any]:
        data = await self.client.gql(ROLLBACK, {"t": self.id, "n": ordinal, "files": files, "key": key})
        return data["rollbackToRun"]  # type: ignore[no-any-return]

    async def statuses(self) -> dict[int, str]:
        data = await self.client.gql(RUNS, {"t": self.id})
        return {e["node"]["ordinal"]: e["node"]["status"] for e in data["thread"]["runs"]["edges"]}

    async def activities(self) -> list[dict[str, Any]]:
        data = await self.client.gql(ACTIVITIES, {"t": self.id})
        return [e["node"] for e in data["thread"]["activities"]["edges"]]


def tree(root: Path) -> dict[str, bytes | str]:
    """The workspace as a user sees it: files' bytes and links' targets (`.git` left out)."""
    found: dict[str, bytes | str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel == ".git" or rel.startswith(".git/"):
            continue
        if path.is_symlink():
            found[rel] = f"-> {path.readlink()}"
        elif path.is_file():
            found[rel] = path.read_bytes()
    return found


def git(workspace: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(workspace), *args], check=True, capture_output=True, text=True).stdout


# ---- the conversation ------------------------------------------------------------------------------------


async def test_rollback_to_one_and_to_zero_forgets_the_later_runs(api: Client, home: Path) -> None:
    thread = await Thread.create(api, home)
    await thread.run("first")
    await thread.run("second")
    answer = await thread.rollback(1, files=False)
    assert answer["userErrors"] == [], answer
    assert answer["rolledBackRuns"] == [{"ordinal": 2, "status": "ROLLED_BACK"}]
    assert await thread.recall() == ["user: first"]
    assert (await thread.statuses()) == {1: "COMPLETED", 2: "ROLLED_BACK", 3: "COMPLETED"}

    # Then a new run, then back again: only runs that still count are undone.
    await thread.run("fourth")
    answer = await thread.rollback(1, files=False)
    assert [r["ordinal"] for r in answer["rolledBackRuns"]] == [3, 4]
    assert await thread.recall() == ["user: first"]

    answer = await thread.rollback(0, files=False)
    assert [r["ordinal"] for r in answer["rolledBackRuns"]] == [1, 5]
    assert await thread.recall() == []
    kinds = [a["kind"] for a in await thread.activities()]
    assert kinds.count("rollback.completed") == 3


NODE_TYPE = """query($id: ID!) { node(id: $id) { __typename id } }"""


async def test_the_completed_record_names_every_object_by_a_global_id(api: Client, home: Path) -> None:
    """Ids nested in `rollback.completed` (its runs, checkpoints, provider threads) resolve through `node`."""
    thread = await Thread.create(api, home)
    await thread.run("first")
    await thread.run("@write notes.txt hello\nsecond")
    assert (await thread.rollback(1))["userErrors"] == []
    record = next(a for a in await thread.activities() if a["kind"] == "rollback.completed")["payload"]
    named = {
        "targetRunId": ("Run", record["targetRunId"]),
        "runs[0].id": ("Run", record["runs"][0]["id"]),
        "staleCheckpoints[0].id": ("Checkpoint", record["staleCheckpoints"][0]["id"]),
        "providerThreads[0].id": ("ProviderThread", record["providerThreads"][0]["id"]),
        "previousActiveProviderThreadId": ("ProviderThread", record["previousActiveProviderThreadId"]),
    }
    for where, (type_name, value) in named.items():
        found = (await api.gql(NODE_TYPE, {"id": value}))["node"]
        assert found == {"__typename": type_name, "id": value}, where


@pytest.mark.parametrize("instance", ["forking", "plain"])
async def test_without_native_rollback_a_fork_or_a_handoff_replaces_the_conversation(
    api: Client, home: Path, instance: str
) -> None:
    thread = await Thread.create(api, home, instance)
    await thread.run("first")
    await thread.run("second")
    answer = await thread.rollback(1, files=False)
    assert answer["userErrors"] == [], answer
    remembered = await thread.recall()
    if instance == "forking":
        assert remembered == ["user: first"]  # a native fork at run 1's turn
    else:
        # A new provider thread told what happened up to run 1 by a handoff; run 2 is nowhere in it.
        assert len(remembered) == 1 and remembered[0].startswith("handoff: "), remembered
        assert "first" in remembered[0] and "second" not in remembered[0]


async def test_rollback_refusals_change_nothing(api: Client, home: Path) -> None:
    thread = await Thread.create(api, home)
    await thread.run("first")
    for ordinal, code in ((5, "NOT_FOUND"), (-1, "INVALID_INPUT")):
        answer = await thread.rollback(ordinal, files=False)
        assert [e["code"] for e in answer["userErrors"]] == [code]
    # Refused while a run is active.
    sent = await send(api, thread.id, "@await go\n@reply slow and steady wins")  # active until the gate opens
    busy = await thread.rollback(0, files=False)
    assert [e["code"] for e in busy["userErrors"]] == ["THREAD_BUSY"]
    (home / "go").touch()
    await finished(api, sent["run"]["id"])
    assert (await thread.statuses()) == {1: "COMPLETED", 2: "COMPLETED"}


async def test_another_projects_token_gets_not_found(
    api: Client, home: Path, database_url: str, tmp_path: Path
) -> None:
    thread = await Thread.create(api, home)
    await thread.run("first")
    other_home = tmp_path / "other"
    other_home.mkdir()
    other = await api.gql(CREATE_PROJECT, {"name": "other", "root": str(other_home)})
    _, token = create_token(database_url, "operate", other["createProject"]["project"]["id"])
    stranger = Client(api.base_url, token)
    try:
        data = await stranger.gql(ROLLBACK, {"t": thread.id, "n": 0, "files": False, "key": None})
        assert [e["code"] for e in data["rollbackToRun"]["userErrors"]] == ["NOT_FOUND"]
        undo = await stranger.gql(UNDO, {"t": thread.id})
        assert [e["code"] for e in undo["undoRollback"]["userErrors"]] == ["NOT_FOUND"]
    finally:
        await stranger.aclose()
    assert (await thread.statuses()) == {1: "COMPLETED"}


async def test_idempotent_with_client_mutation_id(api: Client, home: Path) -> None:
    thread = await Thread.create(api, home)
    await thread.run("first")
    await thread.run("second")
    first = await thread.rollback(1, files=False, key="rb-1")
    again = await thread.rollback(1, files=False, key="rb-1")
    assert first == again
    assert first["clientMutationId"] == "rb-1"
    kinds = [a["kind"] for a in await thread.activities()]
    assert kinds.count("rollback.completed") == 1


async def test_undo_of_a_rollback_brings_the_conversation_back(api: Client, home: Path) -> None:
    thread = await Thread.create(api, home)
    await thread.run("first")
    await thread.run("second")
    await thread.rollback(1, files=False)
    undone = (await api.gql(UNDO, {"t": thread.id}))["undoRollback"]
    assert undone["userErrors"] == [], undone
    assert (await thread.statuses()) == {1: "COMPLETED", 2: "COMPLETED"}
    assert await thread.recall() == ["user: first", "user: second"]
    # A run since (the @recall) makes the next undo impossible: nothing left to undo here anyway.
    again = (await api.gql(UNDO, {"t": thread.id}))["undoRollback"]
    assert [e["code"] for e in again["userErrors"]] == ["ROLLBACK_NOT_UNDOABLE"]


# ---- the files -------------------------------------------------------------------------------------------

RUN_1 = "@write a.txt one\n@tool sh -c 'printf \"\\000\\001bin\" > bin.dat; mkdir -p d; echo shell > d/s.txt'"
RUN_2 = (
    "@tool sh -c 'rm a.txt; mv d/s.txt d/moved.txt; printf x >> bin.dat; echo new > new.txt'"
    "\n@write tracked.txt changed"
)


def git_state(workspace: Path) -> dict[str, str]:
    """Everything of the user's repository a rollback must leave alone."""
    return {
        "head": git(workspace, "rev-parse", "HEAD"),
        "refs": git(workspace, "for-each-ref"),
        "index": git(workspace, "ls-files", "--stage"),
        "branch": git(workspace, "branch", "-a"),
        "status": git(workspace, "status", "--porcelain", "--untracked-files=all"),
    }


async def test_files_follow_the_rollback_and_the_users_git_is_untouched(api: Client, home: Path) -> None:
    git(home, "init", "-q", "-b", "main")
    (home / "tracked.txt").write_text("tracked\n")
    git(home, "add", "tracked.txt")
    git(home, "-c", "user.name=u", "-c", "user.email=u@x", "commit", "-q", "-m", "init")
    thread = await Thread.create(api, home)
    before = tree(home)
    await thread.run(RUN_1)
    after_1 = tree(home)
    assert after_1["bin.dat"] == b"\x00\x01bin" and after_1["d/s.txt"] == b"shell\n"
    await thread.run(RUN_2)
    after_2 = tree(home)
    assert "a.txt" not in after_2 and "d/moved.txt" in after_2
    users_git = git_state(home)

    answer = await thread.rollback(1)
    assert answer["userErrors"] == [], answer
    assert answer["preRollbackRef"].startswith("refs/threadloom/")
    assert tree(home) == after_1  # deleted, renamed, binary and shell-made files all back
    state = git_state(home)
    assert {k: v for k, v in state.items() if k != "status"} == {k: v for k, v in users_git.items() if k != "status"}

    # Undo: forward again to the pre-rollback capture, conversation included.
    undone = (await api.gql(UNDO, {"t": thread.id}))["undoRollback"]
    assert undone["userErrors"] == [], undone
    assert tree(home) == after_2
    assert git_state(home) == users_git

    answer = await thread.rollback(0)
    assert answer["userErrors"] == [], answer
    assert tree(home) == before
    assert await thread.recall() == []


async def test_a_symlink_out_of_the_workspace_is_never_followed(api: Client, home: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("original\n")
    thread = await Thread.create(api, home)  # not a git repository
    await thread.run("@tool sh -c 'mkdir out; echo mine > out/secret.txt'")
    after_1 = tree(home)
    await thread.run(f"@tool sh -c 'rm -r out; ln -s {outside} out'")
    assert (home / "out").is_symlink()
    answer = await thread.rollback(1)
    assert answer["userErrors"] == [], answer
    assert tree(home) == after_1 and not (home / "out").is_symlink()
    assert (outside / "secret.txt").read_text() == "original\n"
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]


@pytest.mark.parametrize(
    ("step", "instance"),
    [
        *(
            (step, instance)
            for step in ("capture", "provider", "files", "record")
            for instance in ("scripted", "forking")
        ),
        # Rolled back in place with no undo fork: that provider step runs after the files, so a failure of the
        # files leaves the conversation untouched.
        ("files", "reverting"),
        ("provider", "reverting"),
    ],
)
@pytest.mark.own_server  # a server of its own that fails the step, on a database of its own
async def test_a_failed_step_leaves_files_and_conversation_as_they_were(
    database_url: str, tmp_path: Path, home: Path, step: str, instance: str
) -> None:
    with _server(database_url, tmp_path, THREADLOOM_TEST_FAIL_ROLLBACK_STEP=step) as proc:
        client = Client(proc.url, proc.admin_token)
        try:
            thread = await Thread.create(client, home, instance)
            await thread.run("@write a.txt one")
            await thread.run("@write a.txt two\n@write b.txt new")
            files = tree(home)
            answer = await thread.rollback(1)
            assert [e["code"] for e in answer["userErrors"]] == ["ROLLBACK_FAILED"], answer
            assert step in answer["userErrors"][0]["message"]
            assert tree(home) == files
            assert (await thread.statuses()) == {1: "COMPLETED", 2: "COMPLETED"}
            failed = [a for a in await thread.activities() if a["kind"] == "rollback.failed"]
            assert len(failed) == 1 and failed[0]["payload"]["failedStep"] == step
            assert await thread.recall() == ["user: @write a.txt one", "user: @write a.txt two\\n@write b.txt new"]
        finally:
            await client.aclose()


REORDER = """mutation($r: ID!, $p: Int!) {
  reorderQueuedRun(input: {runId: $r, position: $p}) { userErrors { code } } }"""


async def test_files_are_not_restored_to_a_run_a_later_one_ran_before(api: Client, home: Path) -> None:
    """A reordered queue runs run 4 before run 3: run 3's checkpoint holds run 4's file, so going back to run 3 with
    files is refused and changes nothing; going back to run 2, before both, restores their files away."""
    thread = await Thread.create(api, home)
    await thread.run("@write a.txt one\n@reply one")
    held = await send(api, thread.id, "@await go\n@reply two")  # runs 3 and 4 queue behind it
    third = await send(api, thread.id, "@write b.txt three\n@reply three", d={"queueAfterActive": True})
    fourth = await send(api, thread.id, "@write c.txt four\n@reply four", d={"queueAfterActive": True})
    moved = await api.gql(REORDER, {"r": fourth["run"]["id"], "p": 1})
    assert moved["reorderQueuedRun"]["userErrors"] == []
    (home / "go").touch()
    for sent in (held, fourth, third):
        assert (await finished(api, sent["run"]["id"]))["status"] == "COMPLETED"
    runs = {n: await finished(api, s["run"]["id"]) for n, s in ((3, third), (4, fourth))}
    assert runs[4]["startedAt"] < runs[3]["startedAt"]  # run 4 ran first
    before = tree(home)

    refused = await thread.rollback(3)
    assert [(e["code"], e["field"]) for e in refused["userErrors"]] == [("CHECKPOINT_MISSING", "restoreFiles")]
    assert "run 4 ran before run 3" in refused["userErrors"][0]["message"]
    assert (await thread.statuses()) == {1: "COMPLETED", 2: "COMPLETED", 3: "COMPLETED", 4: "COMPLETED"}
    assert tree(home) == before

    done = await thread.rollback(2)  # before both: their files go with them
    assert done["userErrors"] == [], done
    assert (await thread.statuses()) == {1: "COMPLETED", 2: "COMPLETED", 3: "ROLLED_BACK", 4: "ROLLED_BACK"}
    assert {k: v for k, v in tree(home).items() if k in ("a.txt", "b.txt", "c.txt")} == {"a.txt": b"one"}


# ---- a subagent's scope ----------------------------------------------------------------------------------

APPROVE = """mutation($r: ID!) {
  respondToApproval(input: {requestId: $r, decision: ACCEPT}) { userErrors { code } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""
CHECKPOINTS = """query($t: ID!) { thread(id: $t) { checkpoints(first: 50) { edges { node {
  id ordinal status scope { kind node { id } } } } } } }"""
ROLLBACK_NODE = """mutation($n: ID!, $c: ID!) { rollbackNode(input: {nodeId: $n, checkpointId: $c}) {
  node { id } checkpoint { id } dirtiedParentWorkspace preRollbackRef userErrors { code message } } }"""


async def test_rollback_of_a_subagent_scope_keeps_the_parents_history(api: Client, home: Path) -> None:
    thread = await Thread.create(api, home)
    sent = await send(
        api, thread.id, "@write parent.txt p\n@subagent @approval echo from-child > child.txt\n@write after.txt late"
    )

    async def pending() -> str | None:
        found = (await api.gql(PENDING, {"t": thread.id}))["thread"]["pendingRequests"]
        return str(found[0]["id"]) if found else None

    request = await until(pending)
    assert (await api.gql(APPROVE, {"r": request}))["respondToApproval"]["userErrors"] == []
    assert (await finished(api, sent["run"]["id"]))["status"] == "COMPLETED"
    after_run = tree(home)
    assert set(after_run) == {"parent.txt", "child.txt", "after.txt"}

    nodes = [e["node"] for e in (await api.gql(CHECKPOINTS, {"t": thread.id}))["thread"]["checkpoints"]["edges"]]
    child = [n for n in nodes if n["scope"]["kind"] == "SUBAGENT"]
    start, end = sorted(child, key=lambda n: n["ordinal"])
    node_id = start["scope"]["node"]["id"]

    answer = (await api.gql(ROLLBACK_NODE, {"n": node_id, "c": start["id"]}))["rollbackNode"]
    assert answer["userErrors"] == [], answer
    assert answer["dirtiedParentWorkspace"] is True  # the subagent shares the parent's workspace
    assert tree(home) == {"parent.txt": b"p"}  # as the subagent found it: its file and the parent's later one gone
    edges = (await api.gql(CHECKPOINTS, {"t": thread.id}))["thread"]["checkpoints"]["edges"]
    statuses = {e["node"]["id"]: e["node"]["status"] for e in edges}
    assert statuses[end["id"]] == "STALE" and statuses[start["id"]] == "READY"
    assert (await thread.statuses()) == {1: "COMPLETED"}  # the parent's history stays

    # A checkpoint of another scope is refused; the undo brings the files back.
    root = next(n for n in nodes if n["scope"]["kind"] == "ROOT_RUN" and n["ordinal"] == 1)
    wrong = (await api.gql(ROLLBACK_NODE, {"n": node_id, "c": root["id"]}))["rollbackNode"]
    assert [e["code"] for e in wrong["userErrors"]] == ["INVALID_INPUT"]
    undone = (await api.gql(UNDO, {"t": thread.id}))["undoRollback"]
    assert undone["userErrors"] == [], undone
    assert tree(home) == after_run

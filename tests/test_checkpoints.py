"""Checkpoints of runs through a real server, real scripted-agent processes and real git.

Each scenario sends messages whose directives edit the workspace the ways agents do (`@write`, shell commands
through `@tool`, deletes, renames, binary files) and reads back through GraphQL what a user sees: the run's
checkpoint, its files with line counts, the unified diff of a path, the thread's checkpoints, and the user's
own repository untouched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.support.graphql import CREATE_PROJECT, make_thread, statements
from tests.support.runs import finished, send
from tests.support.server import Client
from tests.support.waiting import until

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

CHECKPOINT = """
query($id: ID!, $path: String!) {
  run(id: $id) {
    id ordinal status
    checkpoint {
      id ordinal status
      files { path status additions deletions oldPath }
      diff(path: $path)
      scope { kind }
    }
  }
}"""

ACTIVITIES = """
query($t: ID!) { thread(id: $t) { activities(first: 100) { edges { node { kind summary runId nodeId payload } } } } }
"""


@pytest.fixture
async def project(client: Client, workspace: Path) -> str:
    data = await client.gql(CREATE_PROJECT, {"name": "Checkpoints", "root": str(workspace)})
    return str(data["createProject"]["project"]["id"])


@pytest.fixture
async def thread_id(client: Client, project: str) -> str:
    return str((await make_thread(client, project, "work"))["id"])


async def ran(client: Client, thread_id: str, text: str) -> dict[str, Any]:
    sent = await send(client, thread_id, text)
    assert sent["userErrors"] == []
    return await finished(client, sent["run"]["id"])


async def checkpoint_of(client: Client, run_id: str, path: str = "-") -> dict[str, Any]:
    data = await client.gql(CHECKPOINT, {"id": run_id, "path": path})
    found: dict[str, Any] = data["run"]["checkpoint"]
    return found


def files(checkpoint: dict[str, Any]) -> dict[str, tuple[str, int, int, str | None]]:
    return {f["path"]: (f["status"], f["additions"], f["deletions"], f["oldPath"]) for f in checkpoint["files"]}


async def test_runs_capture_ordinal_after_ordinal(client: Client, thread_id: str, workspace: Path) -> None:
    (workspace / "keep.txt").write_text("kept\n")
    (workspace / "gone.txt").write_text("one\ntwo\n")
    (workspace / "old.txt").write_text("moved unchanged\n" * 5)
    first = await ran(
        client,
        thread_id,
        "@write notes.md hello\n"
        "@tool sh -c 'printf \"a\\nb\\nc\\n\" > made.txt'\n"
        "@tool rm gone.txt\n"
        "@tool mv old.txt new.txt\n"
        "@tool printf '\\000\\001\\002' > blob.bin",
    )
    assert first["status"] == "COMPLETED"
    one = await checkpoint_of(client, first["id"], "made.txt")
    assert one["ordinal"] == 1 and one["status"] == "READY" and one["scope"]["kind"] == "ROOT_RUN"
    assert files(one) == {
        "notes.md": ("ADDED", 1, 0, None),
        "made.txt": ("ADDED", 3, 0, None),
        "gone.txt": ("DELETED", 0, 2, None),
        "new.txt": ("RENAMED", 0, 0, "old.txt"),
        "blob.bin": ("ADDED", 0, 0, None),
    }
    assert "+a\n+b\n+c\n" in one["diff"] and one["diff"].startswith("diff --git a/made.txt b/made.txt")

    second = await ran(client, thread_id, "@tool sh -c 'echo more >> made.txt'")
    two = await checkpoint_of(client, second["id"], "made.txt")
    assert two["ordinal"] == 2 and files(two) == {"made.txt": ("MODIFIED", 1, 0, None)}
    assert "+more" in two["diff"] and "+a" not in two["diff"]

    data = await client.gql(ACTIVITIES, {"t": thread_id})
    captured = [a["node"] for a in data["thread"]["activities"]["edges"] if a["node"]["kind"] == "checkpoint.captured"]
    assert [(a["runId"], a["payload"]["ordinal"], a["payload"]["files"]) for a in captured] == [
        (first["id"], 1, 5),
        (second["id"], 2, 1),
    ]
    assert all(a["nodeId"] for a in captured)
    assert not [a for a in data["thread"]["activities"]["edges"] if a["node"]["kind"] == "checkpoint.skipped"]


def _git(cwd: Path, *args: str) -> str:
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "User",
        "GIT_AUTHOR_EMAIL": "user@example.com",
        "GIT_COMMITTER_NAME": "User",
        "GIT_COMMITTER_EMAIL": "user@example.com",
        "GIT_OPTIONAL_LOCKS": "0",  # `git status` must not refresh the index we compare
    }
    return subprocess.run(["git", *args], cwd=cwd, env=env, check=True, capture_output=True, text=True).stdout


def _repo_state(root: Path) -> tuple[bytes, str, str]:
    """The index file's bytes (read first), HEAD and every ref."""
    index = (root / ".git" / "index").read_bytes()
    return index, _git(root, "rev-parse", "HEAD"), _git(root, "for-each-ref")


async def test_the_users_repository_is_untouched(client: Client, thread_id: str, workspace: Path) -> None:
    _git(workspace, "init", "-q", "-b", "main")
    (workspace / "tracked.txt").write_text("v1\n")
    _git(workspace, "add", "tracked.txt")
    _git(workspace, "commit", "-q", "-m", "first")
    _git(workspace, "branch", "side")
    _git(workspace, "tag", "v1")
    (workspace / "tracked.txt").write_text("v2 staged\n")
    _git(workspace, "add", "tracked.txt")
    (workspace / "tracked.txt").write_text("v3 unstaged\n")
    _git(workspace, "update-index", "-q", "--refresh")
    before = _repo_state(workspace)
    assert _git(workspace, "status", "--porcelain") == "MM tracked.txt\n"
    done = await ran(client, thread_id, "@tool sh -c 'echo x > f'\n@write tracked.txt agent")
    one = await checkpoint_of(client, done["id"], "tracked.txt")
    assert files(one) == {"f": ("ADDED", 1, 0, None), "tracked.txt": ("MODIFIED", 1, 1, None)}
    assert "-v3 unstaged\n+agent" in one["diff"]
    assert ".git" not in {p.split("/")[0] for p in files(one)}
    assert _repo_state(workspace) == before
    assert _git(workspace, "status", "--porcelain") == "MM tracked.txt\n?? f\n"  # only the agent's edits


APPROVE = """mutation($r: ID!) {
  respondToApproval(input: {requestId: $r, decision: ACCEPT}) { userErrors { code } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""
INTERRUPT = """mutation($r: ID!) { interruptRun(input: {runId: $r, holdQueue: false}) { userErrors { code } } }"""
THREAD_CHECKPOINTS = """
query($t: ID!) {
  thread(id: $t) {
    checkpoints(first: 50) {
      totalCount
      edges { node { id ordinal status files { path status additions deletions oldPath binary }
                     scope { kind } run { ordinal } children { id ordinal } } }
    }
  }
}"""


async def pending(client: Client, thread_id: str) -> str:
    """The id of the request the agent waits on (polled until there is one)."""

    async def check() -> str | None:
        found = (await client.gql(PENDING, {"t": thread_id}))["thread"]["pendingRequests"]
        return str(found[0]["id"]) if found else None

    return await until(check)


async def test_a_subagent_gets_its_own_scope(client: Client, thread_id: str, workspace: Path) -> None:
    (workspace / "shared.txt").write_text("base\n")
    sent = await send(
        client,
        thread_id,
        "@write parent.txt from-parent\n"
        "@subagent @approval echo from-child > child.txt\n"
        "@approval echo late > after.txt",  # asks after the subagent's end was seen (and captured)
    )
    for _ in range(2):
        request = await pending(client, thread_id)
        assert (await client.gql(APPROVE, {"r": request}))["respondToApproval"]["userErrors"] == []
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "COMPLETED"
    root = await checkpoint_of(client, done["id"], "child.txt")
    assert set(files(root)) == {"parent.txt", "child.txt", "after.txt"}  # the run's diff covers its subagent's

    data = await client.gql(THREAD_CHECKPOINTS, {"t": thread_id})
    nodes = [e["node"] for e in data["thread"]["checkpoints"]["edges"]]
    by_kind = [(n["scope"]["kind"], n["ordinal"], n["run"] and n["run"]["ordinal"]) for n in nodes]
    assert by_kind == [("ROOT_RUN", 0, None), ("SUBAGENT", 0, 1), ("SUBAGENT", 1, 1), ("ROOT_RUN", 1, 1)]
    child_end = nodes[2]
    assert [(f["path"], f["status"], f["additions"]) for f in child_end["files"]] == [("child.txt", "ADDED", 1)]
    assert nodes[3]["children"] == [{"id": child_end["id"], "ordinal": 1}]  # the root names its child scope

    subagent = await client.gql(
        """query($id: ID!) { node(id: $id) { ... on Checkpoint { diff(path: "child.txt")
             scope { id kind node { kind checkpointScope { id } } parentScope { kind } } } } }""",
        {"id": child_end["id"]},
    )
    scope = subagent["node"]["scope"]
    assert scope["kind"] == "SUBAGENT" and scope["parentScope"] == {"kind": "ROOT_RUN"}
    assert scope["node"]["kind"] == "SUBAGENT" and scope["node"]["checkpointScope"] == {"id": scope["id"]}
    assert "+from-child" in subagent["node"]["diff"]
    data = await client.gql(ACTIVITIES, {"t": thread_id})
    captured = [a["node"] for a in data["thread"]["activities"]["edges"] if a["node"]["kind"] == "checkpoint.captured"]
    assert [(a["payload"]["scope"], a["payload"]["ordinal"]) for a in captured] == [("subagent", 1), ("root_run", 1)]
    assert all(a["runId"] == done["id"] and a["nodeId"] for a in captured)


async def test_an_interrupted_run_is_captured_as_it_stopped(client: Client, thread_id: str, workspace: Path) -> None:
    sent = await send(client, thread_id, "@tool sh -c 'echo partial > half.txt'\n@delay 10000\n@reply never")

    async def written() -> bool:
        return (workspace / "half.txt").exists()

    await until(written)
    assert (await client.gql(INTERRUPT, {"r": sent["run"]["id"]}))["interruptRun"]["userErrors"] == []
    done = await finished(client, sent["run"]["id"])
    assert done["status"] == "INTERRUPTED"
    checkpoint = await checkpoint_of(client, done["id"], "half.txt")
    assert checkpoint["status"] == "READY" and files(checkpoint) == {"half.txt": ("ADDED", 1, 0, None)}
    data = await client.gql(ACTIVITIES, {"t": thread_id})
    summaries = [a["node"]["summary"] for a in data["thread"]["activities"]["edges"]]
    assert "checkpoint 1 captured: 1 file changed (run interrupted)" in summaries


async def test_a_workspace_that_is_gone_records_a_missing_checkpoint(
    client: Client, thread_id: str, workspace: Path
) -> None:
    sent = await send(client, thread_id, "@approval true\n@reply gone")
    request = await pending(client, thread_id)
    shutil.rmtree(workspace)  # the baseline was captured before the turn started
    assert (await client.gql(APPROVE, {"r": request}))["respondToApproval"]["userErrors"] == []
    done = await finished(client, sent["run"]["id"])
    checkpoint = await checkpoint_of(client, done["id"])
    assert checkpoint["status"] == "MISSING" and checkpoint["files"] == [] and checkpoint["diff"] is None
    data = await client.gql(ACTIVITIES, {"t": thread_id})
    failed = [a["node"] for a in data["thread"]["activities"]["edges"] if a["node"]["kind"] == "checkpoint.failed"]
    assert len(failed) == 1 and "workspace" in failed[0]["payload"]["reason"]


async def test_thread_checkpoints_cost_the_same_for_2_and_10_runs(client: Client, project: str) -> None:
    counts = []
    for n in (2, 10):
        thread = str((await make_thread(client, project, f"runs{n}"))["id"])
        for i in range(n):
            await ran(client, thread, f"@write f{i}.txt {i}")
        response = await client.post(THREAD_CHECKPOINTS, {"t": thread})
        body = response.json()
        assert "errors" not in body, body
        assert body["data"]["thread"]["checkpoints"]["totalCount"] == n + 1  # the baseline and one per run
        counts.append(statements(response.headers))
    assert counts[0] == counts[1]

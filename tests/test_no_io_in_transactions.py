"""No git or agent call runs inside a database transaction (`threadloom.io_guard`).

Every test server runs with `THREADLOOM_STRICT_TRANSACTIONS=1` (tests/support/server.py), so such a call
raises where it is made; `threadloom_io_in_transaction_total` counts it either way. The workload test drives
a real server through messages with file writes (checkpoints), a subagent (its scope's captures), an
approval, a provider switch, forks (native, and into a folder of their own) and a merge-back, and reads the
counter from /metrics. The twins below prove the guard fires: git or an agent spawn inside a transaction
raises under the strict flag, and is counted without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from prometheus_client import REGISTRY

from tests.support.runs import finished
from tests.support.scripted import ScriptedThread
from tests.support.server import Client
from tests.support.waiting import until
from tests.test_metrics import scrape, value
from threadloom import io_guard
from threadloom.checkpoints.git import Git, find_git
from threadloom.providers.child_process import spawn_process
from threadloom.store.db import Database

PROVIDERS = """
[instances.a]
driver = "scripted"

[instances.b]
driver = "scripted"
"""

SEND_ON = """mutation($t: ID!, $text: String!, $i: String) {
  sendMessage(input: {threadId: $t, text: $text, providerInstanceId: $i}) { run { id } userErrors { code } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""
APPROVE = """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) {
  request { status } userErrors { code } } }"""
FORK = """mutation($run: ID!, $own: Boolean!) { forkThread(input: {source: {run: $run}, ownWorkspace: $own}) {
  thread { id } userErrors { code message } } }"""
MERGE = """mutation($f: ID!) { mergeBack(input: {forkThreadId: $f}) { userErrors { code message } } }"""
CHECKPOINTS = """query($t: ID!) { thread(id: $t) { runs(first: 50) { nodes { ordinal checkpoint { id } } } } }"""
KINDS = ("git", "agent")


def _counted(kind: str) -> float:
    """This process's count of `kind` calls made inside a transaction (the in-process twins)."""
    return REGISTRY.get_sample_value("threadloom_io_in_transaction_total", {"kind": kind}) or 0.0


async def _send(api: Client, thread: ScriptedThread, text: str, instance: str | None = None) -> str:
    sent = (await api.gql(SEND_ON, {"t": thread.id, "text": text, "i": instance}))["sendMessage"]
    assert sent["userErrors"] == [], sent
    return str(sent["run"]["id"])


async def _fork(parent: ScriptedThread, run: dict[str, Any], own: bool) -> ScriptedThread:
    made = (await parent.client.gql(FORK, {"run": run["id"], "own": own}))["forkThread"]
    assert made["userErrors"] == [], made
    return ScriptedThread(parent.client, made["thread"]["id"], parent.workspace)


async def test_a_workload_of_every_lifecycle_makes_no_git_or_agent_call_inside_a_transaction(
    client: Client, workspace: Path
) -> None:
    before = await scrape(client)
    thread = await ScriptedThread.create(client, workspace, "a")
    first = await thread.run("@write one.txt first\n@reply wrote")
    await thread.run("@subagent @todo A; B")
    # An approval: the answer goes to the agent after the command that records it commits.
    asked = await _send(client, thread, "@approval echo approved > ok.txt\n@reply done")
    pending = await until(lambda: _pending(client, thread.id))
    answered = (await client.gql(APPROVE, {"r": pending}))["respondToApproval"]
    assert answered["userErrors"] == [] and answered["request"]["status"] == "RESOLVED"
    assert (await _finished(client, asked)) == "COMPLETED"
    # A switch to b (a full summary), then back to a (a delta).
    assert (await _finished(client, await _send(client, thread, "@reply on b", "b"))) == "COMPLETED"
    assert (await _finished(client, await _send(client, thread, "@write two.txt second", "a"))) == "COMPLETED"
    # A native fork in the shared folder, one in a folder of its own, and a merge-back.
    shared = await _fork(thread, first, own=False)
    await shared.run("@reply in the fork")
    own = await _fork(thread, first, own=True)
    await own.run("@write three.txt in its own folder")
    merged = (await client.gql(MERGE, {"f": shared.id}))["mergeBack"]
    assert merged["userErrors"] == [], merged
    await thread.run("@reply after the merge")

    # The workload did reach git: every run of the thread has its checkpoint.
    runs = (await client.gql(CHECKPOINTS, {"t": thread.id}))["thread"]["runs"]["nodes"]
    assert len(runs) == 6 and all(r["checkpoint"] for r in runs), runs
    assert (workspace / "one.txt").read_text() == "first" and (workspace / "ok.txt").exists()
    after = await scrape(client)
    for kind in KINDS:
        name = "threadloom_io_in_transaction_total"
        assert value(after, name, kind=kind) == value(before, name, kind=kind) == 0.0, kind


async def _pending(client: Client, thread_id: str) -> str | None:
    found = (await client.gql(PENDING, {"t": thread_id}))["thread"]["pendingRequests"]
    return str(found[0]["id"]) if found else None


async def _finished(client: Client, run_id: str) -> str:
    return str((await finished(client, run_id))["status"])


def _git(tmp_path: Path) -> Git:
    return Git(find_git(), tmp_path / "shadow.git", tmp_path, tmp_path / "index")


async def test_git_inside_a_transaction_raises_under_the_strict_flag(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(io_guard.STRICT_ENV, "1")
    git = _git(tmp_path)
    assert (await git.run("--version")).returncode == 0  # outside a transaction: allowed
    db = Database.from_url(database_url)
    try:
        counted = _counted("git")
        async with db.transaction():
            with pytest.raises(io_guard.IoInTransaction, match="git call inside a database transaction"):
                await git.run("--version")
        assert _counted("git") == counted + 1
        assert (await git.run("--version")).returncode == 0  # the mark ends with the transaction
    finally:
        await db.dispose()


async def test_an_agent_spawn_inside_a_transaction_raises_under_the_strict_flag(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(io_guard.STRICT_ENV, "1")
    db = Database.from_url(database_url)
    try:
        async with db.transaction():
            with pytest.raises(io_guard.IoInTransaction, match="agent call inside a database transaction"):
                await spawn_process(["true"], env={"PATH": "/usr/bin:/bin"}, cwd=str(tmp_path))
    finally:
        await db.dispose()


async def test_without_the_strict_flag_a_call_inside_a_transaction_is_counted_and_goes_on(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(io_guard.STRICT_ENV, raising=False)
    git = _git(tmp_path)
    db = Database.from_url(database_url)
    try:
        counted = _counted("git")
        async with db.transaction():
            assert (await git.run("--version")).returncode == 0
        assert _counted("git") == counted + 1
    finally:
        await db.dispose()


async def test_a_named_allowance_lets_a_call_through_uncounted(
    database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(io_guard.STRICT_ENV, "1")
    git = _git(tmp_path)
    db = Database.from_url(database_url)
    try:
        counted = _counted("git")
        async with db.transaction():
            with io_guard.allow_io_in_transaction("rollback"):
                assert (await git.run("--version")).returncode == 0
            with pytest.raises(io_guard.IoInTransaction):  # only inside the allowance's block
                await git.run("--version")
        assert _counted("git") == counted + 1
    finally:
        await db.dispose()

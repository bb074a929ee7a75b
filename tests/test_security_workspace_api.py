"""Security: the workspace attacks a tenant can run through the API, with its own project's agent.

A tenant holds an `operate` token of project P (and a `read` token). Project Q is another tenant's, with a
`secret.txt` in its workspace; an "outside" folder stands for the server's own package (its `__pycache__` is a
code-execution target). P's agent (the scripted agent, real bubblewrap) can make any symlink in P's workspace:
a link's target is just a string, so it can name Q's folder although Q is not mounted in its sandbox. It swaps a
folder the server is about to restore for such a link, before `rollbackToRun`, `undoRollback`, `rollbackNode`
and `forkThread(ownWorkspace: true)`, and leaves one at a run's end for the checkpoint to capture. Another thread's
agent runs the racing loop itself (`renameat2(RENAME_EXCHANGE)` of a folder and a link, for a few seconds in its
sandbox) while restores are asked for through the API. The whole `.pyc` chain runs against the real server
package's `__pycache__` up to the next agent start, and a hard link to a file outside the workspace is restored
over.

What must hold: nothing outside P's workspace is read into a checkpoint, created, overwritten or deleted; a
failure is a typed user error, never an internal one. Each denial has a twin where the same steps, with no
link, restore, delete and capture inside P as a user expects (so a broken probe cannot pass).

Real `threadloom serve` (one for the module), real git, real bubblewrap.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import re
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT
from tests.support.hostile import Snapshot, snapshot
from tests.support.pg import PgServer
from tests.support.runs import TERMINAL, finished, send
from tests.support.runs import run as run_of
from tests.support.server import Client, ServerProcess, serving
from tests.support.waiting import until
from threadloom.api.ids import decode
from threadloom.store import tables as t
from threadloom.store.db import Database

Q_SECRET = "project-Q-secret-9b41"
PYC = b"\x61\x0d\x0d\x0a-the-servers-own-bytecode"

CREATE_THREAD = """mutation($p: ID!) { createThread(input: {projectId: $p}) { thread { id } userErrors { code } } }"""
ROLLBACK = """mutation($t: ID!, $n: Int!, $on: RollbackConflictPolicy) {
  rollbackToRun(input: {threadId: $t, runOrdinal: $n, restoreFiles: true, onConflict: $on}) {
  rolledBackRuns { ordinal status } userErrors { code message } } }"""
UNDO = """mutation($t: ID!) { undoRollback(input: {threadId: $t}) { thread { id } userErrors { code message } } }"""
ROLLBACK_NODE = """mutation($n: ID!, $c: ID!) { rollbackNode(input: {nodeId: $n, checkpointId: $c}) {
  dirtiedParentWorkspace userErrors { code message } } }"""
FORK = """mutation($c: ID!) { forkThread(input: {source: {checkpoint: $c}, ownWorkspace: true}) {
  thread { id workspacePath } userErrors { code message } } }"""
CHECKPOINTS = """query($t: ID!) { thread(id: $t) { checkpoints(first: 50) { nodes {
  id ordinal status scope { kind node { id } } files { path status } } } } }"""
RUN_CHECKPOINT = """query($r: ID!) { run(id: $r) { checkpoint { id status files { path status } } } }"""
DIFF = """query($c: ID!, $p: String!) { node(id: $c) { ... on Checkpoint { diff(path: $p) } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""
APPROVE = (
    """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) { userErrors { code } } }"""
)
TYPED = {"ROLLBACK_FAILED", "ROLLBACK_NOT_UNDOABLE", "THREAD_BUSY"}

# ---- one server for the module; projects and tokens per test ---------------------------------------------


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("workspace-api") / "data"


@pytest.fixture(scope="module")
def server(database_url: str, data_dir: Path) -> Iterator[ServerProcess]:
    with serving(database_url, data_dir) as proc:
        yield proc


@dataclass
class Project:
    """Project P as its tenant holds it: `operator` (an `operate` token) and `reader` (a `read` token)."""

    id: str
    workspace: Path
    operator: Client
    reader: Client
    forks: Path  # where the server keeps this project's forks' own folders

    async def thread(self) -> str:
        data = await self.operator.gql(CREATE_THREAD, {"p": self.id})
        assert data["createThread"]["userErrors"] == [], data
        return str(data["createThread"]["thread"]["id"])

    async def run(self, thread: str, text: str) -> dict[str, Any]:
        sent = await send(self.operator, thread, text)
        assert sent["userErrors"] == [], sent
        done = await finished(self.operator, sent["run"]["id"])
        assert done["status"] == "COMPLETED", done
        return done

    async def swap(self, thread: str, folder: str, target: Path) -> dict[str, Any]:
        """The agent of `thread` moves `folder` aside and puts a symlink to `target` in its place."""
        done = await self.run(thread, f"@tool mv {folder} {folder}.moved && ln -s {target} {folder}")
        assert (self.workspace / folder).is_symlink()
        return done

    async def rollback(self, thread: str, ordinal: int, on_conflict: str = "REFUSE") -> dict[str, Any]:
        answer = await self.operator.gql(ROLLBACK, {"t": thread, "n": ordinal, "on": on_conflict})
        return answer["rollbackToRun"]  # type: ignore[no-any-return]

    async def undo(self, thread: str) -> dict[str, Any]:
        return (await self.operator.gql(UNDO, {"t": thread}))["undoRollback"]  # type: ignore[no-any-return]

    async def checkpoints(self, thread: str) -> list[dict[str, Any]]:
        """The thread's checkpoints, read with the `read` token."""
        return (await self.reader.gql(CHECKPOINTS, {"t": thread}))["thread"]["checkpoints"]["nodes"]  # type: ignore[no-any-return]

    async def diff(self, checkpoint: str, path: str) -> str:
        return str((await self.reader.gql(DIFF, {"c": checkpoint, "p": path}))["node"]["diff"] or "")


@dataclass
class World:
    """Project Q's workspace (another tenant's) and a folder standing for the server's package."""

    admin: Client
    server: ServerProcess
    data_dir: Path
    database_url: str
    q: Path
    outside: Path
    clients: list[Client]

    async def project(self, root: Path, name: str) -> Project:
        _make(root)
        data = await self.admin.gql(CREATE_PROJECT, {"name": name, "root": str(root)})
        assert data["createProject"]["userErrors"] == [], data
        project_id = data["createProject"]["project"]["id"]
        operator = Client(self.server.url, create_token(self.database_url, "operate", project_id)[1])
        reader = Client(self.server.url, create_token(self.database_url, "read", project_id)[1])
        self.clients += [operator, reader]
        forks = self.data_dir.resolve() / "workspaces" / _uuid(project_id) / "forks"
        return Project(project_id, root, operator, reader, forks)

    def untouched(self) -> tuple[Snapshot, Snapshot]:
        return snapshot(self.q), snapshot(self.outside)


@pytest.fixture
async def world(server: ServerProcess, data_dir: Path, database_url: str, tmp_path: Path) -> AsyncIterator[World]:
    admin = Client(server.url, server.admin_token)
    q = tmp_path / "ws-q"
    q.mkdir()
    data = await admin.gql(CREATE_PROJECT, {"name": f"Q-{tmp_path.name}", "root": str(q)})
    assert data["createProject"]["userErrors"] == [], data
    (q / "secret.txt").write_text(Q_SECRET)
    (q / "a.txt").write_text("Q's own a\n")  # what a restore of `dir/a.txt` through a link would overwrite
    (q / "b.txt").write_text("Q's own b\n")  # what a rollback's deletion of `dir/b.txt` through a link would hit
    outside = tmp_path / "server-package"
    (outside / "__pycache__").mkdir(parents=True)
    (outside / "__pycache__" / "app.cpython-311.pyc").write_bytes(PYC)
    (outside / "a.txt").write_text("package a\n")
    (outside / "b.txt").write_text("package b\n")
    found = World(admin, server, data_dir, database_url, q, outside, [])
    yield found
    for client in [admin, *found.clients]:
        await client.aclose()


def _make(folder: Path) -> None:
    folder.mkdir()


def real_dir(project: Project) -> Snapshot:
    """P's `dir`, which must be a real folder (never a link) after a restore."""
    folder = project.workspace / "dir"
    assert folder.is_dir() and not folder.is_symlink(), snapshot(project.workspace)
    return snapshot(folder)


# ---- 1. a folder swapped for a link before rollbackToRun -----------------------------------------------------


@pytest.mark.parametrize("swap", [None, "q", "outside"])
async def test_rollback_to_run_never_reaches_through_a_swapped_folder(
    world: World, tmp_path: Path, swap: str | None
) -> None:
    """Run 1 writes `dir/a.txt`, run 2 `dir/b.txt`, run 3 (the agent) swaps `dir` for a link to Q's workspace or
    to the server's package; `rollbackToRun(1)` puts a real `dir` with `a.txt` back, and Q and the package keep
    every byte (their own `a.txt` not overwritten, their `b.txt` not deleted). Twin (no swap): the rollback
    deletes `dir/b.txt` in P."""
    p = await world.project(tmp_path / "ws-p", f"P-rollback-{swap}")
    thread = await p.thread()
    await p.run(thread, "@write dir/a.txt one")
    await p.run(thread, "@write dir/b.txt two")
    before = world.untouched()
    if swap is not None:
        await p.swap(thread, "dir", world.q if swap == "q" else world.outside)
    else:
        await p.run(thread, "@write c.txt three")

    answer = await p.rollback(thread, 1)
    assert answer["userErrors"] == [], answer
    assert real_dir(p) == {"a.txt": b"one"}
    assert world.untouched() == before
    assert set(snapshot(p.workspace)) == {"dir", "dir/a.txt"}  # run 3's link (or file) and the moved folder gone


# ---- 2. a folder swapped for a link before undoRollback ------------------------------------------------------


@pytest.mark.parametrize("swap", [False, True])
async def test_undo_rollback_never_plants_a_file_through_a_swapped_folder(
    world: World, tmp_path: Path, swap: bool
) -> None:
    """Run 2 leaves `dir/evil.cpython-311.pyc`; `rollbackToRun(1)` removes it. Another thread's agent (no run of
    the rolled-back thread, so the undo stays possible) swaps `dir` for a link to the package's `__pycache__`;
    `undoRollback` writes the `.pyc` into a real `dir` in P, and nothing lands in (or leaves) `__pycache__`.
    Twin (no swap): the undo brings `dir/b.txt` and the `.pyc` back in P."""
    p = await world.project(tmp_path / "ws-p", f"P-undo-{swap}")
    victim, attacker = await p.thread(), await p.thread()
    await p.run(victim, "@write dir/a.txt one")
    await p.run(victim, "@write dir/b.txt two\n@write dir/evil.cpython-311.pyc PLANTED")
    answer = await p.rollback(victim, 1)
    assert answer["userErrors"] == [], answer
    assert real_dir(p) == {"a.txt": b"one"}
    before = world.untouched()
    if swap:
        await p.swap(attacker, "dir", world.outside / "__pycache__")

    undone = await p.undo(victim)
    assert undone["userErrors"] == [], undone
    # The undo puts back only what the rollback changed (b.txt and the .pyc); `a.txt` went away with the
    # attacker's swap, which no rollback of the victim's is for.
    back = {"b.txt": b"two", "evil.cpython-311.pyc": b"PLANTED"}
    assert real_dir(p) == (back if swap else {"a.txt": b"one", **back})
    assert world.untouched() == before
    assert sorted(os.listdir(world.outside / "__pycache__")) == ["app.cpython-311.pyc"]


# ---- 3. a folder swapped for a link before rollbackNode ------------------------------------------------------


async def _subagent_run(p: Project, thread: str) -> None:
    """Run 1: the parent writes `dir/a.txt`, its subagent (after an approval, so its start checkpoint is
    taken first) `dir/c.txt`, then the parent `dir/b.txt`."""
    sent = await send(
        p.operator, thread, "@write dir/a.txt one\n@subagent @approval echo child > dir/c.txt\n@write dir/b.txt two"
    )

    async def pending() -> str | None:
        found = (await p.operator.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"]
        return str(found[0]["id"]) if found else None

    request = await until(pending)
    assert (await p.operator.gql(APPROVE, {"r": request}))["respondToApproval"]["userErrors"] == []
    assert (await finished(p.operator, sent["run"]["id"]))["status"] == "COMPLETED"


@pytest.mark.parametrize("swap", [None, "q", "outside"])
async def test_rollback_node_never_reaches_through_a_swapped_folder(
    world: World, tmp_path: Path, swap: str | None
) -> None:
    """`rollbackNode` to the subagent's start checkpoint (only `dir/a.txt`) after another thread's agent swapped
    `dir` for a link to Q or the package: P gets a real `dir` with `a.txt`; Q and the package keep every byte
    (no `b.txt`/`c.txt` deleted or `a.txt` overwritten there). Twin: without the swap it deletes `dir/b.txt`
    and `dir/c.txt` in P."""
    p = await world.project(tmp_path / "ws-p", f"P-node-{swap}")
    victim, attacker = await p.thread(), await p.thread()
    await _subagent_run(p, victim)
    (world.q / "c.txt").write_text("Q's own c\n")
    (world.outside / "c.txt").write_text("package c\n")
    assert real_dir(p) == {"a.txt": b"one", "b.txt": b"two", "c.txt": b"child\n"}
    subagent = [c for c in await p.checkpoints(victim) if c["scope"]["kind"] == "SUBAGENT"]
    start = min(subagent, key=lambda c: c["ordinal"])
    before = world.untouched()
    if swap is not None:
        await p.swap(attacker, "dir", world.q if swap == "q" else world.outside)

    variables = {"n": start["scope"]["node"]["id"], "c": start["id"]}
    answer = (await p.operator.gql(ROLLBACK_NODE, variables))["rollbackNode"]
    assert answer["userErrors"] == [], answer
    assert answer["dirtiedParentWorkspace"] is True
    assert real_dir(p) == {"a.txt": b"one"}
    assert world.untouched() == before


# ---- 4. a folder swapped for a link before forkThread(ownWorkspace: true) -------------------------------------


@pytest.mark.parametrize("swap", [False, True])
async def test_a_fork_from_a_checkpoint_holds_only_its_files(world: World, tmp_path: Path, swap: bool) -> None:
    """Run 1 writes `dir/a.txt`; run 2 (the agent) swaps `dir` for a link to Q. A fork with its own folder from
    run 1's checkpoint holds exactly `dir/a.txt`; a fork from run 2's checkpoint holds the link as a link (a
    string, not Q's files). Nothing the read token lists or diffs shows Q's secret, and nothing is written into
    Q. Twin (run 2 adds `dir/secret.txt` to a real `dir`): that fork holds the file, and its diff shows it."""
    p = await world.project(tmp_path / "ws-p", f"P-fork-{swap}")
    thread = await p.thread()
    first = await p.run(thread, "@write dir/a.txt one")
    before = world.untouched()
    if swap:
        second = await p.swap(thread, "dir", world.q)
    else:
        second = await p.run(thread, f"@write dir/secret.txt {Q_SECRET}")
    at_first = await _fork(p, await _checkpoint_of(p, first["id"]))
    at_second = await _fork(p, await _checkpoint_of(p, second["id"]))
    assert snapshot(at_first.folder) == {"dir": "<dir>", "dir/a.txt": b"one"}
    if swap:
        assert snapshot(at_second.folder) == {"dir": f"-> {world.q}", "dir.moved": "<dir>", "dir.moved/a.txt": b"one"}
    else:
        assert snapshot(at_second.folder) == {"dir": "<dir>", "dir/a.txt": b"one", "dir/secret.txt": Q_SECRET.encode()}

    # Each fork's agent works once in its folder; then everything P's read token can list and diff.
    for fork in (at_first, at_second):
        await p.run(fork.id, "@write mine.txt the-forks-own")
    seen, listed = [], set()
    for thread_id in (thread, at_first.id, at_second.id):
        for checkpoint in await p.checkpoints(thread_id):
            listed |= {f["path"] for f in checkpoint["files"]}
            paths = {f["path"] for f in checkpoint["files"]} | {"dir/secret.txt", "dir", "secret.txt"}
            seen += [await p.diff(checkpoint["id"], path) for path in sorted(paths)]
    assert ("dir/secret.txt" in listed) is not swap and "secret.txt" not in listed and "mine.txt" in listed
    assert any("the-forks-own" in d for d in seen)
    assert any(Q_SECRET in d for d in seen) is not swap  # the twin's own file is shown; Q's never is
    assert world.untouched() == before


@dataclass
class Fork:
    id: str
    folder: Path


async def _checkpoint_of(p: Project, run_id: str) -> str:
    checkpoint = (await p.reader.gql(RUN_CHECKPOINT, {"r": run_id}))["run"]["checkpoint"]
    assert checkpoint["status"] == "READY", checkpoint
    return str(checkpoint["id"])


async def _fork(p: Project, checkpoint: str) -> Fork:
    """A fork with its own folder from `checkpoint`; the folder is made before the mutation answers."""
    data = (await p.operator.gql(FORK, {"c": checkpoint}))["forkThread"]
    assert data["userErrors"] == [], data
    thread = data["thread"]
    folder = p.forks / _uuid(thread["id"])
    assert thread["workspacePath"] == f"forks/{folder.name}" and folder.is_dir() and not folder.is_symlink()
    return Fork(thread["id"], folder)


def _uuid(global_id: str) -> str:
    decoded = decode(global_id)
    assert decoded is not None, global_id
    return str(decoded[1])


# ---- 5. a link to Q's workspace at a run's end ------------------------------------------------------------


@pytest.mark.parametrize("kind", ["link", "folder"])
async def test_a_link_at_a_runs_end_is_read_back_as_a_link(world: World, tmp_path: Path, kind: str) -> None:
    """The agent leaves `peek` (a link to Q's workspace) and `peek.txt` (a link to Q's `secret.txt`): the run's
    checkpoint, read with P's `read` token, lists two added links whose diffs show Q's path, never the secret.
    Twin: a real folder `peek` and a file `peek.txt` holding the same text are captured with their content."""
    p = await world.project(tmp_path / "ws-p", f"P-capture-{kind}")
    thread = await p.thread()
    if kind == "link":
        text = f"@tool ln -s {world.q} peek && ln -s {world.q}/secret.txt peek.txt"
    else:
        text = f"@write peek/secret.txt {Q_SECRET}\n@write peek.txt {Q_SECRET}"
    done = await p.run(thread, text)
    checkpoint = (await p.reader.gql(RUN_CHECKPOINT, {"r": done["id"]}))["run"]["checkpoint"]
    assert checkpoint["status"] == "READY", checkpoint
    files = {f["path"]: f["status"] for f in checkpoint["files"]}
    diffs = {path: await p.diff(checkpoint["id"], path) for path in sorted({*files, "peek/secret.txt", "peek"})}
    if kind == "link":
        assert files == {"peek": "ADDED", "peek.txt": "ADDED"}
        assert "new file mode 120000" in diffs["peek"] and f"+{world.q}" in diffs["peek"]
        assert f"+{world.q}/secret.txt" in diffs["peek.txt"] and diffs["peek/secret.txt"] == ""
        assert not any(Q_SECRET in d for d in diffs.values())
    else:
        assert files == {"peek/secret.txt": "ADDED", "peek.txt": "ADDED"}
        assert f"+{Q_SECRET}" in diffs["peek/secret.txt"] and f"+{Q_SECRET}" in diffs["peek.txt"]
    assert snapshot(world.q)["secret.txt"] == Q_SECRET.encode()


# ---- 6. the RENAME_EXCHANGE race, run by another thread's agent in its sandbox for a bounded time -------------

RACE_SECONDS = 4.0
STARTED = "race-started"
# The agent's loop: `renameat2(RENAME_EXCHANGE)` of `dir` (a real folder) and `link` (a link to the package),
# as fast as it can for RACE_SECONDS; when a restore replaced the link (both names real folders) or removed a
# name, it plants a link or a folder again, so a link stays in play. /usr's python, inside bubblewrap.
RACE_LOOP = """
import ctypes, errno, os, sys, time
libc = ctypes.CDLL(None, use_errno=True)
outside, seconds = sys.argv[1], float(sys.argv[2])
swaps = spare = 0
open(sys.argv[3], "w").close()
end = time.monotonic() + seconds
while time.monotonic() < end:
    if libc.renameat2(-100, b"dir", -100, b"link", 2) == 0:
        swaps += 1
        continue
    code = ctypes.get_errno()
    if code != errno.ENOENT:
        print("error", os.strerror(code))
        break
    try:
        if not os.path.lexists("link"):
            os.symlink(outside, "link")
        elif not os.path.islink("link") and not os.path.islink("dir"):
            spare += 1
            os.rename("link", "spare-%d" % spare)
            os.symlink(outside, "link")
    except OSError:
        pass
    try:
        if not os.path.lexists("dir"):
            os.mkdir("dir")
    except OSError:
        pass
print("swaps", swaps)
"""


def race_command(outside: Path, seconds: float) -> str:
    """The `@tool` line running RACE_LOOP (shipped base64-encoded: one directive is one line)."""
    script = base64.b64encode(RACE_LOOP.encode()).decode()
    return f"@tool echo {script} | base64 -d > /tmp/race.py && python3 /tmp/race.py {outside} {seconds} {STARTED}"


async def test_a_rename_exchange_race_during_rollbacks_never_reaches_outside(world: World, tmp_path: Path) -> None:
    """Another thread's agent swaps `dir` and a link to the server's package in a loop inside its sandbox for a
    few seconds. Meanwhile the victim thread's `undoRollback` and, again and again, `rollbackNode` (neither is
    held back by another thread's active run; `rollbackToRun` is, with WORKSPACE_BUSY) restore files into `dir`.
    The package keeps every byte after every answer; each answer is a success or a typed user error, and a
    restore that the swaps kept from putting a path in place names it ("not restored: …") instead of
    answering success. Once the loop has ended, the same rollbackNode leaves exactly the checkpoint's files.
    Twin, first (no loop, another project): the rollbackNode deletes `dir/b.txt` and `dir/c.txt` in P."""
    twin = await world.project(tmp_path / "ws-twin", "P-race-twin")
    victim = await twin.thread()
    await _subagent_run(twin, victim)
    start = await _subagent_start(twin, victim)
    answer = (await twin.operator.gql(ROLLBACK_NODE, start))["rollbackNode"]
    assert answer["userErrors"] == [] and real_dir(twin) == {"a.txt": b"one"}, answer

    p = await world.project(tmp_path / "ws-p", "P-race")
    victim, attacker = await p.thread(), await p.thread()
    await _subagent_run(p, victim)
    start = await _subagent_start(p, victim)
    await p.run(victim, "@write dir/d.txt four")
    assert (await p.rollback(victim, 1))["userErrors"] == []  # removes d.txt; undone below, under the race
    (p.workspace / "link").symlink_to(world.outside)
    before = world.untouched()

    racing = await send(p.operator, attacker, race_command(world.outside, RACE_SECONDS))
    assert racing["userErrors"] == [], racing
    await until(lambda: _exists(p.workspace / STARTED), within=30)
    answers: list[dict[str, Any]] = [await p.undo(victim)]
    busy = await p.rollback(victim, 1, "OVERWRITE")
    # Not raced: refused before anything is touched (WORKSPACE_BUSY; or the plan's read of the swapping
    # workspace gave up first, "nothing changed").
    assert [e["code"] for e in busy["userErrors"]] in (["WORKSPACE_BUSY"], ["ROLLBACK_FAILED"]), busy
    assert world.untouched() == before
    while True:  # at least once, then for as long as the loop runs
        answers.append((await p.operator.gql(ROLLBACK_NODE, start))["rollbackNode"])
        assert world.untouched() == before
        if (await run_of(p.operator, racing["run"]["id"]))["status"] in TERMINAL:
            break
    loop = await finished(p.operator, racing["run"]["id"])
    assert loop["status"] == "COMPLETED", loop
    output = " ".join(outputs(loop))
    print(f"{output}; answers {[a['userErrors'] for a in answers]}")  # shown if it fails
    assert "swaps" in output and "error" not in output and "swaps 0" not in output
    for answer in answers:
        for error in answer["userErrors"]:
            assert error["code"] in TYPED, answer
            if "changed during the restore" in error["message"]:  # put back, then moved before the answer
                assert re.search(r"not restored: (dir|link|spare-\d+)\b", error["message"]), answer

    # The loop has ended: the same rollback leaves exactly the checkpoint's files (links and spares gone; an
    # empty folder the loop made may stay, as checkpoints hold files, not empty folders).
    final = (await p.operator.gql(ROLLBACK_NODE, start))["rollbackNode"]
    assert final["userErrors"] == [], final
    left = {path: what for path, what in snapshot(p.workspace).items() if what != "<dir>"}
    assert left == {"dir/a.txt": b"one"} and real_dir(p) == {"a.txt": b"one"}  # an empty folder is no file
    assert world.untouched() == before


async def _subagent_start(p: Project, thread: str) -> dict[str, str]:
    """rollbackNode's variables for the subagent's start checkpoint (the workspace holds only `dir/a.txt`)."""
    subagent = [c for c in await p.checkpoints(thread) if c["scope"]["kind"] == "SUBAGENT"]
    start = min(subagent, key=lambda c: c["ordinal"])
    return {"n": start["scope"]["node"]["id"], "c": start["id"]}


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


# ---- 7. the whole `.pyc` chain: undo through a link into the running server's `__pycache__`, then an agent start


def _server_pycache() -> tuple[Path, str]:
    """Where the python the server runs (this one: tests/support/server.py) looks for the bytecode of the
    threadloom package it imports, and its cache tag: asked of that python itself."""
    code = (
        "import importlib.util, sys, threadloom; print(importlib.util.cache_from_source(threadloom.__file__));"
        " print(sys.implementation.cache_tag)"
    )
    found = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return Path(found[0]).parent, found[1]


@contextlib.contextmanager
def existing(folder: Path) -> Iterator[Path]:
    """`folder`, made for the test if it is missing (PYTHONDONTWRITEBYTECODE: python still loads a `.pyc` it
    finds there, so it is the target all the same) and removed again if the test made it and it is empty."""
    made = not folder.exists()
    folder.mkdir(exist_ok=True)
    try:
        yield folder
    finally:
        if made:
            with contextlib.suppress(OSError):
                folder.rmdir()


async def _token_count(database_url: str) -> int:
    db = Database.from_url(database_url)
    try:
        async with db.engine.connect() as conn:
            return int((await conn.execute(sa.select(sa.func.count()).select_from(t.api_tokens))).scalar_one())
    finally:
        await db.dispose()


@pytest.mark.parametrize("swap", [False, True])
async def test_an_undo_through_a_link_into_the_servers_pycache_plants_nothing_for_the_next_agent_start(
    world: World, tmp_path: Path, swap: bool
) -> None:
    """The issue's code-execution chain, against the real package: run 2 leaves the package's own `__init__`
    bytecode name and a new one in `dir`; `rollbackToRun(1)` removes them; another thread's agent swaps `dir`
    for a link to the running server's `threadloom/__pycache__`; `undoRollback`; then the agent `@crash`es and
    the next run starts it again (the start that would load a planted `.pyc`). That `__pycache__` is byte for
    byte as it was, no token was minted, and the next run completes. Twin (no swap): the undo puts the two
    files back in P's `dir`, and the same crash and new run work."""
    cache, tag = _server_pycache()
    with existing(cache) as pycache:
        await _pyc_chain(world, tmp_path, swap, pycache, tag)


async def _pyc_chain(world: World, tmp_path: Path, swap: bool, pycache: Path, tag: str) -> None:
    planted = {f"__init__.{tag}.pyc": b"PLANTED-INIT", f"zz_planted.{tag}.pyc": b"PLANTED-NEW"}
    p = await world.project(tmp_path / "ws-p", f"P-pyc-{swap}")
    victim, attacker = await p.thread(), await p.thread()
    await p.run(victim, "@write dir/a.txt one")
    await p.run(victim, "\n".join(f"@write dir/{name} {text.decode()}" for name, text in planted.items()))
    assert (await p.rollback(victim, 1))["userErrors"] == []
    assert real_dir(p) == {"a.txt": b"one"}
    package, tokens = snapshot(pycache), await _token_count(world.database_url)
    if swap:
        await p.swap(attacker, "dir", pycache)

    undone = await p.undo(victim)
    assert undone["userErrors"] == [], undone
    assert real_dir(p) == (planted if swap else {"a.txt": b"one", **planted})
    crash = await send(p.operator, attacker, "@crash")
    assert (await finished(p.operator, crash["run"]["id"]))["status"] == "FAILED"
    await p.run(victim, "@write after.txt the-next-start-works")
    assert (p.workspace / "after.txt").read_bytes() == b"the-next-start-works"
    assert snapshot(pycache) == package
    assert await _token_count(world.database_url) == tokens


# ---- 8. a hard link in the workspace to a file outside it --------------------------------------------------


@pytest.mark.parametrize("kind", ["hard-link", "file"])
async def test_a_restore_replaces_a_hard_link_and_never_writes_the_file_it_shares(
    world: World, tmp_path: Path, kind: str
) -> None:
    """Run 1 writes `dir/a.txt`, run 2 changes it. The agent cannot make a hard link to a file outside its
    workspace from inside its sandbox (that file is not even there); whoever can (a local user, an agent run
    without a sandbox) puts `dir/a.txt` as a hard link to the package's `a.txt`, readable and writable by the
    agent user. `rollbackToRun(1)` puts "one" in `dir/a.txt` as a new file: the package's `a.txt` keeps its
    bytes, its owner and its ACL, and has one link again. An agent start in between (after `@crash`) grants the
    workspace to the agent user, and that grant skips the shared file. Twin (an ordinary file there): the
    rollback rewrites it."""
    p = await world.project(tmp_path / "ws-p", f"P-hardlink-{kind}")
    thread = await p.thread()
    await p.run(thread, "@write dir/a.txt one")
    await p.run(thread, "@write dir/a.txt two")
    shared = world.outside / "a.txt"
    tried = outputs(await p.run(thread, f"@tool ln {shared} dir/x.txt 2>&1; ls dir"))
    assert tried == [f"ln: failed to access '{shared}': No such file or directory\na.txt\n"], tried
    os.chown(shared, 65534, 65534)  # protected_hardlinks: the agent user may link only what it owns or may write
    (p.workspace / "dir" / "a.txt").unlink()
    if kind == "hard-link":
        os.link(shared, p.workspace / "dir" / "a.txt")
    else:
        (p.workspace / "dir" / "a.txt").write_text("package a\n")
    before, owner, acl = world.untouched(), os.stat(shared).st_uid, _acl_of(shared)
    crash = await send(p.operator, thread, "@crash")
    assert (await finished(p.operator, crash["run"]["id"]))["status"] == "FAILED"
    await p.run(thread, "@tool true")  # the next agent start: grants the workspace

    answer = await p.rollback(thread, 1, "OVERWRITE")
    assert answer["userErrors"] == [], answer
    assert real_dir(p) == {"a.txt": b"one"}
    assert world.untouched() == before and shared.read_text() == "package a\n"
    assert (os.stat(shared).st_uid, os.stat(shared).st_nlink, _acl_of(shared)) == (owner, 1, acl)


def outputs(run: dict[str, Any]) -> list[str]:
    """The output of each `@tool` command of a finished run, in order."""
    details = [c["detail"] or {} for c in run["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]
    return [str(d["output"]) for d in details if "output" in d]


def _acl_of(path: Path) -> bytes | None:
    try:
        return os.getxattr(path, "system.posix_acl_access")
    except OSError:
        return None

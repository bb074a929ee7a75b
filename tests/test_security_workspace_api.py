"""Security: the workspace attacks a tenant can run through the API, with its own project's agent.

A tenant holds an `operate` token of project P (and a `read` token). Project Q is another tenant's, with a
`secret.txt` in its workspace; an "outside" folder stands for the server's own package (its `__pycache__` is a
code-execution target). P's agent (the scripted agent, real bubblewrap) can make any symlink in P's workspace:
a link's target is just a string, so it can name Q's folder although Q is not mounted in its sandbox. It swaps a
folder the server is about to restore for such a link, before `rollbackToRun`, `undoRollback`, `rollbackNode`
and `forkThread(ownWorkspace: true)`, and leaves one at a run's end for the checkpoint to capture. Last, the test
process plays the agent's background loop (`renameat2(RENAME_EXCHANGE)` of a folder and a link) while rollbacks
and undos are asked for through the API.

What must hold: nothing outside P's workspace is read into a checkpoint, created, overwritten or deleted; a
failure is a typed user error, never an internal one. Each denial has a twin where the same steps, with no
link, restore, delete and capture inside P as a user expects (so a broken probe cannot pass).

Real `threadloom serve` (one for the module), real git, real bubblewrap.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT
from tests.support.hostile import Snapshot, edit_the_real_folder, exchange, snapshot
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, serving
from tests.support.waiting import until
from threadloom.api.ids import decode

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


# ---- 6. the RENAME_EXCHANGE race, played by the test as the agent's background loop ---------------------

ROUNDS = 8
DIRS = ("dir", "link")
EDITS = {"a.txt": b"changed", "b.txt": b"two"}


@contextlib.contextmanager
def racing(workspace: Path, outside: Path) -> Iterator[dict[str, Any]]:
    """A thread swapping `dir` (a real folder) and `link` (a link to `outside`) as fast as it can, for a bounded
    count. When a restore replaced the link (both names real folders) or removed a name, it plants a link or a
    folder again, so a link stays in play: the agent's loop, run by the test process itself."""
    folder, link = workspace / "dir", workspace / "link"
    stop = threading.Event()
    counts: dict[str, Any] = {"swaps": 0, "errors": []}

    def loop() -> None:
        spare = 0
        for _ in range(1_000_000):
            if stop.is_set():
                return
            code = exchange(folder, link)
            if code == 0:
                counts["swaps"] += 1
                continue
            if code != errno.ENOENT:
                counts["errors"].append(os.strerror(code))
                return
            with contextlib.suppress(OSError):  # a restore may be changing the same names meanwhile
                if not os.path.lexists(link):
                    os.symlink(outside, link)
                elif not os.path.islink(link) and not os.path.islink(folder):
                    spare += 1
                    os.rename(link, workspace / f"spare-{spare}")
                    os.symlink(outside, link)
            with contextlib.suppress(OSError):
                if not os.path.lexists(folder):
                    folder.mkdir()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield counts
    finally:
        stop.set()
        thread.join()


async def test_a_rename_exchange_race_during_rollbacks_never_reaches_outside(world: World, tmp_path: Path) -> None:
    """While the loop swaps `dir` and a link to the server's package, rollbackToRun(1) and undoRollback are asked
    for, each round after the agent changed `dir/a.txt` and wrote `dir/b.txt` again (so every rollback has a file
    to delete and every undo one to write). The package keeps every byte; each call succeeds or answers a typed
    user error.
    Twin, first (no loop, another project): the same rollback deletes `dir/b.txt` in P (the path run 2 wrote)
    and leaves `a.txt` as the hand edit left it (no undone run changed it)."""
    twin = await world.project(tmp_path / "ws-twin", "P-race-twin")
    thread = await twin.thread()
    await twin.run(thread, "@write dir/a.txt one")
    await twin.run(thread, "@write dir/b.txt two")
    edit_the_real_folder(twin.workspace, DIRS, EDITS)
    assert (await twin.rollback(thread, 1))["userErrors"] == []
    assert real_dir(twin) == {"a.txt": b"changed"}

    p = await world.project(tmp_path / "ws-p", "P-race")
    thread = await p.thread()
    await p.run(thread, "@write dir/a.txt one")
    await p.run(thread, "@write dir/b.txt two")
    (p.workspace / "link").symlink_to(world.outside)
    before = world.untouched()
    answers: list[dict[str, Any]] = []
    with racing(p.workspace, world.outside) as counts:
        for _ in range(ROUNDS):
            edit_the_real_folder(p.workspace, DIRS, EDITS)
            # OVERWRITE: the swaps make `dir/b.txt` look changed by no run; put it back anyway, through the race
            answers.append(await p.rollback(thread, 1, "OVERWRITE"))
            answers.append(await p.undo(thread))
            assert world.untouched() == before
    print(f"swaps {counts['swaps']}; answers {[a['userErrors'] for a in answers]}")  # shown if it fails
    assert counts["errors"] == [] and counts["swaps"] > 0
    codes = {e["code"] for a in answers for e in a["userErrors"]}
    assert codes <= TYPED, answers
    assert world.untouched() == before

"""Security: a fork's own workspace (`forkThread(ownWorkspace: true)`) is out of every agent's reach.

Older releases put it at `.threadloom/forks/<fork id>` inside the project's workspace, where another thread's
agent of the same project could swap it (or `.threadloom/forks` itself) for a symlink: to another project's
workspace, to the server's data dir, to `/proc/self/cwd`. The fork's next checkpoint then captured the target,
and `Checkpoint.files` / `diff(path:)` showed it to the project's read token. Now the folder is under the
data dir (`<data dir>/workspaces/<project id>/forks/<fork id>`) and its location is derived from ids only.

Real `threadloom serve` (one for the module), real bubblewrap, the scripted agent; every planted symlink is
made by an agent (`@tool ln -s ...`), and what is read back is read with project P's `read` token.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.cli import create_token
from tests.support.graphql import CREATE_PROJECT
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, serving
from threadloom.api.ids import decode
from threadloom.store import tables as t
from threadloom.store.db import Database

Q_SECRET = "project-Q-secret-5d8e"
DATA_MARKER = "data-dir-marker-71c0"

CREATE_THREAD = """mutation($p: ID!) { createThread(input: {projectId: $p}) { thread { id } userErrors { code } } }"""
FORK = """mutation($run: ID!) { forkThread(input: {source: {run: $run}, ownWorkspace: true}) {
  thread { id workspacePath } userErrors { code message } } }"""
CHECKPOINTS = """query($t: ID!) { thread(id: $t) { checkpoints(first: 50) { nodes { id status files { path } } } } }"""
DIFF = """query($c: ID!, $p: String!) { node(id: $c) { ... on Checkpoint { diff(path: $p) } } }"""
RUN_CHECKPOINT = """query($r: ID!) { run(id: $r) { checkpoint { id status files { path } } } }"""


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    """One database for the module's server; each test works in projects of its own."""
    return await pg.fresh()


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fork-folders") / "data"


@pytest.fixture(scope="module")
def server(database_url: str, data_dir: Path) -> Iterator[ServerProcess]:
    """One server for the module; a marker file in its data dir that no agent may ever show."""
    with serving(database_url, data_dir) as proc:
        data_dir.mkdir(exist_ok=True)  # made lazily by the server
        (data_dir / "marker.txt").write_text(DATA_MARKER)
        yield proc


@dataclass
class Project:
    """A project, its workspace and its clients: `admin` operates, `reader` holds only a `read` token."""

    id: str
    uuid: str
    workspace: Path
    admin: Client
    reader: Client

    async def thread(self) -> str:
        data = await self.admin.gql(CREATE_THREAD, {"p": self.id})
        assert data["createThread"]["userErrors"] == [], data
        return str(data["createThread"]["thread"]["id"])

    async def run(self, thread: str, text: str) -> dict[str, Any]:
        """Send `text` on `thread` and wait for its run to complete."""
        sent = await send(self.admin, thread, text)
        assert sent["userErrors"] == [], sent
        done = await finished(self.admin, sent["run"]["id"])
        assert done["status"] == "COMPLETED", done
        return done

    async def fork(self, run_id: str) -> str:
        """A fork with its own workspace from `run_id`."""
        data = await self.admin.gql(FORK, {"run": run_id})
        assert data["forkThread"]["userErrors"] == [], data
        fork = data["forkThread"]["thread"]
        assert fork["workspacePath"] == f"forks/{uuid_of(fork['id'])}"
        return str(fork["id"])


@dataclass
class World:
    server: ServerProcess
    data_dir: Path
    admin: Client
    database_url: str

    def folder_of(self, project: Project, fork_id: str) -> Path:
        """Where the server keeps a fork's own workspace."""
        return self.data_dir.resolve() / "workspaces" / project.uuid / "forks" / uuid_of(fork_id)

    async def project(self, root: Path, name: str) -> Project:
        _make(root)
        data = await self.admin.gql(CREATE_PROJECT, {"name": name, "root": str(root)})
        assert data["createProject"]["userErrors"] == [], data
        project_id = data["createProject"]["project"]["id"]
        reader = Client(self.server.url, create_token(self.database_url, "read", project_id)[1])
        return Project(project_id, uuid_of(project_id), root, self.admin, reader)


def outputs(run: dict[str, Any]) -> list[str]:
    """The output of each `@tool` command of a finished run, in order (an `@write` has none)."""
    details = [c["detail"] or {} for c in run["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]
    return [str(d["output"]) for d in details if "output" in d]


def _make(folder: Path) -> None:
    folder.mkdir()


def uuid_of(global_id: str) -> str:
    decoded = decode(global_id)
    assert decoded is not None, global_id
    return str(decoded[1])


@pytest.fixture
async def world(server: ServerProcess, data_dir: Path, database_url: str) -> AsyncIterator[World]:
    admin = Client(server.url, server.admin_token)
    yield World(server, data_dir, admin, database_url)
    await admin.aclose()


async def _seen_by_reader(project: Project, fork_id: str) -> tuple[set[str], list[str]]:
    """Every path the fork's checkpoints list, and every diff of those paths, read with P's `read` token."""
    data = await project.reader.gql(CHECKPOINTS, {"t": fork_id})
    nodes = data["thread"]["checkpoints"]["nodes"]
    paths = {f["path"] for node in nodes for f in node["files"]}
    diffs = []
    for node in nodes:
        for path in sorted(paths | {"q.txt", "marker.txt", "secret.txt"}):
            diff = (await project.reader.gql(DIFF, {"c": node["id"], "p": path}))["node"]["diff"]
            diffs.append(diff or "")
    return paths, diffs


TWIN_LINK = "twin-link"  # the same link, planted where checkpoints look (`.threadloom/forks/` is excluded)


async def _plant(project: Project, thread: str, link: str, target: str) -> dict[str, Any]:
    """Thread `thread`'s agent (project P) makes `link` (in P's workspace) a symlink to `target`, and
    TWIN_LINK the same symlink at the workspace's top; its run."""
    folder = str(Path(link).parent)
    done = await project.run(
        thread,
        f"@tool mkdir -p {folder} && rm -rf {link} {TWIN_LINK} && ln -s {target} {link} && ln -s {target} {TWIN_LINK}",
    )
    assert (project.workspace / link).is_symlink() and (project.workspace / TWIN_LINK).is_symlink()
    return done


async def _captured_as_a_link(project: Project, run: dict[str, Any], link: str, target: str) -> None:
    """The positive twin of every planted link: the planting thread's own run-end checkpoint (a project
    thread's, not a fork's) holds `link` as a link whose diff, read with P's `read` token, shows `target` as
    text: the probe really planted a link to that target, and a capture meets it."""
    checkpoint = (await project.reader.gql(RUN_CHECKPOINT, {"r": run["id"]}))["run"]["checkpoint"]
    assert checkpoint["status"] == "READY" and link in {f["path"] for f in checkpoint["files"]}, checkpoint
    diff = (await project.reader.gql(DIFF, {"c": checkpoint["id"], "p": link}))["node"]["diff"]
    assert "new file mode 120000" in diff and f"+{target}" in diff, diff


def working_folder(server: ServerProcess) -> Path:
    """The server process's current working folder: what `/proc/self/cwd` names when the server follows it."""
    return Path(os.readlink(f"/proc/{server.proc.pid}/cwd"))


def shallow(folder: Path) -> dict[str, tuple[int, int, int]]:
    """Each entry of `folder` (not below: the fork's files would land at its top) by name: its type and
    permission bits, size and modification time, never following a link. pytest's own cache is left out."""
    found = {}
    for entry in os.scandir(folder):
        if entry.name != ".pytest_cache":
            info = entry.stat(follow_symlinks=False)
            found[entry.name] = (info.st_mode, info.st_size, info.st_mtime_ns)
    return found


TARGETS = ["other-project", "data-dir", "proc-self-cwd"]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("where", ["forks-folder", "fork-folder"])
async def test_symlinks_planted_where_forks_used_to_live_reach_nothing(
    world: World, tmp_path: Path, target: str, where: str
) -> None:
    """Another thread's agent links `.threadloom/forks` (before the fork) or the fork's old folder (after) to Q's
    workspace, the data dir or `/proc/self/cwd`: the fork works in its own folder, its checkpoints read with
    P's `read` token show only its files, and nothing lands in Q, the data dir or the server's working folder
    (its entries as they were). Twins: the same link planted at the workspace's top is captured by the
    planting thread's own checkpoint as a link to that target, and the fork's own file's diff is shown."""
    p = await world.project(tmp_path / "ws-p", f"P-{target}-{where}")
    q = await world.project(tmp_path / "ws-q", f"Q-{target}-{where}")
    (q.workspace / "q.txt").write_text(Q_SECRET)
    to = {"other-project": str(q.workspace), "data-dir": str(world.data_dir), "proc-self-cwd": "/proc/self/cwd"}
    attacker, victim = await p.thread(), await p.thread()
    point = await p.run(victim, "@write point.txt at-the-fork-point")
    cwd = working_folder(world.server)
    cwd_before = shallow(cwd)

    if where == "forks-folder":  # `.threadloom/forks` itself, before the fork is made
        planted = await _plant(p, attacker, ".threadloom/forks", to[target])
    fork = await p.fork(point["id"])
    if where == "fork-folder":  # the fork's old folder, once its id is known
        planted = await _plant(p, attacker, f".threadloom/forks/{uuid_of(fork)}", to[target])
    await _captured_as_a_link(p, planted, TWIN_LINK, to[target])

    own = world.folder_of(p, fork)
    assert own.is_dir() and not own.is_symlink() and (own / "point.txt").read_text() == "at-the-fork-point"
    ran = await p.run(fork, "@write mine.txt written-by-the-fork\n@tool pwd")
    assert outputs(ran) == [f"{own}\n"]  # the fork's agent works in its own folder

    paths, diffs = await _seen_by_reader(p, fork)
    assert "mine.txt" in paths and paths <= {"point.txt", "mine.txt"}  # only the fork's own files
    assert any("written-by-the-fork" in d for d in diffs)  # the positive twin: its own file's diff is shown
    assert not any(Q_SECRET in d or DATA_MARKER in d for d in diffs)
    assert (own / "mine.txt").read_text() == "written-by-the-fork"
    assert sorted(x.name for x in q.workspace.iterdir()) == ["q.txt"]  # nothing written into Q
    assert not (world.data_dir / "mine.txt").exists()
    assert shallow(cwd) == cwd_before  # nothing created, changed or removed in the server's working folder
    assert not (cwd / "mine.txt").exists() and not (cwd / "point.txt").exists()


async def test_the_forks_agent_writes_its_folder_and_sees_nothing_else(world: World, tmp_path: Path) -> None:
    p = await world.project(tmp_path / "ws-p", "P-sandbox")
    (p.workspace / "project-only.txt").write_text("in the project's workspace")
    source = await p.thread()
    point = await p.run(source, "@write point.txt at-the-fork-point")
    first = await p.fork(point["id"])
    second = await p.fork(point["id"])
    own, sibling = world.folder_of(p, first), world.folder_of(p, second)
    data = world.data_dir.resolve()

    await p.run(second, "@write sibling.txt the-other-fork")
    probe = (
        "@write mine.txt in-my-own-folder\n"
        "@tool cat mine.txt point.txt\n"
        f"@tool ls -A {data}\n"
        f"@tool ls {data}/checkpoints {sibling} {p.workspace} 2>&1; true\n"
        f"@tool cat {data}/marker.txt {sibling}/sibling.txt {p.workspace}/project-only.txt 2>&1; true"
    )
    own_files, data_listing, listing, reads = outputs(await p.run(first, probe))
    assert own_files == "in-my-own-folderat-the-fork-point"  # its own folder: written and read back
    assert (own / "mine.txt").read_text() == "in-my-own-folder"
    # The data dir holds the fork's folder, so that path exists inside the sandbox, but nothing else of it.
    assert data_listing == "workspaces\n"
    assert listing.count("No such file or directory") == 3, listing  # checkpoints/, the sibling fork, the project
    assert DATA_MARKER not in reads and "the-other-fork" not in reads and "in the project's" not in reads
    assert reads.count("No such file or directory") == 3, reads
    # The positive twins: the same reads from the sibling fork and from a project thread succeed there.
    assert outputs(await p.run(second, "@tool cat sibling.txt")) == ["the-other-fork"]
    assert outputs(await p.run(source, "@tool cat project-only.txt")) == ["in the project's workspace"]


async def test_a_fork_from_an_older_release_is_made_again_from_its_checkpoints(world: World, tmp_path: Path) -> None:
    """A fork whose stored folder is the old `.threadloom/forks/<id>`: that path is never followed. Its next run
    works in a folder made under the data dir from its latest checkpoint, even with the old path a symlink."""
    p = await world.project(tmp_path / "ws-p", "P-legacy")
    q = await world.project(tmp_path / "ws-q", "Q-legacy")
    (q.workspace / "q.txt").write_text(Q_SECRET)
    attacker, source = await p.thread(), await p.thread()
    point = await p.run(source, "@write point.txt at-the-fork-point")
    fork = await p.fork(point["id"])
    await p.run(fork, "@write before.txt before-the-upgrade")

    # What an older release left: the stored text names the folder inside the workspace, and it is not here.
    own = world.folder_of(p, fork)
    db = Database.from_url(world.database_url)
    try:
        async with db.engine.begin() as conn:
            legacy = f".threadloom/forks/{uuid_of(fork)}"
            await conn.execute(
                sa.update(t.threads).where(t.threads.c.id == uuid.UUID(uuid_of(fork))).values(workspace_path=legacy)
            )
    finally:
        await db.dispose()
    for path in sorted(own.rglob("*"), reverse=True):
        path.unlink() if not path.is_dir() else path.rmdir()
    own.rmdir()
    await _plant(p, attacker, legacy, str(q.workspace))

    ran = await p.run(fork, "@write after.txt after-the-upgrade")
    assert sorted(x.name for x in own.iterdir()) == ["after.txt", "before.txt", "point.txt"]
    files = (await p.reader.gql(RUN_CHECKPOINT, {"r": ran["id"]}))["run"]["checkpoint"]["files"]
    assert [f["path"] for f in files] == ["after.txt"]  # against its own last checkpoint: nothing of Q
    paths, diffs = await _seen_by_reader(p, fork)
    assert paths <= {"point.txt", "before.txt", "after.txt"} and not any(Q_SECRET in d for d in diffs)
    assert sorted(x.name for x in q.workspace.iterdir()) == ["q.txt"]

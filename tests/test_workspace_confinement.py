"""The checkpoint store's own file work never reaches beyond the workspace, whatever the workspace holds.

A project's agents control the workspace's contents: symlinks to anywhere, a folder swapped for a link
at the worst moment, `renameat2(RENAME_EXCHANGE)` of a folder and a link in a loop, a fork's whole folder
replaced by a link. These tests play that agent against real git, real bwrap and real files, and look at a
folder outside the workspace (standing for another project, or the server's own package): nothing there is
ever read into a checkpoint, created, overwritten or deleted. Each denial has a twin where the same probe,
aimed inside the workspace, does what it says, so a broken probe cannot pass.
"""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.hostile import edit_the_real_folder, exchange, snapshot
from threadloom.agent.sandbox import SandboxUnavailable
from threadloom.checkpoints import CheckpointError, CheckpointErrorCode, CheckpointStore, ShadowRepo, checkpoint_ref
from threadloom.checkpoints import git as git_module
from threadloom.checkpoints import repo as repo_module
from threadloom.checkpoints.confine import open_root
from threadloom.checkpoints.git import sandbox_argv
from threadloom.checkpoints.walk import walk_workspace


def ref(ordinal: int) -> str:
    return checkpoint_ref("t1", "root", ordinal)


def tree(repo: ShadowRepo, commit: str) -> dict[str, tuple[str, bytes]]:
    """path → (mode, content) of a checkpoint, read back with git."""
    env = {"GIT_DIR": str(repo.git_dir), "PATH": os.environ["PATH"]}
    listing = subprocess.run(
        ["git", "ls-tree", "-r", "-z", commit], env=env, check=True, capture_output=True
    ).stdout.split(b"\0")
    found = {}
    for line in filter(None, listing):
        header, path = line.split(b"\t", 1)
        mode, _, blob = header.decode().split(" ")
        content = subprocess.run(["git", "cat-file", "blob", blob], env=env, check=True, capture_output=True).stdout
        found[path.decode()] = (mode, content)
    return found


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "data")


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the workspace: another project's files, seen by name from a link in ours."""
    folder = tmp_path / "other-project"
    folder.mkdir()
    (folder / "a.txt").write_text("OUTSIDE A\n")
    (folder / "c.txt").write_text("OUTSIDE C\n")
    return folder


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "ws"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "a.txt").write_text("A1\n")
    (root / "sub" / "b.txt").write_text("B1\n")
    (root / "top.txt").write_text("top\n")
    return root


def before_removal(monkeypatch: pytest.MonkeyPatch, act: Callable[[], None]) -> None:
    """Run `act` (the agent's move) inside a restore, after it staged and diffed, just before it deletes:
    the moment a check-then-act restore was open to a swap."""
    real = ShadowRepo._blocked_folders

    def swapped(self: ShadowRepo, *args: Any) -> list[str]:
        act()
        return real(self, *args)

    monkeypatch.setattr(ShadowRepo, "_blocked_folders", swapped)


async def test_a_workspace_root_that_is_a_link_is_refused(
    store: CheckpointStore, workspace: Path, tmp_path: Path
) -> None:
    """A root that is a symlink, or lies below one, is never resolved: capture and restore are refused with
    UNSAFE_WORKSPACE. Twin: the real folder is captured (and restored) as usual."""
    real = await store.repo("p1", workspace).capture(ref(0), "real")
    assert set(tree(store.repo("p1", workspace), real.commit)) == {"sub/a.txt", "sub/b.txt", "top.txt"}
    (tmp_path / "fork-link").symlink_to(workspace)
    (tmp_path / "parent-link").symlink_to(tmp_path)
    for path in (tmp_path / "fork-link", tmp_path / "parent-link" / "ws"):
        repo = store.repo("p1", path, index_key="fork")
        for attempt in (repo.capture(ref(1), "x"), repo.capture_changes(ref(1), "x"), repo.restore(real.commit)):
            with pytest.raises(CheckpointError) as refused:
                await attempt
            assert refused.value.code == CheckpointErrorCode.UNSAFE_WORKSPACE
    assert await store.repo("p1", workspace).resolve(ref(1)) is None
    (workspace / "top.txt").write_text("changed\n")
    assert (await store.repo("p1", workspace).restore(real.commit)).written == ("top.txt",)


async def test_a_link_to_an_outside_folder_is_stored_as_a_link(
    store: CheckpointStore, workspace: Path, outside: Path
) -> None:
    """Capture stores a link to another project's folder as a link, never the files behind it. Twin: a real
    folder holding the same file is captured with its content."""
    (workspace / "peek").symlink_to(outside)
    repo = store.repo("p1", workspace)
    files = tree(repo, (await repo.capture(ref(0), "link")).commit)
    assert files["peek"] == ("120000", os.fsencode(outside))
    assert not any(b"OUTSIDE" in content for _, content in files.values())
    (workspace / "peek").unlink()
    (workspace / "peek").mkdir()
    (workspace / "peek" / "a.txt").write_text("OUTSIDE A\n")
    files = tree(repo, (await repo.capture(ref(1), "folder")).commit)
    assert files["peek/a.txt"] == ("100644", b"OUTSIDE A\n")


async def test_a_folder_swapped_for_a_link_during_capture_is_not_read_through(
    store: CheckpointStore, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The walk lists `sub/a.txt`, then the agent swaps `sub` for a link to the other project: git, reading
    the listed files in its sandbox, never reads that project's `a.txt`; the capture walks again and stores
    the link, and the real folder's file under its new name (the twin: the same file read where it is)."""
    repo = store.repo("p1", workspace)
    walk = walk_workspace

    def then_swap(*args: Any) -> list[bytes]:
        listed = walk(*args)
        if not (workspace / "sub").is_symlink():  # once: the capture walks again after git's refusal
            (workspace / "sub").rename(workspace / "sub.moved")
            (workspace / "sub").symlink_to(outside)
        return listed

    monkeypatch.setattr(repo_module, "walk_workspace", then_swap)
    files = tree(repo, (await repo.capture(ref(0), "swapped")).commit)
    assert not any(b"OUTSIDE" in content for _, content in files.values()) and "sub/a.txt" not in files
    assert files["sub"] == ("120000", os.fsencode(outside)) and files["sub.moved/a.txt"] == ("100644", b"A1\n")


async def test_a_restore_never_writes_or_deletes_through_a_swapped_folder(
    store: CheckpointStore, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checkpoint has `sub/a.txt` and `sub/b.txt`; the disk has `a.txt` changed, `b.txt` gone and a new
    `c.txt`. The agent swaps `sub` for a link to the other project right before the restore deletes: the
    other project's `a.txt` and `c.txt` stay as they were and no `b.txt` appears there; the workspace ends
    with a real `sub` as checkpointed. Twin: without the swap, the same restore writes and deletes in `sub`."""
    repo = store.repo("p1", workspace)
    checkpoint = await repo.capture(ref(0), "checkpoint")
    untouched = snapshot(outside)

    def edit() -> None:
        (workspace / "sub" / "a.txt").write_text("A2\n")
        (workspace / "sub" / "b.txt").unlink()
        (workspace / "sub" / "c.txt").write_text("C2\n")

    edit()
    restored = await repo.restore(checkpoint.commit)  # twin: in the real folder
    assert restored.written == ("sub/a.txt", "sub/b.txt") and restored.removed == ("sub/c.txt",)
    assert snapshot(workspace / "sub") == {"a.txt": b"A1\n", "b.txt": b"B1\n"}

    edit()

    def swap() -> None:
        (workspace / "sub").rename(workspace / "sub.moved")
        (workspace / "sub").symlink_to(outside)

    before_removal(monkeypatch, swap)
    await repo.restore(checkpoint.commit)
    assert snapshot(outside) == untouched
    assert snapshot(workspace / "sub") == {"a.txt": b"A1\n", "b.txt": b"B1\n"}  # the link was replaced
    assert snapshot(workspace / "sub.moved") == {"a.txt": b"A2\n", "c.txt": b"C2\n"}  # the agent's move, kept


async def test_a_planted_file_never_reaches_the_server_package(
    store: CheckpointStore, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent checkpoints `pkg/evil.pyc`, then points `pkg` at a folder standing for the server's
    `__pycache__` (first as a plain link, then swapped in mid-restore) and asks for a rollback: nothing is
    written there. Twin: with `pkg` a real folder, the restore writes the file in it."""
    pycache = tmp_path / "server" / "threadloom" / "__pycache__"
    pycache.mkdir(parents=True)
    (workspace / "pkg").mkdir()
    (workspace / "pkg" / "evil.cpython-311.pyc").write_bytes(b"PLANTED")
    repo = store.repo("p1", workspace)
    planted = await repo.capture(ref(0), "plant")
    (workspace / "pkg" / "evil.cpython-311.pyc").unlink()
    assert (await repo.restore(planted.commit)).written == ("pkg/evil.cpython-311.pyc",)  # twin
    assert (workspace / "pkg" / "evil.cpython-311.pyc").read_bytes() == b"PLANTED"

    (workspace / "pkg" / "evil.cpython-311.pyc").unlink()
    (workspace / "pkg").rmdir()
    (workspace / "pkg").symlink_to(pycache)
    await repo.restore(planted.commit)
    assert list(pycache.iterdir()) == [] and (workspace / "pkg" / "evil.cpython-311.pyc").read_bytes() == b"PLANTED"

    (workspace / "pkg" / "evil.cpython-311.pyc").unlink()

    def swap() -> None:
        (workspace / "pkg").rename(workspace / "pkg.moved")
        (workspace / "pkg").symlink_to(pycache)

    before_removal(monkeypatch, swap)
    await repo.restore(planted.commit)
    assert list(pycache.iterdir()) == []


@pytest.fixture
def racer(workspace: Path, outside: Path) -> Iterator[tuple[Callable[[], None], dict[str, int]]]:
    """A thread (started by the test) swapping `sub` (a real folder) and `link` (a link to the other project)
    as fast as it can, putting back whichever a restore removed. Stops when the test ends (or after a bounded
    count)."""
    stop = threading.Event()
    counts = {"swaps": 0}

    def loop() -> None:
        for _ in range(2_000_000):
            if stop.is_set():
                return
            code = exchange(workspace / "sub", workspace / "link")
            if code == 0:
                counts["swaps"] += 1
                continue
            assert code == errno.ENOENT, os.strerror(code)
            if not os.path.lexists(workspace / "link"):
                os.symlink(outside, workspace / "link")
            if not os.path.lexists(workspace / "sub"):
                with contextlib.suppress(FileExistsError):  # a restore made it meanwhile
                    (workspace / "sub").mkdir()

    thread = threading.Thread(target=loop, daemon=True)
    try:
        yield thread.start, counts
    finally:
        stop.set()
        if thread.ident is not None:
            thread.join()


async def test_a_rename_exchange_race_never_reaches_outside(
    store: CheckpointStore,
    workspace: Path,
    outside: Path,
    racer: tuple[Callable[[], None], dict[str, int]],
) -> None:
    """Thirty restores run while `sub` and a link to the other project are swapped in a loop. Each round the
    agent first changes `a.txt` and adds `c.txt` in the real folder, so every restore has a file to write and
    one to delete there. The other project's files are never changed or deleted, nothing is added there; a
    restore either finishes or stops with a typed error. Twin: once the race stops, the same restore deletes
    the `c.txt` and rewrites the `a.txt` the race left in the real folder."""
    repo = store.repo("p1", workspace)
    checkpoint = await repo.capture(ref(0), "checkpoint")
    untouched = snapshot(outside)
    codes = set()
    start, counts = racer
    start()
    for _ in range(30):
        edit_the_real_folder(workspace, ("sub", "link"), {"a.txt": b"A2\n", "c.txt": b"C2\n"})
        try:
            await repo.restore(checkpoint.commit)
        except CheckpointError as error:
            codes.add(error.code)
        assert snapshot(outside) == untouched
    assert counts["swaps"] > 0
    assert codes <= {CheckpointErrorCode.RESTORE_CONFLICT, CheckpointErrorCode.WORKSPACE_CHANGING}


async def test_the_unlink_path_deletes_inside_the_workspace(store: CheckpointStore, workspace: Path) -> None:
    """The twin of the race, without it: the files the race's restores aim at are deleted and rewritten
    when they stand in the workspace's real folder."""
    repo = store.repo("p1", workspace)
    checkpoint = await repo.capture(ref(0), "checkpoint")
    (workspace / "sub" / "a.txt").write_text("A2\n")
    (workspace / "sub" / "c.txt").write_text("C2\n")
    restored = await repo.restore(checkpoint.commit)
    assert restored.removed == ("sub/c.txt",) and restored.written == ("sub/a.txt",)
    assert snapshot(workspace / "sub") == {"a.txt": b"A1\n", "b.txt": b"B1\n"}


def test_the_git_sandbox_holds_only_the_workspace(store: CheckpointStore, workspace: Path, outside: Path) -> None:
    """What git sees when it reads the workspace: the workspace (at /workspace) and /usr, not the other
    project. Twins: the same read of a workspace file succeeds, and so does a read through a link that stays
    inside the workspace, where the one that escapes finds nothing."""
    fd = open_root(workspace)
    try:

        def cat(path: str) -> subprocess.CompletedProcess[bytes]:
            argv = sandbox_argv("/usr/bin/cat", fd, store.root, {"PATH": "/usr/bin"}, ["/usr/bin/cat", path])
            return subprocess.run(argv, pass_fds=(fd,), capture_output=True, env={"PATH": "/usr/bin"})

        store.root.mkdir(parents=True, exist_ok=True)
        assert cat("/workspace/top.txt").stdout == b"top\n"
        denied = cat(str(outside / "a.txt"))
        assert denied.returncode != 0 and denied.stdout == b"" and b"No such file" in denied.stderr
        (workspace / "peek").symlink_to(outside / "a.txt")
        escaping = cat("/workspace/peek")
        assert escaping.returncode != 0 and escaping.stdout == b"" and b"No such file" in escaping.stderr
        (workspace / "inside").symlink_to("sub/a.txt")
        assert cat("/workspace/inside").stdout == b"A1\n"
    finally:
        os.close(fd)


async def test_without_bwrap_nothing_reads_the_workspace(
    store: CheckpointStore, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No bwrap: a capture is refused with SANDBOX_UNAVAILABLE rather than let git read the workspace
    unconfined. Twin: with bwrap it captures."""
    repo = store.repo("p1", workspace)

    def missing() -> str:
        raise SandboxUnavailable("bubblewrap (bwrap) is not installed")

    monkeypatch.setattr(git_module, "find_bwrap", missing)
    with pytest.raises(CheckpointError) as refused:
        await repo.capture(ref(0), "x")
    assert refused.value.code == CheckpointErrorCode.SANDBOX_UNAVAILABLE
    monkeypatch.undo()
    assert "top.txt" in tree(repo, (await repo.capture(ref(0), "x")).commit)


async def test_a_removal_skipped_behind_a_swapped_folder_is_not_reported_as_removed(
    store: CheckpointStore, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restore means to delete `sub/c.txt`, but the agent swapped `sub` for a link just before: the unlink
    is skipped (the file is behind the link, in the agent's moved folder), so `Restored.removed` leaves it out,
    while the restore still ends with a real `sub` as checkpointed (no `c.txt` there). Twin: the same restore
    without the swap reports `sub/c.txt` removed."""
    repo = store.repo("p1", workspace)
    checkpoint = await repo.capture(ref(0), "checkpoint")
    (workspace / "sub" / "c.txt").write_text("C2\n")
    assert (await repo.restore(checkpoint.commit)).removed == ("sub/c.txt",)  # twin

    (workspace / "sub" / "c.txt").write_text("C2\n")

    def swap() -> None:
        (workspace / "sub").rename(workspace / "sub.moved")
        (workspace / "sub").symlink_to(outside)

    before_removal(monkeypatch, swap)
    restored = await repo.restore(checkpoint.commit)
    assert restored.removed == () and restored.written == ()  # what git saw differing: only c.txt
    assert (workspace / "sub").is_symlink()  # the agent's link stays: the restore was only to delete c.txt
    assert snapshot(workspace / "sub.moved") == {"a.txt": b"A1\n", "b.txt": b"B1\n", "c.txt": b"C2\n"}


async def test_a_restore_whose_written_folder_was_moved_away_names_what_it_could_not_restore(
    store: CheckpointStore, workspace: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restore writes `sub/a.txt` and `sub/b.txt`; right after, before it answers, the agent moves `sub`
    away and puts a link to the other project in its place. The restore does not answer success: it raises
    RESTORE_CONFLICT naming both paths, and the other project is untouched. Twin (nothing moved): the same
    restore answers both as written, and they are there."""
    repo = store.repo("p1", workspace)
    checkpoint = await repo.capture(ref(0), "checkpoint")
    untouched = snapshot(outside)

    def edit() -> None:
        (workspace / "sub" / "a.txt").write_text("A2\n")
        (workspace / "sub" / "b.txt").unlink()

    edit()
    assert (await repo.restore(checkpoint.commit)).written == ("sub/a.txt", "sub/b.txt")  # twin
    assert snapshot(workspace / "sub") == {"a.txt": b"A1\n", "b.txt": b"B1\n"}

    edit()
    check = repo_module._not_in_place

    def moved_first(*args: Any) -> list[str]:
        (workspace / "sub").rename(workspace / "sub.moved")
        (workspace / "sub").symlink_to(outside)
        return check(*args)

    monkeypatch.setattr(repo_module, "_not_in_place", moved_first)
    with pytest.raises(CheckpointError) as refused:
        await repo.restore(checkpoint.commit)
    assert refused.value.code == CheckpointErrorCode.RESTORE_CONFLICT
    assert str(refused.value).endswith("not restored: sub/a.txt, sub/b.txt"), str(refused.value)
    assert snapshot(workspace / "sub.moved") == {"a.txt": b"A1\n", "b.txt": b"B1\n"}  # written, then moved
    assert snapshot(outside) == untouched

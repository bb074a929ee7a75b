"""The checkpoint store against real git and real workspaces on disk.

Every test builds a workspace in a temp folder, edits it the way agents do (Python writes like
`@write`, and shell commands like `@tool sh -c ...`), captures, diffs and restores through
`threadloom.checkpoints`, and then looks at the disk and at the user's own repository with git.
"""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from threadloom.checkpoints import (
    CheckpointError,
    CheckpointErrorCode,
    CheckpointStore,
    FileChange,
    FileStatus,
    ShadowRepo,
    checkpoint_ref,
    diffs,
)
from threadloom.checkpoints import walk as walk_module
from threadloom.checkpoints.excludes import Excludes
from threadloom.checkpoints.git import Git
from threadloom.checkpoints.walk import walk_workspace

State = dict[str, tuple[str, bytes, bool]]


def ref(ordinal: int, thread: str = "t1", scope: str = "root") -> str:
    return checkpoint_ref(thread, scope, ordinal)


def sh(cwd: Path, script: str) -> None:
    """A shell-made edit, as an agent's `@tool sh -c '...'` makes it."""
    subprocess.run(["sh", "-c", script], cwd=cwd, check=True)


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """The user's git (their own repository in the workspace), with a fixed identity."""
    base = {
        "PATH": os.environ["PATH"],
        "HOME": str(cwd),
        "GIT_CONFIG_NOSYSTEM": "1",
        "GIT_AUTHOR_NAME": "User",
        "GIT_AUTHOR_EMAIL": "user@example.com",
        "GIT_COMMITTER_NAME": "User",
        "GIT_COMMITTER_EMAIL": "user@example.com",
    }
    done = subprocess.run(
        ["git", *args], cwd=cwd, env={**base, **(env or {})}, check=True, capture_output=True, text=True
    )
    return done.stdout


def state(root: Path, skip_git: bool = True) -> State:
    """Everything on disk under `root`: files (content, executable) and links (target), `.git` left out."""
    found: State = {}
    for dirpath, dirnames, filenames in os.walk(root):
        if skip_git:
            dirnames[:] = [d for d in dirnames if d != ".git"]
        for name in filenames + [d for d in dirnames if (Path(dirpath) / d).is_symlink()]:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if skip_git and name == ".git":
                continue
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path).encode(), False)
            else:
                found[rel] = ("file", path.read_bytes(), bool(path.stat().st_mode & stat.S_IXUSR))
    return found


def tree_paths(repo: ShadowRepo, commit: str) -> dict[str, str]:
    """path -> git mode of every entry of a checkpoint's tree."""
    out = subprocess.run(
        ["git", "--git-dir", str(repo.git_dir), "ls-tree", "-r", "-z", commit],
        check=True,
        capture_output=True,
    ).stdout
    entries = {}
    for line in out.split(b"\0"):
        if line:
            meta, path = line.split(b"\t", 1)
            entries[path.decode()] = meta.split(b" ")[0].decode()
    return entries


def shadow_git_bytes(repo: ShadowRepo, *args: str) -> bytes:
    """git's own answer about the shadow repository, as the bytes it printed."""
    return subprocess.run(["git", "--git-dir", str(repo.git_dir), *args], check=True, capture_output=True).stdout


def shadow_git(repo: ShadowRepo, *args: str) -> str:
    """git's own answer about the shadow repository."""
    return subprocess.run(
        ["git", "--git-dir", str(repo.git_dir), *args], check=True, capture_output=True, text=True
    ).stdout


def by_path(changes: list[FileChange]) -> dict[str, FileChange]:
    return {change.path: change for change in changes}


@pytest.fixture
def store(tmp_path: Path) -> CheckpointStore:
    return CheckpointStore(tmp_path / "data")


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    (root / "src").mkdir(parents=True)
    (root / "src" / "app.py").write_text("print('hello')\n")
    (root / "README.md").write_text("# demo\nline two\n")
    (root / "logo.bin").write_bytes(bytes(range(256)) * 4)
    return root


async def test_write_and_shell_edits_are_captured_and_diffed(store: CheckpointStore, workspace: Path) -> None:
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")

    (workspace / "src" / "app.py").write_text("print('hello')\nprint('again')\n")  # an @write edit
    (workspace / "notes.txt").write_text("new file\n")
    sh(workspace, "echo x > made-by-shell.txt")
    sh(workspace, "rm README.md")
    sh(workspace, "mkdir -p lib && mv src/app.py lib/app.py")
    sh(workspace, "printf '\\000\\001\\002\\377' > data.bin && printf 'y' >> logo.bin")
    sh(workspace, "printf '#!/bin/sh\\necho run\\n' > run.sh && chmod +x run.sh")
    run1 = await repo.capture(ref(1), "run 1", parent=base.commit)

    changes = by_path(await repo.diff(base.commit, run1.commit))
    assert set(changes) == {
        "lib/app.py",
        "notes.txt",
        "made-by-shell.txt",
        "README.md",
        "data.bin",
        "logo.bin",
        "run.sh",
    }
    assert changes["lib/app.py"].status == FileStatus.RENAMED
    assert changes["lib/app.py"].old_path == "src/app.py"
    assert (changes["lib/app.py"].additions, changes["lib/app.py"].deletions) == (1, 0)
    assert changes["notes.txt"] == FileChange("notes.txt", FileStatus.ADDED, 1, 0)
    assert changes["made-by-shell.txt"].status == FileStatus.ADDED
    assert changes["README.md"] == FileChange("README.md", FileStatus.DELETED, 0, 2)
    assert changes["data.bin"].binary and changes["data.bin"].status == FileStatus.ADDED
    assert changes["logo.bin"].binary and changes["logo.bin"].status == FileStatus.MODIFIED
    assert tree_paths(repo, run1.commit)["run.sh"] == "100755"

    sh(workspace, "chmod -x run.sh")  # a mode-only change is a modification with no lines
    run2 = await repo.capture(ref(2), "run 2", parent=run1.commit)
    assert await repo.diff(run1.commit, run2.commit) == [FileChange("run.sh", FileStatus.MODIFIED, 0, 0)]

    text = await repo.file_diff(base.commit, run1.commit, "lib/app.py", old_path="src/app.py")
    assert "rename from src/app.py" in text and "+print('again')" in text
    assert "-# demo" in await repo.file_diff(base.commit, run1.commit, "README.md")
    everything = by_path(await repo.diff(None, base.commit))
    assert set(everything) == {"src/app.py", "README.md", "logo.bin"}
    assert all(change.status == FileStatus.ADDED for change in everything.values())


async def test_capture_without_change_still_commits(store: CheckpointStore, workspace: Path) -> None:
    repo = store.repo("p1", workspace)
    first = await repo.capture(ref(0), "baseline")
    second = await repo.capture(ref(1), "nothing happened", parent=first.commit)
    assert second.tree == first.tree and second.commit != first.commit
    assert await repo.diff(first.commit, second.commit) == []
    assert await repo.resolve(ref(1)) == second.commit


async def test_capture_changes_is_capture_then_diff(store: CheckpointStore, workspace: Path) -> None:
    """The run-end capture (fewer git calls) gives the commit, tree and changes of capture + diff."""
    repo = store.repo("p1", workspace)
    first, everything = await repo.capture_changes(ref(0), "baseline")
    assert everything == await repo.diff(None, first.commit)
    assert {c.path for c in everything} == {"src/app.py", "README.md", "logo.bin"}
    sh(workspace, "mkdir -p lib && mv src/app.py lib/app.py && echo x > notes.txt && rm README.md")
    second, changes = await repo.capture_changes(ref(1), "run 1", parent=first.commit)
    assert changes == await repo.diff(first.commit, second.commit) and len(changes) == 3
    assert await repo.resolve(ref(1)) == second.commit
    assert await repo.parent(second.commit) == first.commit
    third, none = await repo.capture_changes(ref(2), "nothing happened", parent=second.commit)
    assert none == [] and third.tree == second.tree and await repo.resolve(ref(2)) == third.commit
    with pytest.raises(CheckpointError) as refused:
        await repo.capture_changes(ref(3), "bad parent", parent="0" * 40)
    assert refused.value.code == CheckpointErrorCode.UNKNOWN_COMMIT


async def test_capture_changes_against_a_ref(store: CheckpointStore, workspace: Path) -> None:
    """A parent named by its checkpoint ref is resolved with the staging; a ref naming nothing means no parent."""
    repo = store.repo("p1", workspace)
    first, _ = await repo.capture_changes(ref(0), "baseline")
    assert first.parent is None
    (workspace / "notes.txt").write_text("x\n")
    second, changes = await repo.capture_changes(ref(1), "run 1", parent_ref=ref(0))
    assert second.parent == first.commit and await repo.parent(second.commit) == first.commit
    assert changes == await repo.diff(first.commit, second.commit) and [c.path for c in changes] == ["notes.txt"]
    orphan, everything = await repo.capture_changes(ref(2), "no such parent", parent_ref=ref(7))
    assert orphan.parent is None and everything == await repo.diff(None, orphan.commit)


def git_commands(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The git subcommands the store runs from now on, in order (the real git still runs them)."""
    calls: list[str] = []
    run = Git.run

    async def counted(self: Git, *args: str, **kwargs: object) -> object:
        calls.append(args[0])
        return await run(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Git, "run", counted)
    return calls


async def test_an_unchanged_workspace_reuses_the_last_tree(
    store: CheckpointStore, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """When every file's stat data is as at the last capture, the capture reuses its tree without staging;
    any change — a new file, a rewrite that puts the old mtime back — is staged as usual."""
    monkeypatch.setattr(walk_module, "RACY_SECONDS", 0.0)  # the files were all written just now
    calls = git_commands(monkeypatch)
    repo = store.repo("p1", workspace)
    first, _ = await repo.capture_changes(ref(0), "baseline")
    calls.clear()
    second, none = await repo.capture_changes(ref(1), "run 1", parent_ref=ref(0))
    assert none == [] and second.tree == first.tree and second.parent == first.commit
    assert "update-index" not in calls and "ls-files" not in calls and "write-tree" not in calls
    app = workspace / "src" / "app.py"
    before = app.stat()
    app.write_text(app.read_text().upper()[: before.st_size].ljust(before.st_size))  # same size
    os.utime(app, ns=(before.st_atime_ns, before.st_mtime_ns))  # and the old mtime
    third, changes = await repo.capture_changes(ref(2), "run 2", parent_ref=ref(1))
    assert [c.path for c in changes] == ["src/app.py"] and third.tree != second.tree
    (workspace / "new.txt").write_text("new\n")
    fourth, added = await repo.capture_changes(ref(3), "run 3", parent_ref=ref(2))
    assert [c.path for c in added] == ["new.txt"]
    assert await repo.diff(None, fourth.commit) == await repo.diff(None, (await repo.capture(ref(4), "x")).commit)


async def test_restore_removes_added_and_brings_back_deleted(store: CheckpointStore, workspace: Path) -> None:
    (workspace / "tool.sh").write_text("#!/bin/sh\n")
    (workspace / "tool.sh").chmod(0o755)
    os.symlink("src/app.py", workspace / "link-to-app")
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    before = state(workspace)

    sh(workspace, "rm -r src tool.sh link-to-app && mkdir -p new/deep && echo n > new/deep/file && echo z > z.txt")
    sh(workspace, "printf changed > logo.bin && mkdir src && echo 'not a link' > link-to-app")
    restored = await repo.restore(base.commit)

    assert state(workspace) == before
    assert not (workspace / "new").exists()  # folders emptied by the restore go too
    assert (workspace / "link-to-app").is_symlink()
    assert os.stat(workspace / "tool.sh").st_mode & stat.S_IXUSR
    assert set(restored.removed) == {"new/deep/file", "z.txt"}
    assert set(restored.written) == {"src/app.py", "tool.sh", "link-to-app", "logo.bin"}


async def test_restore_is_idempotent_and_finishes_an_interrupted_one(store: CheckpointStore, workspace: Path) -> None:
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    before = state(workspace)
    sh(workspace, "echo a > added && rm README.md && echo changed > src/app.py")
    await repo.capture(ref(1), "run 1", parent=base.commit)

    await repo.restore(base.commit)
    again = await repo.restore(base.commit)
    assert again.written == () and again.removed == ()
    assert state(workspace) == before

    # A restore stopped half-way (some files back, some not) is completed by the next one.
    sh(workspace, "echo a > added && rm README.md")
    await repo.restore(base.commit)
    assert state(workspace) == before


async def test_restore_moves_forward_too(store: CheckpointStore, workspace: Path) -> None:
    """Undoing a rollback is restoring a later checkpoint."""
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    sh(workspace, "echo one > one.txt && rm logo.bin")
    later = await repo.capture(ref(1), "run 1", parent=base.commit)
    after_run = state(workspace)
    await repo.restore(base.commit)
    await repo.restore(later.commit)
    assert state(workspace) == after_run


async def test_users_repository_is_never_touched(store: CheckpointStore, workspace: Path) -> None:
    git(workspace, "init", "-q", "-b", "main")
    (workspace / ".gitignore").write_text("*.log\n")
    git(workspace, "add", "-A")
    git(workspace, "commit", "-q", "-m", "first")
    git(workspace, "branch", "feature")
    git(workspace, "tag", "v1")
    (workspace / "README.md").write_text("# demo\nstashed edit\n")
    git(workspace, "stash", "-q")
    (workspace / "src" / "app.py").write_text("print('staged')\n")
    git(workspace, "add", "src/app.py")
    (workspace / "untracked.txt").write_text("u\n")
    (workspace / "debug.log").write_text("ignored by the user\n")
    # Let git settle its own stat cache first, so any later change is ours.
    git(workspace, "status", "--porcelain")

    def user_repo() -> tuple[dict[str, bytes], str, str, str, str]:
        files = {
            p.relative_to(workspace).as_posix(): p.read_bytes()
            for p in sorted((workspace / ".git").rglob("*"))
            if p.is_file()
        }
        no_refresh = {"GIT_OPTIONAL_LOCKS": "0"}  # reading, never rewriting, the user's index
        return (
            files,
            git(workspace, "status", "--porcelain=v2", "--branch", "--untracked-files=all", env=no_refresh),
            git(workspace, "for-each-ref", env=no_refresh),
            git(workspace, "stash", "list", env=no_refresh),
            git(workspace, "rev-parse", "HEAD", env=no_refresh),
        )

    before = user_repo()
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    assert ".gitignore" in tree_paths(repo, base.commit)
    assert not any(path.startswith(".git/") for path in tree_paths(repo, base.commit))
    sh(workspace, "echo more >> src/app.py && echo x > new.txt && rm untracked.txt")
    await repo.capture(ref(1), "run 1", parent=base.commit)
    await repo.restore(base.commit)

    after = user_repo()
    assert after[1:] == before[1:]  # status, refs, stash, HEAD
    assert after[0] == before[0]  # every byte under .git: HEAD, index, refs, objects, config


async def test_nested_repositories_are_captured_without_their_git(store: CheckpointStore, workspace: Path) -> None:
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    nested = workspace / "vendor" / "lib"
    nested.mkdir(parents=True)
    git(nested, "init", "-q")
    (nested / "lib.py").write_text("x = 1\n")
    (workspace / "worktree").mkdir()
    (workspace / "worktree" / ".git").write_text("gitdir: /somewhere/else\n")  # a linked worktree's .git file
    (workspace / "worktree" / "code.py").write_text("y = 2\n")
    run1 = await repo.capture(ref(1), "run 1", parent=base.commit)

    paths = tree_paths(repo, run1.commit)
    assert "vendor/lib/lib.py" in paths and "worktree/code.py" in paths
    assert not any(".git" in path.split("/") for path in paths)
    nested_git = state(nested / ".git", skip_git=False)

    await repo.restore(base.commit)
    assert not (nested / "lib.py").exists() and not (workspace / "worktree" / "code.py").exists()
    assert state(nested / ".git", skip_git=False) == nested_git  # folders holding a .git stay, untouched
    assert (workspace / "worktree" / ".git").read_text() == "gitdir: /somewhere/else\n"


async def test_workspace_gitignore_does_not_hide_files(store: CheckpointStore, workspace: Path) -> None:
    (workspace / ".gitignore").write_text("build/\n*.log\n")
    (workspace / "src" / ".gitignore").write_text("*\n")
    (workspace / "build").mkdir()
    (workspace / "build" / "out.js").write_text("compiled\n")
    (workspace / "run.log").write_text("log\n")
    repo = store.repo("p1", workspace)
    paths = tree_paths(repo, (await repo.capture(ref(0), "baseline")).commit)
    assert {"build/out.js", "run.log", "src/app.py", "src/.gitignore"} <= set(paths)


async def test_project_excludes_are_honoured(store: CheckpointStore, workspace: Path) -> None:
    (workspace / "node_modules" / "pkg").mkdir(parents=True)
    (workspace / "node_modules" / "pkg" / "index.js").write_text("module\n")
    (workspace / "src" / "node_modules").mkdir()
    (workspace / "src" / "node_modules" / "x.js").write_text("nested\n")
    (workspace / "cache.tmp").write_text("tmp\n")
    (workspace / "keep.tmp").write_text("kept\n")
    repo = store.repo("p1", workspace, ["node_modules/", "*.tmp", "!keep.tmp"])
    base = await repo.capture(ref(0), "baseline")
    paths = set(tree_paths(repo, base.commit))
    assert paths == {"src/app.py", "README.md", "logo.bin", "keep.tmp"}
    assert "node_modules/" in (repo.git_dir / "info" / "exclude").read_text()

    sh(workspace, "echo more > node_modules/pkg/more.js && echo t > other.tmp && echo n > new.txt")
    run1 = await repo.capture(ref(1), "run 1", parent=base.commit)
    assert [c.path for c in await repo.diff(base.commit, run1.commit)] == ["new.txt"]

    await repo.restore(base.commit)  # excluded paths are neither removed nor written
    assert (workspace / "node_modules" / "pkg" / "more.js").exists()
    assert (workspace / "other.tmp").exists() and (workspace / "cache.tmp").exists()
    assert not (workspace / "new.txt").exists()


@pytest.mark.parametrize(
    "patterns",
    [
        ["node_modules/", "*.log", "!keep.log"],
        ["/build", "docs/**/*.md", "a?c.txt", "[ab]*.py", "**/gen/", "deep/**", "\\#hash", "trail   "],
        ["*", "!*/", "!*.py"],
        ["dir/sub/", "/top.txt", "x/**/y", "*.[ch]", "[!a]*.c"],
    ],
)
def test_exclude_matching_agrees_with_git(tmp_path: Path, patterns: list[str]) -> None:
    """Our matcher against git's own: the same files survive (no .gitignore in this tree)."""
    root = tmp_path / "tree"
    files = [
        "a.log", "keep.log", "sub/b.log", "node_modules/m.js", "sub/node_modules/n.js", "build/x", "sub/build/y",
        "docs/a.md", "docs/x/y/b.md", "docs/c.txt", "abc.txt", "sub/abc.txt", "aXc.txt", "a.py", "b.py", "c.py",
        "sub/a.py", "gen/g.c", "sub/gen/h.c", "deep/one/two", "#hash", "trail", "dir/sub/f", "other/dir/sub/f",
        "top.txt", "sub/top.txt", "x/y", "x/m/n/y", "q.h", "b.c", "a.c",
    ]  # fmt: skip
    for name in files:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    (root / ".git" / "info").mkdir(exist_ok=True)
    (root / ".git" / "info" / "exclude").write_text("".join(f"{p}\n" for p in patterns))
    listed = subprocess.run(
        ["git", "-c", "core.excludesFile=/dev/null", "ls-files", "-z", "--others", "--exclude-standard"],
        cwd=root,
        env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "GIT_CONFIG_NOSYSTEM": "1"},
        check=True,
        capture_output=True,
    ).stdout
    theirs = {p.decode() for p in listed.split(b"\0") if p}
    ours = {p.decode() for p in walk_workspace(root, Excludes(patterns))}
    assert ours == theirs


async def test_symlinks_are_links_and_never_followed(store: CheckpointStore, workspace: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside the workspace\n")
    os.symlink(outside, workspace / "escape")
    (workspace / "dir").mkdir()
    (workspace / "dir" / "file.txt").write_text("inside\n")
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    paths = tree_paths(repo, base.commit)
    assert paths["escape"] == "120000"  # the link itself, not the folder it points at
    assert not any(path.startswith("escape/") for path in paths)

    # The agent replaces dir/ with a link out of the workspace; restore must not write through it.
    sh(workspace, f"rm -r dir && ln -s '{outside}' dir && rm escape")
    await repo.capture(ref(1), "run 1", parent=base.commit)
    await repo.restore(base.commit)

    assert (workspace / "dir").is_dir() and not (workspace / "dir").is_symlink()
    assert (workspace / "dir" / "file.txt").read_text() == "inside\n"
    assert os.readlink(workspace / "escape") == str(outside)
    assert sorted(p.name for p in outside.iterdir()) == ["secret.txt"]
    assert (outside / "secret.txt").read_text() == "outside the workspace\n"


async def test_restore_refuses_to_remove_a_folder_holding_a_repository(store: CheckpointStore, workspace: Path) -> None:
    (workspace / "vendor").write_text("a file at first\n")
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    sh(workspace, "rm vendor && mkdir vendor && echo x > vendor/x.py && echo changed > README.md")
    git(workspace / "vendor", "init", "-q")
    before = state(workspace)

    with pytest.raises(CheckpointError) as refused:
        await repo.restore(base.commit)
    assert refused.value.code == CheckpointErrorCode.RESTORE_CONFLICT
    assert state(workspace) == before  # refused before anything was written
    assert (workspace / "vendor" / ".git" / "HEAD").exists()


async def test_projects_share_no_refs_or_commits(store: CheckpointStore, tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    for root in (one, two):
        root.mkdir()
        (root / "f.txt").write_text(root.name)
    repo_one, repo_two = store.repo("p-one", one), store.repo("p-two", two)
    capture_one = await repo_one.capture(ref(0), "one")
    await repo_two.capture(ref(0, thread="t2"), "two")

    assert [r for r, _ in await repo_one.list_refs("refs/threadloom/")] == [ref(0)]
    assert [r for r, _ in await repo_two.list_refs("refs/threadloom/")] == [ref(0, thread="t2")]
    assert await repo_two.resolve(ref(0)) is None
    with pytest.raises(CheckpointError) as unknown:
        await repo_two.restore(capture_one.commit)
    assert unknown.value.code == CheckpointErrorCode.UNKNOWN_COMMIT
    assert (two / "f.txt").read_text() == "two"


async def test_refs_are_listed_by_ordinal_and_kept_by_update_ref(store: CheckpointStore, workspace: Path) -> None:
    repo = store.repo("p1", workspace)
    assert await repo.resolve(ref(0)) is None  # nothing captured yet: no repository, no ref
    assert await repo.list_refs("refs/threadloom/t1") == []
    captures = [await repo.capture(ref(n), f"run {n}") for n in (0, 1, 2, 10)]
    await repo.capture(ref(1, scope="node-7"), "child")
    listed = await repo.list_refs("refs/threadloom/t1/root")
    assert [r for r, _ in listed] == [ref(0), ref(1), ref(2), ref(10)]
    assert [c for _, c in listed] == [c.commit for c in captures]

    await repo.update_ref("refs/threadloom/t1/stale/2", captures[2].commit)
    await repo.delete_ref(ref(2))
    await repo.delete_ref(ref(2))  # twice is harmless
    assert await repo.resolve(ref(2)) is None
    assert await repo.resolve("refs/threadloom/t1/stale/2") == captures[2].commit
    assert len(await repo.list_refs("refs/threadloom/t1/")) == 5


@pytest.mark.parametrize(
    "bad", ["refs/heads/main", "refs/threadloom/../x", "refs/threadloom/t/a.lock", "refs/threadloom/", "HEAD"]
)
async def test_bad_refs_are_refused(store: CheckpointStore, workspace: Path, bad: str) -> None:
    repo = store.repo("p1", workspace)
    with pytest.raises(CheckpointError) as refused:
        await repo.capture(bad, "x")
    assert refused.value.code == CheckpointErrorCode.INVALID_REF
    assert not repo.git_dir.exists()  # refused before anything was created


async def test_bad_input_is_refused_with_codes(store: CheckpointStore, workspace: Path, tmp_path: Path) -> None:
    with pytest.raises(CheckpointError) as bad_project:
        store.repo("../escape", workspace)
    assert bad_project.value.code == CheckpointErrorCode.INVALID_PROJECT_ID

    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    for commit in ("HEAD~1", "--all", "0" * 40):
        with pytest.raises(CheckpointError) as unknown:
            await repo.diff(commit, base.commit)
        assert unknown.value.code == CheckpointErrorCode.UNKNOWN_COMMIT
    with pytest.raises(CheckpointError) as bad_path:
        await repo.file_diff(None, base.commit, "../etc/passwd")
    assert bad_path.value.code == CheckpointErrorCode.INVALID_PATH

    missing = store.repo("p2", tmp_path / "does-not-exist")
    with pytest.raises(CheckpointError) as gone:
        await missing.capture(ref(0), "x")
    assert gone.value.code == CheckpointErrorCode.WORKSPACE_MISSING
    with pytest.raises(CheckpointError) as bad_exclude:
        store.repo("p1", workspace, ["a\nb"])
    assert bad_exclude.value.code == CheckpointErrorCode.INVALID_EXCLUDE


async def test_concurrent_captures_of_one_project_serialize(store: CheckpointStore, workspace: Path) -> None:
    repos = [store.repo("p1", workspace) for _ in range(4)]  # separate handles share the project's lock
    captures = await asyncio.gather(*(r.capture(ref(n), f"c{n}") for n, r in enumerate(repos)))
    assert len({c.tree for c in captures}) == 1
    assert len(await repos[0].list_refs("refs/threadloom/t1/root")) == 4


async def test_user_git_environment_is_ignored(
    store: CheckpointStore, workspace: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """GIT_DIR/GIT_INDEX_FILE inherited from a hook, and attributes that would convert line endings."""
    git(workspace, "init", "-q")
    monkeypatch.setenv("GIT_DIR", str(workspace / ".git"))
    monkeypatch.setenv("GIT_INDEX_FILE", str(tmp_path / "elsewhere"))
    (workspace / ".gitattributes").write_text("*.txt text eol=crlf\n")
    (workspace / "mixed.txt").write_bytes(b"unix\nwindows\r\n")
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    (workspace / "mixed.txt").write_bytes(b"other\n")
    await repo.restore(base.commit)
    assert (workspace / "mixed.txt").read_bytes() == b"unix\nwindows\r\n"
    assert not (tmp_path / "elsewhere").exists()
    assert git(workspace, "for-each-ref") == ""


async def test_restore_across_type_changes(store: CheckpointStore, workspace: Path) -> None:
    """A file that became a folder, a folder that became a file, a file that became a link, and back."""
    (workspace / "becomes-dir").write_text("file\n")
    (workspace / "becomes-file").mkdir()
    (workspace / "becomes-file" / "inner.txt").write_text("inner\n")
    (workspace / "becomes-link").write_text("plain\n")
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    before = state(workspace)

    sh(workspace, "rm becomes-dir && mkdir -p becomes-dir/sub && echo x > becomes-dir/sub/x")
    sh(workspace, "rm -r becomes-file && echo now-a-file > becomes-file")
    sh(workspace, "rm becomes-link && ln -s README.md becomes-link")
    after = state(workspace)
    run1 = await repo.capture(ref(1), "run 1", parent=base.commit)
    statuses = {c.path: c.status for c in await repo.diff(base.commit, run1.commit)}
    assert statuses == {
        "becomes-dir": FileStatus.DELETED,
        "becomes-dir/sub/x": FileStatus.ADDED,
        "becomes-file": FileStatus.ADDED,
        "becomes-file/inner.txt": FileStatus.DELETED,
        "becomes-link": FileStatus.MODIFIED,
    }

    await repo.restore(base.commit)
    assert state(workspace) == before
    await repo.restore(run1.commit)
    assert state(workspace) == after


async def test_another_process_holding_the_lock_delays_capture(store: CheckpointStore, workspace: Path) -> None:
    """Captures from two processes never overlap: ours waits for the other's flock."""
    repo = store.repo("p1", workspace)
    await repo.capture(ref(0), "baseline")  # the repository exists
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        "import fcntl, sys; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); print('held', flush=True);"
        " sys.stdin.readline()",
        str(store.root / "p1.lock"),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    assert holder.stdin is not None and holder.stdout is not None
    assert await holder.stdout.readline() == b"held\n"
    waiting = asyncio.create_task(repo.capture(ref(1), "waits"))
    await repo.lock.blocked_by_other_process.wait()  # the capture is now stuck on the other process's lock
    (workspace / "made-while-waiting.txt").write_text("x\n")  # so it cannot have staged yet
    assert await repo.resolve(ref(1)) is None and not waiting.done()
    holder.stdin.write(b"release\n")
    await holder.stdin.drain()
    capture = await waiting
    await holder.wait()
    assert "made-while-waiting.txt" in tree_paths(repo, capture.commit)


async def test_unusual_file_names_are_captured_diffed_and_restored(store: CheckpointStore, workspace: Path) -> None:
    names = ["with space.txt", "-leading-dash", "new\nline", "tab\tname", "ünïcode.txt", 'quote"s', "git~1", ".gitx"]
    raw_name = b"latin1-\xe9.bin"  # not UTF-8
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    before = state(workspace)
    for name in names:
        (workspace / name).write_text(name)
    (workspace / os.fsdecode(raw_name)).write_bytes(b"\xe9")
    run1 = await repo.capture(ref(1), "run 1", parent=base.commit)
    added = {c.path for c in await repo.diff(base.commit, run1.commit)}
    assert added == {*names, os.fsdecode(raw_name)}
    assert "+new\n" in await repo.file_diff(base.commit, run1.commit, "new\nline")
    with_files = state(workspace)

    await repo.restore(base.commit)
    assert state(workspace) == before
    await repo.restore(run1.commit)
    assert state(workspace) == with_files


async def test_one_diff_call_reads_as_git_s_raw_and_numstat_read_apart(store: CheckpointStore, workspace: Path) -> None:
    """A diff is one `diff-tree --raw --numstat`; its two parts are told apart by position. Names that look
    like the other part (a header's `:`, a count and a tab), renames, binary files, deletions and a type change
    give the same changes as git's `--raw` and `--numstat` run apart, and a capture reports the same."""
    repo = store.repo("p1", workspace)
    for name in (":R100 looks like a header", "1\t2\tlooks like a count", "moved.txt", "gone.txt", "kind"):
        (workspace / name).write_text(f"{name}\n" * 5)
    base = await repo.capture(ref(0), "baseline")
    (workspace / ":R100 looks like a header").write_text("changed\n")
    (workspace / "1\t2\tlooks like a count").unlink()
    (workspace / "moved.txt").rename(workspace / ":moved here")
    (workspace / "gone.txt").unlink()
    (workspace / "kind").unlink()
    (workspace / "kind").symlink_to("README.md")
    (workspace / "logo.bin").write_bytes(bytes(range(255, -1, -1)) * 4)
    (workspace / "1\t0\t:new").write_text("new\n")
    capture, captured = await repo.capture_changes(ref(1), "after", parent=base.commit)
    assert {":moved here", "1\t0\t:new"} <= set(tree_paths(repo, capture.commit))

    trees = [f"{commit}^{{tree}}" for commit in (base.commit, capture.commit)]
    apart = [shadow_git_bytes(repo, "diff-tree", "-r", "-z", "-M", flag, *trees) for flag in ("--raw", "--numstat")]
    expected = diffs.combine(*apart)
    assert await repo.diff(base.commit, capture.commit) == expected == captured
    by = by_path(expected)
    assert by[":moved here"].status == FileStatus.RENAMED and by[":moved here"].old_path == "moved.txt"
    assert by["logo.bin"].binary and by["1\t2\tlooks like a count"].status == FileStatus.DELETED
    assert by[":R100 looks like a header"].additions == 1 and by["kind"].status == FileStatus.MODIFIED


async def test_a_capture_against_the_last_commits_and_moves_its_ref_as_git_would(
    store: CheckpointStore, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A capture whose tree and parent are loose objects writes its commit and ref in-process; git reads
    them as its own (the ref, the parent, the tree, `fsck --strict`). After `compact` packs them, git
    makes the commit again."""
    calls = git_commands(monkeypatch)
    repo = store.repo("p1", workspace)
    first, _ = await repo.capture_changes(ref(0), "baseline")
    (workspace / "notes.txt").write_text("x\n")
    calls.clear()
    second, changes = await repo.capture_changes(ref(1), "after run 1", parent_ref=ref(0))
    assert "commit-tree" not in calls and "update-ref" not in calls
    assert [c.path for c in changes] == ["notes.txt"]
    assert await repo.resolve(ref(1)) == second.commit and await repo.parent(second.commit) == first.commit
    assert "notes.txt" in tree_paths(repo, second.commit)
    shown = shadow_git(repo, "cat-file", "-p", second.commit)
    assert f"tree {second.tree}\nparent {first.commit}\nauthor Threadloom <" in shown
    assert shown.endswith("\n\nafter run 1")
    shadow_git(repo, "fsck", "--strict")
    await repo.compact()
    calls.clear()
    third, none = await repo.capture_changes(ref(2), "after run 2", parent_ref=ref(1))
    assert none == [] and "commit-tree" in calls and third.parent == second.commit
    assert await repo.resolve(ref(2)) == third.commit


async def test_compact_keeps_what_refs_reach(store: CheckpointStore, workspace: Path) -> None:
    repo = store.repo("p1", workspace)
    kept = await repo.capture(ref(0), "kept")
    (workspace / "extra.txt").write_text("only in the dropped checkpoint\n")
    dropped = await repo.capture(ref(1), "dropped", parent=kept.commit)
    await repo.delete_ref(ref(1))
    await repo.compact()
    with pytest.raises(CheckpointError) as gone:
        await repo.restore(dropped.commit)
    assert gone.value.code == CheckpointErrorCode.UNKNOWN_COMMIT
    await repo.restore(kept.commit)
    assert not (workspace / "extra.txt").exists()
    assert (workspace / "README.md").read_text() == "# demo\nline two\n"


async def test_history_stays_readable_when_the_workspace_is_gone(store: CheckpointStore, workspace: Path) -> None:
    repo = store.repo("p1", workspace)
    base = await repo.capture(ref(0), "baseline")
    sh(workspace.parent, f"rm -rf '{workspace.name}'")
    assert await repo.resolve(ref(0)) == base.commit
    assert {c.path for c in await repo.diff(None, base.commit)} == {"src/app.py", "README.md", "logo.bin"}
    for action in (repo.restore(base.commit), repo.capture(ref(1), "x")):
        with pytest.raises(CheckpointError) as missing:
            await action
        assert missing.value.code == CheckpointErrorCode.WORKSPACE_MISSING
    assert workspace.name not in os.listdir(workspace.parent)  # a restore never recreates a deleted workspace


async def test_exclude_list_changed_after_capture(store: CheckpointStore, workspace: Path) -> None:
    """A path excluded later is dropped from the next capture and never written back by a restore."""
    (workspace / "cache").mkdir()
    (workspace / "cache" / "x").write_text("captured before it was excluded\n")
    base = await store.repo("p1", workspace).capture(ref(0), "baseline")
    repo = store.repo("p1", workspace, ["cache/"])
    (workspace / "cache" / "x").write_text("the user's current content\n")
    (workspace / "README.md").write_text("changed\n")

    restored = await repo.restore(base.commit)
    assert restored.written == ("README.md",)
    assert (workspace / "cache" / "x").read_text() == "the user's current content\n"
    later = await repo.capture(ref(1), "after", parent=base.commit)
    assert [(c.path, c.status) for c in await repo.diff(base.commit, later.commit)] == [("cache/x", FileStatus.DELETED)]


async def _edited_in_the_capture_second(repo: ShadowRepo, folder: Path) -> tuple[str, int] | None:
    """Write `a.txt` and `b.txt`, capture, then rewrite `a.txt` with the same size and delete `b.txt`.
    The capture commit and the second it happened in, when the edit fell in that same second (git then
    sees the same stat data for `a.txt`: seconds, size, inode); None when the clock moved on meanwhile."""
    (folder / "a.txt").write_text("A1\n")
    (folder / "b.txt").write_text("B1\n")
    made = os.stat(folder / "a.txt")
    first = await repo.capture(ref(0), "before the edit")
    (folder / "a.txt").write_text("A2\n")
    (folder / "b.txt").unlink()
    edited = os.stat(folder / "a.txt")
    same = (made.st_mtime_ns // 10**9, made.st_ctime_ns // 10**9) == (
        edited.st_mtime_ns // 10**9,
        edited.st_ctime_ns // 10**9,
    )
    return (first.commit, edited.st_ctime_ns // 10**9) if same else None


@pytest.mark.parametrize("then", ["capture", "restore"])
async def test_a_same_size_edit_in_the_second_of_a_capture_is_never_taken_for_unchanged(
    store: CheckpointStore, workspace: Path, then: str
) -> None:
    """git trusts a file's stat data only when the file changed before the second its index was written; an
    edit in that second with the same size keeps the stat data git compares. The next call drops the deleted
    `b.txt` from the index in the following second, without looking at any file. That must not make the edit
    look clean: the capture holds `A2`, the restore writes `A1` back and says so."""
    repo = store.repo("p1", workspace)
    for _ in range(5):  # a try whose edit crossed into the next second shows nothing: make the files again
        edit = await _edited_in_the_capture_second(repo, workspace)
        if edit is not None:
            break
    assert edit is not None, "every try crossed a second boundary"
    commit, second = edit
    await asyncio.sleep(second + 1.05 - time.time())  # the scenario itself: the next call is a second later
    if then == "capture":
        _, changes = await repo.capture_changes(ref(1), "after the edit", parent=commit)
        assert {c.path: c.status for c in changes} == {"a.txt": FileStatus.MODIFIED, "b.txt": FileStatus.DELETED}
    else:
        restored = await repo.restore(commit)
        assert set(restored.written) == {"a.txt", "b.txt"}
        assert (workspace / "a.txt").read_text() == "A1\n"

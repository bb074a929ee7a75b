"""A project's shadow repository: capture the workspace, diff checkpoints, restore one.

The git dir lives in Threadloom's data dir and the workspace is only its work tree; the index is
a private file in the git dir. The user's own repository (if any) is just more files to git here,
minus its `.git`, so its HEAD, index, branches, refs, stash and hooks are never read or written.

Capture stages the walked workspace into the private index with `update-index`, which skips every
file whose stat data still matches the index (so an unchanged file is never read again), then
`write-tree` reuses the index's cached subtrees and `commit-tree` makes the checkpoint commit.

Restore first stages the workspace (the index then describes the disk exactly), asks git what
differs from the target, removes what the target lacks, and writes the rest itself: each blob is read
with `git cat-file --batch` (git never touches the workspace) and written by the server through folder
descriptors reached from the root with O_NOFOLLOW (`confine`): what stands at a path (a file, a link, a
hard link) is unlinked and a new file created with O_EXCL, a symlink or file standing where the target
has a folder is replaced by a real folder, and nothing is ever written or deleted through a link. Last,
it checks that every path it wrote still names the entry it created and every path it meant to remove
holds no file: an agent that moved things meanwhile gets RESTORE_CONFLICT naming those paths, never an
answer claiming them restored. Each step is recomputed from the disk, so a restore that was interrupted
(or refused that way) is finished by running it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import stat
import subprocess
import threading
import time
import zlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeVar

from threadloom.checkpoints.confine import (
    Dirs,
    changed_is_conflict,
    lstat_at,
    open_root,
    remove_empty_folders,
    unlink_at,
    walk_below,
    write_at,
)
from threadloom.checkpoints.diffs import DIFF_TREE, EMPTY_TREE, FileChange, changes_of
from threadloom.checkpoints.errors import CheckpointError, CheckpointErrorCode
from threadloom.checkpoints.excludes import Excludes
from threadloom.checkpoints.git import IDENTITY, SHADOW_ATTRIBUTES, SHADOW_CONFIG, Git
from threadloom.checkpoints.locks import RepoLock
from threadloom.checkpoints.refs import check_commit, check_prefix, check_ref, ref_sort_key
from threadloom.checkpoints.walk import Fingerprint, is_git_name, walk_marked, walk_workspace
from threadloom.faults import crash_point

INDEX_NAME = "threadloom-index"
STAGE_TRIES = 3  # walks of a workspace whose folders keep turning into links before WORKSPACE_CHANGING
T = TypeVar("T")
# What `git update-index` says when a listed path changed kind under it (a folder swapped for a link).
_SWAPPED = (
    b"beyond a symbolic link",  # a listed folder became a link
    b"is a directory - add files inside instead",  # a listed file or link became a folder
    b'readlink("',  # a listed link became a folder or file
    b"Not a directory",  # a listed folder became a file
    b"No such file or directory",  # gone between git's lstat and its read (or behind a link now)
)
COMMITS_KEPT = 4096  # commit → tree pairs a store remembers (`ShadowRepo._known_ref`)
_SETTINGS_WRITTEN: dict[Path, str] = {}  # git dir → the exclude file text this process last wrote there


@dataclass(frozen=True, slots=True)
class Capture:
    """A checkpoint commit and its tree (equal trees mean equal workspaces)."""

    commit: str
    tree: str
    parent: str | None = None  # the commit it was captured against (`capture_changes`), if any


@dataclass(frozen=True, slots=True)
class Restored:
    """What a restore changed on disk (both empty when the workspace already matched). `removed` holds only
    what this restore unlinked: a path it skipped (its folder had become a link, or it was gone already) is
    left out, although the restore checked it holds no file now."""

    written: tuple[str, ...]
    removed: tuple[str, ...]


def _config_text() -> str:
    sections: dict[str, list[str]] = {}
    for key, value in SHADOW_CONFIG.items():
        section, name = key.split(".", 1)
        sections.setdefault(section, []).append(f"\t{name} = {value}\n")
    sections.setdefault("core", []).insert(0, "\trepositoryformatversion = 0\n")
    return "".join(f"[{section}]\n" + "".join(lines) for section, lines in sections.items())


def _write_if_changed(path: Path, text: str) -> None:
    if path.exists() and path.read_text() == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".tmp")
    partial.write_text(text)
    partial.replace(path)


async def _done() -> None:
    """Work already done (the ref written in-process), awaited where git's `update-ref` would be."""


def _z(paths: list[bytes] | list[str]) -> bytes:
    """A NUL-terminated list for `--stdin -z`."""
    return b"".join((p if isinstance(p, bytes) else os.fsencode(p)) + b"\0" for p in paths)


class ShadowRepo:
    """One project's checkpoints. Get it from `CheckpointStore.repo`; methods are coroutine-safe."""

    def __init__(
        self,
        git: Git,
        excludes: Excludes,
        lock: RepoLock,
        trees: dict[tuple[str, ...], Any] | None = None,
        commits: dict[str, str] | None = None,
    ) -> None:
        self._git = git
        self.git_dir = git.git_dir
        self.workspace = git.work_tree
        self.excludes = excludes
        self.lock = lock
        # The store's memory of each index's last capture: (fingerprint of the files, their tree).
        self._trees: dict[tuple[str, ...], tuple[Fingerprint, str]] = trees if trees is not None else {}
        self._key = (str(self.git_dir), str(git.index_file), str(self.workspace), *excludes.patterns)
        # The trees of commits the store made or resolved lately (a commit's tree never changes).
        self._commits: dict[str, str] = commits if commits is not None else {}

    # -- setup -------------------------------------------------------------------------------

    async def _ensure(self) -> None:
        """Create the repository on first use; (re)write its config, attributes and excludes (in a
        thread, once per repository and exclude list in this process: a run's end waits for this)."""
        if not (self.git_dir / "HEAD").exists():
            self.git_dir.parent.mkdir(parents=True, exist_ok=True)
            await self._git.run("init", "--bare", "--quiet", "--template=", str(self.git_dir), bare=True)
            _SETTINGS_WRITTEN.pop(self.git_dir, None)  # a new repository: its config is git's own
        excludes = self.excludes.file_text()
        if _SETTINGS_WRITTEN.get(self.git_dir) != excludes:
            await asyncio.to_thread(self._write_settings, excludes)
            _SETTINGS_WRITTEN[self.git_dir] = excludes
        # Under our lock no git of ours is running on this index: a lock file left by a crash is stale.
        (self.git_dir / f"{INDEX_NAME}.lock").unlink(missing_ok=True)

    def _write_settings(self, excludes: str) -> None:
        _write_if_changed(self.git_dir / "config", _config_text())
        _write_if_changed(self.git_dir / "info" / "attributes", SHADOW_ATTRIBUTES)
        _write_if_changed(self.git_dir / "info" / "exclude", excludes)

    @contextlib.contextmanager
    def _root(self) -> Iterator[int]:
        """The workspace root's descriptor for one operation (`confine.open_root`: WORKSPACE_MISSING, or
        UNSAFE_WORKSPACE for a root that is or passes through a symlink); every file operation of the
        operation starts from it."""
        fd = open_root(self.workspace)
        try:
            yield fd
        finally:
            os.close(fd)

    # -- capture -----------------------------------------------------------------------------

    async def _stage(self, root: int) -> None:
        """Make the private index describe the workspace exactly (`_staged_again` on a swap)."""
        await _staged_again(lambda: self._stage_once(root))

    async def _stage_once(self, root: int) -> None:
        present, listing = await asyncio.gather(
            asyncio.to_thread(walk_workspace, root, self.excludes, self.git_dir, self.workspace),
            self._git.run("ls-files", "-z"),
        )
        await self._stage_listed(root, present, listing.stdout)

    async def _stage_or_reuse(self, root: int) -> tuple[str | None, Fingerprint | None]:
        """The last capture's tree when the files' stat data is as it was then (no git at all); else
        stage (`_stage`) and answer None. Also the fingerprint, for `_remember`."""
        return await _staged_again(lambda: self._stage_or_reuse_once(root))

    async def _stage_or_reuse_once(self, root: int) -> tuple[str | None, Fingerprint | None]:
        present, mark = await asyncio.to_thread(walk_marked, root, self.excludes, self.git_dir, self.workspace)
        known = self._trees.get(self._key)
        if mark is not None and known is not None and known[0] == mark:
            return known[1], mark
        listing = await self._git.run("ls-files", "-z")
        await self._stage_listed(root, present, listing.stdout)
        return None, mark

    def _remember(self, mark: Fingerprint | None, tree: str) -> None:
        if mark is None:
            self._trees.pop(self._key, None)
        else:
            self._trees[self._key] = (mark, tree)

    async def _stage_listed(self, root: int, present: list[bytes], ls_files: bytes) -> None:
        """Drop the index entries the walk no longer found (index only: no work tree), then let git read
        the walked files, sandboxed (`git.sandbox_argv`): it reads only the changed ones."""
        listed = ls_files.split(b"\0")
        stale = set(listed) - set(present) - {b""}
        if stale:  # gone from disk, now excluded, or replaced by a folder
            dropped = b"".join(map(_unlisted, sorted(stale)))
            await self._git.rewrite_index("update-index", "-z", "--index-info", stdin=dropped)
        if present:
            added = await self._git.run(
                "update-index",
                "-z",
                "--add",
                "--remove",
                "--replace",
                "--stdin",
                stdin=_z(present),
                workspace_fd=root,
                check=False,
            )
            if added.returncode != 0 and any(sign in added.stderr for sign in _SWAPPED):
                # A folder the walk listed became a link (or a link a folder) before git read it.
                raise CheckpointError(CheckpointErrorCode.WORKSPACE_CHANGING, added.stderr.decode(errors="replace"))
            if added.returncode != 0:
                message = added.stderr.decode(errors="replace").strip()[:2000]
                raise CheckpointError(CheckpointErrorCode.GIT_FAILED, f"git update-index failed: {message}")

    async def capture(self, ref: str, message: str, parent: str | None = None) -> Capture:
        """Commit the whole workspace as a checkpoint on `ref` (also when nothing changed)."""
        check_ref(ref)
        async with self.lock.hold():
            await self._ensure()
            with self._root() as root:
                commit, tree = await self._capture(root, ref, message, parent)
        return Capture(commit, tree)

    async def _capture(self, root: int, ref: str, message: str, parent: str | None) -> tuple[str, str]:
        # Checking the parent alongside staging: a refused parent leaves only a fresher index.
        staged = asyncio.create_task(self._stage(root))
        try:
            parents = ["-p", await self._commit(parent)] if parent is not None else []
        finally:
            await staged
        tree = await self._git.rewrite_index_text("write-tree")  # reuses the index's cached subtrees
        commit = await self._git.text("commit-tree", tree, *parents, stdin=message.encode())
        await self._git.run("update-ref", "--no-deref", ref, commit)
        return commit, tree

    async def capture_changes(
        self, ref: str, message: str, parent: str | None = None, *, parent_ref: str | None = None
    ) -> tuple[Capture, list[FileChange]]:
        """`capture`, then `diff(parent, capture)`, in fewer git calls: a run's end waits for this.

        The parent's tree is looked up while staging, the diff compares trees (no commit lookups),
        runs alongside the ref update, and is skipped when the trees are equal (nothing changed).
        `parent_ref`, a checkpoint ref instead of `parent`, is resolved while staging too; when it
        names nothing the capture has no parent (`Capture.parent` None)."""
        check_ref(ref)
        if parent_ref is not None:
            check_ref(parent_ref)
        async with self.lock.hold():
            await self._ensure()
            with self._root() as root:
                return await self._capture_changes(root, ref, message, parent, parent_ref)

    async def _capture_changes(
        self, root: int, ref: str, message: str, parent: str | None, parent_ref: str | None
    ) -> tuple[Capture, list[FileChange]]:
        base = self._known_ref(parent_ref) if parent is None and parent_ref is not None else None
        if base is not None or (parent is None and parent_ref is None):  # nothing to ask git meanwhile
            reused, mark = await self._stage_or_reuse(root)
        else:
            staged = asyncio.create_task(self._stage_or_reuse(root))
            try:
                if parent is not None:
                    base = await self._commit_and_tree(parent)
                elif parent_ref is not None:
                    base = await self._ref_commit_and_tree(parent_ref)
            finally:
                reused, mark = await staged
        tree = reused or await self._git.rewrite_index_text("write-tree")
        self._remember(mark, tree)
        parent_commit = base[0] if base is not None else None
        # In a thread: a loaded disk can take milliseconds, and a run's end reads meanwhile.
        commit = await asyncio.to_thread(self._write_commit_and_ref, tree, parent_commit, message, ref)
        if commit is None:
            parents = ["-p", parent_commit] if parent_commit is not None else []
            commit = await self._git.text("commit-tree", tree, *parents, stdin=message.encode())
            moved: Awaitable[object] = self._git.run("update-ref", "--no-deref", ref, commit)
        else:
            moved = _done()
        self._met(commit, tree)
        old = base[1] if base is not None else EMPTY_TREE
        captured = Capture(commit, tree, base[0] if base is not None else None)
        if old == tree:
            await moved
            return captured, []
        _, out = await asyncio.gather(moved, self._git.run(*DIFF_TREE, old, tree))
        return captured, changes_of(out.stdout)

    def _loose(self, oid: str) -> Path:
        return self.git_dir / "objects" / oid[:2] / oid[2:]

    def _write_commit(self, tree: str, parent: str | None, message: str) -> str | None:
        """`git commit-tree` without a process: the commit object written as git writes a loose one
        (zlib of `commit <size>\\0` and the body; its SHA-1 names it), with the identity and UTC time
        every git call here gets. Only when the tree and the parent are loose objects on disk (they
        are whenever the last capture made them, until `compact` packs them): a commit never names an
        object the repository lacks. None: ask git."""
        if len(tree) != 40 or not self._loose(tree).is_file():
            return None
        if parent is not None and (len(parent) != 40 or not self._loose(parent).is_file()):
            return None
        stamp = f"{int(time.time())} +0000"
        who = f"{IDENTITY['GIT_COMMITTER_NAME']} <{IDENTITY['GIT_COMMITTER_EMAIL']}>"
        lines = [f"tree {tree}", *([f"parent {parent}"] if parent is not None else [])]
        lines += [f"author {who} {stamp}", f"committer {who} {stamp}", "", message]
        body = "\n".join(lines).encode()
        raw = b"commit %d\0" % len(body) + body
        oid = hashlib.sha1(raw, usedforsecurity=False).hexdigest()
        path = self._loose(oid)
        if not path.is_file():
            path.parent.mkdir(exist_ok=True)
            temporary = path.parent / f"tmp_obj_{oid}_{os.getpid()}"
            temporary.write_bytes(zlib.compress(raw))
            os.chmod(temporary, 0o444)
            os.replace(temporary, path)
        return oid

    def _write_commit_and_ref(self, tree: str, parent: str | None, message: str, ref: str) -> str | None:
        """`_write_commit`, then `_write_ref` of what it wrote (None: neither, ask git)."""
        commit = self._write_commit(tree, parent, message)
        if commit is not None:
            self._write_ref(ref, commit)
        return commit

    def _write_ref(self, ref: str, commit: str) -> None:
        """`git update-ref --no-deref` of a checkpoint ref without a process: the loose ref file written
        through `<ref>.lock` and renamed, as git does (no reflog: `core.logAllRefUpdates` is off here). A
        loose ref outranks a packed one. Under the repository's lock no git of ours touches the ref."""
        path = self.git_dir / ref
        path.parent.mkdir(parents=True, exist_ok=True)
        locked = path.parent / f"{path.name}.lock"
        locked.write_text(f"{commit}\n")
        os.replace(locked, path)

    async def _ref_commit_and_tree(self, ref: str) -> tuple[str, str] | None:
        """The commit a checkpoint ref points at and its tree, None when there is no such ref."""
        found = await self._git.run("rev-parse", f"{ref}^{{commit}}", f"{ref}^{{tree}}", check=False)
        lines = found.stdout.decode().split()
        if found.returncode != 0 or len(lines) != 2:
            return None
        self._met(lines[0], lines[1])
        return lines[0], lines[1]

    def _known_ref(self, ref: str) -> tuple[str, str] | None:
        """`_ref_commit_and_tree` without running git, when the ref is a loose ref file naming a commit
        whose tree this store met (the previous run's end, usually); None: ask git (a packed ref, no
        ref, a commit not met). Under the repository's lock no git of ours is moving the ref."""
        try:
            commit = (self.git_dir / ref).read_text().strip()
        except (OSError, UnicodeDecodeError):
            return None
        tree = self._commits.get(commit)
        return (commit, tree) if tree is not None else None

    def _met(self, commit: str, tree: str) -> None:
        self._commits[commit] = tree
        while len(self._commits) > COMMITS_KEPT:
            del self._commits[next(iter(self._commits))]  # the oldest

    async def _commit_and_tree(self, commit: str) -> tuple[str, str]:
        """The full id of a commit of this repository and its tree's, or UNKNOWN_COMMIT."""
        check_commit(commit)
        found = await self._git.run("rev-parse", f"{commit}^{{commit}}", f"{commit}^{{tree}}", check=False)
        lines = found.stdout.decode().split()
        if found.returncode != 0 or len(lines) != 2:
            raise CheckpointError(CheckpointErrorCode.UNKNOWN_COMMIT, f"no such checkpoint commit: {commit}")
        return lines[0], lines[1]

    # -- reading -----------------------------------------------------------------------------

    async def _commit(self, commit: str) -> str:
        """The full id of a commit of this repository, or UNKNOWN_COMMIT."""
        check_commit(commit)
        found = await self._git.run("rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}", check=False)
        if found.returncode != 0:
            raise CheckpointError(CheckpointErrorCode.UNKNOWN_COMMIT, f"no such checkpoint commit: {commit}")
        return found.stdout.decode().strip()

    async def _initialized(self) -> bool:
        return (self.git_dir / "HEAD").exists()

    async def resolve(self, ref: str) -> str | None:
        """The commit a checkpoint ref points at, None when there is no such ref."""
        check_ref(ref)
        if not await self._initialized():
            return None
        found = await self._git.run("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}", check=False)
        return found.stdout.decode().strip() if found.returncode == 0 else None

    async def parent(self, commit: str) -> str | None:
        """The checkpoint a capture was made against (its `parent`), None for a first capture."""
        full = await self._commit(commit)
        out = await self._git.text("rev-list", "--parents", "-n", "1", full)
        parents = out.split()[1:]
        return parents[0] if parents else None

    async def update_ref(self, ref: str, commit: str) -> None:
        """Point `ref` at an existing checkpoint commit (e.g. to mark one stale under another name)."""
        check_ref(ref)
        target = await self._commit(commit)
        await self._git.run("update-ref", "--no-deref", ref, target)

    async def delete_ref(self, ref: str) -> None:
        """Remove a ref; a missing one is not an error (deleting twice is harmless)."""
        check_ref(ref)
        if await self._initialized():
            await self._git.run("update-ref", "--no-deref", "-d", ref)

    async def list_refs(self, prefix: str) -> list[tuple[str, str]]:
        """(ref, commit) under `prefix`, ordinals in numeric order."""
        check_prefix(prefix)
        if not await self._initialized():
            return []
        out = await self._git.run("for-each-ref", "--format=%(refname)%00%(objectname)", prefix)
        pairs = [tuple(line.split("\0", 1)) for line in out.stdout.decode().splitlines() if line]
        return sorted(((ref, commit) for ref, commit in pairs), key=lambda pair: ref_sort_key(pair[0]))

    async def diff(self, from_commit: str | None, to_commit: str) -> list[FileChange]:
        """Files that differ from `from_commit` (None: from nothing) to `to_commit`, renames paired."""
        old = await self._commit(from_commit) if from_commit is not None else EMPTY_TREE
        new = await self._commit(to_commit)
        out = await self._git.run(*DIFF_TREE, old, new)
        return changes_of(out.stdout)

    async def file_diff(self, from_commit: str | None, to_commit: str, path: str, old_path: str | None = None) -> str:
        """Unified diff of one path (and its old path, for a rename) between two checkpoints."""
        old = await self._commit(from_commit) if from_commit is not None else EMPTY_TREE
        new = await self._commit(to_commit)
        paths = [self._relative(p) for p in ([old_path, path] if old_path else [path])]
        out = await self._git.run(
            "diff-tree", "-p", "-M", "--no-color", "--no-ext-diff", "--no-textconv", old, new, "--", *paths
        )
        return out.stdout.decode(errors="replace")

    @staticmethod
    def _relative(path: str) -> str:
        parts = path.split("/")
        if not path or path.startswith("/") or any(p in ("", ".", "..") or is_git_name(p) for p in parts):
            raise CheckpointError(CheckpointErrorCode.INVALID_PATH, f"not a workspace-relative path: {path!r}")
        return path

    async def compact(self) -> None:
        """Pack objects and drop those no ref reaches (automatic gc is off: it never pauses a capture).

        Only refs keep checkpoints: a commit whose ref was deleted is gone after this. Runs under
        the repository's lock, so no capture has written objects that are not yet on a ref.
        """
        async with self.lock.hold():
            for key in [k for k in self._trees if k[0] == str(self.git_dir)]:
                del self._trees[key]  # a remembered tree may be among what gc drops
            if await self._initialized():
                await self._git.run("gc", "--quiet", "--prune=now")

    # -- restore -----------------------------------------------------------------------------

    async def restore(self, commit: str, paths: Sequence[str] | None = None) -> Restored:
        """Make the workspace equal to the checkpoint's tree, leaving `.git` and excluded paths alone; with
        `paths`, only those paths (each written as the checkpoint has it, or removed if it has none)."""
        async with self.lock.hold():
            await self._ensure()
            with self._root() as root:
                return await self._restore(root, commit, paths)

    async def changed_paths(self, from_commit: str, to_commit: str) -> set[str]:
        """Every path whose content differs between two checkpoints (a rename counts as both of its paths)."""
        old, new = await self._commit(from_commit), await self._commit(to_commit)
        out = await self._git.run("diff-tree", "-r", "-z", "--name-only", "--no-renames", old, new)
        return {os.fsdecode(p) for p in out.stdout.split(b"\0") if p}

    async def present(self, commit: str, paths: Sequence[str]) -> set[str]:
        """Which of `paths` the checkpoint holds (as a file or a link)."""
        return set(await self.blobs(commit, paths))

    async def blobs(self, commit: str, paths: Sequence[str]) -> dict[str, str]:
        """The content id of each of `paths` the checkpoint holds (a path it has not is left out). The whole
        tree is listed and filtered here: `ls-tree` reads its path arguments as patterns, not names."""
        if not paths:
            return {}
        wanted = set(paths)
        tree = await self._commit(commit)
        out = await self._git.run("ls-tree", "-r", "-z", "--full-tree", tree)
        found = {}
        for entry in out.stdout.split(b"\0"):
            meta, _, raw = entry.partition(b"\t")
            name = os.fsdecode(raw)
            if name in wanted:
                found[name] = meta.split(b" ")[2].decode()
        return found

    async def differs_now(self, commit: str, paths: Sequence[str] | None) -> set[str]:
        """Which of `paths` (None: any path) the workspace holds differently from the checkpoint now (walked
        as a capture is)."""
        if paths is not None and not paths:
            return set()
        async with self.lock.hold():
            await self._ensure()
            with self._root() as root:
                staged = asyncio.create_task(self._stage(root))
                try:
                    target = await self._commit(commit)
                finally:
                    await staged
                only = ["--", *_literal(paths)] if paths is not None else []
                out = await self._git.run("diff-index", "--cached", "-z", "--no-renames", "--name-only", target, *only)
        return {os.fsdecode(p) for p in out.stdout.split(b"\0") if p}

    async def _restore(self, root: int, commit: str, paths: Sequence[str] | None = None) -> Restored:
        staged = asyncio.create_task(self._stage(root))
        try:
            target = await self._commit(commit)
        finally:
            await staged
        only = ["--", *_literal(paths)] if paths is not None else []
        if paths is not None and not paths:
            return Restored((), ())
        out = await self._git.run("diff-index", "--cached", "-z", "--no-renames", "--raw", target, *only)
        fields = out.stdout.split(b"\0")
        remove: list[str] = []
        write: list[str] = []
        blobs: list[tuple[str, int, bytes]] = []
        # Index lines making the index match the target; removals first (a file may become a folder).
        removals: list[bytes] = []
        entries: list[bytes] = []
        for header, raw in zip(fields[0::2], fields[1::2], strict=False):
            # ":<target mode> <disk mode> <target id> <disk id> <status>": target is the old side.
            mode, _disk_mode, blob, _disk_blob, letter = header[1:].split(b" ")
            path = os.fsdecode(raw)
            if letter == b"A":
                remove.append(path)
                removals.append(_unlisted(raw))
            elif not self.excludes.covers(path):
                write.append(path)
                blobs.append((path, int(mode, 8), blob))
                entries.append(mode + b" " + blob + b"\t" + raw + b"\0")
        removed = set(remove)
        blocked = await asyncio.to_thread(self._blocked_folders, root, write, removed)
        if blocked:
            raise CheckpointError(
                CheckpointErrorCode.RESTORE_CONFLICT,
                f"folders hold files a restore must not remove (.git or excluded): {', '.join(blocked)}",
            )
        unlinked = await asyncio.to_thread(self._remove, root, remove, write)
        crash_point("restore-midway")  # test-only: killed with files removed and none written yet
        if removals or entries:  # only the differing entries change: the others keep their stat data
            await self._git.rewrite_index("update-index", "-z", "--index-info", stdin=b"".join(removals + entries))
        made = await asyncio.to_thread(self._checkout, root, blobs) if blobs else {}
        missed = await asyncio.to_thread(_not_in_place, root, made, remove)
        if missed:
            raise CheckpointError(
                CheckpointErrorCode.RESTORE_CONFLICT,
                f"the workspace changed during the restore; not restored: {', '.join(missed)}",
            )
        return Restored(tuple(sorted(write)), tuple(sorted(unlinked)))

    def _blocked_folders(self, root: int, write: list[str], removed: set[str]) -> list[str]:
        """Paths the target has as files where the disk has a folder with something we may not remove."""
        blocked = []
        with changed_is_conflict("checking folders"), Dirs(root) as dirs:
            for path in write:
                folder = dirs.get(path)  # None: not a real folder (a link is not entered)
                if folder is None:
                    continue
                for rel, folders, others in walk_below(folder):
                    inside = f"{path}/{rel}" if rel else path
                    if any(is_git_name(d) for d in folders) or any(
                        f"{inside}/{name}" not in removed for name in others
                    ):
                        blocked.append(path)
                        break
        return blocked

    def _remove(self, root: int, remove: list[str], write: list[str]) -> list[str]:
        """Delete what the target lacks, then the folders this emptied (never the workspace root); answers
        the paths it unlinked.

        Every unlink and rmdir is relative to a folder reached from the root without following a link: a
        path whose folder is now a link (swapped in since staging) is skipped, its file is not in the
        workspace any more (and it is not answered as removed)."""
        folders: set[str] = set()
        unlinked: list[str] = []
        with changed_is_conflict("removing"), Dirs(root) as dirs:
            for path in remove:
                parent, _, name = path.rpartition("/")
                fd = dirs.get(parent)
                st = None if fd is None else lstat_at(fd, name)
                if fd is None or st is None or stat.S_ISDIR(st.st_mode):
                    continue  # gone, behind a link now, or became a folder since staging: leave it
                if not unlink_at(fd, name):
                    continue  # gone (or a folder) between the look and the unlink
                unlinked.append(path)
                while parent:
                    folders.add(parent)
                    parent = parent.rpartition("/")[0]
            for path in write:  # a folder standing where the target has a file (checked empty of others)
                parent, _, name = path.rpartition("/")
                fd = dirs.get(parent)
                if fd is not None:
                    remove_empty_folders(fd, name)
        for folder in sorted(folders, key=lambda p: p.count("/"), reverse=True):
            with Dirs(root) as dirs:  # afresh: the folders above were just removed, their descriptors stale
                parent, _, name = folder.rpartition("/")
                fd = dirs.get(parent)
                if fd is not None:
                    with contextlib.suppress(OSError):  # not empty (excluded or other content): keep it
                        os.rmdir(name, dir_fd=fd)
        return unlinked

    def _checkout(self, root: int, blobs: list[tuple[str, int, bytes]]) -> dict[str, tuple[int, int]]:
        """Write the target's files (what `git checkout-index --force` did, without letting git near the
        workspace): contents from `git cat-file --batch` (no work tree), each file created in its folder's
        descriptor (`confine.write_at`), folders made or put in place of a file or link (`Dirs.make`).
        Answers each path's new (device, inode)."""
        made: dict[str, tuple[int, int]] = {}
        how = self._git.launch("cat-file", "--batch")
        with subprocess.Popen(
            how.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=how.env, cwd=how.cwd
        ) as process:
            assert process.stdin is not None and process.stdout is not None
            ids = b"".join(blob + b"\n" for _, _, blob in blobs)
            feeder = threading.Thread(target=_feed, args=(process.stdin, ids), daemon=True)
            feeder.start()
            try:
                with changed_is_conflict("writing"), Dirs(root) as dirs:
                    for path, mode, blob in blobs:
                        header = process.stdout.readline().split()
                        if len(header) != 3 or header[0] != blob:
                            raise CheckpointError(CheckpointErrorCode.GIT_FAILED, f"git cat-file: no object {blob!r}")
                        content = process.stdout.read(int(header[2]))
                        process.stdout.read(1)  # the newline after each object
                        parent, _, name = path.rpartition("/")
                        made[path] = write_at(dirs.make(parent), name, mode, content)
            finally:
                process.kill()
                feeder.join()
        return made


def _not_in_place(root: int, made: dict[str, tuple[int, int]], removed: list[str]) -> list[str]:
    """The paths a restore could not leave as the target has them, looked up afresh from the root (never
    through a link): a written path that no longer names the entry written there (its folder swapped or
    moved meanwhile), a removed one where a file or link stands again. A folder at a removed path is fine:
    the target has a folder there, or nothing."""
    missed = []
    with changed_is_conflict("checking the restore"), Dirs(root) as dirs:
        for path, (device, inode) in made.items():
            parent, _, name = path.rpartition("/")
            fd = dirs.get(parent)
            st = None if fd is None else lstat_at(fd, name)
            if st is None or (st.st_dev, st.st_ino) != (device, inode):
                missed.append(path)
        for path in removed:
            parent, _, name = path.rpartition("/")
            fd = dirs.get(parent)
            st = None if fd is None else lstat_at(fd, name)
            if st is not None and not stat.S_ISDIR(st.st_mode):
                missed.append(path)
    return sorted(missed)


async def _staged_again(stage: Callable[[], Awaitable[T]]) -> T:
    """`stage()`, walked and staged afresh when a folder was swapped for a link between the walk and git's
    read (WORKSPACE_CHANGING); an agent swapping on every try gets that error after `STAGE_TRIES`."""
    for _ in range(STAGE_TRIES - 1):
        try:
            return await stage()
        except CheckpointError as error:
            if error.code != CheckpointErrorCode.WORKSPACE_CHANGING:
                raise
    return await stage()


def _feed(pipe: IO[bytes], data: bytes) -> None:
    """Write `data` to a child's stdin and close it (in a thread: the child answers as it reads)."""
    with contextlib.suppress(BrokenPipeError), pipe:
        pipe.write(data)


def _literal(paths: Sequence[str]) -> list[str]:
    """Pathspecs naming exactly these workspace-relative paths: every git here runs with
    GIT_LITERAL_PATHSPECS=1 (no glob or magic read into them), so each is the path itself, checked."""
    return [ShadowRepo._relative(p) for p in paths]


def _unlisted(path: bytes) -> bytes:
    """An `update-index --index-info` line removing `path` from the index (mode 0)."""
    return b"0 " + b"0" * 40 + b"\t" + path + b"\0"

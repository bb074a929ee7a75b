"""Listing what a checkpoint captures: every file and symlink in the workspace.

The walk never follows a symlink (a link is an entry of its own, stored as a link), never enters
an entry named `.git` at any depth (the user's repository, a nested clone, a worktree's `.git`
file), never enters the shadow repository itself should it live inside the workspace, and prunes
what the project's exclude list names. Sockets, FIFOs and devices are not content and are
skipped. Nested repositories are walked like any folder: their files are captured, their `.git`
is not.

Everything goes through directory descriptors (`confine.py`): the walk reads only inside the workspace,
whatever links it holds or swaps in while it runs.
"""

from __future__ import annotations

import errno
import os
import time
from pathlib import Path

from threadloom.checkpoints.confine import DIR_FLAGS, open_root
from threadloom.checkpoints.excludes import Excludes


def is_git_name(name: str) -> bool:
    """`.git` in any letter case (git itself refuses such a path component in an index)."""
    return name.lower() == ".git"


def walk_workspace(
    root: Path | int, excludes: Excludes, skip: Path | None = None, root_path: Path | None = None
) -> list[bytes]:
    """Workspace-relative paths (bytes, `/`-separated) of the files and symlinks to capture.

    `root` is the workspace's descriptor from `confine.open_root` (a path is opened that way here).
    Folders are entered only through descriptors opened with O_NOFOLLOW from their parent's: a folder
    swapped for a link while the walk runs is not entered (its name is simply not listed). `skip` (the
    shadow git dir, should it lie inside) is left out; with a descriptor, `root_path` says where it is."""
    return _walk(root, excludes, skip, None, root_path)


def walk_marked(
    root: int, excludes: Excludes, skip: Path | None, root_path: Path
) -> tuple[list[bytes], Fingerprint | None]:
    """`walk_workspace` and the `fingerprint` of what it found, stat-ing each file from its folder's descriptor
    during the walk (up to `FINGERPRINT_FILES` files)."""
    stats: list[os.stat_result] = []
    found = _walk(root, excludes, skip, stats, root_path)
    return found, (fingerprint(found, stats) if len(stats) == len(found) else None)


def _walk(
    root: Path | int,
    excludes: Excludes,
    skip: Path | None,
    stats: list[os.stat_result] | None,
    root_path: Path | None = None,
) -> list[bytes]:
    if not isinstance(root, int):
        fd = open_root(root)
        try:
            return _walk(fd, excludes, skip, stats, root_path or root)
        finally:
            os.close(fd)
    skip_rel = None
    if skip is not None and root_path is not None and skip.is_relative_to(root_path) and skip != root_path:
        skip_rel = skip.relative_to(root_path).as_posix()
    found: list[bytes] = []
    # Depth first; a folder's descriptor stays open while its sub-folders are walked (open fds = depth).
    stack: list[tuple[int, str, list[str]]] = []
    try:
        first = os.dup(root)
        stack.append((first, "", _scan(first, "", excludes, skip_rel, found, stats)))
        while stack:
            fd, relative, folders = stack[-1]
            if not folders:
                os.close(fd)
                stack.pop()
                continue
            name = folders.pop()
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno in (errno.ENOENT, errno.ENOTDIR, errno.ELOOP):
                    continue  # gone, or swapped for a file or link since it was listed: not entered
                raise
            rel = f"{relative}{name}/"
            stack.append((child, rel, []))
            stack[-1][2].extend(_scan(child, rel, excludes, skip_rel, found, stats))
    finally:
        for fd, _, _ in stack:
            os.close(fd)
    return found


def _scan(
    fd: int,
    relative: str,
    excludes: Excludes,
    skip_rel: str | None,
    found: list[bytes],
    stats: list[os.stat_result] | None,
) -> list[str]:
    """List one folder: its files and links go to `found` (their stat data to `stats`, while it is kept),
    its sub-folders to walk are returned."""
    folders: list[str] = []
    with os.scandir(fd) as entries:
        for entry in entries:
            name = entry.name
            if len(name) == 4 and name.lower() == ".git":
                continue
            rel = relative + name
            try:
                # d_type from readdir: no stat call per entry (fstatat only where the type is unknown).
                if entry.is_symlink():
                    is_dir = False
                elif entry.is_dir(follow_symlinks=False):
                    is_dir = True
                elif entry.is_file(follow_symlinks=False):
                    is_dir = False
                else:
                    continue  # socket, FIFO, device: not content
            except FileNotFoundError:
                continue
            if is_dir:
                if rel == skip_rel or (excludes and excludes.excluded(rel, True)):
                    continue
                folders.append(name)
                continue
            if excludes and excludes.excluded(rel, False):
                continue
            if stats is not None and len(stats) == len(found) and len(found) < FINGERPRINT_FILES:
                try:
                    stats.append(entry.stat(follow_symlinks=False))  # fstatat on this folder's descriptor
                except FileNotFoundError:
                    continue
            found.append(os.fsencode(rel))
    return folders


FINGERPRINT_FILES = 5000  # above this, stat-ing every file again costs about what git's own staging does
RACY_SECONDS = 2.0  # a change within a file system's timestamp tick of the last one leaves its stat data as it was

Fingerprint = tuple[tuple[bytes, int, int, int, int, int], ...]


def fingerprint(paths: list[bytes], stats: list[os.stat_result]) -> Fingerprint | None:
    """The stat data of the walked files (mode, size, inode, mtime, ctime): equal fingerprints mean the
    same files with the same contents, so a capture can reuse the last one's tree without git.

    None when it would not be safe or cheap: a file changed in the last `RACY_SECONDS` (a further change
    within the same timestamp tick would not show), or more than `FINGERPRINT_FILES` files. ctime
    catches a rewrite that puts the old mtime back (nothing but the kernel sets it)."""
    if len(paths) > FINGERPRINT_FILES or len(stats) != len(paths):
        return None
    recent = time.time_ns() - int(RACY_SECONDS * 1e9)
    found = []
    for rel, st in zip(paths, stats, strict=True):
        if st.st_mtime_ns > recent or st.st_ctime_ns > recent:
            return None
        found.append((rel, st.st_mode, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(found)

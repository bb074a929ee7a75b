"""Listing what a checkpoint captures: every file and symlink in the workspace.

The walk never follows a symlink (a link is an entry of its own, stored as a link), never enters
an entry named `.git` at any depth (the user's repository, a nested clone, a worktree's `.git`
file), never enters the shadow repository itself should it live inside the workspace, and prunes
what the project's exclude list names. Sockets, FIFOs and devices are not content and are
skipped. Nested repositories are walked like any folder: their files are captured, their `.git`
is not.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from threadloom.checkpoints.excludes import Excludes


def is_git_name(name: str) -> bool:
    """`.git` in any letter case (git itself refuses such a path component in an index)."""
    return name.lower() == ".git"


def walk_workspace(root: Path, excludes: Excludes, skip: Path | None = None) -> list[bytes]:
    """Workspace-relative paths (bytes, `/`-separated) of the files and symlinks to capture."""
    found: list[bytes] = []
    skip_key = os.fsencode(skip) if skip is not None else None
    pending: list[tuple[bytes, bytes]] = [(os.fsencode(root), b"")]
    while pending:
        absolute, relative = pending.pop()
        try:
            entries = os.scandir(absolute)
        except (FileNotFoundError, NotADirectoryError):
            continue  # removed while walking: simply not there any more
        with entries:
            for entry in entries:
                name = entry.name
                if len(name) == 4 and name.lower() == b".git":
                    continue
                rel = relative + name
                try:
                    # d_type from readdir: no stat call per entry (lstat only where the type is unknown).
                    if entry.is_symlink():
                        kind = "file"
                    elif entry.is_dir(follow_symlinks=False):
                        kind = "dir"
                    elif entry.is_file(follow_symlinks=False):
                        kind = "file"
                    else:
                        continue  # socket, FIFO, device: not content
                except FileNotFoundError:
                    continue
                if kind == "dir":
                    if skip_key is not None and entry.path == skip_key:
                        continue
                    if excludes and excludes.excluded(os.fsdecode(rel), True):
                        continue
                    pending.append((entry.path, rel + b"/"))
                else:
                    if excludes and excludes.excluded(os.fsdecode(rel), False):
                        continue
                    found.append(rel)
    return found


FINGERPRINT_FILES = 5000  # above this, stat-ing every file again costs about what git's own staging does
RACY_SECONDS = 2.0  # a change within a file system's timestamp tick of the last one leaves its stat data as it was

Fingerprint = tuple[tuple[bytes, int, int, int, int, int], ...]


def fingerprint(root: Path, paths: list[bytes]) -> Fingerprint | None:
    """The stat data of the walked files (mode, size, inode, mtime, ctime): equal fingerprints mean the
    same files with the same contents, so a capture can reuse the last one's tree without git.

    None when it would not be safe or cheap: a file changed in the last `RACY_SECONDS` (a further change
    within the same timestamp tick would not show), or more than `FINGERPRINT_FILES` files. ctime
    catches a rewrite that puts the old mtime back (nothing but the kernel sets it)."""
    if len(paths) > FINGERPRINT_FILES:
        return None
    base = os.fsencode(root) + b"/"
    recent = time.time_ns() - int(RACY_SECONDS * 1e9)
    found = []
    for rel in paths:
        try:
            st = os.lstat(base + rel)
        except OSError:
            return None
        if st.st_mtime_ns > recent or st.st_ctime_ns > recent:
            return None
        found.append((rel, st.st_mode, st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns))
    return tuple(found)


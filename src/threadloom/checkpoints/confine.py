"""Touching a workspace without ever following a link out of it.

A workspace's contents are hostile input: the project's agents can put a symlink anywhere in it, swap a
folder for a link between two of the server's system calls (`renameat2(RENAME_EXCHANGE)` in a loop), or
replace a fork's whole folder with a link to someone else's. The server's own file work on a workspace
(capture's walk, restore's deletions and writes) therefore goes through directory file descriptors only:

- the root is opened one component at a time from `/` with `O_NOFOLLOW` (`open_root`): a root that is, or
  passes through, a symlink is refused with `UNSAFE_WORKSPACE`, never resolved;
- every folder below it is opened from its parent's descriptor with `O_NOFOLLOW` (`Dirs`), and every
  stat, unlink, rmdir, mkdir, symlink and create is relative to such a descriptor and never follows the
  last component. A folder swapped for a link is then either opened before the swap (its descriptor keeps
  pointing at the real folder, which is still inside the workspace) or refused (`ENOTDIR`): a name is
  never resolved through a link, whatever the timing.

Why descriptors rather than checking paths first (`is_symlink`, `realpath`): any check on a path is stale by
the time the path is used, and a loop of swaps wins that race within seconds.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator
from pathlib import Path

from threadloom import unprivileged
from threadloom.checkpoints.errors import CheckpointError, CheckpointErrorCode

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_NOT_ENTERED = (errno.ENOENT, errno.ENOTDIR, errno.ELOOP)  # missing, a file, or a link: not a folder to enter
_CREATE_TRIES = 3  # a name re-taken by someone else this often in a row is a conflict, not bad luck


def open_root(path: Path) -> int:
    """A descriptor of the workspace root, reached without following any symlink on the way.

    WORKSPACE_MISSING when a component is missing or a file; UNSAFE_WORKSPACE when one is a symlink (the
    workspace itself included) or the path is not absolute and normal."""
    text = os.fspath(path)
    if not text.startswith("/") or os.path.normpath(text) != text:
        raise CheckpointError(CheckpointErrorCode.UNSAFE_WORKSPACE, f"workspace is not a normal absolute path: {text}")
    fd = os.open("/", DIR_FLAGS)
    try:
        for name in (part for part in text.split("/") if part):
            try:
                child = os.open(name, DIR_FLAGS, dir_fd=fd)
            except OSError as error:
                if error.errno not in _NOT_ENTERED:
                    raise
                if error.errno != errno.ENOENT and _is_link(fd, name):
                    raise CheckpointError(
                        CheckpointErrorCode.UNSAFE_WORKSPACE, f"workspace is or passes through a symlink: {text}"
                    ) from None
                raise CheckpointError(
                    CheckpointErrorCode.WORKSPACE_MISSING, f"workspace is not a folder: {text}"
                ) from None
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_link(dir_fd: int, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except FileNotFoundError:
        return False


def lstat_at(dir_fd: int, name: str) -> os.stat_result | None:
    """The entry's own stat data (never its link target's), None when it is not there."""
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


class Dirs:
    """Descriptors of folders beneath one root, opened (and kept) by their workspace-relative path.

    `get` answers None for a folder that is missing or is not a real folder (a link is never entered);
    `make` creates what is missing and, like `git checkout-index --force`, replaces a file or link standing
    where a folder is needed (the entry itself is removed, never what a link points at). Close with
    `close` (or use as a context manager)."""

    def __init__(self, root_fd: int) -> None:
        self._fds: dict[str, int] = {"": os.dup(root_fd)}

    def __enter__(self) -> Dirs:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def get(self, folder: str) -> int | None:
        found = self._fds.get(folder)
        if found is not None:
            return found
        parent_path, _, name = folder.rpartition("/")
        parent = self.get(parent_path)
        if parent is None:
            return None
        try:
            fd = os.open(name, DIR_FLAGS, dir_fd=parent)
        except OSError as error:
            if error.errno in _NOT_ENTERED:
                return None
            raise
        self._fds[folder] = fd
        return fd

    def make(self, folder: str) -> int:
        found = self._fds.get(folder)
        if found is not None:
            return found
        parent_path, _, name = folder.rpartition("/")
        parent = self.make(parent_path)
        for _ in range(_CREATE_TRIES):
            try:
                fd = os.open(name, DIR_FLAGS, dir_fd=parent)
            except OSError as error:
                if error.errno not in _NOT_ENTERED:
                    raise
            else:
                self._fds[folder] = fd
                return fd
            st = lstat_at(parent, name)
            if st is not None and not stat.S_ISDIR(st.st_mode):
                unlink_at(parent, name)  # a file or link where the target has a folder: the entry goes
            try:
                os.mkdir(name, 0o777, dir_fd=parent)
            except FileExistsError:
                continue  # someone made it meanwhile: open it (or what replaced it) again
            made = os.open(name, DIR_FLAGS, dir_fd=parent)
            try:
                unprivileged.give(made)  # the agent user's, to write in (the descriptor: never a link)
            finally:
                os.close(made)
        raise CheckpointError(
            CheckpointErrorCode.RESTORE_CONFLICT, f"could not make folder {folder!r}: it kept changing"
        )


def unlink_at(dir_fd: int, name: str) -> bool:
    """Remove a file or link (never a folder) from the folder of `dir_fd`; gone already, or a folder now
    (swapped in since it was looked at), is left as it is. True when this call removed it."""
    try:
        os.unlink(name, dir_fd=dir_fd)
    except (FileNotFoundError, IsADirectoryError):
        return False
    return True


def write_at(dir_fd: int, name: str, mode: int, content: bytes) -> tuple[int, int]:
    """Put a file (mode 100644/100755) or symlink (120000) named `name` in the folder of `dir_fd`; answers
    the new entry's (device, inode), so the restore can check afterwards that the name still holds it.

    Whatever stands there (a file or link) is removed first and the new entry is created with O_EXCL (or
    symlinkat), neither of which follows a link: a link re-planted in between fails the create, which is
    retried, never written through. Nor is an existing file ever opened for writing: a hard link standing
    there (whose inode a file outside the workspace shares) loses its name, and the outside file keeps its
    bytes. A folder standing there is a RESTORE_CONFLICT (it appeared since the restore removed what stood
    in the way)."""
    for _ in range(_CREATE_TRIES):
        st = lstat_at(dir_fd, name)
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise CheckpointError(CheckpointErrorCode.RESTORE_CONFLICT, f"a folder appeared at {name!r}")
            unlink_at(dir_fd, name)
        try:
            if stat.S_ISLNK(mode):
                os.symlink(content, name, dir_fd=dir_fd)
                made = lstat_at(dir_fd, name)  # another entry by now: the restore's check reports it
                return (made.st_dev, made.st_ino) if made is not None else (-1, -1)
            perms = 0o777 if mode & 0o100 else 0o666  # as git: the umask decides the rest
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, perms, dir_fd=dir_fd
            )
        except FileExistsError:
            continue
        # The agent user's, so it can edit a restored file: an inherited ACL's mask would follow the create
        # mode (read-only for 0644). Through the descriptor just created, so never anything a link names.
        unprivileged.give(fd)
        made_at = os.fstat(fd)
        with os.fdopen(fd, "wb") as out:
            out.write(content)
        return made_at.st_dev, made_at.st_ino
    raise CheckpointError(CheckpointErrorCode.RESTORE_CONFLICT, f"could not write {name!r}: it kept being replaced")


# What a file operation meets when the workspace changed under it: an entry gone, a folder where a file was
# (or the reverse), a link, a folder no longer empty, a name taken meanwhile.
_CHANGED = (errno.ENOENT, errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.ENOTEMPTY, errno.EEXIST)


@contextlib.contextmanager
def changed_is_conflict(what: str) -> Iterator[None]:
    """Turn the errors of a workspace changed mid-operation (`_CHANGED`) into RESTORE_CONFLICT: typed, and
    finished by running the restore again once the workspace holds still."""
    try:
        yield
    except OSError as error:
        if error.errno not in _CHANGED:
            raise
        raise CheckpointError(CheckpointErrorCode.RESTORE_CONFLICT, f"{what}: the workspace changed: {error}") from None


def walk_below(dir_fd: int) -> Iterator[tuple[str, list[str], list[str]]]:
    """(folder relative to `dir_fd` — "" first —, its real sub-folders, its other entries), top down, never
    entering a link. Descriptors stay open only along the current branch."""
    stack: list[tuple[int, str]] = []
    try:
        stack.append((os.dup(dir_fd), ""))
        while stack:
            fd, rel = stack.pop()
            try:
                folders: list[str] = []
                others: list[str] = []
                with os.scandir(fd) as entries:
                    for entry in entries:
                        (folders if entry.is_dir(follow_symlinks=False) else others).append(entry.name)
                yield rel, folders, others
                for name in folders:
                    try:
                        child = os.open(name, DIR_FLAGS, dir_fd=fd)
                    except OSError as error:
                        if error.errno in _NOT_ENTERED:
                            continue
                        raise
                    stack.append((child, f"{rel}/{name}" if rel else name))
            finally:
                os.close(fd)
    finally:
        for fd, _ in stack:
            os.close(fd)


def remove_empty_folders(dir_fd: int, name: str) -> None:
    """rmdir a folder and every folder beneath it, deepest first (files must have gone already: a folder
    still holding one raises). A link standing there is not entered and not removed."""
    try:
        fd = os.open(name, DIR_FLAGS, dir_fd=dir_fd)
    except OSError as error:
        if error.errno in _NOT_ENTERED:
            return
        raise
    try:
        with os.scandir(fd) as entries:
            folders = [entry.name for entry in entries if entry.is_dir(follow_symlinks=False)]
        for child in folders:
            remove_empty_folders(fd, child)
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)

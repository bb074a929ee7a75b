"""The server's own file work in folders an agent controls, without ever following a link.

An agent owns its state folder (`threadloom.unprivileged`) and everything in it, so any name there may be a
symlink to anywhere, a FIFO, or a folder swapped for a link between two system calls. The server runs as
root in the supported deployment: a plain `open`, `mkdir`, `mkstemp` or `os.replace` by path would create,
overwrite or read the link's target. Here every step goes through descriptors instead:

- a folder is reached from a base the server trusts (its last component opened with O_NOFOLLOW, the folders
  above it the server's own), then one component at a time with `openat(O_NOFOLLOW|O_DIRECTORY)`;
- a file is written by staging it with O_CREAT|O_EXCL|O_NOFOLLOW in such a folder and renaming it into place,
  so a link at either name is replaced, never written through;
- a file is read with O_NOFOLLOW|O_NONBLOCK and only if `fstat` says it is a regular file (a FIFO would hang
  the reader, a link to `/dev/zero` would fill its memory), up to a size limit.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_STAGE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def open_folder(
    base: Path, parts: Iterable[str] = (), *, make: int | None = None, made: Callable[[int], None] | None = None
) -> int:
    """A descriptor of the folder `base/parts...` (the caller closes it).

    `base` is opened with O_NOFOLLOW on its last component (the folders above it are the server's own), each
    of `parts` from the one before with O_NOFOLLOW: a link anywhere on the way raises OSError (ELOOP or
    ENOTDIR). A missing part is made with mode `make` (else FileNotFoundError) and `made(fd)` called on it.
    """
    fd = os.open(base, DIR_FLAGS)
    try:
        for part in parts:
            if part in ("", ".", "..") or "/" in part:
                raise ValueError(f"not a single folder name: {part!r}")
            fresh = False
            if make is not None:
                try:
                    os.mkdir(part, make, dir_fd=fd)
                    fresh = True
                except FileExistsError:
                    pass
            inner = os.open(part, DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = inner
            if fresh and made is not None:
                made(fd)
    except BaseException:
        os.close(fd)
        raise
    return fd


def put_file_at(folder: int, name: str, content: bytes, mode: int = 0o644) -> None:
    """Replace `name` in the open folder `folder` with `content` as a whole (a reader sees the old file or the
    new one): staged under a fresh name with O_CREAT|O_EXCL|O_NOFOLLOW, then renamed over `name`."""
    staged = f".{name}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError, IsADirectoryError):
        os.unlink(staged, dir_fd=folder)
    out = os.open(staged, _STAGE_FLAGS, mode, dir_fd=folder)
    with os.fdopen(out, "wb") as file:
        file.write(content)
    os.rename(staged, name, src_dir_fd=folder, dst_dir_fd=folder)


def read_at(folder: int, name: str, limit: int) -> bytes | None:
    """The content of the regular file `name` in the open folder `folder`; None when it is missing, a link,
    not a regular file (a FIFO, a device, a folder) or longer than `limit` bytes."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=folder)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > limit:
            return None
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > limit:  # grew while read
                return None
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_file(base: Path, parts: Iterable[str], limit: int) -> bytes | None:
    """`read_at` of the file `base/parts...`, every folder on the way opened as `open_folder` does; None when
    any of them is missing or a link."""
    *folders, name = parts
    try:
        folder = open_folder(base, folders)
    except OSError:
        return None
    try:
        return read_at(folder, name, limit)
    finally:
        os.close(folder)


def is_file_at(folder: int, name: str) -> bool:
    """Whether `name` in the open folder `folder` is a regular file itself (a link to one is not)."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=folder, follow_symlinks=False).st_mode)
    except OSError:
        return False

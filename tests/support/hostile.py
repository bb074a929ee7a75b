"""What the workspace-attack tests share: a link-blind snapshot of a folder, the atomic swap an agent's
racing loop uses, and the agent's own edits made without ever writing through a link."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

Snapshot = dict[str, bytes | str]

_libc = ctypes.CDLL(None, use_errno=True)
_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def snapshot(root: Path) -> Snapshot:
    """Every entry under `root` (files by content, links by target, folders by name), never following links."""
    found: Snapshot = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if path.is_symlink():
                found[rel] = f"-> {os.readlink(path)}"
            elif path.is_dir():
                found[rel] = "<dir>"
            else:
                found[rel] = path.read_bytes()
    return found


def exchange(a: Path, b: Path) -> int:
    """renameat2(RENAME_EXCHANGE): swap two names atomically, as an agent's racing loop does; 0 or the errno."""
    if _libc.renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return 0
    return ctypes.get_errno()


def edit_the_real_folder(workspace: Path, names: tuple[str, str], files: dict[str, bytes]) -> None:
    """The agent's edits during a race: `files` written in the real folder, whichever of `names` names it now
    (opened with O_NOFOLLOW, so the test itself never writes outside)."""
    for _ in range(1000):
        for name in names:
            try:
                folder = os.open(workspace / name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
            except OSError:
                continue
            try:
                for file, text in files.items():
                    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644, dir_fd=folder)
                    os.write(fd, text)
                    os.close(fd)
                return
            except FileNotFoundError:
                continue  # a restore removed that folder meanwhile (the racer makes a new one)
            finally:
                os.close(folder)

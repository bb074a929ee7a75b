"""`@write`: files the agent may touch are those inside the thread's cwd, after resolving `..` and symlinks.

The write itself happens inside the sandbox (shell.write_file), so this check is the clear refusal, not the
only barrier.
"""

from __future__ import annotations

import os
from pathlib import Path


class EscapeError(ValueError):
    """The path resolves outside the cwd."""


def display_path(cwd: str, path: str) -> str:
    """The absolute path a client is shown: joined to the cwd and normalized, symlinks left alone."""
    return os.path.normpath(os.path.join(cwd, path))


def resolve(cwd: str, path: str) -> Path:
    """The real target of `path` (relative to cwd, or absolute) if it stays inside cwd; raises `EscapeError`."""
    root = Path(cwd).resolve()
    target = (root / path).resolve()
    if not target.is_relative_to(root) or target == root:
        raise EscapeError(f"{path} is outside the working directory {cwd}")
    return target

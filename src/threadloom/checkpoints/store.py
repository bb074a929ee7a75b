"""Where shadow repositories live: `<data dir>/checkpoints/<project id>.git`, one per project."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from threadloom.checkpoints.excludes import Excludes
from threadloom.checkpoints.git import Git, find_git
from threadloom.checkpoints.locks import RepoLock
from threadloom.checkpoints.refs import check_project_id
from threadloom.checkpoints.repo import INDEX_NAME, ShadowRepo

CHECKPOINTS_DIR = "checkpoints"  # the data dir's folder of shadow repositories


class CheckpointStore:
    """Hands out `ShadowRepo`s; repositories of one project share one lock in this process."""

    def __init__(self, data_dir: Path) -> None:
        self.root = Path(data_dir).resolve() / CHECKPOINTS_DIR
        self._git = find_git()
        self._locks: dict[str, RepoLock] = {}
        self._trees: dict[tuple[str, ...], Any] = {}  # each index's last capture (`ShadowRepo.capture_changes`)
        self._commits: dict[str, str] = {}  # trees of commits met lately (`ShadowRepo._known_ref`)

    def git_dir(self, project_id: str) -> Path:
        return self.root / f"{check_project_id(project_id)}.git"

    def repo(
        self, project_id: str, workspace_root: Path, excludes: Sequence[str] = (), index_key: str | None = None
    ) -> ShadowRepo:
        """The project's shadow repository over `workspace_root`; created on its first capture.

        A folder other than the project's workspace (a fork's own) gets its own index (`index_key`),
        so the two never disturb each other's staged state; both share the objects and the lock.

        The exclude list is the project's current one: it decides what the next capture or restore
        walks, and is written to the repository's `info/exclude` for anyone inspecting it.
        """
        git_dir = self.git_dir(project_id)
        lock = self._locks.get(project_id)
        if lock is None:
            lock = self._locks[project_id] = RepoLock(self.root / f"{project_id}.lock")
        index = INDEX_NAME if index_key is None else f"{INDEX_NAME}-{check_project_id(index_key)}"
        # Never resolved: a root that is or passes through a symlink is refused when opened (UNSAFE_WORKSPACE).
        workspace = Path(os.path.abspath(workspace_root))
        git = Git(self._git, git_dir, workspace, git_dir / index)
        return ShadowRepo(git, Excludes(excludes), lock, self._trees, self._commits)

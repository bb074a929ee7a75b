"""Rules for projects: creation, renaming, archiving, and when a project's threads may run."""

from __future__ import annotations

import posixpath
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import StrEnum
from pathlib import PurePosixPath

from threadloom.domain.changes import Change
from threadloom.domain.checkpoints import ALWAYS_EXCLUDED
from threadloom.domain.entities import Project
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.labels import clean_label

MAX_NAME = 200


def clean_name(name: str) -> str:
    return clean_label(name, "name", MAX_NAME)


def clean_workspace_root(path: str) -> str:
    """An absolute, normalized POSIX path; the workspace agents work in."""
    if "\x00" in path or not path.startswith("/"):
        raise DomainError(ErrorCode.INVALID_INPUT, "workspaceRoot must be an absolute path", "workspaceRoot")
    if len(path) > 4096:
        raise DomainError(ErrorCode.INVALID_INPUT, "workspaceRoot is too long", "workspaceRoot")
    return posixpath.normpath(path)


# Never a workspace, nor anything inside: the system's own files.
SYSTEM_TREES = (
    "/bin",
    "/boot",
    "/dev",
    "/etc",
    "/lib",
    "/lib32",
    "/lib64",
    "/libx32",
    "/proc",
    "/run",
    "/sbin",
    "/sys",
    "/usr",
)
# Shared top-level folders: not a workspace themselves (a folder inside them is fine).
SHARED_FOLDERS = ("/", "/home", "/media", "/mnt", "/opt", "/root", "/srv", "/tmp", "/var", "/var/tmp")


def _within(path: PurePosixPath, other: PurePosixPath) -> bool:
    return path == other or path.is_relative_to(other)


def check_not_system(path_text: str) -> None:
    """Refuse a path that is, or lies inside, a system folder, or is a shared top-level folder.

    Applied to the path as given as well as to where it resolves: `/proc/self/cwd` resolves to
    an ordinary folder (the server's own working directory) but names one through `/proc`.
    """
    path = PurePosixPath(path_text)
    if any(_within(path, PurePosixPath(tree)) for tree in SYSTEM_TREES) or str(path) in SHARED_FOLDERS:
        raise DomainError(ErrorCode.INVALID_WORKSPACE_ROOT, f"{path} is a system folder", "workspaceRoot")


def check_workspace_root(
    candidate: str,
    *,
    existing: Iterable[str],
    data_dir: str | None,
    install_dirs: Iterable[str] = (),
    agents_dir: str | None = None,
) -> None:
    """Refuse a workspace root agents must not be given (`candidate`: the resolved, absolute path).

    Not a system folder or inside one, not a shared top-level folder itself, not the data
    dir, a folder inside it (the forks' own workspaces, the checkpoints, the database) or a folder
    containing it (agents would reach the database and every project's state), nor the agents' state
    folder (`agents_dir`, when it lies outside the data dir: every project's conversations), inside it
    or around it, not inside or around the server's installation (`install_dirs`: its virtualenv and
    package; agents would rewrite the server), and not the same as, inside or around another project's
    root (one project's agents would reach the other's files). The filesystem (existence, symlinks) is
    the engine's business; this only compares paths.
    """
    path = PurePosixPath(candidate)
    field = "workspaceRoot"
    check_not_system(candidate)
    for folder, what in ((data_dir, "the server's data folder"), (agents_dir, "the agents' state folder")):
        if folder is None:
            continue
        if _within(PurePosixPath(folder), path):
            raise DomainError(ErrorCode.INVALID_WORKSPACE_ROOT, f"{path} holds {what}", field)
        if _within(path, PurePosixPath(folder)):
            raise DomainError(ErrorCode.INVALID_WORKSPACE_ROOT, f"{path} is inside {what}", field)
    for folder in install_dirs:
        if _within(path, PurePosixPath(folder)) or _within(PurePosixPath(folder), path):
            raise DomainError(ErrorCode.INVALID_WORKSPACE_ROOT, f"{path} overlaps the server's installation", field)
    for root in existing:
        other = PurePosixPath(root)
        if _within(path, other) or _within(other, path):
            raise DomainError(ErrorCode.WORKSPACE_OVERLAPS, f"{path} overlaps another project's workspace root", field)


def create_project(project_id: uuid.UUID, name: str, workspace_root: str, now: datetime) -> Change:
    project = Project(
        id=project_id,
        name=clean_name(name),
        workspace_root=clean_workspace_root(workspace_root),
        created_at=now,
        updated_at=now,
    )
    return Change.created(project)


def rename_project(project: Project, name: str, now: datetime) -> Change:
    """A new name; the workspace root never changes (checkpoints and forks are keyed by it)."""
    return Change.updated(project.evolve(name=clean_name(name), updated_at=now))


MAX_EXCLUDES = 200
MAX_EXCLUDE_LENGTH = 1000


def clean_excludes(patterns: Sequence[str]) -> tuple[str, ...] | None:
    """A project's own checkpoint exclude list, read as the server's setting is (`checkpoints.excludes`).

    Each pattern is trimmed and blanks are dropped, as in THREADLOOM_CHECKPOINT_EXCLUDES; a pattern may not
    span lines (the store refuses one with INVALID_EXCLUDE: it would be two lines of `info/exclude`). The list
    replaces the server's, so a leading `-` (in the setting: drop a default) has nothing to drop and is
    refused rather than silently taken as a name (`\\-name` matches a name starting with `-`). An empty
    list means "no list of its own": the server's default applies again (None).
    """
    if len(patterns) > MAX_EXCLUDES:
        raise DomainError(ErrorCode.INVALID_INPUT, f"at most {MAX_EXCLUDES} exclude patterns", "excludes")
    chosen: list[str] = []
    for raw in patterns:
        if "\n" in raw or "\r" in raw or "\0" in raw:
            raise DomainError(ErrorCode.INVALID_INPUT, f"exclude pattern spans lines: {raw!r}", "excludes")
        pattern = raw.strip()
        if len(pattern) > MAX_EXCLUDE_LENGTH:
            raise DomainError(ErrorCode.INVALID_INPUT, f"exclude pattern longer than {MAX_EXCLUDE_LENGTH}", "excludes")
        if pattern.startswith("-"):
            raise DomainError(
                ErrorCode.INVALID_INPUT,
                f"{pattern!r}: a project's list replaces the server's, there is no default to drop",
                "excludes",
            )
        if pattern and pattern not in chosen:
            chosen.append(pattern)
    return tuple(chosen) or None


def effective_excludes(own: tuple[str, ...] | None, server_default: tuple[str, ...]) -> tuple[str, ...]:
    """What a project's checkpoints leave out: its own list, else the server's (which already ends with
    `ALWAYS_EXCLUDED`); the always-excluded folders stay excluded under a list of its own too."""
    if own is None:
        return server_default
    return (*own, *(p for p in ALWAYS_EXCLUDED if p not in own))


def update_project(project: Project, name: str | None, excludes: Sequence[str] | None, now: datetime) -> Change:
    """updateProject: the fields given change, the others stay. `excludes` [] clears the project's own list."""
    changed = project.evolve(
        name=project.name if name is None else clean_name(name),
        excludes=project.excludes if excludes is None else clean_excludes(excludes),
        updated_at=now,
    )
    return Change.updated(changed)


def archive_project(project: Project, now: datetime) -> Change:
    """Archived: left out of `projects`, refuses new runs and threads. Runs already started finish;
    its threads, runs and tokens stay readable, and `unarchiveProject` brings it back as it was."""
    if project.archived_at is not None:
        raise DomainError(ErrorCode.ALREADY_ARCHIVED, "project is already archived", "projectId")
    return Change.updated(project.evolve(archived_at=now, updated_at=now))


def unarchive_project(project: Project, now: datetime) -> Change:
    if project.archived_at is None:
        raise DomainError(ErrorCode.NOT_ARCHIVED, "project is not archived", "projectId")
    return Change.updated(project.evolve(archived_at=None, updated_at=now))


class WorkspaceStatus(StrEnum):
    """What the server finds at a project's workspace root (looked at when asked, never stored)."""

    OK = "ok"
    MISSING = "missing"  # nothing there (deleted, or a mount gone)
    NOT_A_DIRECTORY = "not_a_directory"  # a file or a dangling link where the folder was


def check_open(project: Project, field: str) -> None:
    """Refuse new work (a run, a thread) in an archived project."""
    if project.archived_at is not None:
        raise DomainError(ErrorCode.PROJECT_ARCHIVED, "the project is archived; unarchive it first", field)


def check_runnable(project: Project, workspace: WorkspaceStatus | None, field: str) -> None:
    """May a run start in this project? Not when it is archived, nor when the folder its agent would work in
    is gone (`workspace`: None when the thread works in a folder of its own, not the project's): an agent
    started there would fail on its first command, and the message would look delivered."""
    check_open(project, field)
    if workspace is not None and workspace != WorkspaceStatus.OK:
        what = "is missing" if workspace == WorkspaceStatus.MISSING else "is not a directory"
        raise DomainError(
            ErrorCode.WORKSPACE_MISSING, f"the project's workspace root {project.workspace_root} {what}", field
        )

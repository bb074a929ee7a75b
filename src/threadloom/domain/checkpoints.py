"""Checkpoints of a thread's files: which scope a capture belongs to and what gets recorded.

The engine does the git work (`threadloom.checkpoints`, outside any transaction) and hands the result here
as a `Captured` or a `CaptureFailed`; these rules turn it into entities and activities that the completion
barrier (or a node's end) commits. Nothing here does I/O.

- A thread has one root scope (`ROOT_RUN`, advances the run count): its checkpoint ordinal N is the workspace
  right after run N, ordinal 0 the baseline before the first run.
- A subagent node that can change files gets a child scope (`SUBAGENT`, never advances the run count) under
  the root scope: ordinal 0 when the node starts, ordinal 1 when it ends, the diff between the two.
- A checkpoint's `files` is the list of what changed against the previous checkpoint of its scope, each
  entry `{path, status, additions, deletions, oldPath?, binary?}`; a root checkpoint's child summaries are
  read through the child scopes (`parent_scope_id`), never copied into it.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Any

from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, NewId
from threadloom.domain.entities import Checkpoint, CheckpointScope, ExecutionNode
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import CheckpointScopeKind, CheckpointStatus, NodeKind, RunStatus

# Never captured unless a project asks otherwise: dependency and cache folders an agent can rebuild.
DEFAULT_EXCLUDES: tuple[str, ...] = (
    "node_modules/",
    ".venv/",
    "venv/",
    "__pycache__/",
    ".mypy_cache/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".tox/",
)
# Always excluded: where older releases put forks' own workspaces, inside the project's workspace.
# Forks now work under the server's data dir (`threads.workspace_of`) and nothing reads these folders any
# more, but they may still be there: excluding them keeps the project's next checkpoint from suddenly
# listing every old fork's files as added, and a rollback of the project from deleting them.
LEGACY_FORK_WORKSPACES = ".threadloom/forks"
FORK_WORKSPACES = LEGACY_FORK_WORKSPACES  # its older name (domain.projects refuses it as a workspace root)
ALWAYS_EXCLUDED = (f"/{LEGACY_FORK_WORKSPACES}/",)
EXCLUDES_ENV = "THREADLOOM_CHECKPOINT_EXCLUDES"
ROOT_SCOPE_NAME = "root"  # the ref component of the root scope (`checkpoint_ref(thread, "root", n)`)


def excludes(env_value: str | None) -> tuple[str, ...]:
    """The server's exclude list: the defaults plus the env's comma- or newline-separated patterns.

    A leading `-` in the env value (`-node_modules/`) drops a default instead of adding a pattern.
    """
    chosen = list(DEFAULT_EXCLUDES)
    for raw in (env_value or "").replace("\n", ",").split(","):
        pattern = raw.strip()
        if not pattern:
            continue
        if pattern.startswith("-"):
            chosen = [p for p in chosen if p != pattern[1:]]
        elif pattern not in chosen:
            chosen.append(pattern)
    return (*chosen, *ALWAYS_EXCLUDED)


class CheckpointFileStatus(StrEnum):
    """How a path changed between two checkpoints (a file <-> symlink switch is a modification)."""

    ADDED = "added"
    MODIFIED = "modified"
    DELETED = "deleted"
    RENAMED = "renamed"


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointFile:
    """One changed path; `old_path` is set for a rename; binary files count no lines."""

    path: str
    status: CheckpointFileStatus
    additions: int
    deletions: int
    old_path: str | None = None
    binary: bool = False

    def to_json(self) -> dict[str, Any]:
        entry: dict[str, Any] = {
            "path": self.path,
            "status": self.status.value,
            "additions": self.additions,
            "deletions": self.deletions,
        }
        if self.old_path is not None:
            entry["oldPath"] = self.old_path
        if self.binary:
            entry["binary"] = True
        return entry

    @classmethod
    def from_json(cls, entry: Mapping[str, Any]) -> CheckpointFile:
        old = entry.get("oldPath")
        status = str(entry.get("status") or "")
        known = status in {m.value for m in CheckpointFileStatus}
        return cls(
            path=str(entry.get("path") or ""),
            status=CheckpointFileStatus(status) if known else CheckpointFileStatus.MODIFIED,
            additions=int(entry.get("additions") or 0),
            deletions=int(entry.get("deletions") or 0),
            old_path=None if old is None else str(old),
            binary=bool(entry.get("binary")),
        )


def files_of(checkpoint: Checkpoint) -> list[CheckpointFile]:
    """The typed file list stored on a checkpoint (empty for a missing or failed one)."""
    listed = checkpoint.files if isinstance(checkpoint.files, list) else []
    return [CheckpointFile.from_json(entry) for entry in listed if isinstance(entry, dict)]


MAX_FILE_PATH = 4096  # PATH_MAX: no file a checkpoint lists has a longer workspace-relative path


def check_file_path(path: str, field: str = "path") -> str:
    """`path` if it can name a file a checkpoint lists; else `INVALID_INPUT` on `field`.

    Workspace-relative, `/`-separated, no empty, `.` or `..` component, no `.git` in any letter case
    (never captured), no U+0000 and at most `MAX_FILE_PATH` characters: the shadow repository would
    refuse such a path (or git could not be given it), and that refusal must be the caller's typed
    error, not a server error.
    """
    parts = path.split("/")
    if (
        not path
        or len(path) > MAX_FILE_PATH
        or "\x00" in path
        or any(p in ("", ".", "..") or p.lower() == ".git" for p in parts)
    ):
        raise DomainError(
            ErrorCode.INVALID_INPUT, f"{field} must be a workspace-relative path as `files` lists it", field
        )
    return path


@dataclasses.dataclass(frozen=True, slots=True)
class Captured:
    """The git side of a capture: the ref now holding the commit and what changed against `base_ordinal`."""

    ref: str
    files: tuple[CheckpointFile, ...]
    base_ordinal: int | None  # the checkpoint of the same scope the diff is against; None: against nothing


@dataclasses.dataclass(frozen=True, slots=True)
class CaptureFailed:
    """The capture could not be made (workspace missing, git failed): recorded as an ERROR checkpoint."""

    reason: str
    missing: bool = False  # True: the workspace is gone (MISSING), not a git failure (ERROR)


CaptureResult = Captured | CaptureFailed


def _scope(
    kind: CheckpointScopeKind, thread_id: uuid.UUID, now: datetime, new_id: NewId, **under: uuid.UUID | None
) -> CheckpointScope:
    """A scope of `kind`; only the thread's root scope counts runs (a subagent's checkpoints are its own)."""
    advances = kind == CheckpointScopeKind.ROOT_RUN
    return CheckpointScope(
        id=new_id(), thread_id=thread_id, kind=kind, advances_run_count=advances, created_at=now, **under
    )


def root_scope(thread_id: uuid.UUID, now: datetime, new_id: NewId) -> CheckpointScope:
    return _scope(CheckpointScopeKind.ROOT_RUN, thread_id, now, new_id)


def ensure_root_scope(
    current: CheckpointScope | None, thread_id: uuid.UUID, now: datetime, new_id: NewId
) -> tuple[CheckpointScope, list[Change]]:
    """The thread's root scope, created (one change) on its first checkpoint."""
    if current is not None:
        return current, []
    scope = root_scope(thread_id, now, new_id)
    return scope, [Change.created(scope)]


@dataclasses.dataclass(frozen=True, slots=True)
class Recorded:
    """A checkpoint to commit and every change recording it (its scope if new, the row, the activity)."""

    checkpoint: Checkpoint
    changes: list[Change]


def child_scope(parent: CheckpointScope, node: ExecutionNode, now: datetime, new_id: NewId) -> CheckpointScope:
    """The scope of a subagent's node, under the scope it was opened in."""
    under = {"run_id": node.run_id, "node_id": node.id, "parent_scope_id": parent.id}
    return _scope(CheckpointScopeKind.SUBAGENT, node.thread_id, now, new_id, **under)


def has_scope(node: ExecutionNode) -> bool:
    """Nodes whose work can change files and get a child scope: subagents (a delegated task is a node too)."""
    return node.kind == NodeKind.SUBAGENT


def base_of(checkpoints: Iterable[Checkpoint], ordinal: int) -> Checkpoint | None:
    """The checkpoint a capture at `ordinal` diffs against: the latest ready one of the scope before it.

    After a rollback the later checkpoints are stale, so the base is the restored run's checkpoint.
    """
    ready = [c for c in checkpoints if c.ordinal < ordinal and c.status == CheckpointStatus.READY and c.ref]
    return max(ready, key=lambda c: c.ordinal, default=None)


def record(
    scope: CheckpointScope,
    existing: Checkpoint | None,
    ordinal: int,
    result: CaptureResult,
    now: datetime,
    new_id: NewId,
    *,
    run_id: uuid.UUID | None,
    node_id: uuid.UUID | None = None,
    run_status: RunStatus | None = None,
    announce: bool = True,
) -> Recorded:
    """The checkpoint row for a capture (a new one, or `existing` at that ordinal updated) and its activity.

    `run_status` is the status the run ends with (root captures at the barrier): an interrupted or failed
    run's capture says so in its activity; the files are as the turn left them. `announce` False records
    no activity: a baseline or a subagent's start is bookkeeping, not news for people.
    """
    if isinstance(result, Captured):
        status, ref, files = CheckpointStatus.READY, result.ref, [f.to_json() for f in result.files]
    else:
        status = CheckpointStatus.MISSING if result.missing else CheckpointStatus.ERROR
        ref, files = None, None
    fields: dict[str, Any] = {"ref": ref, "status": status, "files": files, "run_id": run_id}
    if existing is not None:
        checkpoint = existing.evolve(**fields)
        change = Change.updated(checkpoint, run_id=run_id, node_id=node_id)
    else:
        checkpoint = Checkpoint(
            id=new_id(), thread_id=scope.thread_id, scope_id=scope.id, ordinal=ordinal, created_at=now, **fields
        )
        change = Change.created(checkpoint, run_id=run_id, node_id=node_id)
    if not announce:
        return Recorded(checkpoint, [change])
    return Recorded(checkpoint, [change, _activity(scope, checkpoint, result, now, new_id, node_id, run_status)])


def _activity(
    scope: CheckpointScope,
    checkpoint: Checkpoint,
    result: CaptureResult,
    now: datetime,
    new_id: NewId,
    node_id: uuid.UUID | None,
    run_status: RunStatus | None,
) -> Change:
    what = "checkpoint" if scope.kind == CheckpointScopeKind.ROOT_RUN else "subagent checkpoint"
    payload: dict[str, Any] = {
        "checkpointId": str(checkpoint.id),
        "ordinal": checkpoint.ordinal,
        "scope": str(scope.kind),
        "status": str(checkpoint.status),
    }
    if isinstance(result, CaptureFailed):
        summary = f"{what} {checkpoint.ordinal} not captured: {result.reason}"
        kind = ActivityKind.CHECKPOINT_FAILED
        payload["reason"] = result.reason
    else:
        count = len(result.files)
        summary = f"{what} {checkpoint.ordinal} captured: {count} file{'' if count == 1 else 's'} changed"
        if run_status in (RunStatus.INTERRUPTED, RunStatus.FAILED):
            summary += f" (run {run_status})"
        kind = ActivityKind.CHECKPOINT_CAPTURED
        payload["files"] = count
    if run_status is not None:
        payload["runStatus"] = str(run_status)
    return activity(
        scope.thread_id, kind, summary, now, new_id, run_id=checkpoint.run_id, node_id=node_id, payload=payload
    )

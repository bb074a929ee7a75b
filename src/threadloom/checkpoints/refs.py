"""Names of checkpoint refs and ids, checked before they reach git.

A checkpoint is a commit on `refs/threadloom/<thread_id>/<scope>/<ordinal>`, where scope is
`root` for a run's checkpoints or a node id for a child scope. Refs live outside `refs/heads` and
`refs/tags`, so no git porcelain shows them and nothing prunes the commits they keep.
"""

from __future__ import annotations

import re

from threadloom.checkpoints.errors import CheckpointError, CheckpointErrorCode

REF_PREFIX = "refs/threadloom/"
ROOT_SCOPE = "root"
_COMPONENT = r"[A-Za-z0-9_][A-Za-z0-9_.-]*"
_REF = re.compile(rf"refs/threadloom/{_COMPONENT}(?:/{_COMPONENT})*")
_PREFIX = re.compile(rf"refs/threadloom/(?:{_COMPONENT}/)*")
_COMMIT = re.compile(r"[0-9a-f]{4,64}")
_PROJECT = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")


def checkpoint_ref(thread_id: str, scope: str, ordinal: int) -> str:
    """The ref of checkpoint `ordinal` of `scope` ("root" or a node id) in a thread."""
    return check_ref(f"{REF_PREFIX}{thread_id}/{scope}/{ordinal}")


def check_ref(ref: str) -> str:
    """A ref under refs/threadloom/ whose components are plain names (no `..`, no `.lock`)."""
    if not _REF.fullmatch(ref) or ".." in ref or any(part.endswith(".lock") for part in ref.split("/")):
        raise CheckpointError(CheckpointErrorCode.INVALID_REF, f"not a checkpoint ref: {ref!r}")
    return ref


def check_prefix(prefix: str) -> str:
    """A prefix of checkpoint refs ending at a component boundary, e.g. `refs/threadloom/<thread>/`."""
    if not prefix.endswith("/"):
        prefix += "/"
    if not _PREFIX.fullmatch(prefix) or ".." in prefix:
        raise CheckpointError(CheckpointErrorCode.INVALID_REF, f"not a checkpoint ref prefix: {prefix!r}")
    return prefix


def check_commit(commit: str) -> str:
    """A (possibly abbreviated) commit id; never a revision expression git would interpret."""
    if not _COMMIT.fullmatch(commit):
        raise CheckpointError(CheckpointErrorCode.UNKNOWN_COMMIT, f"not a commit id: {commit!r}")
    return commit


def check_project_id(project_id: str) -> str:
    """A project id usable as a folder name under the data dir (no separators, no dots)."""
    if not _PROJECT.fullmatch(project_id):
        raise CheckpointError(CheckpointErrorCode.INVALID_PROJECT_ID, f"not a usable project id: {project_id!r}")
    return project_id


def ref_sort_key(ref: str) -> tuple[tuple[int, int | str], ...]:
    """Numeric components compare as numbers, so ordinal 10 sorts after 9."""
    return tuple((0, int(part)) if part.isdigit() else (1, part) for part in ref.split("/"))

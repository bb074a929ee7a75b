"""Expected failures of the checkpoint store, each with a stable code.

The engine turns these into typed errors and recorded "error" checkpoints; the codes are part of
that contract, so they never change meaning.
"""

from __future__ import annotations

from enum import StrEnum


class CheckpointErrorCode(StrEnum):
    GIT_NOT_FOUND = "GIT_NOT_FOUND"  # no `git` executable on PATH
    GIT_FAILED = "GIT_FAILED"  # git exited non-zero where nothing else explains it
    WORKSPACE_MISSING = "WORKSPACE_MISSING"  # the workspace root is not an existing directory
    UNSAFE_WORKSPACE = "UNSAFE_WORKSPACE"  # the workspace root is, or passes through, a symlink
    WORKSPACE_CHANGING = "WORKSPACE_CHANGING"  # folders kept turning into links while a capture read them
    SANDBOX_UNAVAILABLE = "SANDBOX_UNAVAILABLE"  # no bwrap: git is never let read a workspace unconfined
    INVALID_PROJECT_ID = "INVALID_PROJECT_ID"  # would not make a safe folder name
    INVALID_REF = "INVALID_REF"  # not a well-formed ref under refs/threadloom/
    INVALID_EXCLUDE = "INVALID_EXCLUDE"  # an exclude pattern spanning lines
    INVALID_PATH = "INVALID_PATH"  # a path outside the workspace or naming .git
    UNKNOWN_COMMIT = "UNKNOWN_COMMIT"  # not a commit of this shadow repository
    RESTORE_CONFLICT = "RESTORE_CONFLICT"  # something the store must not remove is in the way


class CheckpointError(Exception):
    """A checkpoint operation failed in an expected way; `code` is stable, `message` is for people."""

    def __init__(self, code: CheckpointErrorCode, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

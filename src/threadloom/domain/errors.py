"""Expected failures with stable codes.

Every rule that can refuse a command raises `DomainError` with a code from `ErrorCode`;
the API turns it into a `userErrors` entry. The codes are part of the public contract.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorCode(StrEnum):
    INVALID_INPUT = "INVALID_INPUT"
    INVALID_ID = "INVALID_ID"
    NOT_FOUND = "NOT_FOUND"
    FORBIDDEN = "FORBIDDEN"
    ALREADY_ARCHIVED = "ALREADY_ARCHIVED"
    NOT_ARCHIVED = "NOT_ARCHIVED"
    THREAD_ARCHIVED = "THREAD_ARCHIVED"
    IDEMPOTENCY_KEY_REUSED = "IDEMPOTENCY_KEY_REUSED"
    UNKNOWN_PROVIDER_INSTANCE = "UNKNOWN_PROVIDER_INSTANCE"
    PAGE_SIZE_EXCEEDED = "PAGE_SIZE_EXCEEDED"
    INVALID_CURSOR = "INVALID_CURSOR"
    THREAD_BUSY = "THREAD_BUSY"
    THREAD_ROLLING_BACK = "THREAD_ROLLING_BACK"
    NOT_STEERABLE = "NOT_STEERABLE"
    QUEUE_NOT_HELD = "QUEUE_NOT_HELD"
    RUN_NOT_STARTABLE = "RUN_NOT_STARTABLE"
    PROVIDER_SWITCH_UNAVAILABLE = "PROVIDER_SWITCH_UNAVAILABLE"
    EXPECTED_ATTEMPT_MISMATCH = "EXPECTED_ATTEMPT_MISMATCH"
    RUN_NOT_ACTIVE = "RUN_NOT_ACTIVE"
    RUN_NOT_QUEUED = "RUN_NOT_QUEUED"
    INTERRUPT_UNSUPPORTED = "INTERRUPT_UNSUPPORTED"
    NOT_INTERRUPTIBLE = "NOT_INTERRUPTIBLE"
    NOT_RESUMABLE = "NOT_RESUMABLE"
    REQUEST_NOT_PENDING = "REQUEST_NOT_PENDING"
    PLAN_ALREADY_IMPLEMENTED = "PLAN_ALREADY_IMPLEMENTED"
    INVALID_WORKSPACE_ROOT = "INVALID_WORKSPACE_ROOT"
    WORKSPACE_OVERLAPS = "WORKSPACE_OVERLAPS"
    RUNTIME_MODE_NOT_ALLOWED = "RUNTIME_MODE_NOT_ALLOWED"
    CHECKPOINT_MISSING = "CHECKPOINT_MISSING"
    ROLLBACK_FAILED = "ROLLBACK_FAILED"
    ROLLBACK_UNSUPPORTED = "ROLLBACK_UNSUPPORTED"
    ROLLBACK_NOT_UNDOABLE = "ROLLBACK_NOT_UNDOABLE"
    UNSTABLE_FORK_POINT = "UNSTABLE_FORK_POINT"
    NOT_A_FORK = "NOT_A_FORK"
    NOTHING_TO_MERGE = "NOTHING_TO_MERGE"
    RUN_NOT_RETRYABLE = "RUN_NOT_RETRYABLE"
    RUN_NOT_LATEST = "RUN_NOT_LATEST"
    PROJECT_ARCHIVED = "PROJECT_ARCHIVED"
    WORKSPACE_MISSING = "WORKSPACE_MISSING"
    TOKEN_REVOKED = "TOKEN_REVOKED"


class DomainError(Exception):
    """A command was refused by a rule; nothing was changed."""

    def __init__(self, code: ErrorCode, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field


NOT_FOUND_MESSAGE = "not found"


def not_found(field: str | None) -> DomainError:
    """The one answer for an unknown id and an id of another project: nothing tells them apart."""
    return DomainError(ErrorCode.NOT_FOUND, NOT_FOUND_MESSAGE, field)

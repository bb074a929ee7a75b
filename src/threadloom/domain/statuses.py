"""Exhaustive status and kind vocabularies (docs/lifecycles/). Values are the stored strings."""

from __future__ import annotations

from enum import StrEnum


class RunStatus(StrEnum):
    QUEUED = "queued"
    PREPARING = "preparing"
    STARTING = "starting"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    ROLLED_BACK = "rolled_back"


ACTIVE_RUN_STATUSES = frozenset({RunStatus.PREPARING, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.WAITING})
TERMINAL_RUN_STATUSES = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.INTERRUPTED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.ROLLED_BACK,
    }
)


class ThreadStatus(StrEnum):
    """Derived: `idle`, or the status of the thread's active run."""

    IDLE = "idle"
    PREPARING = "preparing"
    STARTING = "starting"
    RUNNING = "running"
    WAITING = "waiting"


class AttemptReason(StrEnum):
    INITIAL = "initial"
    STEERING_RESTART = "steering_restart"
    RETRY = "retry"
    PROVIDER_RECOVERY = "provider_recovery"


class AttemptStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"


class NodeKind(StrEnum):
    ROOT_TURN = "root_turn"
    ASSISTANT_MESSAGE = "assistant_message"
    REASONING = "reasoning"
    PLAN = "plan"
    TODO_LIST = "todo_list"
    TOOL_CALL = "tool_call"
    APPROVAL_REQUEST = "approval_request"
    USER_INPUT_REQUEST = "user_input_request"
    SUBAGENT = "subagent"
    SYSTEM = "system"


class NodeStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    WAITING = "waiting"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"
    CANCELLED = "cancelled"


class MessageRole(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"


class InputIntent(StrEnum):
    TURN_START = "turn_start"
    QUEUED_TURN = "queued_turn"
    STEER = "steer"
    RESTART = "restart"


class ProviderSessionStatus(StrEnum):
    STARTING = "starting"
    READY = "ready"
    RUNNING = "running"
    STOPPED = "stopped"
    ERROR = "error"


class ProviderThreadStatus(StrEnum):
    NOT_LOADED = "not_loaded"
    IDLE = "idle"
    ACTIVE = "active"
    CLOSED = "closed"
    ERROR = "error"


class ProviderTurnStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    COMPLETED = "completed"
    INTERRUPTED = "interrupted"
    FAILED = "failed"


class LineageRelationship(StrEnum):
    FORK = "fork"
    SUBAGENT = "subagent"


class TransferType(StrEnum):
    FORK = "fork"
    PROVIDER_HANDOFF = "provider_handoff"
    MERGE_BACK = "merge_back"
    SUBAGENT_SPAWN = "subagent_spawn"
    SUBAGENT_RESULT = "subagent_result"


class TransferStatus(StrEnum):
    PENDING = "pending"
    RESOLVED_NATIVE = "resolved_native"
    RESOLVED_PORTABLE = "resolved_portable"
    CONSUMED = "consumed"
    FAILED = "failed"
    SUPERSEDED = "superseded"


class HandoffStrategy(StrEnum):
    DELTA_SINCE_TARGET_LAST_SEEN = "delta_since_target_last_seen"
    FULL_THREAD_SUMMARY = "full_thread_summary"
    FORK_DELTA_SUMMARY = "fork_delta_summary"


class HandoffStatus(StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    FAILED = "failed"


class CheckpointScopeKind(StrEnum):
    ROOT_RUN = "root_run"
    SUBAGENT = "subagent"


class CheckpointStatus(StrEnum):
    READY = "ready"
    MISSING = "missing"
    ERROR = "error"
    STALE = "stale"


class RuntimeRequestKind(StrEnum):
    COMMAND_APPROVAL = "command_approval"
    FILE_CHANGE_APPROVAL = "file_change_approval"
    PERMISSION = "permission"
    USER_INPUT = "user_input"
    ELICITATION = "elicitation"


class RuntimeRequestStatus(StrEnum):
    PENDING = "pending"
    RESOLVED = "resolved"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


class ResponseCapability(StrEnum):
    LIVE = "live"
    NOT_RESUMABLE = "not_resumable"


class PlanKind(StrEnum):
    TODO_LIST = "todo_list"
    PROPOSED_PLAN = "proposed_plan"
    QUESTIONS = "questions"


class PlanStatus(StrEnum):
    ACTIVE = "active"
    FINALIZED = "finalized"
    IMPLEMENTED = "implemented"
    SUPERSEDED = "superseded"


class TokenScope(StrEnum):
    READ = "read"
    OPERATE = "operate"
    ADMIN = "admin"


class EffectStatus(StrEnum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"

"""Typed vocabularies of the schema: the names that were free strings (`runtimeMode`, `Activity.kind`,
`ThreadEvent.type`) as GraphQL enums.

The string fields stay (deprecated) so no client breaks; the enum fields sit beside them
(docs/graph.md, "Types and their links", says which is which). The string values come from the
domain (`domain.threads.RUNTIME_MODES`, `domain.activities.ActivityKind`, `domain.changes.event_type`);
`tests/test_graph_links_vocab.py` checks that every value the domain can produce has its member here.
"""

from __future__ import annotations

from enum import StrEnum

import strawberry

from threadloom.domain.activities import ActivityKind


class RuntimeMode(StrEnum):
    WORKSPACE_WRITE = "workspace_write"
    APPROVAL_REQUIRED = "approval_required"
    READ_ONLY = "read_only"
    FULL_ACCESS = "full_access"


class ThreadEventType(StrEnum):
    """Every `<entity>.<verb>` a thread's log holds, and the two stream markers."""

    THREAD_CREATED = "thread.created"
    THREAD_UPDATED = "thread.updated"
    THREAD_RENAMED = "thread.renamed"
    THREAD_ARCHIVED = "thread.archived"
    THREAD_UNARCHIVED = "thread.unarchived"
    THREAD_LEASED = "thread.leased"
    PROJECT_CREATED = "project.created"
    PROJECT_UPDATED = "project.updated"
    RUN_CREATED = "run.created"
    RUN_UPDATED = "run.updated"
    ATTEMPT_CREATED = "attempt.created"
    ATTEMPT_UPDATED = "attempt.updated"
    NODE_CREATED = "node.created"
    NODE_UPDATED = "node.updated"
    MESSAGE_CREATED = "message.created"
    MESSAGE_UPDATED = "message.updated"
    PROVIDER_SESSION_CREATED = "provider_session.created"
    PROVIDER_SESSION_UPDATED = "provider_session.updated"
    PROVIDER_THREAD_CREATED = "provider_thread.created"
    PROVIDER_THREAD_UPDATED = "provider_thread.updated"
    PROVIDER_TURN_CREATED = "provider_turn.created"
    PROVIDER_TURN_UPDATED = "provider_turn.updated"
    TRANSFER_CREATED = "transfer.created"
    TRANSFER_UPDATED = "transfer.updated"
    CONTEXT_HANDOFF_CREATED = "context_handoff.created"
    CONTEXT_HANDOFF_UPDATED = "context_handoff.updated"
    CHECKPOINT_SCOPE_CREATED = "checkpoint_scope.created"
    CHECKPOINT_SCOPE_UPDATED = "checkpoint_scope.updated"
    CHECKPOINT_CREATED = "checkpoint.created"
    CHECKPOINT_UPDATED = "checkpoint.updated"
    REQUEST_CREATED = "request.created"
    REQUEST_UPDATED = "request.updated"
    PLAN_CREATED = "plan.created"
    PLAN_UPDATED = "plan.updated"
    ACTIVITY_RECORDED = "activity.recorded"
    USAGE_CREATED = "usage.created"  # a model call's usage record (docs/usage.md)
    BUDGET_CREATED = "budget.created"  # a thread's budget was set (docs/usage.md, "Budgets")
    BUDGET_UPDATED = "budget.updated"  # a thread's budget was changed or cleared
    SYNCHRONIZED = "synchronized"  # marker: the replay is over, live events follow
    RELOAD_REQUIRED = "reload_required"  # marker: the replay would be too long


strawberry.enum(
    RuntimeMode,
    description="What a thread's agent may do: WORKSPACE_WRITE (edit its workspace, run sandboxed commands), "
    "APPROVAL_REQUIRED (ask before every command and write), READ_ONLY (no writes), FULL_ACCESS (a network and "
    "no approvals; only on an instance that allows it).",
)
strawberry.enum(
    ActivityKind,
    description="What an activity records (docs/activities.md): the same names as the string `kind`, upper-cased "
    "with `_` for the dot (`run.started` is RUN_STARTED).",
)
strawberry.enum(
    ThreadEventType,
    description="The name of a thread log event (`run.updated` is RUN_UPDATED) or a stream marker "
    "(SYNCHRONIZED, RELOAD_REQUIRED).",
)


def runtime_mode(value: str | None) -> RuntimeMode | None:
    """The enum of a stored runtime mode (None for none, or for a mode this server does not name)."""
    if value is None:
        return None
    try:
        return RuntimeMode(value)
    except ValueError:
        return None


def activity_kind(value: str) -> ActivityKind | None:
    try:
        return ActivityKind(value)
    except ValueError:
        return None


def thread_event_type(value: str) -> ThreadEventType | None:
    try:
        return ThreadEventType(value)
    except ValueError:
        return None

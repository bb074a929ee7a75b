"""The entities (docs/lifecycles/README.md). Field names are the API's, in snake_case here.

Each entity is a frozen `Record`; a change produces a new value that is written as an
event payload and upserted into its projection table of the same name.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime
from typing import Any, ClassVar

from threadloom.domain.failures import RunFailureCode
from threadloom.domain.records import Record
from threadloom.domain.statuses import (
    AttemptReason,
    AttemptStatus,
    BudgetAction,
    BudgetWindow,
    CheckpointScopeKind,
    CheckpointStatus,
    CostSource,
    HandoffStatus,
    HandoffStrategy,
    InputIntent,
    LineageRelationship,
    MessageRole,
    NodeKind,
    NodeStatus,
    PlanKind,
    PlanStatus,
    ProviderSessionStatus,
    ProviderThreadStatus,
    ProviderTurnStatus,
    ResponseCapability,
    RunStatus,
    RuntimeRequestKind,
    RuntimeRequestStatus,
    TransferStatus,
    TransferType,
)

Json = Any


# The fields entities share, declared once. Ownership is a chain of `Record` subclasses (a base's fields
# come first in an entity's field list, so its columns and payload keys start with `id`, `thread_id`, ...).
# Timestamps combine with any of them as mixins: their `__slots__` is empty so they sit beside a slotted
# `Record` base, and each entity's own slots hold their values.


@dataclasses.dataclass(frozen=True, kw_only=True)
class Created:
    """An entity stamped once, when it is made."""

    __slots__ = ()
    created_at: datetime


@dataclasses.dataclass(frozen=True, kw_only=True)
class Timestamps(Created):
    """An entity that changes after it is made: `updated_at` is the time of its last change."""

    __slots__ = ()
    updated_at: datetime


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ThreadOwned(Record):
    """An entity held in one app thread's log: `thread_id` names that thread (`store.log.thread_of`)."""

    thread_id: uuid.UUID


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InRun(ThreadOwned):
    """Part of one run of its thread."""

    run_id: uuid.UUID


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class MaybeInRun(ThreadOwned):
    """Tied to a run, and to the node of it that made it, when it came from one (a user's message before its
    run exists, a thread-level checkpoint scope or activity has neither)."""

    run_id: uuid.UUID | None = None
    node_id: uuid.UUID | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Project(Timestamps, Record):
    entity_type: ClassVar[str] = "project"
    name: str
    workspace_root: str
    archived_at: datetime | None = None  # set: runs and new threads are refused; left out of `projects`
    # The project's own checkpoint exclude list (`updateProject(excludes:)`); None: the server's default.
    excludes: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class AppThread(Timestamps, Record):
    entity_type: ClassVar[str] = "thread"
    project_id: uuid.UUID
    title: str
    provider_instance_id: str
    model: str | None
    runtime_mode: str
    active_provider_thread_id: uuid.UUID | None = None
    active_run_id: uuid.UUID | None = None
    parent_thread_id: uuid.UUID | None = None
    lineage_relationship: LineageRelationship | None = None
    root_thread_id: uuid.UUID | None = None
    forked_from_transfer_id: uuid.UUID | None = None
    workspace_path: str | None = None  # set: its own folder under the data dir (threads.workspace_of)
    queue_held: bool = False
    queue_hold_reason: str | None = None
    archived_at: datetime | None = None
    rollback_operation_id: uuid.UUID | None = None  # set: a rollback is being carried out (ROLLING_BACK)
    # The writer lease (domain/leases.py): who drives the thread, until when. Live while `lease_expires_at`
    # is in the future; a release clears it, an expired one is left as it was and read as no lease.
    lease_token_id: uuid.UUID | None = None
    lease_token_name: str | None = None
    lease_device_id: str | None = None
    lease_expires_at: datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Run(ThreadOwned):
    entity_type: ClassVar[str] = "run"
    ordinal: int
    provider_instance_id: str
    model: str | None
    provider_thread_id: uuid.UUID | None = None
    user_message_id: uuid.UUID | None = None
    root_node_id: uuid.UUID | None = None
    active_attempt_id: uuid.UUID | None = None
    status: RunStatus
    status_reason: str | None = None
    failure_code: RunFailureCode | None = None  # a FAILED run's code (domain.failures)
    failure_http_status: int | None = None  # the model API's HTTP status, when its CLI reported one
    queue_position: int | None = None
    supersedes_run_id: uuid.UUID | None = None
    context_handoff_id: uuid.UUID | None = None
    checkpoint_id: uuid.UUID | None = None
    fresh_context: bool = False  # sendMessage's freshContext: a new provider thread with a full summary
    interrupt_requested_at: datetime | None = None
    requested_at: datetime
    started_at: datetime | None = None
    completed_at: datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RunAttempt(Created, InRun):
    entity_type: ClassVar[str] = "run_attempt"
    attempt_ordinal: int
    root_node_id: uuid.UUID
    provider_thread_id: uuid.UUID | None = None
    provider_turn_id: uuid.UUID | None = None
    reason: AttemptReason
    status: AttemptStatus
    status_reason: str | None = None
    completed_at: datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ExecutionNode(Timestamps, InRun):
    entity_type: ClassVar[str] = "execution_node"
    attempt_id: uuid.UUID | None = None
    parent_node_id: uuid.UUID | None = None
    root_node_id: uuid.UUID | None = None
    kind: NodeKind
    status: NodeStatus
    counts_for_run: bool = False
    provider_turn_id: uuid.UUID | None = None
    runtime_request_id: uuid.UUID | None = None
    checkpoint_scope_id: uuid.UUID | None = None
    child_thread_id: uuid.UUID | None = None
    title: str | None = None
    detail: Json = None
    completed_at: datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ConversationMessage(Timestamps, MaybeInRun):
    entity_type: ClassVar[str] = "conversation_message"
    role: MessageRole
    text: str
    streaming: bool = False
    input_intent: InputIntent | None = None
    client_message_id: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProviderSession(Timestamps, Record):
    entity_type: ClassVar[str] = "provider_session"
    provider_instance_id: str
    status: ProviderSessionStatus
    owner: str | None = None
    lease_expires_at: datetime | None = None
    capabilities: Json = None
    last_error: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProviderThread(Timestamps, ThreadOwned):
    """An agent's native thread; `thread_id` is the app thread it serves."""

    entity_type: ClassVar[str] = "provider_thread"
    provider_instance_id: str
    owner_node_id: uuid.UUID | None = None
    native_thread_ref: str | None = None
    status: ProviderThreadStatus
    forked_from_provider_thread_id: uuid.UUID | None = None
    session_id: uuid.UUID | None = None
    first_run_ordinal: int | None = None
    last_run_ordinal: int | None = None
    # What it last ran a turn with (domain.settings_compat): None until its first turn is prepared.
    model: str | None = None  # None: the provider instance's default model
    runtime_mode: str | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ProviderTurn(Created, ThreadOwned):
    entity_type: ClassVar[str] = "provider_turn"
    provider_thread_id: uuid.UUID
    run_attempt_id: uuid.UUID
    node_id: uuid.UUID
    native_turn_ref: str | None = None
    ordinal: int
    status: ProviderTurnStatus
    completed_at: datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ContextTransfer(Timestamps, ThreadOwned):
    """Context moving between threads; `thread_id` is the target, the thread that receives it (its log holds
    the transfer)."""

    entity_type: ClassVar[str] = "context_transfer"
    type: TransferType
    source_thread_id: uuid.UUID
    source_point: Json = None
    base_point: Json = None
    status: TransferStatus
    resolution_strategy: str | None = None
    resolution_fidelity: str | None = None
    target_run_id: uuid.UUID | None = None
    # A FORK transfer's portable context, built when the fork was made (`domain.forks.FrozenContext`): what the
    # fork receives cannot change when its source is later rolled back, switched or forked again.
    fork_context: Json = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ContextHandoff(Created, ThreadOwned):
    entity_type: ClassVar[str] = "context_handoff"
    transfer_id: uuid.UUID | None = None
    target_run_id: uuid.UUID | None = None
    from_provider_thread_ids: Json = None
    to_provider_thread_id: uuid.UUID | None = None
    covered_run_ordinals: Json = None
    omitted_run_ordinals: Json = None  # selected but left out for length: accounted for, never sent again
    strategy: HandoffStrategy
    status: HandoffStatus
    text: str
    token_estimate: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointScope(Created, MaybeInRun):
    entity_type: ClassVar[str] = "checkpoint_scope"
    parent_scope_id: uuid.UUID | None = None
    kind: CheckpointScopeKind
    advances_run_count: bool


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Checkpoint(Created, ThreadOwned):
    entity_type: ClassVar[str] = "checkpoint"
    scope_id: uuid.UUID
    run_id: uuid.UUID | None = None
    ordinal: int
    ref: str | None = None
    status: CheckpointStatus
    files: Json = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RuntimeRequest(Created, InRun):
    entity_type: ClassVar[str] = "runtime_request"
    node_id: uuid.UUID
    native_request_ref: str | None = None
    kind: RuntimeRequestKind
    status: RuntimeRequestStatus
    response_capability: ResponseCapability
    not_resumable_reason: str | None = None
    payload: Json = None
    response: Json = None
    resolved_at: datetime | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class PlanArtifact(Timestamps, InRun):
    entity_type: ClassVar[str] = "plan_artifact"
    node_id: uuid.UUID | None = None
    kind: PlanKind
    items: Json = None
    text: str | None = None
    status: PlanStatus


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Activity(Created, MaybeInRun):
    """A UI projection of an event; `sequence` is the event's sequence in its thread."""

    entity_type: ClassVar[str] = "activity"
    sequence: int
    kind: str
    summary: str
    payload: Json = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class UsageRecord(Created, InRun):
    """One model call an agent reported, on the attempt and node that made it (domain/usage.py). Append-only:
    made once, never changed. `call_ref` is the provider's own name for the call, unique per thread, so a
    report that arrives twice (a restart, a resumed thread) is recorded once.

    Tokens by kind, each a part of the one before it: `input_tokens` counts every input token, cache reads
    (`cached_input_tokens`) and cache writes (`cache_write_tokens`) included; `output_tokens` counts every
    output token, `reasoning_tokens` included. `cost_nano_usd` is the cost in billionths of a dollar (exact
    sums), None when `cost_source` is UNKNOWN."""

    entity_type: ClassVar[str] = "usage_record"
    attempt_id: uuid.UUID
    node_id: uuid.UUID
    provider_instance_id: str
    model: str | None = None
    call_ref: str
    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    cost_nano_usd: int | None = None
    cost_source: CostSource


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Budget(Timestamps, Record):
    """A spending limit on a project, or on a thread with its delegated tasks (domain/budgets.py).

    At least one of `max_cost_nano_usd` (billionths of a dollar) and `max_tokens` is set. A thread budget's
    events are in its thread's log, a project budget's in the project's (`thread_id` None). One budget per
    scope and window: setting it again changes its limits; `cleared_at` set: cleared, checked no more."""

    entity_type: ClassVar[str] = "budget"
    project_id: uuid.UUID
    thread_id: uuid.UUID | None = None
    time_window: BudgetWindow  # `window` is a reserved word in SQL
    action: BudgetAction
    max_cost_nano_usd: int | None = None
    max_tokens: int | None = None
    cleared_at: datetime | None = None


ENTITY_TYPES: tuple[type[Record], ...] = (
    Project,
    AppThread,
    Run,
    RunAttempt,
    ExecutionNode,
    ConversationMessage,
    ProviderSession,
    ProviderThread,
    ProviderTurn,
    ContextTransfer,
    ContextHandoff,
    CheckpointScope,
    Checkpoint,
    RuntimeRequest,
    PlanArtifact,
    Activity,
    UsageRecord,
    Budget,
)
ENTITY_BY_TYPE: dict[str, type[Record]] = {cls.entity_type: cls for cls in ENTITY_TYPES}

"""The database schema.

Projection tables are derived from the entity dataclasses in `domain.entities`, so a
field added to an entity is a column here and nothing is written twice. Foreign keys,
uniqueness and status checks that protect invariants are declared beside them.
Alembic migrations in `migrations/` are generated from this metadata and then frozen.
"""

from __future__ import annotations

import dataclasses
import types
import typing
import uuid
from datetime import datetime
from enum import Enum
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from threadloom.domain import entities as e
from threadloom.domain.records import Record
from threadloom.domain.statuses import ACTIVE_RUN_STATUSES, EffectStatus, TokenScope
from threadloom.domain.webhooks import DeliveryStatus, EndpointStatus

metadata = sa.MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "ck": "ck_%(table_name)s_%(constraint_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

TABLE_NAMES: dict[type[Record], str] = {
    e.Project: "projects",
    e.AppThread: "threads",
    e.Run: "runs",
    e.RunAttempt: "run_attempts",
    e.ExecutionNode: "execution_nodes",
    e.ConversationMessage: "conversation_messages",
    e.ProviderSession: "provider_sessions",
    e.ProviderThread: "provider_threads",
    e.ProviderTurn: "provider_turns",
    e.ContextTransfer: "context_transfers",
    e.ContextHandoff: "context_handoffs",
    e.CheckpointScope: "checkpoint_scopes",
    e.Checkpoint: "checkpoints",
    e.RuntimeRequest: "runtime_requests",
    e.PlanArtifact: "plan_artifacts",
    e.Activity: "activities",
    e.UsageRecord: "usage_records",
    e.Budget: "budgets",
}

# Parent links only; "current pointer" columns (active_run_id, root_node_id …) carry no
# foreign key so that one command can create a run and point the thread at it in any order.
FOREIGN_KEYS: dict[str, dict[str, str]] = {
    "threads": {"project_id": "projects.id", "parent_thread_id": "threads.id"},
    "runs": {"thread_id": "threads.id"},
    "run_attempts": {"thread_id": "threads.id", "run_id": "runs.id"},
    "execution_nodes": {"thread_id": "threads.id", "run_id": "runs.id", "attempt_id": "run_attempts.id"},
    "conversation_messages": {"thread_id": "threads.id", "run_id": "runs.id"},
    "provider_threads": {"thread_id": "threads.id", "session_id": "provider_sessions.id"},
    "provider_turns": {
        "thread_id": "threads.id",
        "provider_thread_id": "provider_threads.id",
        "run_attempt_id": "run_attempts.id",
        "node_id": "execution_nodes.id",
    },
    "context_transfers": {"source_thread_id": "threads.id", "thread_id": "threads.id"},
    "context_handoffs": {"thread_id": "threads.id", "transfer_id": "context_transfers.id"},
    "checkpoint_scopes": {"thread_id": "threads.id", "parent_scope_id": "checkpoint_scopes.id"},
    "checkpoints": {"thread_id": "threads.id", "scope_id": "checkpoint_scopes.id"},
    "runtime_requests": {"thread_id": "threads.id", "run_id": "runs.id", "node_id": "execution_nodes.id"},
    "plan_artifacts": {"thread_id": "threads.id", "run_id": "runs.id"},
    "activities": {"thread_id": "threads.id"},
    "usage_records": {
        "thread_id": "threads.id",
        "run_id": "runs.id",
        "attempt_id": "run_attempts.id",
        "node_id": "execution_nodes.id",
    },
    "budgets": {"project_id": "projects.id", "thread_id": "threads.id"},
}

# The columns queries look rows up by; the graph links (a thread's forks, a provider thread's runs, the handoffs
# a run received, a thread's transfers in and out) among them. Each new one needs a migration (test_indexes.py).
INDEXES: dict[str, list[tuple[str, ...]]] = {
    "threads": [("project_id", "id"), ("parent_thread_id",)],
    "runs": [("thread_id", "queue_position"), ("provider_thread_id",)],
    "run_attempts": [("run_id",)],
    "execution_nodes": [("run_id", "id"), ("parent_node_id",)],
    "conversation_messages": [("thread_id", "id"), ("run_id",)],
    "provider_threads": [("thread_id",)],
    "provider_turns": [("run_attempt_id",)],
    "runtime_requests": [("thread_id", "status"), ("run_id",)],
    "plan_artifacts": [("run_id",)],
    "checkpoints": [("run_id",)],
    "context_transfers": [("thread_id",), ("source_thread_id",)],
    "context_handoffs": [("target_run_id",)],
    # Roll-ups: a run's, an attempt's, a node subtree's records; a project's over a time window by thread.
    "usage_records": [("run_id",), ("attempt_id",), ("node_id",), ("thread_id", "created_at")],
    # The budgets a check reads: a project's, a thread's.
    "budgets": [("project_id",), ("thread_id",)],
}

UNIQUES: dict[str, list[tuple[str, ...]]] = {
    "runs": [("thread_id", "ordinal")],
    "run_attempts": [("run_id", "attempt_ordinal")],
    "provider_turns": [("provider_thread_id", "ordinal")],
    "checkpoints": [("scope_id", "ordinal")],
    "activities": [("thread_id", "sequence")],
    "usage_records": [("thread_id", "call_ref")],  # one record per provider call: a report seen twice is one
}


def _unwrap(hint: typing.Any) -> tuple[typing.Any, bool]:
    if typing.get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        return (args[0] if len(args) == 1 else typing.Any), True
    return hint, False


def _column_type(hint: typing.Any) -> sa.types.TypeEngine[typing.Any]:
    if hint is uuid.UUID:
        return sa.Uuid()
    if hint is datetime:
        return sa.DateTime(timezone=True)
    if hint is bool:
        return sa.Boolean()
    if hint is int:
        return sa.BigInteger()
    if hint is str or (isinstance(hint, type) and issubclass(hint, Enum)):
        return sa.Text()
    return JSONB(none_as_null=True)


def _projection_table(cls: type[Record], name: str) -> sa.Table:
    hints = typing.get_type_hints(cls)
    fks = FOREIGN_KEYS.get(name, {})
    items: list[Any] = []
    for f in dataclasses.fields(cls):
        hint, optional = _unwrap(hints[f.name])
        args: list[typing.Any] = [f.name, _column_type(hint)]
        if f.name in fks:
            args.append(sa.ForeignKey(fks[f.name]))
        items.append(sa.Column(*args, primary_key=f.name == "id", nullable=optional or hint is typing.Any))
        if isinstance(hint, type) and issubclass(hint, Enum):
            allowed = ", ".join(f"'{m.value}'" for m in hint)
            items.append(sa.CheckConstraint(f"{f.name} IN ({allowed})", name=f"{f.name}_valid"))
    items += [sa.UniqueConstraint(*cols) for cols in UNIQUES.get(name, [])]
    items += [sa.Index(None, *cols) for cols in INDEXES.get(name, [])]
    return sa.Table(name, metadata, *items)


PROJECTIONS: dict[type[Record], sa.Table] = {cls: _projection_table(cls, n) for cls, n in TABLE_NAMES.items()}
TABLE_BY_ENTITY_TYPE: dict[str, sa.Table] = {cls.entity_type: t for cls, t in PROJECTIONS.items()}

projects = PROJECTIONS[e.Project]
threads = PROJECTIONS[e.AppThread]
runs = PROJECTIONS[e.Run]
run_attempts = PROJECTIONS[e.RunAttempt]
execution_nodes = PROJECTIONS[e.ExecutionNode]
conversation_messages = PROJECTIONS[e.ConversationMessage]
provider_sessions = PROJECTIONS[e.ProviderSession]
provider_threads = PROJECTIONS[e.ProviderThread]
provider_turns = PROJECTIONS[e.ProviderTurn]
context_transfers = PROJECTIONS[e.ContextTransfer]
context_handoffs = PROJECTIONS[e.ContextHandoff]
checkpoint_scopes = PROJECTIONS[e.CheckpointScope]
checkpoints = PROJECTIONS[e.Checkpoint]
runtime_requests = PROJECTIONS[e.RuntimeRequest]
plan_artifacts = PROJECTIONS[e.PlanArtifact]
activities = PROJECTIONS[e.Activity]
usage_records = PROJECTIONS[e.UsageRecord]
budgets = PROJECTIONS[e.Budget]

# The per-thread sequence counter, advanced under the thread's row lock.
threads.append_column(sa.Column("last_sequence", sa.BigInteger(), nullable=False, server_default="0"))

_active = ", ".join(f"'{s.value}'" for s in sorted(ACTIVE_RUN_STATUSES))
sa.Index(
    "uq_runs_one_active_per_thread",
    runs.c.thread_id,
    unique=True,
    postgresql_where=sa.text(f"status IN ({_active})"),
)
sa.Index(
    "uq_conversation_messages_client_message_id",
    conversation_messages.c.thread_id,
    conversation_messages.c.client_message_id,
    unique=True,
    postgresql_where=sa.text("client_message_id IS NOT NULL"),
)

# The log, the outbox and tokens carry no foreign keys into projections: projections
# are derived from the log and can be truncated and rebuilt underneath them.
events = sa.Table(
    "events",
    metadata,
    sa.Column("position", sa.BigInteger(), sa.Identity(), primary_key=True),
    sa.Column("thread_id", sa.Uuid(), nullable=True),
    sa.Column("sequence", sa.BigInteger(), nullable=True),
    sa.Column("project_id", sa.Uuid(), nullable=True),
    sa.Column("event_type", sa.Text(), nullable=False),
    sa.Column("entity_type", sa.Text(), nullable=False),
    sa.Column("entity_id", sa.Uuid(), nullable=False),
    sa.Column("run_id", sa.Uuid(), nullable=True),
    sa.Column("node_id", sa.Uuid(), nullable=True),
    sa.Column("command_id", sa.Text(), nullable=True),
    sa.Column("occurred_at", sa.DateTime(timezone=True), nullable=False),
    # The writer's transaction id: feeds read only below the oldest in-flight writer.
    sa.Column("xid", sa.BigInteger(), nullable=False, server_default=sa.text("(pg_current_xact_id()::text)::bigint")),
    sa.Column("payload", JSONB(), nullable=False),
    sa.UniqueConstraint("thread_id", "sequence"),
    sa.CheckConstraint("(thread_id IS NULL) = (sequence IS NULL)", name="sequence_with_thread"),
    sa.Index(None, "project_id", "position"),
)

command_receipts = sa.Table(
    "command_receipts",
    metadata,
    sa.Column("key", sa.Text(), primary_key=True),
    sa.Column("command_type", sa.Text(), nullable=False),
    sa.Column("fingerprint", sa.Text(), nullable=False),
    sa.Column("token_id", sa.Uuid(), nullable=True),
    sa.Column("result", JSONB(), nullable=False),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
)

_effect_statuses = ", ".join(f"'{s.value}'" for s in EffectStatus)
effects = sa.Table(
    "effects",
    metadata,
    sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
    sa.Column("thread_id", sa.Uuid(), nullable=True),
    sa.Column("kind", sa.Text(), nullable=False),
    sa.Column("payload", JSONB(), nullable=False),
    sa.Column("status", sa.Text(), nullable=False, server_default="pending"),
    sa.Column("replay_safe", sa.Boolean(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("available_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("lease_owner", sa.Text(), nullable=True),
    sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("last_error", sa.Text(), nullable=True),
    sa.Column("command_id", sa.Text(), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
    # Work for a live provider runtime goes to the worker that owns it while that worker lives.
    sa.Column("affinity", sa.Uuid(), nullable=True),
    sa.CheckConstraint(f"status IN ({_effect_statuses})", name="status_valid"),
    sa.Index("ix_effects_claimable", "available_at", "id", postgresql_where=sa.text("status = 'pending'")),
    sa.Index(None, "thread_id", "id"),
)

_scopes = ", ".join(f"'{s.value}'" for s in TokenScope)
api_tokens = sa.Table(
    "api_tokens",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("name", sa.Text(), nullable=False),
    sa.Column("scope", sa.Text(), nullable=False),
    sa.Column("project_id", sa.Uuid(), nullable=True),
    sa.Column("token_hash", sa.Text(), nullable=False, unique=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("revoked_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True),  # None: never expires
    sa.CheckConstraint(f"scope IN ({_scopes})", name="scope_valid"),
)

# One row per server process. A worker is alive while it holds its PostgreSQL advisory
# lock (classid WORKER_LOCK_SPACE, objid lock_no): the lock vanishes with the process's
# connection, so a crash is visible at once, without waiting for a lease to run out.
WORKER_LOCK_SPACE = 0x746C
workers = sa.Table(
    "workers",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("lock_no", sa.Integer(), sa.Identity(), nullable=False, unique=True),
    sa.Column("host", sa.Text(), nullable=False),
    sa.Column("pid", sa.Integer(), nullable=False),
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("stopped_at", sa.DateTime(timezone=True), nullable=True),
)

# Webhooks (docs/webhooks.md). Not projections: an endpoint is configuration, a delivery a piece of outbox work
# written in the same statement as its event (store/log.py), so no foreign key reaches into a projection.
_endpoint_statuses = ", ".join(f"'{s.value}'" for s in EndpointStatus)
webhook_endpoints = sa.Table(
    "webhook_endpoints",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True),
    sa.Column("project_id", sa.Uuid(), nullable=False),
    sa.Column("url", sa.Text(), nullable=False),
    sa.Column("events", ARRAY(sa.Text()), nullable=False),
    sa.Column("description", sa.Text(), nullable=False, server_default=""),
    sa.Column("include_subagents", sa.Boolean(), nullable=False, server_default=sa.false()),
    sa.Column("status", sa.Text(), nullable=False),
    # Deliveries in a row that used up their retries (domain.webhooks.after_attempt); a 2xx resets it.
    sa.Column("exhausted_in_a_row", sa.Integer(), nullable=False, server_default="0"),
    # The HMAC secret itself: signing needs it (a hash would not do). Never shown after createWebhookEndpoint
    # and rotateWebhookSecret.
    sa.Column("secret", sa.Text(), nullable=False),
    sa.Column("previous_secret", sa.Text(), nullable=True),
    sa.Column("previous_secret_expires_at", sa.DateTime(timezone=True), nullable=True),
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("disabled_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(f"status IN ({_endpoint_statuses})", name="status_valid"),
    sa.Index(None, "project_id"),
)

_delivery_statuses = ", ".join(f"'{s.value}'" for s in DeliveryStatus)
webhook_deliveries = sa.Table(
    "webhook_deliveries",
    metadata,
    sa.Column("id", sa.Uuid(), primary_key=True, server_default=sa.text("gen_random_uuid()")),
    sa.Column("position", sa.BigInteger(), sa.Identity(), nullable=False),  # the order they were written in
    sa.Column("endpoint_id", sa.Uuid(), sa.ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), nullable=False),
    sa.Column("project_id", sa.Uuid(), nullable=False),
    sa.Column("thread_id", sa.Uuid(), nullable=False),
    sa.Column("sequence", sa.BigInteger(), nullable=False),  # the event's in its thread: the order of sending
    sa.Column("message_id", sa.Text(), nullable=False),  # `webhook-id`: one per event, on every retry
    sa.Column("event_type", sa.Text(), nullable=False),
    sa.Column("body", sa.Text(), nullable=False),  # the exact bytes signed and sent, every attempt
    sa.Column("status", sa.Text(), nullable=False),
    sa.Column("attempts", sa.Integer(), nullable=False, server_default="0"),
    sa.Column("available_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("lease_owner", sa.Uuid(), nullable=True),  # the worker sending it (alive: its advisory lock)
    sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("completed_at", sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint(f"status IN ({_delivery_statuses})", name="status_valid"),
    sa.UniqueConstraint("endpoint_id", "message_id"),
    sa.Index("ix_webhook_deliveries_due", "available_at", postgresql_where=sa.text("status = 'pending'")),
    sa.Index(None, "endpoint_id", "thread_id", "sequence"),
    sa.Index(None, "endpoint_id", "position"),
)

webhook_attempts = sa.Table(
    "webhook_attempts",
    metadata,
    sa.Column("id", sa.BigInteger(), sa.Identity(), primary_key=True),
    sa.Column(
        "delivery_id", sa.Uuid(), sa.ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), nullable=False
    ),
    sa.Column("number", sa.Integer(), nullable=False),  # 1, 2, ... across redeliveries
    sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
    sa.Column("status_code", sa.Integer(), nullable=True),
    sa.Column("latency_ms", sa.Integer(), nullable=False),
    sa.Column("error", sa.Text(), nullable=True),  # domain.webhooks.AttemptError; null: a 2xx
    sa.Column("message", sa.Text(), nullable=True),
    sa.Index(None, "delivery_id", "number"),
)

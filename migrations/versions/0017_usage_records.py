"""the usage ledger: one record per model call an agent reported

Revision ID: 0017_usage_records
Revises: 0016_project_excludes
Create Date: 2026-12-02 16:30:00.000000

`usage_records` is the projection of the `usage_record` entity (events `usage.created`): tokens by kind, the
model, the cost in billionths of a dollar and its source, on the attempt and node that made the call.
`(thread_id, call_ref)` is unique, so a call reported twice is recorded once (docs/usage.md). New table
only: nothing existing changes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017_usage_records"
down_revision = "0016_project_excludes"
branch_labels = None
depends_on = None

INDEXES = (("run_id",), ("attempt_id",), ("node_id",), ("thread_id", "created_at"))


def upgrade() -> None:
    op.create_table(
        "usage_records",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("thread_id", sa.Uuid(), nullable=False),
        sa.Column("run_id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempt_id", sa.Uuid(), nullable=False),
        sa.Column("node_id", sa.Uuid(), nullable=False),
        sa.Column("provider_instance_id", sa.Text(), nullable=False),
        sa.Column("model", sa.Text(), nullable=True),
        sa.Column("call_ref", sa.Text(), nullable=False),
        sa.Column("input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cached_input_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cache_write_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("reasoning_tokens", sa.BigInteger(), nullable=False),
        sa.Column("cost_nano_usd", sa.BigInteger(), nullable=True),
        sa.Column("cost_source", sa.Text(), nullable=False),
        sa.CheckConstraint(
            "cost_source IN ('reported', 'priced', 'unknown')", name=op.f("ck_usage_records_cost_source_valid")
        ),
        sa.ForeignKeyConstraint(["thread_id"], ["threads.id"], name=op.f("fk_usage_records_thread_id_threads")),
        sa.ForeignKeyConstraint(["run_id"], ["runs.id"], name=op.f("fk_usage_records_run_id_runs")),
        sa.ForeignKeyConstraint(
            ["attempt_id"], ["run_attempts.id"], name=op.f("fk_usage_records_attempt_id_run_attempts")
        ),
        sa.ForeignKeyConstraint(
            ["node_id"], ["execution_nodes.id"], name=op.f("fk_usage_records_node_id_execution_nodes")
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_usage_records")),
        sa.UniqueConstraint("thread_id", "call_ref", name=op.f("uq_usage_records_thread_id_call_ref")),
    )
    for columns in INDEXES:
        op.create_index(op.f(f"ix_usage_records_{'_'.join(columns)}"), "usage_records", list(columns), unique=False)


def downgrade() -> None:
    for columns in reversed(INDEXES):
        op.drop_index(op.f(f"ix_usage_records_{'_'.join(columns)}"), table_name="usage_records")
    op.drop_table("usage_records")

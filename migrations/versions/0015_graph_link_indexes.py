"""indexes for the graph links' lookups

Revision ID: 0015_graph_link_indexes
Revises: 0014_project_archived
Create Date: 2026-12-02 15:20:00.000000

The graph links look rows up by columns that had no index, so each lookup scanned its whole table:
a provider thread's runs (`runs.provider_thread_id`), the handoffs a run received
(`context_handoffs.target_run_id`), a thread's transfers in and out (`context_transfers.thread_id`,
`context_transfers.source_thread_id`) and a thread's forks (`threads.parent_thread_id`). Plain
CREATE INDEX inside the migration's transaction: it holds writes to each table while it builds.
"""

from __future__ import annotations

from alembic import op

revision = "0015_graph_link_indexes"
down_revision = "0014_project_archived"
branch_labels = None
depends_on = None

INDEXES = (
    ("runs", "provider_thread_id"),
    ("context_handoffs", "target_run_id"),
    ("context_transfers", "thread_id"),
    ("context_transfers", "source_thread_id"),
    ("threads", "parent_thread_id"),
)


def upgrade() -> None:
    for table, column in INDEXES:
        op.create_index(op.f(f"ix_{table}_{column}"), table, [column], unique=False)


def downgrade() -> None:
    for table, column in reversed(INDEXES):
        op.drop_index(op.f(f"ix_{table}_{column}"), table_name=table)

"""a run's fresh-context flag

Revision ID: 0006_run_fresh_context
Revises: 0005_thread_workspace_path
Create Date: 2026-12-01 06:15:00.000000

`runs.fresh_context`: sendMessage's `freshContext` — the run starts a new provider thread that gets
a full summary of the conversation instead of continuing the provider's own thread.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006_run_fresh_context"
down_revision = "0005_thread_workspace_path"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("runs", sa.Column("fresh_context", sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("runs", "fresh_context")

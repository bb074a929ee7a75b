"""a thread's own workspace folder

Revision ID: 0005_thread_workspace_path
Revises: 0004_owning_thread_column
Create Date: 2026-12-01 06:10:00.000000

`threads.workspace_path`: a fork made with its own workspace works in this folder, relative to its
project's workspace (NULL: the project's workspace itself, as every thread before).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005_thread_workspace_path"
down_revision = "0004_owning_thread_column"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("threads", sa.Column("workspace_path", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("threads", "workspace_path")

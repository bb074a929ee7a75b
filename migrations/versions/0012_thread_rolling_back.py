"""a thread's rollback in progress

Revision ID: 0012_thread_rolling_back
Revises: 0011_attempt_reason_wake
Create Date: 2026-12-02 14:05:00.000000

`threads.rollback_operation_id`: set while a rollbackToRun is carried out (its plan is committed first, its
steps run outside any transaction and are recorded one by one); the thread reads ROLLING_BACK and the
commands that would change its conversation or files are refused until the operation completes or is
compensated, by this process or, after a crash, by the next one to start.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012_thread_rolling_back"
down_revision = "0011_attempt_reason_wake"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("threads", sa.Column("rollback_operation_id", sa.Uuid(), nullable=True))


def downgrade() -> None:
    op.drop_column("threads", "rollback_operation_id")

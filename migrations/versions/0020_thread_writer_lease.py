"""a thread's writer lease

Revision ID: 0020_thread_writer_lease
Revises: 0019_budgets
Create Date: 2026-12-02 17:10:00.000000

`threads.lease_token_id`, `lease_token_name`, `lease_device_id`, `lease_expires_at`: who drives the thread
(acquireThreadLease: a token and the device it named) and until when. While `lease_expires_at` is in the
future, client commands from anyone else are refused with WRITER_LEASE_HELD. Existing threads have no lease
and behave as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0020_thread_writer_lease"
down_revision = "0019_budgets"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("threads", sa.Column("lease_token_id", sa.Uuid(), nullable=True))
    op.add_column("threads", sa.Column("lease_token_name", sa.Text(), nullable=True))
    op.add_column("threads", sa.Column("lease_device_id", sa.Text(), nullable=True))
    op.add_column("threads", sa.Column("lease_expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    for column in ("lease_expires_at", "lease_device_id", "lease_token_name", "lease_token_id"):
        op.drop_column("threads", column)

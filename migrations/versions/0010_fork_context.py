"""a fork's context, frozen when the fork is made

Revision ID: 0010_fork_context
Revises: 0009_provider_thread_settings
Create Date: 2026-12-02 14:00:00.000000

`context_transfers.fork_context` (domain.forks.FrozenContext): a FORK transfer's portable context, built at
`forkThread` from the source's log as it was then, so a later rollback, provider switch or fork of the source
cannot change what the fork's first run receives. Forks made before this revision keep NULL: their context is
built from the log at their first run, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0010_fork_context"
down_revision = "0009_provider_thread_settings"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("context_transfers", sa.Column("fork_context", JSONB(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.drop_column("context_transfers", "fork_context")

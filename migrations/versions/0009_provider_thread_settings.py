"""the settings a provider thread last ran with

Revision ID: 0009_provider_thread_settings
Revises: 0008_handoff_omitted_runs
Create Date: 2026-12-02 13:40:00.000000

`provider_threads.model` and `provider_threads.runtime_mode`: the model (NULL: the instance's default) and
runtime mode the provider thread last ran a turn with (domain.settings_compat). A run asking for others that
its driver cannot change on a live provider thread starts a new one with a full summary. Provider threads
made before this revision keep NULL: nothing recorded, so their next run keeps them and records its settings.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009_provider_thread_settings"
down_revision = "0008_handoff_omitted_runs"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("provider_threads", sa.Column("model", sa.Text(), nullable=True))
    op.add_column("provider_threads", sa.Column("runtime_mode", sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column("provider_threads", "runtime_mode")
    op.drop_column("provider_threads", "model")

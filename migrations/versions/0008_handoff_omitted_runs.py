"""the runs a handoff left out for length

Revision ID: 0008_handoff_omitted_runs
Revises: 0007_run_failure_code
Create Date: 2026-12-02 13:30:00.000000

`context_handoffs.omitted_run_ordinals`: the selected runs a handoff listed as omitted because the text
would not fit its budget. A provider thread is told of a run by a handoff when the run is covered or
omitted there; with the set of runs it holds (no longer "everything up to the last ordinal it saw"), an
omitted run would otherwise be handed again at every return. Handoffs written before this revision keep
NULL: they are read as omitting nothing.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0008_handoff_omitted_runs"
down_revision = "0007_run_failure_code"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("context_handoffs", sa.Column("omitted_run_ordinals", JSONB(none_as_null=True), nullable=True))


def downgrade() -> None:
    op.drop_column("context_handoffs", "omitted_run_ordinals")

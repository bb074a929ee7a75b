"""an archived project

Revision ID: 0014_project_archived
Revises: 0013_provider_turn_rolled_back
Create Date: 2026-12-02 15:30:00.000000

`projects.archived_at`: set by archiveProject. An archived project is left out of `projects` (unless
`includeArchived`), refuses new runs (PROJECT_ARCHIVED) and new threads; unarchiveProject clears it.
Existing projects stay as they are (null: not archived).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014_project_archived"
down_revision = "0013_provider_turn_rolled_back"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("projects", sa.Column("archived_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("projects", "archived_at")

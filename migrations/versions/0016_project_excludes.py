"""a project's own checkpoint exclude list

Revision ID: 0016_project_excludes
Revises: 0015_graph_link_indexes
Create Date: 2026-12-02 15:10:00.000000

`projects.excludes`: a JSON list of gitignore patterns set by `updateProject(excludes:)`; the project's
shadow repositories leave those paths out instead of the server's THREADLOOM_CHECKPOINT_EXCLUDES.
Existing projects stay as they are (null: the server's list).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision = "0016_project_excludes"
down_revision = "0015_graph_link_indexes"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("projects", sa.Column("excludes", JSONB(), nullable=True))


def downgrade() -> None:
    op.drop_column("projects", "excludes")

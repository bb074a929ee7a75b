"""token expiry

Revision ID: 0003_token_expiry
Revises: 0002
Create Date: 2026-12-01 03:30:00.000000

`api_tokens.expires_at`: a token made with `token create --expires-in` stops authenticating
at that instant (NULL: it never expires).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003_token_expiry"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_tokens", sa.Column("expires_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("api_tokens", "expires_at")

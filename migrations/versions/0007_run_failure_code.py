"""a failed run's failure code

Revision ID: 0007_run_failure_code
Revises: 0006_run_fresh_context
Create Date: 2026-12-02 09:00:00.000000

`runs.failure_code` (domain.failures.RunFailureCode: why a FAILED run failed, e.g. MODEL_RATE_LIMITED) and
`runs.failure_http_status` (the model API's HTTP status, when the agent's CLI reported one). Runs that
failed before this revision keep NULL: their code was never decided, and a replay of their events has none.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007_run_failure_code"
down_revision = "0006_run_fresh_context"
branch_labels = None
depends_on = None

CODES = (
    "MODEL_AUTH_FAILED",
    "MODEL_RATE_LIMITED",
    "MODEL_OVERLOADED",
    "MODEL_SERVER_ERROR",
    "MODEL_STREAM_CUT",
    "MODEL_REQUEST_FAILED",
    "AGENT_ERROR",
    "AGENT_EXITED",
    "PROVIDER_REFUSED",
    "SERVER_LOST",
    "WORKSPACE_ERROR",
)


def upgrade() -> None:
    op.add_column("runs", sa.Column("failure_code", sa.Text(), nullable=True))
    op.add_column("runs", sa.Column("failure_http_status", sa.BigInteger(), nullable=True))
    allowed = ", ".join(f"'{code}'" for code in CODES)
    op.create_check_constraint(op.f("ck_runs_failure_code_valid"), "runs", f"failure_code IN ({allowed})")


def downgrade() -> None:
    op.drop_constraint(op.f("ck_runs_failure_code_valid"), "runs", type_="check")
    op.drop_column("runs", "failure_http_status")
    op.drop_column("runs", "failure_code")

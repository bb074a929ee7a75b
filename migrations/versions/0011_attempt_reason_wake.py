"""an attempt started by a wake

Revision ID: 0011_attempt_reason_wake
Revises: 0010_fork_context
Create Date: 2026-12-02 14:30:00.000000

`run_attempts.reason` may be `wake`: the first attempt of a run Threadloom started on an idle parent thread
when a delegated task's result arrived (domain.wakes). Only the check constraint changes; no row is touched.
"""

from __future__ import annotations

from alembic import op

revision = "0011_attempt_reason_wake"
down_revision = "0010_fork_context"
branch_labels = None
depends_on = None

BEFORE = ("initial", "steering_restart", "retry", "provider_recovery")
AFTER = (*BEFORE, "wake")


def _reasons(values: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_run_attempts_reason_valid"), "run_attempts", type_="check")
    allowed = ", ".join(f"'{value}'" for value in values)
    op.create_check_constraint(op.f("ck_run_attempts_reason_valid"), "run_attempts", f"reason IN ({allowed})")


def upgrade() -> None:
    _reasons(AFTER)


def downgrade() -> None:
    op.execute("UPDATE run_attempts SET reason = 'initial' WHERE reason = 'wake'")
    _reasons(BEFORE)

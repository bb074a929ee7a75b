"""a subagent's provider turn can be rolled back

Revision ID: 0013_provider_turn_rolled_back
Revises: 0012_thread_rolling_back
Create Date: 2026-12-02 15:00:00.000000

`provider_turns.status` may be `rolled_back`: rollbackNode dropped a subagent's turn from the subagent's own
provider thread (domain.subagents). The turn stays on record; the provider no longer holds it. Only the check
constraint changes; no row is touched.
"""

from __future__ import annotations

from alembic import op

revision = "0013_provider_turn_rolled_back"
down_revision = "0012_thread_rolling_back"
branch_labels = None
depends_on = None

BEFORE = ("pending", "running", "completed", "interrupted", "failed")
AFTER = (*BEFORE, "rolled_back")


def _statuses(values: tuple[str, ...]) -> None:
    op.drop_constraint(op.f("ck_provider_turns_status_valid"), "provider_turns", type_="check")
    allowed = ", ".join(f"'{value}'" for value in values)
    op.create_check_constraint(op.f("ck_provider_turns_status_valid"), "provider_turns", f"status IN ({allowed})")


def upgrade() -> None:
    _statuses(AFTER)


def downgrade() -> None:
    op.execute("UPDATE provider_turns SET status = 'completed' WHERE status = 'rolled_back'")
    _statuses(BEFORE)

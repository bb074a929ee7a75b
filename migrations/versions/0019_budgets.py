"""budgets: spending limits on a project, or on a thread with its delegated tasks

Revision ID: 0019_budgets
Revises: 0018_webhooks
Create Date: 2026-12-02 17:00:00.000000

`budgets` is the projection of the `budget` entity (events `budget.created` / `budget.updated`): a limit in
billionths of a dollar and/or tokens over a window (RUN, DAY, MONTH, TOTAL), with what passing it does (STOP
or ASK; docs/usage.md, "Budgets"). A runtime request may now be of kind `budget` (ASK's question), so the
check on `runtime_requests.kind` gains that value. Nothing existing is rewritten.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019_budgets"
down_revision = "0018_webhooks"
branch_labels = None
depends_on = None

INDEXES = (("project_id",), ("thread_id",))
KINDS = ("command_approval", "file_change_approval", "permission", "user_input", "elicitation")


def _kinds(kinds: tuple[str, ...]) -> str:
    return "kind IN ({})".format(", ".join(f"'{k}'" for k in kinds))


def upgrade() -> None:
    op.create_table(
        "budgets",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("project_id", sa.Uuid(), nullable=False),
        sa.Column("thread_id", sa.Uuid(), nullable=True),
        sa.Column("time_window", sa.Text(), nullable=False),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("max_cost_nano_usd", sa.BigInteger(), nullable=True),
        sa.Column("max_tokens", sa.BigInteger(), nullable=True),
        sa.Column("cleared_at", sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint(
            "time_window IN ('run', 'day', 'month', 'total')", name=op.f("ck_budgets_time_window_valid")
        ),
        sa.CheckConstraint("action IN ('stop', 'ask')", name=op.f("ck_budgets_action_valid")),
        sa.ForeignKeyConstraint(["project_id"], ["projects.id"], name=op.f("fk_budgets_project_id_projects")),
        sa.ForeignKeyConstraint(["thread_id"], ["threads.id"], name=op.f("fk_budgets_thread_id_threads")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budgets")),
    )
    for columns in INDEXES:
        op.create_index(op.f(f"ix_budgets_{'_'.join(columns)}"), "budgets", list(columns), unique=False)
    op.drop_constraint(op.f("ck_runtime_requests_kind_valid"), "runtime_requests", type_="check")
    op.create_check_constraint(op.f("ck_runtime_requests_kind_valid"), "runtime_requests", _kinds((*KINDS, "budget")))


def downgrade() -> None:
    op.execute("DELETE FROM runtime_requests WHERE kind = 'budget'")
    op.drop_constraint(op.f("ck_runtime_requests_kind_valid"), "runtime_requests", type_="check")
    op.create_check_constraint(op.f("ck_runtime_requests_kind_valid"), "runtime_requests", _kinds(KINDS))
    for columns in reversed(INDEXES):
        op.drop_index(op.f(f"ix_budgets_{'_'.join(columns)}"), table_name="budgets")
    op.drop_table("budgets")

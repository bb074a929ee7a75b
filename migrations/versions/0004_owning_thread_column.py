"""one name for the owning-thread column

Revision ID: 0004_owning_thread_column
Revises: 0003_token_expiry
Create Date: 2026-12-01 04:20:00.000000

Every projection names the thread whose log holds it `thread_id`: `provider_threads.app_thread_id` and
`context_transfers.target_thread_id` (a transfer is held by its target thread) are renamed, with their
foreign keys and index, and the stored events carrying those entities are rewritten to the new field
name so `log.rebuild_projections` replays them unchanged.
"""

from __future__ import annotations

from alembic import op

revision = "0004_owning_thread_column"
down_revision = "0003_token_expiry"
branch_labels = None
depends_on = None

# (table, entity type in the log, old column, its foreign key, its index or None)
RENAMED = (
    (
        "provider_threads",
        "provider_thread",
        "app_thread_id",
        "fk_provider_threads_{}_threads",
        "ix_provider_threads_{}",
    ),
    ("context_transfers", "context_transfer", "target_thread_id", "fk_context_transfers_{}_threads", None),
)


def _rename(*, to_thread_id: bool) -> None:
    for table, entity_type, column, fk, index in RENAMED:
        before, after = (column, "thread_id") if to_thread_id else ("thread_id", column)
        op.alter_column(table, before, new_column_name=after)
        op.execute(f"ALTER TABLE {table} RENAME CONSTRAINT {fk.format(before)} TO {fk.format(after)}")
        if index is not None:
            op.execute(f"ALTER INDEX {index.format(before)} RENAME TO {index.format(after)}")
        # `->` is SQL NULL only when the key is absent (a JSON null is not), so this finds every old row.
        op.execute(
            f"UPDATE events SET payload = (payload - '{before}') || jsonb_build_object('{after}', payload -> '{before}') "
            f"WHERE entity_type = '{entity_type}' AND (payload -> '{before}') IS NOT NULL"
        )


def upgrade() -> None:
    _rename(to_thread_id=True)


def downgrade() -> None:
    _rename(to_thread_id=False)

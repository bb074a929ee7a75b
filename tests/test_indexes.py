"""The indexes the tables declare (store/tables.py) are the ones the migrations build.

The graph links look rows up by `runs.provider_thread_id`, `context_handoffs.target_run_id`,
`context_transfers.thread_id` / `.source_thread_id` and `threads.parent_thread_id`; without an index each
lookup scanned its table. Migration 0015 builds those indexes and its downgrade drops them. The metadata and
the migrated database are compared through `pg_indexes` (no timings: the planner's choice on a small test
database says nothing).
"""

from __future__ import annotations

import sqlalchemy as sa

from tests.support.pg import PgServer
from threadloom.store import migrate
from threadloom.store.db import Database
from threadloom.store.tables import metadata

GRAPH_LINK_INDEXES = {
    ("runs", "ix_runs_provider_thread_id"),
    ("context_handoffs", "ix_context_handoffs_target_run_id"),
    ("context_transfers", "ix_context_transfers_thread_id"),
    ("context_transfers", "ix_context_transfers_source_thread_id"),
    ("threads", "ix_threads_parent_thread_id"),
}


async def _indexes(db: Database) -> dict[tuple[str, str], str]:
    """(table, index name) → its definition, for every index of the public schema."""
    async with db.read() as r:
        rows = await r.rows(
            sa.text("SELECT tablename, indexname, indexdef FROM pg_indexes WHERE schemaname = 'public'")
        )
    # Unquoted: pg_indexes quotes a column named by a keyword (`"position"`).
    return {(row["tablename"], row["indexname"]): row["indexdef"].replace('"', "") for row in rows}


def _declared() -> dict[tuple[str, str], tuple[str, ...]]:
    """(table, index name) → its columns, for every index the metadata declares."""
    return {
        (table.name, str(index.name)): tuple(c.name for c in index.columns)
        for table in metadata.tables.values()
        for index in table.indexes
    }


async def test_every_index_the_tables_declare_is_built_by_the_migrations_on_its_columns(pg: PgServer) -> None:
    db = Database.from_url(await pg.fresh(migrated=False), pool_size=1)
    try:
        await migrate.upgrade(db.engine)
        built = await _indexes(db)
    finally:
        await db.dispose()
    declared = _declared()
    assert set(declared) >= GRAPH_LINK_INDEXES
    assert set(declared) - set(built) == set()
    wrong = {key: built[key] for key, columns in declared.items() if f"({', '.join(columns)})" not in built[key]}
    assert wrong == {}


async def test_the_graph_link_indexes_go_with_a_downgrade_and_come_back_with_an_upgrade(pg: PgServer) -> None:
    db = Database.from_url(await pg.fresh(migrated=False), pool_size=1)
    try:
        await migrate.upgrade(db.engine)
        assert set(await _indexes(db)) >= GRAPH_LINK_INDEXES
        await migrate.downgrade(db.engine, "0014_project_archived")
        assert GRAPH_LINK_INDEXES & set(await _indexes(db)) == set()
        await migrate.upgrade(db.engine)
        assert set(await _indexes(db)) >= GRAPH_LINK_INDEXES
    finally:
        await db.dispose()

"""Alembic: upgrade → downgrade → upgrade on an empty database, and the invariants it installs."""

from __future__ import annotations

import uuid

import asyncpg
import pytest
import sqlalchemy as sa
from alembic.runtime.migration import MigrationContext

from tests.support.pg import PgServer
from threadloom.store import migrate
from threadloom.store.db import Database
from threadloom.store.tables import metadata


async def _tables(db: Database) -> set[str]:
    async with db.read() as r:
        rows = await r.rows(sa.text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
    return {row["tablename"] for row in rows}


async def _alembics_own_reading(db: Database) -> str | None:
    async with db.engine.connect() as conn:
        return await conn.run_sync(lambda c: MigrationContext.configure(c).get_current_revision())


async def test_round_trip_on_empty_database(pg: PgServer) -> None:
    """At each step the revision the server reads (two plain statements) is the one Alembic reads itself."""
    db = Database.from_url(await pg.fresh(migrated=False), pool_size=1)
    try:
        assert await migrate.current_revision(db.engine) is None
        assert await _alembics_own_reading(db) is None
        await migrate.upgrade(db.engine, "0001")
        assert await migrate.current_revision(db.engine) == "0001" == await _alembics_own_reading(db)
        assert not await migrate.is_migrated(db.engine)
        await migrate.upgrade(db.engine)
        assert await migrate.is_migrated(db.engine)
        assert await migrate.current_revision(db.engine) == migrate.head_revision() == await _alembics_own_reading(db)
        assert set(metadata.tables) <= await _tables(db)
        await migrate.downgrade(db.engine, "base")
        assert await _tables(db) == {"alembic_version"}
        assert await migrate.current_revision(db.engine) is None
        assert await _alembics_own_reading(db) is None
        await migrate.upgrade(db.engine)
        assert set(metadata.tables) <= await _tables(db)
    finally:
        await db.dispose()


async def test_a_database_recording_two_revisions_is_refused_as_alembic_refuses_it(pg: PgServer) -> None:
    db = Database.from_url(await pg.fresh(), pool_size=1)
    try:
        async with db.transaction() as tx:
            await tx.execute(sa.text("INSERT INTO alembic_version VALUES ('0001')"))
        with pytest.raises(RuntimeError, match="more than one revision"):
            await migrate.current_revision(db.engine)
        with pytest.raises(Exception, match="more than one head"):
            await _alembics_own_reading(db)
    finally:
        await db.dispose()


async def test_database_constraints_enforce_run_and_event_invariants(pg: PgServer) -> None:
    url = await pg.fresh()
    conn = await pg.connect(url)
    try:
        project, thread = uuid.uuid4(), uuid.uuid4()
        await conn.execute("INSERT INTO projects VALUES ($1, 'p', '/w', now(), now())", project)
        await conn.execute(
            "INSERT INTO threads (id, project_id, title, provider_instance_id, runtime_mode, queue_held, "
            "created_at, updated_at) VALUES ($1, $2, 't', 'scripted', 'full_access', false, now(), now())",
            thread,
            project,
        )
        insert_run = (
            "INSERT INTO runs (id, thread_id, ordinal, provider_instance_id, status, requested_at) "
            "VALUES ($1, $2, $3, 'scripted', $4, now())"
        )
        await conn.execute(insert_run, uuid.uuid4(), thread, 1, "running")
        with pytest.raises(asyncpg.UniqueViolationError):  # one active run per thread
            await conn.execute(insert_run, uuid.uuid4(), thread, 2, "waiting")
        with pytest.raises(asyncpg.UniqueViolationError):  # ordinal unique per thread
            await conn.execute(insert_run, uuid.uuid4(), thread, 1, "queued")
        with pytest.raises(asyncpg.CheckViolationError):  # statuses are a closed list
            await conn.execute(insert_run, uuid.uuid4(), thread, 3, "exploded")
        with pytest.raises(asyncpg.ForeignKeyViolationError):
            await conn.execute(insert_run, uuid.uuid4(), uuid.uuid4(), 1, "queued")
        insert_event = (
            "INSERT INTO events (thread_id, sequence, event_type, entity_type, entity_id, occurred_at, payload) "
            "VALUES ($1, $2, 'x', 'thread', $1, now(), '{}')"
        )
        await conn.execute(insert_event, thread, 1)
        with pytest.raises(asyncpg.UniqueViolationError):  # (thread_id, sequence) unique
            await conn.execute(insert_event, thread, 1)
    finally:
        await conn.close()

"""A database user cancelled mid-statement does not hand its session to the next user of the pool.

Found by a CI run: `thread(id:)` answered INTERNAL_SERVER_ERROR, its snapshot's
`BEGIN ISOLATION LEVEL REPEATABLE READ` refused with "must be called before any query". The
connection's previous user was a loader's read, cancelled as its subscription was ended by the
client. asyncpg prepares a statement (Parse, Describe, Flush) before it binds and runs it (Bind,
Execute, Sync); a task cancelled as its prepare answered leaves the server in an implicit transaction
holding a snapshot while asyncpg believes the session idle, and the connection went back to the pool
so. Likewise SQLAlchemy's lazy BEGIN cancelled as it answers: asyncpg keeps that transaction as the
connection's top one and SQLAlchemy holds none to roll back, so the next user's BEGIN became a savepoint and
its COMMIT released it, committing nothing. Here a user is cancelled at exactly those points, on the real
database, through each way the store checks out a connection; the next users of the one-connection pool
then read through a query's snapshot and commit a write that another session sees.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.pg import PgServer
from threadloom.store.db import Database, Reader


@contextlib.asynccontextmanager
async def _snapshot_read(db: Database) -> AsyncIterator[Reader]:
    snapshot = db.snapshot()
    try:
        async with snapshot.reader() as reader:
            yield reader
    finally:
        await snapshot.close()


CHECKOUTS: dict[str, Callable[[Database], Any]] = {
    "statements": lambda db: db.statements(),
    "read": lambda db: db.read(),
    "transaction": lambda db: db.transaction(),
    "snapshot": _snapshot_read,
}


async def _prepare(driver: Any) -> None:
    await driver.prepare("SELECT count(*) FROM threads")  # answered; its Bind, Execute, Sync not sent


async def _begin(driver: Any) -> None:
    """As SQLAlchemy's lazy BEGIN when its task is cancelled as the BEGIN answers: asyncpg holds the transaction
    as the connection's top one, SQLAlchemy holds none to roll back."""
    await driver.transaction().start()


@pytest.mark.parametrize(
    ("checkout", "stopped"),
    [(checkout, _prepare) for checkout in CHECKOUTS] + [(checkout, _begin) for checkout in ("statements", "read")],
)
async def test_a_user_cancelled_mid_statement_leaves_the_pool_clean(
    pg: PgServer, checkout: str, stopped: Callable[[Any], Any]
) -> None:
    url = await pg.fresh()
    other = await pg.connect(url)  # another session, outside the pool
    await other.execute("CREATE TABLE marks (n int)")
    db = Database.from_url(url, pool_size=1)  # one pooled connection: the next user gets it back
    prepared = asyncio.Event()

    async def user() -> None:
        async with CHECKOUTS[checkout](db) as reader:
            driver = (await reader.conn.get_raw_connection()).driver_connection
            await stopped(driver)
            prepared.set()
            await asyncio.Event().wait()  # cancelled here, as if it had been as the prepare answered

    task = asyncio.create_task(user())
    try:
        await prepared.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        async with _snapshot_read(db) as reader:  # a query's snapshot: BEGIN ... REPEATABLE READ, READ ONLY
            assert await reader.tuples(sa.text("SELECT count(*) FROM marks")) == [(0,)]
        async with db.transaction() as writer:  # a command: its COMMIT must commit
            await writer.execute(sa.text("INSERT INTO marks VALUES (1)"))
        assert await other.fetchval("SELECT count(*) FROM marks") == 1
    finally:
        task.cancel()
        await db.dispose()
        await other.close()

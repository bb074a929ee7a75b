"""This process as a worker: a row in `workers` and an advisory lock held for its lifetime.

Other processes see this worker as alive exactly while the lock is held; when the
process dies its connection closes and the lock goes, so recovery can start at once.
"""

from __future__ import annotations

import uuid

from sqlalchemy.ext.asyncio import AsyncConnection

from threadloom.domain.ids import new_id
from threadloom.engine.clock import Clock
from threadloom.store import workers as worker_store
from threadloom.store.db import Database


class Worker:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self.id: uuid.UUID = new_id()
        self._conn: AsyncConnection | None = None

    async def start(self) -> None:
        self._conn = await self.db.engine.connect()
        await worker_store.register(self._conn, self.id, self.clock.now())

    async def stop(self) -> None:
        async with self.db.transaction() as db:
            await worker_store.mark_stopped(db, self.id, self.clock.now())
        if self._conn is not None:
            # Drop the database session itself (not back to the pool): that releases the lock.
            await self._conn.invalidate()
            await self._conn.close()
            self._conn = None

"""This process as a worker: a row in `workers` and an advisory lock held for its lifetime.

Other processes see this worker as alive exactly while the lock is held; when the
process dies its connection closes and the lock goes, so recovery can start at once.

The lock can also go while the process lives (the connection broke: a network cut, a database
restart or failover). The others then recover this worker's runs and take its effects while
its agent processes keep running — two owners of one provider thread. So the worker watches its
connection, and when it breaks the process is told to stop (`on_lost`): the graceful stop, then
a restart by whatever runs the process, as a new worker.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable

from sqlalchemy.ext.asyncio import AsyncConnection

from threadloom.domain.ids import new_id
from threadloom.engine.clock import Clock
from threadloom.store import workers as worker_store
from threadloom.store.db import Database

log = logging.getLogger("threadloom.worker")

WATCH_SECONDS = 1.0  # how often the lock's connection is checked


class Worker:
    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self.id: uuid.UUID = new_id()
        self._conn: AsyncConnection | None = None
        self._watch: asyncio.Task[None] | None = None

    async def start(self, on_lost: Callable[[], None] | None = None) -> None:
        self._conn = await self.db.engine.connect()
        await worker_store.register(self._conn, self.id, self.clock.now())
        if on_lost is not None:
            self._watch = asyncio.create_task(self._watch_lock(self._conn, on_lost), name="worker-lock")

    async def _watch_lock(self, conn: AsyncConnection, on_lost: Callable[[], None]) -> None:
        """Call `on_lost` once the lock's connection fails a statement (slowness alone is no loss)."""
        while True:
            await asyncio.sleep(WATCH_SECONDS)
            try:
                await worker_store.ping(conn)
            except Exception as error:
                log.error("worker %s lost its lock connection (%s): stopping this process", self.id, error)
                on_lost()
                return

    async def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watch
            self._watch = None
        try:
            async with self.db.transaction() as db:
                await worker_store.mark_stopped(db, self.id, self.clock.now())
        except Exception as error:  # the database is gone: the lock went with its connection already
            log.warning("worker %s could not record its stop (%s)", self.id, error)
        if self._conn is not None:
            # Drop the database session itself (not back to the pool): that releases the lock.
            await self._conn.invalidate()
            await self._conn.close()
            self._conn = None

"""Row access for threads and projects used by command handlers."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from threadloom.domain.entities import AppThread, Project
from threadloom.store import tables as t
from threadloom.store.db import Reader

THREAD_LOCK_SPACE = 0x7468
_LOCK = sa.text(
    "WITH held AS MATERIALIZED (SELECT pg_advisory_xact_lock(:space, hashtext(:key))) "
    "SELECT threads.* FROM held, threads WHERE threads.id = :id FOR NO KEY UPDATE OF threads"
)


async def lock(db: Reader, thread_id: uuid.UUID) -> AppThread | None:
    """Serialize commands on one thread across processes, then read the row `FOR NO KEY UPDATE`.

    The advisory lock comes first so that a waiting transaction gets its transaction id
    only once it holds the thread: per thread, transaction ids then follow commit order,
    which the project feed (ordered by writer transaction id) relies on. One statement (a
    write transaction's first, so every command's round trip): the lock is taken in a
    materialized CTE the row must join, so the row is locked, and an id assigned, only after
    it; the row lock returns the row's latest version, committed while this one waited.

    `NO KEY UPDATE`, never `FOR UPDATE`: a foreign-key check on a row naming this thread takes
    `FOR KEY SHARE` of it, which only `FOR UPDATE` blocks. With `FOR UPDATE` a mergeBack (source
    locked, its transfer's check waiting for the fork's row) and a step of the fork writing the
    fork's row twice (PostgreSQL then checks `parent_thread_id` again: waiting for the source's row)
    deadlocked. Nothing changes a thread's id, so no command needs more (docs/architecture.md).
    """
    row = await db.one_or_none(_LOCK, {"space": THREAD_LOCK_SPACE, "key": str(thread_id), "id": thread_id})
    return None if row is None else AppThread.from_mapping(row)


async def get_project(db: Reader, project_id: uuid.UUID) -> Project | None:
    row = await db.one_or_none(sa.select(t.projects).where(t.projects.c.id == project_id))
    return None if row is None else Project.from_mapping(row)


async def get_thread(db: Reader, thread_id: uuid.UUID) -> AppThread | None:
    row = await db.one_or_none(sa.select(t.threads).where(t.threads.c.id == thread_id))
    return None if row is None else AppThread.from_mapping(row)

"""Row access for threads and projects used by command handlers."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from threadloom.domain.entities import AppThread, Project
from threadloom.store import tables as t
from threadloom.store.db import Reader


async def lock(db: Reader, thread_id: uuid.UUID) -> AppThread | None:
    """`SELECT … FOR UPDATE` on the thread row: the per-thread serialization across processes."""
    row = await db.one_or_none(sa.select(t.threads).where(t.threads.c.id == thread_id).with_for_update())
    return None if row is None else AppThread.from_mapping(row)


async def get_project(db: Reader, project_id: uuid.UUID) -> Project | None:
    row = await db.one_or_none(sa.select(t.projects).where(t.projects.c.id == project_id))
    return None if row is None else Project.from_mapping(row)

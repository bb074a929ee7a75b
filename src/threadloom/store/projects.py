"""Row access for the project management commands and the run gate."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from threadloom.domain.entities import Project
from threadloom.store import tables as t
from threadloom.store.db import Reader

_THREAD_PROJECT = (
    sa.select(t.projects, t.threads.c.workspace_path.label("thread_workspace_path"))
    .select_from(t.threads.join(t.projects, t.projects.c.id == t.threads.c.project_id))
    .where(t.threads.c.id == sa.bindparam("thread_id"))
)


async def lock_project(db: Reader, project_id: uuid.UUID) -> Project | None:
    """The project's row `FOR NO KEY UPDATE`: a rename and an archive of one project are serialized, neither
    lost, while its threads' foreign-key checks (`FOR KEY SHARE`) go on (`threads.lock` says why)."""
    query = sa.select(t.projects).where(t.projects.c.id == project_id).with_for_update(key_share=True)
    row = await db.one_or_none(query)
    return None if row is None else Project.from_mapping(row)


async def project_of_thread(db: Reader, thread_id: uuid.UUID) -> tuple[Project, bool] | None:
    """The thread's project, and whether the thread works in a folder of its own (a fork) rather than
    the project's workspace root; None for an unknown thread. One statement."""
    row = await db.one_or_none(_THREAD_PROJECT, {"thread_id": thread_id})
    if row is None:
        return None
    values = dict(row)
    own = bool(values.pop("thread_workspace_path"))
    return Project.from_mapping(values), own


async def own_excludes(db: Reader) -> dict[uuid.UUID, tuple[str, ...]]:
    """Every project that has a checkpoint exclude list of its own, with that list."""
    rows = await db.rows(sa.select(t.projects.c.id, t.projects.c.excludes).where(t.projects.c.excludes.is_not(None)))
    return {row["id"]: tuple(row["excludes"]) for row in rows}

"""Reads a rollback in a shared workspace needs: the other threads writing in the same folder, their active
runs, and the root checkpoints their runs captured since a point in time."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import datetime

import sqlalchemy as sa

from threadloom.domain.entities import AppThread
from threadloom.domain.statuses import ACTIVE_RUN_STATUSES, CheckpointScopeKind, CheckpointStatus
from threadloom.domain.workspace_rollback import captured_at
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader


@dataclasses.dataclass(frozen=True, slots=True)
class Captured:
    """One root checkpoint of another thread, with the one before it on that thread (None: its first)."""

    thread_id: uuid.UUID
    thread_title: str
    run_id: uuid.UUID | None
    run_ordinal: int | None
    ref: str
    previous_ref: str | None
    captured_at: datetime  # `domain.workspace_rollback.captured_at`


async def sharing(db: Reader, thread: AppThread) -> list[AppThread]:
    """The project's other threads that work in the same folder (the project's, or the same own folder)."""
    table = t.threads
    same = (
        table.c.workspace_path.is_(None)
        if thread.workspace_path is None
        else table.c.workspace_path == thread.workspace_path
    )
    return await entities.where(db, AppThread, table.c.project_id == thread.project_id, table.c.id != thread.id, same)


async def active_in(db: Reader, threads: list[AppThread]) -> dict[uuid.UUID, str]:
    """Those of `threads` with an active run: id → title."""
    if not threads:
        return {}
    active = [s.value for s in ACTIVE_RUN_STATUSES]
    rows = await db.rows(
        sa.select(t.runs.c.thread_id).where(
            t.runs.c.thread_id.in_([x.id for x in threads]), t.runs.c.status.in_(active)
        )
    )
    busy = {r["thread_id"] for r in rows}
    return {x.id: x.title for x in threads if x.id in busy}


async def captured_since(db: Reader, threads: list[AppThread], since: datetime) -> list[Captured]:
    """The ready root checkpoints `threads` captured after `since`, in the order they were captured
    (`domain.workspace_rollback.captured_at`), each with the one its thread captured before it."""
    if not threads:
        return []
    c, s, r = t.checkpoints, t.checkpoint_scopes, t.runs
    rows = await db.rows(
        sa.select(c.c.id, c.c.thread_id, c.c.ref, c.c.created_at, c.c.run_id, r.c.ordinal, r.c.completed_at)
        .select_from(c.join(s, s.c.id == c.c.scope_id).outerjoin(r, r.c.id == c.c.run_id))
        .where(
            c.c.thread_id.in_([x.id for x in threads]),
            s.c.kind == CheckpointScopeKind.ROOT_RUN.value,
            c.c.status.in_([CheckpointStatus.READY.value, CheckpointStatus.STALE.value]),
            c.c.ref.is_not(None),
        )
    )
    titles = {x.id: x.title for x in threads}
    found: list[Captured] = []
    previous: dict[uuid.UUID, str] = {}
    timed = [(captured_at(row["created_at"], row["completed_at"]), str(row["id"]), row) for row in rows]
    for at, _, row in sorted(timed, key=lambda entry: entry[:2]):
        thread_id = row["thread_id"]
        if at > since:
            ordinal = int(row["ordinal"]) if row["ordinal"] is not None else None
            found.append(
                Captured(
                    thread_id,
                    titles[thread_id],
                    row["run_id"],
                    ordinal,
                    row["ref"],
                    previous.get(thread_id),
                    at,
                )
            )
        previous[thread_id] = row["ref"]
    return found

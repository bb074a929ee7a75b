"""Reads a provider switch needs: the thread's provider threads of an instance, what they were handed, its runs."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from threadloom.domain.entities import ContextHandoff, ProviderThread
from threadloom.domain.handoffs import NOT_IN_CONVERSATION
from threadloom.domain.statuses import HandoffStatus
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader
from threadloom.store.rollback_facts import handoffs_to


async def provider_threads_of(db: Reader, thread_id: uuid.UUID, instance: str) -> list[ProviderThread]:
    """The thread's own provider threads (not a subagent's) of `instance`, newest first."""
    table = t.provider_threads
    return await entities.where(
        db,
        ProviderThread,
        table.c.thread_id == thread_id,
        table.c.provider_instance_id == instance,
        table.c.owner_node_id.is_(None),
        order_by=[table.c.created_at.desc(), table.c.id.desc()],
    )


async def delivered_to(db: Reader, provider_thread_id: uuid.UUID) -> list[ContextHandoff]:
    return await handoffs_to(db, provider_thread_id, HandoffStatus.DELIVERED)


async def conversation_before(db: Reader, thread_id: uuid.UUID, ordinal: int) -> list[int]:
    """Ordinals of the thread's runs before `ordinal` that are part of its conversation."""
    left_out = [s.value for s in NOT_IN_CONVERSATION]
    rows = await db.rows(
        sa.select(t.runs.c.ordinal).where(
            t.runs.c.thread_id == thread_id, t.runs.c.ordinal < ordinal, t.runs.c.status.not_in(left_out)
        )
    )
    return sorted(int(r["ordinal"]) for r in rows)

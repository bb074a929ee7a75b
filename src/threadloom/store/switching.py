"""Reads a provider switch needs: the thread's provider threads of an instance, what they were handed, its runs."""

from __future__ import annotations

import uuid

import sqlalchemy as sa

from threadloom.domain.entities import ContextHandoff, ProviderThread
from threadloom.domain.handoffs import NOT_IN_CONVERSATION
from threadloom.domain.statuses import HandoffStatus, RunStatus
from threadloom.domain.switching import Histories, History
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader


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


async def histories(db: Reader, thread_id: uuid.UUID) -> Histories:
    """What each of the thread's own provider threads was given (`domain.switching.History`): the runs it ran
    a turn of that reached the provider, its delivered and pending handoffs and the run that carried each;
    and the thread's rolled-back runs. Four reads for all of them."""
    table = t.provider_threads
    pts = await entities.where(db, ProviderThread, table.c.thread_id == thread_id, table.c.owner_node_id.is_(None))
    turns, attempts, runs = t.provider_turns, t.run_attempts, t.runs
    rows = await db.rows(
        sa.select(turns.c.provider_thread_id, runs.c.ordinal)
        .distinct()
        .select_from(
            turns.join(attempts, attempts.c.id == turns.c.run_attempt_id).join(runs, runs.c.id == attempts.c.run_id)
        )
        .where(turns.c.thread_id == thread_id, turns.c.native_turn_ref.is_not(None))
    )
    ran: dict[uuid.UUID, set[int]] = {}
    for row in rows:
        ran.setdefault(row["provider_thread_id"], set()).add(int(row["ordinal"]))
    run_rows = await db.rows(sa.select(runs.c.id, runs.c.ordinal, runs.c.status).where(runs.c.thread_id == thread_id))
    ordinal_of = {row["id"]: int(row["ordinal"]) for row in run_rows}
    rolled_back = frozenset(int(r["ordinal"]) for r in run_rows if r["status"] == RunStatus.ROLLED_BACK.value)
    c = t.context_handoffs.c
    given = await entities.where(
        db,
        ContextHandoff,
        c.thread_id == thread_id,
        c.status.in_([HandoffStatus.DELIVERED.value, HandoffStatus.PENDING.value]),
        order_by=[c.created_at, c.id],
    )
    handed: dict[uuid.UUID, list[ContextHandoff]] = {}
    for handoff in given:
        if handoff.to_provider_thread_id is not None:
            handed.setdefault(handoff.to_provider_thread_id, []).append(handoff)

    def carried(of: list[ContextHandoff]) -> dict[uuid.UUID, int]:
        return {
            h.id: ordinal_of[h.target_run_id]
            for h in of
            if h.status == HandoffStatus.DELIVERED and h.target_run_id in ordinal_of
        }

    threads = {
        pt.id: History(pt, frozenset(ran.get(pt.id, ())), tuple(handed.get(pt.id, ())), carried(handed.get(pt.id, [])))
        for pt in pts
    }
    return Histories(threads, rolled_back)


async def conversation_before(db: Reader, thread_id: uuid.UUID, ordinal: int) -> list[int]:
    """Ordinals of the thread's runs before `ordinal` that are part of its conversation."""
    left_out = [s.value for s in NOT_IN_CONVERSATION]
    rows = await db.rows(
        sa.select(t.runs.c.ordinal).where(
            t.runs.c.thread_id == thread_id, t.runs.c.ordinal < ordinal, t.runs.c.status.not_in(left_out)
        )
    )
    return sorted(int(r["ordinal"]) for r in rows)

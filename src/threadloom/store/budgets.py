"""Budgets' reads: a scope's budgets, the delegation chain a run's spending counts in, and the answers a run
already got (domain/budgets.py; what each budget has spent comes from `store.usage.totals`)."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence

import sqlalchemy as sa

from threadloom.domain import budgets as rules
from threadloom.domain.entities import AppThread, Budget, ExecutionNode, RuntimeRequest
from threadloom.domain.statuses import BudgetWindow, LineageRelationship, RuntimeRequestKind, RuntimeRequestStatus
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader

MAX_DEPTH = 64  # delegation deeper than this is not followed (a guard, not a rule)


async def of_scope(
    db: Reader, project_id: uuid.UUID, thread_id: uuid.UUID | None, window: BudgetWindow
) -> Budget | None:
    """The budget of this scope and window, cleared or not (setBudget changes it rather than adding one)."""
    scope = t.budgets.c.thread_id == thread_id if thread_id is not None else t.budgets.c.thread_id.is_(None)
    found = await entities.where(
        db, Budget, t.budgets.c.project_id == project_id, scope, t.budgets.c.time_window == window.value
    )
    return found[0] if found else None


async def active(db: Reader, project_id: uuid.UUID, thread_ids: Sequence[uuid.UUID]) -> list[Budget]:
    """The project's own budgets and those of these threads, not cleared, in one statement."""
    return await entities.in_order(
        db,
        Budget,
        t.budgets.c.project_id == project_id,
        t.budgets.c.cleared_at.is_(None),
        sa.or_(t.budgets.c.thread_id.is_(None), t.budgets.c.thread_id.in_(list(thread_ids))),
    )


async def any_active(db: Reader, thread_id: uuid.UUID) -> bool:
    """Whether the thread's project has a budget not cleared, its own or any of its threads': one statement.

    Every budget a run's spending counts against is of its thread's project (`active`), and most projects have
    none: the checks after each model call and before each turn ask this first, outside a transaction, and read
    the run, its chain and the budgets only when it says yes."""
    project = sa.select(t.threads.c.project_id).where(t.threads.c.id == thread_id).scalar_subquery()
    found = sa.select(t.budgets.c.id).where(t.budgets.c.project_id == project, t.budgets.c.cleared_at.is_(None))
    return bool(await db.scalar(sa.select(sa.exists(found))))


@dataclasses.dataclass(frozen=True, slots=True)
class Level:
    """One step of a delegation chain: a thread and the run of it the spending belongs to."""

    thread_id: uuid.UUID
    run_id: uuid.UUID | None  # None: the task was delegated while its parent ran nothing


async def chain(db: Reader, thread: AppThread, run_id: uuid.UUID) -> list[Level]:
    """The run's thread, then each thread that delegated it (lineage SUBAGENT) with the run whose node did,
    up to the root of the tree: whose budgets a call of this run counts against."""
    levels = [Level(thread.id, run_id)]
    current = thread
    while current.lineage_relationship == LineageRelationship.SUBAGENT and current.parent_thread_id is not None:
        parent = await entities.get(db, AppThread, current.parent_thread_id)
        if parent is None or len(levels) >= MAX_DEPTH:
            break
        nodes = await entities.where(db, ExecutionNode, t.execution_nodes.c.child_thread_id == current.id)
        levels.append(Level(parent.id, nodes[0].run_id if nodes else None))
        current = parent
    return levels


async def budget_requests(db: Reader, run_id: uuid.UUID) -> list[RuntimeRequest]:
    """The run's BUDGET requests, pending and answered."""
    return await entities.where(
        db,
        RuntimeRequest,
        t.runtime_requests.c.run_id == run_id,
        t.runtime_requests.c.kind == RuntimeRequestKind.BUDGET.value,
    )


def answered_for(requests: Sequence[RuntimeRequest]) -> tuple[set[uuid.UUID], set[uuid.UUID]]:
    """(budgets this run was allowed past, budgets it has a question pending about)."""
    granted = {b for r in requests if rules.granted(r) and (b := rules.budget_of(r))}
    pending = {
        b for r in requests if r.status == RuntimeRequestStatus.PENDING and (b := rules.budget_of(r)) is not None
    }
    return granted, pending

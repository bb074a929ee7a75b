"""Reads behind the graph's links that are not a plain parent column (the API's loaders batch them).

`THREAD_TRANSFERS` lists each context transfer once per thread it touches (its target, and its source
when that is another thread), so a thread's transfers page like any other child list. `forks_of_runs`
finds the threads forked at each run: the fork point lives in the fork transfer's `source_point`.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from threadloom.domain.statuses import TransferType
from threadloom.store import tables as t
from threadloom.store.db import Reader

_ct = t.context_transfers

THREAD_TRANSFERS = sa.union_all(
    sa.select(_ct, _ct.c.thread_id.label("owner_thread_id")),
    sa.select(_ct, _ct.c.source_thread_id.label("owner_thread_id")).where(_ct.c.source_thread_id != _ct.c.thread_id),
).subquery("thread_transfers")

_FORK_RUN = _ct.c.source_point["runId"].astext

_FORKS_OF_RUNS = (
    sa.select(t.threads, _FORK_RUN.label("_fork_run"))
    .join(_ct, _ct.c.id == t.threads.c.forked_from_transfer_id)
    .where(
        _ct.c.type == TransferType.FORK.value,
        _FORK_RUN.in_(sa.bindparam("runs", expanding=True)),
    )
    .order_by(t.threads.c.id)
)


async def forks_of_runs(db: Reader, run_ids: Sequence[uuid.UUID]) -> dict[uuid.UUID, list[dict[str, Any]]]:
    """By run: the threads forked at it (archived ones too), oldest first; one statement for all runs."""
    found: dict[uuid.UUID, list[dict[str, Any]]] = {r: [] for r in run_ids}
    if not run_ids:
        return found
    for row in await db.dicts(_FORKS_OF_RUNS, {"runs": sorted({str(r) for r in run_ids})}):
        found[uuid.UUID(row.pop("_fork_run"))].append(row)
    return found

"""The database's side of /metrics, read when it is scraped (two statements), never kept per event."""

from __future__ import annotations

import dataclasses

import sqlalchemy as sa

from threadloom.store.db import Reader

# Every run by status: one pass over the runs table. Queued runs are the queue's depth.
_RUNS = sa.text("SELECT status, count(*) AS n FROM runs GROUP BY status")

# The outbox's unfinished effects: pending (waiting or due) and running, and the age of the oldest
# pending one by the database's clock. The pending rows are read through the claim index.
_OUTBOX = sa.text(
    """
    SELECT count(*) FILTER (WHERE status = 'pending') AS pending,
           count(*) FILTER (WHERE status = 'running') AS running,
           coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE status = 'pending')), 0) AS oldest
    FROM effects WHERE status IN ('pending', 'running')
    """
)


@dataclasses.dataclass(frozen=True, slots=True)
class Gauges:
    runs_by_status: dict[str, int]
    outbox_pending: int
    outbox_running: int
    outbox_oldest_seconds: float  # 0 when nothing is pending


async def read(db: Reader) -> Gauges:
    runs = {str(row["status"]): int(row["n"]) for row in await db.rows(_RUNS)}
    outbox = await db.one_or_none(_OUTBOX)
    assert outbox is not None  # an aggregate always has its row
    return Gauges(runs, int(outbox["pending"]), int(outbox["running"]), float(outbox["oldest"]))

"""The transactional effect outbox: effects are enqueued in the command's transaction."""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from typing import Any

import orjson
import sqlalchemy as sa

from threadloom import tracing
from threadloom.domain.changes import Effect
from threadloom.store import tables as t
from threadloom.store.db import Reader
from threadloom.store.workers import alive_sql


async def enqueue(
    db: Reader,
    thread_id: uuid.UUID | None,
    effects: Sequence[Effect],
    *,
    command_id: str | None,
    now: datetime,
) -> None:
    """Store `effects` (`rows`)."""
    await db.execute(sa.insert(t.effects), rows(thread_id, effects, command_id=command_id, now=now))


def rows(
    thread_id: uuid.UUID | None, effects: Sequence[Effect], *, command_id: str | None, now: datetime
) -> list[dict[str, Any]]:
    """The outbox rows of `effects` (for `enqueue`, or written with the command's events by `log.append`);
    with tracing on, each payload also carries the current trace context, so the effect's span continues
    the trace of the command that wrote it (effects.EffectWorker)."""
    trace = {tracing.CARRIER_KEY: tracing.carrier()} if tracing.ENABLED else {}
    return [
        {
            "thread_id": thread_id,
            "kind": e.kind,
            "payload": orjson.loads(orjson.dumps({**e.payload, **trace} if trace else e.payload)),
            "status": "pending",
            "replay_safe": e.replay_safe,
            "available_at": now + timedelta(seconds=e.delay_s),
            "command_id": command_id,
            "created_at": now,
            "affinity": e.affinity,
        }
        for e in effects
    ]


_CLAIM = sa.text(
    """
    WITH done AS (
      UPDATE effects SET status = 'done', completed_at = :now, last_error = NULL, lease_owner = NULL,
                         lease_expires_at = NULL
      WHERE id = CAST(:done AS bigint) AND set_config('synchronous_commit', 'off', true) = 'off'
    ),
    next AS (
      SELECT e.id FROM effects e
      WHERE e.status = 'pending' AND e.available_at <= :now
        AND (e.affinity IS NULL OR e.affinity = :me OR NOT EXISTS (
              SELECT 1 FROM workers w WHERE w.id = e.affinity AND """
    + alive_sql("w")
    + """))
        AND NOT EXISTS (SELECT 1 FROM effects r WHERE r.thread_id = e.thread_id AND r.status = 'running'
                        AND r.id IS DISTINCT FROM CAST(:done AS bigint))
        AND NOT EXISTS (SELECT 1 FROM effects p WHERE p.thread_id = e.thread_id AND p.status = 'pending'
                        AND p.id < e.id)
      ORDER BY e.id
      LIMIT 1
      FOR UPDATE SKIP LOCKED
    )
    UPDATE effects SET status = 'running', lease_owner = :me, lease_expires_at = :lease,
                       attempts = effects.attempts + 1
    FROM next WHERE effects.id = next.id AND set_config('synchronous_commit', 'off', true) = 'off'
    RETURNING effects.id, effects.thread_id, effects.kind, effects.payload, effects.attempts, effects.replay_safe,
      EXISTS (SELECT 1 FROM effects o WHERE o.status = 'pending' AND o.available_at <= :now
              AND o.id <> effects.id) AS more
    """
)


async def claim(
    db: Reader, worker_id: uuid.UUID, now: datetime, lease: datetime, *, done: int | None = None
) -> Mapping[str, Any] | None:
    """Take the next runnable effect: oldest first, one at a time per thread, respecting affinity.
    `more` says whether any other effect was due (maybe not runnable yet: blocked by its thread's
    running effect, or another worker's). `done`, an effect of this worker that succeeded, is marked
    done by the same statement (as `finish`), and no longer holds its thread's next effect back: one
    statement, so it can run on its own, outside a transaction.

    Its commit does not wait for the WAL flush (`synchronous_commit` off for this statement only, set
    where it writes): the handler's first commit (a turn's record, before the agent is asked to start)
    flushes it along, and a claim lost with a crash of PostgreSQL before that leaves the effect pending
    (or the done one running, recovered as an orphan), as a lease lost with its worker does."""
    return await db.one_or_none(_CLAIM, {"now": now, "me": worker_id, "lease": lease, "done": done})


async def next_due(db: Reader, now: datetime) -> datetime | None:
    """When the next pending effect not yet due falls due (a retry's backoff, a delayed effect); None if none
    is waiting for its time. Pending effects already due but blocked (their thread runs another) are not
    counted: the end of that one wakes the worker."""
    return await db.scalar(  # type: ignore[no-any-return]
        sa.select(sa.func.min(t.effects.c.available_at)).where(
            t.effects.c.status == "pending", t.effects.c.available_at > now
        )
    )


async def finish(db: Reader, effect_id: int, now: datetime, *, status: str = "done", error: str | None = None) -> None:
    await db.execute(
        sa.update(t.effects)
        .where(t.effects.c.id == effect_id)
        .values(status=status, completed_at=now, last_error=error, lease_owner=None, lease_expires_at=None)
    )


async def retry_later(db: Reader, effect_id: int, error: str, available_at: datetime) -> None:
    await db.execute(
        sa.update(t.effects)
        .where(t.effects.c.id == effect_id)
        .values(status="pending", available_at=available_at, last_error=error, lease_owner=None, lease_expires_at=None)
    )


async def orphaned(db: Reader) -> list[sa.RowMapping]:
    """Running effects whose worker is gone (its advisory lock vanished with its connection)."""
    return await db.rows(
        sa.text(
            "SELECT e.id, e.thread_id, e.kind, e.payload, e.replay_safe FROM effects e "
            "WHERE e.status = 'running' AND NOT EXISTS (SELECT 1 FROM workers w WHERE w.id::text = e.lease_owner AND "
            + alive_sql("w")
            + ") FOR UPDATE OF e SKIP LOCKED"
        )
    )


async def pending_for_run(db: Reader, run_id: uuid.UUID) -> list[sa.RowMapping]:
    return await db.rows(
        sa.select(t.effects.c.id, t.effects.c.kind, t.effects.c.status).where(
            t.effects.c.payload["runId"].astext == str(run_id), t.effects.c.status.in_(["pending", "running"])
        )
    )

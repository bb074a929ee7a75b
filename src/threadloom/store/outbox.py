"""The transactional effect outbox: effects are enqueued in the command's transaction."""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime

import orjson
import sqlalchemy as sa

from threadloom.domain.changes import Effect
from threadloom.store import tables as t
from threadloom.store.db import Reader


async def enqueue(
    db: Reader,
    thread_id: uuid.UUID | None,
    effects: Sequence[Effect],
    *,
    command_id: str | None,
    now: datetime,
) -> None:
    await db.execute(
        sa.insert(t.effects),
        [
            {
                "thread_id": thread_id,
                "kind": e.kind,
                "payload": orjson.loads(orjson.dumps(e.payload)),
                "status": "pending",
                "replay_safe": e.replay_safe,
                "available_at": now,
                "command_id": command_id,
                "created_at": now,
            }
            for e in effects
        ],
    )

"""A handoff goes out with its run's first turn: recorded as delivered, with its lineage activity."""

from __future__ import annotations

import uuid

from threadloom.domain import lineage
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import (
    AppThread,
    ContextHandoff,
    ContextTransfer,
    Run,
)
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import (
    HandoffStatus,
)
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.store import entities
from threadloom.store.db import Reader


async def handoff_delivered(pipeline: Pipeline, handoff: ContextHandoff, run_id: uuid.UUID) -> None:
    """Record that the handoff went out with `run_id`'s first turn."""

    async def decide(db: Reader, thread: AppThread) -> Outcome:
        current = await entities.get(db, ContextHandoff, handoff.id)
        if current is None or current.status != HandoffStatus.PENDING:
            return Outcome()
        delivered = Change.updated(current.evolve(status=HandoffStatus.DELIVERED, target_run_id=run_id))
        run = await entities.get(db, Run, run_id)
        if run is None:
            return Outcome([delivered])
        transfer = await entities.get(db, ContextTransfer, current.transfer_id) if current.transfer_id else None
        kind = transfer.type if transfer is not None else None
        return Outcome([delivered, lineage.handoff_delivered(current, run, kind, pipeline.clock.now(), new_id)])

    await pipeline.execute(Command(command_type="handoff.delivered", decide=decide, thread_id=handoff.thread_id))

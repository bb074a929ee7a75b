"""Where a command's effects run: the worker whose live runtime holds the thread's provider thread.

Shared by every command that starts, steers or ends a turn (`engine.runs`, `engine.run_finish`,
`engine.dispatch` …): a turn's effects go to the process that holds its agent, for native continuity."""

from __future__ import annotations

import dataclasses

from threadloom.domain.changes import Outcome
from threadloom.domain.entities import AppThread
from threadloom.engine.sessions import SessionManager
from threadloom.store.db import Reader
from threadloom.store.runs import SessionOf


async def route(
    sessions: SessionManager, db: Reader, thread: AppThread, outcome: Outcome, known: SessionOf | None = None
) -> None:
    """Send `outcome`'s effects to the worker whose live runtime holds the thread's provider thread (`known`:
    its session as read already, `SessionManager.owner_of`)."""
    if not outcome.effects:
        return
    owner = await sessions.owner_of(db, thread.active_provider_thread_id, known)
    if owner is not None:
        outcome.effects = [dataclasses.replace(e, affinity=owner) for e in outcome.effects]

"""Before a recovery attempt's turn: the lost turn is rolled back natively, so the agent sees its message once.

A PROVIDER_RECOVERY attempt resumes the provider thread that held the lost turn. The agent had recorded that
turn (the user's message, maybe part of a reply) in its own history before the loss, and the new attempt sends
the message again. Where the provider can roll a thread back and show what it holds (`thread/revert` and
`thread/read`: Codex and the scripted agent), the lost turns it still holds are dropped first and the snapshot is
read back; they then read ROLLED_BACK. Where it cannot (Claude Code), or anything goes wrong, the retry goes on
as before (the message may then be there twice): a recovery is never failed for this. Rules in
`domain.recovery` (`lost_turns`, `first_held`); the agent calls run outside any transaction.
"""

from __future__ import annotations

import logging
from typing import Any

from threadloom.domain import subagents
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import AppThread, ProviderThread, ProviderTurn, RunAttempt
from threadloom.domain.recovery import first_held, lost_turns
from threadloom.domain.statuses import ProviderTurnStatus
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.sessions import LiveSession
from threadloom.providers.contract import Capabilities, ProviderError
from threadloom.store import entities, runs
from threadloom.store import tables as t
from threadloom.store.db import Reader

log = logging.getLogger("threadloom.recovery")


async def drop_lost_turns(
    pipeline: Pipeline, caps: Capabilities, session: LiveSession, attempt: RunAttempt, pt: ProviderThread
) -> None:
    """The lost turns of `attempt`'s run dropped from `pt`'s native thread (loaded in `session`), if any."""
    if not (caps.can_rollback_thread and caps.can_read_thread_snapshot) or pt.native_thread_ref is None:
        return
    async with pipeline.db.read() as db:
        attempts = await runs.attempts_of(db, attempt.run_id)
        turns = await entities.where(db, ProviderTurn, t.provider_turns.c.provider_thread_id == pt.id)
    lost = lost_turns(attempt, attempts, turns, pt.id)
    if not lost:
        return
    native = pt.native_thread_ref
    try:
        held = subagents.snapshot_turns(await session.runtime.read_thread_snapshot(native)) or []
        start = first_held(lost, held)
        if start is None:
            return  # the provider holds none of them: nothing to drop
        await session.runtime.rollback_thread(native, start)
        after = subagents.snapshot_turns(await session.runtime.read_thread_snapshot(native)) or []
        problems = subagents.reconcile([], [x.native_turn_ref for x in lost], after)
        if problems:
            raise ProviderError("reconcile", "; ".join(problems))
    except ProviderError as error:
        log.warning("could not drop the lost turn of run %s before its retry: %s", attempt.run_id, error)
        return
    await _record(pipeline, attempt, lost)


async def _record(pipeline: Pipeline, attempt: RunAttempt, dropped: list[ProviderTurn]) -> None:
    """The dropped turns read ROLLED_BACK (the provider holds none of them now)."""
    now = pipeline.clock.now()

    async def decide(db: Reader, thread: AppThread) -> Outcome:
        changes: list[Any] = []
        for turn in dropped:
            current = await entities.get(db, ProviderTurn, turn.id)
            if current is not None and current.status != ProviderTurnStatus.ROLLED_BACK:
                ended = current.evolve(status=ProviderTurnStatus.ROLLED_BACK, completed_at=current.completed_at or now)
                changes.append(Change.updated(ended))
        return Outcome(changes)

    command = Command(command_type="recovery.lost_turn_dropped", decide=decide, thread_id=attempt.thread_id)
    await pipeline.execute(command)

"""Where a new user message goes (docs/lifecycles/steering-and-queue.md).

- no run active and nothing queued → start now;
- the user asked for a new turn → queue, even if steering is available;
- the provider can steer a live turn → steer it (same run);
- it cannot, but can interrupt → restart the run with the steering message (same run, new attempt);
- a steer that arrives after its target run ended becomes a new run.
"""

from __future__ import annotations

import dataclasses
import uuid

from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.runs import AppliedDispatch, DispatchMode, ThreadState


@dataclasses.dataclass(frozen=True, slots=True)
class SteerAbility:
    native: bool  # supportsActiveSteering
    restart: bool  # supportsSteeringByInterruptRestart


@dataclasses.dataclass(frozen=True, slots=True)
class Dispatch:
    mode: DispatchMode = DispatchMode.AUTO
    target_run_id: uuid.UUID | None = None
    expected_attempt_id: uuid.UUID | None = None


def _new_run(state: ThreadState) -> AppliedDispatch:
    idle = state.active is None and not state.queue
    return AppliedDispatch.START_IMMEDIATELY if idle else AppliedDispatch.QUEUE_AFTER_ACTIVE


def choose(dispatch: Dispatch, state: ThreadState, ability: SteerAbility) -> AppliedDispatch:
    if state.thread.archived_at is not None:
        raise DomainError(ErrorCode.THREAD_ARCHIVED, "the thread is archived; unarchive it first", "threadId")
    active = state.active
    mode = dispatch.mode
    if mode == DispatchMode.START_IMMEDIATELY:
        if active is not None:
            raise DomainError(ErrorCode.THREAD_BUSY, "a run is active; queue the message or stop the run", "dispatch")
        return AppliedDispatch.START_IMMEDIATELY
    if mode == DispatchMode.QUEUE_AFTER_ACTIVE:
        blocked = active is not None or (state.thread.queue_held and bool(state.queue))
        return AppliedDispatch.QUEUE_AFTER_ACTIVE if blocked else AppliedDispatch.START_IMMEDIATELY
    if mode in (DispatchMode.STEER_ACTIVE, DispatchMode.RESTART_ACTIVE):
        if active is None or active.id != dispatch.target_run_id:
            return _new_run(state)  # the target already ended: the message becomes a new run
        if dispatch.expected_attempt_id is not None and dispatch.expected_attempt_id != active.active_attempt_id:
            raise DomainError(
                ErrorCode.EXPECTED_ATTEMPT_MISMATCH,
                "the run has moved on to another attempt; reload it and decide again",
                "dispatch.steerActive.expectedAttemptId",
            )
        if mode == DispatchMode.STEER_ACTIVE and ability.native:
            return AppliedDispatch.STEER_ACTIVE
        if ability.restart:
            return AppliedDispatch.RESTART_ACTIVE
        raise DomainError(ErrorCode.NOT_STEERABLE, "this provider can neither steer nor restart a turn", "dispatch")
    # auto
    if active is None:
        return _new_run(state)
    if ability.native:
        return AppliedDispatch.STEER_ACTIVE
    if ability.restart:
        return AppliedDispatch.RESTART_ACTIVE
    return AppliedDispatch.QUEUE_AFTER_ACTIVE

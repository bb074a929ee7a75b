"""What to do with an active run after its worker is gone (docs/lifecycles/resumption-and-recovery.md).

A turn start is never blindly resent: a ProviderTurn row is written before the start
request goes out, so its absence proves the provider never saw the turn. A run whose turn
may have been seen and is lost (`RecoveryAction.FAIL`) is then given a new attempt on its
resumed provider thread or failed (`after_loss`, with the rules of `domain.retries`).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import StrEnum
from typing import Any

from threadloom.domain.entities import ExecutionNode, ProviderTurn, RunAttempt
from threadloom.domain.retries import RetryPolicy, may_retry
from threadloom.domain.statuses import AttemptReason, ProviderTurnStatus, RunStatus


class RecoveryAction(StrEnum):
    NONE = "none"
    REQUEUE_START = "requeue_start"
    FAIL = "fail"
    RETRY = "retry"  # a lost turn that did nothing irreversible: a PROVIDER_RECOVERY attempt


def recover_run(
    status: RunStatus,
    *,
    start_pending: bool,
    turn_recorded: bool,
    owner_alive: bool | None,
    start_claimed: bool = False,
) -> RecoveryAction:
    """What recovery does with an active run.

    `start_claimed`: a live worker holds the run's start effect (orphaned effects are requeued
    or cancelled before runs are checked), so that worker ends the run itself, whatever step of
    the start it is at. `start_pending`: the start effect waits to be claimed. `owner_alive` is
    None when no runtime took the turn yet (the session has no owner): with a start still to
    come, that is a run on its way, not a lost one.
    """
    if start_claimed:
        return RecoveryAction.NONE
    if status == RunStatus.PREPARING:
        if start_pending:
            return RecoveryAction.NONE
        return RecoveryAction.FAIL if turn_recorded else RecoveryAction.REQUEUE_START
    if status in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.WAITING):
        if owner_alive:
            return RecoveryAction.NONE
        if start_pending and (owner_alive is None or not turn_recorded):
            return RecoveryAction.NONE
        return RecoveryAction.FAIL
    return RecoveryAction.NONE


def after_loss(policy: RetryPolicy, attempts: Sequence[RunAttempt], nodes: Sequence[ExecutionNode]) -> RecoveryAction:
    """A lost run (`recover_run` said FAIL): RETRY while its instance's recovery policy allows another attempt
    in a row and the lost attempt (`nodes`: its execution nodes) recorded no command, file change or subagent;
    else FAIL (`provider_lost`). What the server never recorded it cannot know: a command the agent started in
    the last moment before the loss, whose item never reached the server, is not seen."""
    return RecoveryAction.RETRY if may_retry(policy, attempts, nodes) else RecoveryAction.FAIL


def lost_turns(
    attempt: RunAttempt, attempts: Sequence[RunAttempt], turns: Sequence[ProviderTurn], provider_thread_id: Any
) -> list[ProviderTurn]:
    """What a PROVIDER_RECOVERY attempt drops from its provider thread before its own turn: the turns of the run's
    earlier attempts on that same provider thread that reached the provider (a native ref) and are still held,
    earliest first. The provider may have recorded a lost turn's message in its own history; resumed as it is,
    the agent would get the message twice (once in the lost turn, once in the new one)."""
    if attempt.reason != AttemptReason.PROVIDER_RECOVERY:
        return []
    earlier = {a.id for a in attempts if a.id != attempt.id and a.attempt_ordinal < attempt.attempt_ordinal}
    lost = [
        t
        for t in turns
        if t.run_attempt_id in earlier
        and t.provider_thread_id == provider_thread_id
        and t.native_turn_ref is not None
        and t.status != ProviderTurnStatus.ROLLED_BACK
    ]
    return sorted(lost, key=lambda t: t.ordinal)


def first_held(lost: Sequence[ProviderTurn], held: Sequence[str]) -> str | None:
    """The native turn to revert from (it and every later one go): the first lost turn the provider's snapshot
    still holds; None when it holds none of them (nothing to drop)."""
    have = set(held)
    return next((t.native_turn_ref for t in lost if t.native_turn_ref in have), None)

"""What to do with an active run after its worker is gone (spec: Resumption, provider runtime recovery).

A turn start is never blindly resent: a ProviderTurn row is written before the start
request goes out, so its absence proves the provider never saw the turn.
"""

from __future__ import annotations

from enum import StrEnum

from threadloom.domain.statuses import RunStatus


class RecoveryAction(StrEnum):
    NONE = "none"
    REQUEUE_START = "requeue_start"
    FAIL = "fail"


def recover_run(
    status: RunStatus, *, start_pending: bool, turn_recorded: bool, owner_alive: bool | None
) -> RecoveryAction:
    """`owner_alive` is None when no runtime ever took the turn."""
    if status == RunStatus.PREPARING:
        if start_pending:
            return RecoveryAction.NONE
        return RecoveryAction.FAIL if turn_recorded else RecoveryAction.REQUEUE_START
    if status in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.WAITING):
        if owner_alive:
            return RecoveryAction.NONE
        if start_pending and not turn_recorded:
            return RecoveryAction.NONE
        return RecoveryAction.FAIL
    return RecoveryAction.NONE

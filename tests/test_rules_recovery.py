"""What recovery does with an active run, `recovery.recover_run`, as a table
(docs/lifecycles/resumption-and-recovery.md "The server stops or is killed"), then the promises that hold over
every combination: a turn start is never resent once the provider may have seen it, and a run that is on its way
(its start claimed by a live worker, or waiting to be claimed while no runtime owns its session) is never failed.
Pure: no database.
"""

from __future__ import annotations

import itertools

import pytest

from threadloom.domain.recovery import RecoveryAction, recover_run
from threadloom.domain.statuses import ACTIVE_RUN_STATUSES, RunStatus

NONE, REQUEUE, FAIL = RecoveryAction.NONE, RecoveryAction.REQUEUE_START, RecoveryAction.FAIL
LIVE = (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.WAITING)  # the provider may have the turn

# (status, start claimed, start pending, turn recorded, owner alive) → action.
# owner alive: True / False (its server is gone) / None (no runtime owns the session yet).
TABLE = [
    # a live worker holds the start: it ends the run itself, whatever step it is at
    ("claimed-preparing", RunStatus.PREPARING, True, False, False, None, NONE),
    ("claimed-starting-no-turn-owner-gone", RunStatus.STARTING, True, False, False, False, NONE),
    ("claimed-running-turn-owner-gone", RunStatus.RUNNING, True, False, True, False, NONE),
    # PREPARING: the start waits to be claimed → on its way
    ("preparing-start-pending", RunStatus.PREPARING, False, True, False, None, NONE),
    ("preparing-start-pending-turn", RunStatus.PREPARING, False, True, True, False, NONE),
    # PREPARING, no start anywhere, no turn recorded: the provider provably never saw it → start it again
    ("preparing-lost-start-no-turn", RunStatus.PREPARING, False, False, False, None, REQUEUE),
    ("preparing-lost-start-no-turn-owner-alive", RunStatus.PREPARING, False, False, False, True, REQUEUE),
    ("preparing-lost-start-no-turn-owner-gone", RunStatus.PREPARING, False, False, False, False, REQUEUE),
    # PREPARING with a turn recorded: the provider may have worked on it → fail, never run twice
    ("preparing-turn-recorded", RunStatus.PREPARING, False, False, True, False, FAIL),
    ("preparing-turn-recorded-no-owner", RunStatus.PREPARING, False, False, True, None, FAIL),
    # STARTING/RUNNING/WAITING: the owner decides
    *[(f"{s}-owner-alive", s, False, False, True, True, NONE) for s in LIVE],
    *[(f"{s}-owner-gone", s, False, False, True, False, FAIL) for s in LIVE],
    *[(f"{s}-owner-gone-no-turn", s, False, False, False, False, FAIL) for s in LIVE],
    *[(f"{s}-no-owner-no-start", s, False, False, True, None, FAIL) for s in LIVE],
    # ... unless a start still waits and the provider has not got the turn (or no runtime has it yet)
    *[(f"{s}-start-pending-no-turn-owner-gone", s, False, True, False, False, NONE) for s in LIVE],
    *[(f"{s}-start-pending-no-owner", s, False, True, True, None, NONE) for s in LIVE],
    *[(f"{s}-start-pending-turn-owner-gone", s, False, True, True, False, FAIL) for s in LIVE],
    # not active: nothing to recover
    *[(f"{s}", s, False, False, True, False, NONE) for s in RunStatus if s not in ACTIVE_RUN_STATUSES],
]


@pytest.mark.parametrize(
    ("status", "claimed", "pending", "turn", "owner", "action"), [pytest.param(*row[1:], id=row[0]) for row in TABLE]
)
def test_recovery_action_per_run_state_after_a_restart(
    status: RunStatus, claimed: bool, pending: bool, turn: bool, owner: bool | None, action: RecoveryAction
) -> None:
    got = recover_run(status, start_claimed=claimed, start_pending=pending, turn_recorded=turn, owner_alive=owner)
    assert got == action


EVERY = [
    pytest.param(s, c, p, t, o, id=f"{s}-claimed={c}-pending={p}-turn={t}-owner={o}")
    for s, c, p, t, o in itertools.product(RunStatus, [False, True], [False, True], [False, True], [True, False, None])
]


@pytest.mark.parametrize(("status", "claimed", "pending", "turn", "owner"), EVERY)
def test_promises_over_every_combination(
    status: RunStatus, claimed: bool, pending: bool, turn: bool, owner: bool | None
) -> None:
    action = recover_run(status, start_claimed=claimed, start_pending=pending, turn_recorded=turn, owner_alive=owner)
    if status not in ACTIVE_RUN_STATUSES:
        assert action == NONE  # queued and ended runs are not recovery's business
    if claimed:
        assert action == NONE  # a live worker holds the start: it finishes the run itself
    if pending and not turn:
        assert action != FAIL  # the start is coming and the provider has not seen the turn
    if pending and owner is None:
        assert action != FAIL  # no runtime took the turn yet: on its way, not lost
    if owner is True and status in LIVE:
        assert action == NONE  # its server lives and works on it
    if action == REQUEUE:
        assert status == RunStatus.PREPARING and not turn and not pending and not claimed  # never resent

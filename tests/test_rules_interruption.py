"""What an interrupt request does: `interruption.plan_interrupt` and the outcomes of each plan, as tables
(docs/steering.md "Interruption and Stop", docs/lifecycles/interruption-and-stop.md). Pure: no database.
"""

from __future__ import annotations

import itertools

import pytest

from tests.support import builders as b
from threadloom.domain.effects import INTERRUPT_EFFECT
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.interruption import (
    STOP_HOLD_REASON,
    Plan,
    UnsupportedPolicy,
    hold,
    plan_interrupt,
    requested,
    unsupported,
    unsupported_error,
)
from threadloom.domain.statuses import ACTIVE_RUN_STATUSES, TERMINAL_RUN_STATUSES, RunStatus

ACTIVE = sorted(ACTIVE_RUN_STATUSES)
ENDED = sorted(TERMINAL_RUN_STATUSES)

# An active run: (provider turn recorded, provider can interrupt, policy for providers that cannot) → plan.
ACTIVE_TABLE = [
    # the provider never got the turn: the run ends at once, whatever the provider could do
    (False, True, UnsupportedPolicy.REJECT, Plan.END_NOW),
    (False, True, UnsupportedPolicy.STOP_SESSION, Plan.END_NOW),
    (False, False, UnsupportedPolicy.REJECT, Plan.END_NOW),
    (False, False, UnsupportedPolicy.STOP_SESSION, Plan.END_NOW),
    # the provider has the turn and can interrupt it: ask, its terminal event ends the run
    (True, True, UnsupportedPolicy.REJECT, Plan.ASK_PROVIDER),
    (True, True, UnsupportedPolicy.STOP_SESSION, Plan.ASK_PROVIDER),
    # it cannot: the instance's policy decides
    (True, False, UnsupportedPolicy.REJECT, Plan.UNSUPPORTED),
    (True, False, UnsupportedPolicy.STOP_SESSION, Plan.STOP_SESSION),
]
FLAGS = list(itertools.product([False, True], [False, True], UnsupportedPolicy))


def _id(turn: bool, supports: bool, policy: UnsupportedPolicy) -> str:
    return f"{'turn' if turn else 'no-turn'}-{'can' if supports else 'cannot'}-interrupt-{policy}"


def test_the_active_table_covers_every_combination() -> None:
    assert sorted((t, s, p) for t, s, p, _ in ACTIVE_TABLE) == sorted(FLAGS)
    assert set(ACTIVE_RUN_STATUSES) | set(TERMINAL_RUN_STATUSES) | {RunStatus.QUEUED} == set(RunStatus)


@pytest.mark.parametrize("status", ACTIVE)
@pytest.mark.parametrize(
    ("turn", "supports", "policy", "plan"), [pytest.param(*row, id=_id(*row[:3])) for row in ACTIVE_TABLE]
)
def test_interrupt_plan_for_an_active_run(
    status: RunStatus, turn: bool, supports: bool, policy: UnsupportedPolicy, plan: Plan
) -> None:
    run = b.run(b.thread(), 1, status)
    assert plan_interrupt(run, turn_recorded=turn, supports_interrupt=supports, policy=policy) == plan


@pytest.mark.parametrize(("turn", "supports", "policy"), [pytest.param(*f, id=_id(*f)) for f in FLAGS])
def test_a_queued_run_is_cancelled(turn: bool, supports: bool, policy: UnsupportedPolicy) -> None:
    run = b.run(b.thread(), 1, RunStatus.QUEUED)
    assert plan_interrupt(run, turn_recorded=turn, supports_interrupt=supports, policy=policy) == Plan.CANCEL_QUEUED


@pytest.mark.parametrize("status", ENDED)
@pytest.mark.parametrize(("turn", "supports", "policy"), [pytest.param(*f, id=_id(*f)) for f in FLAGS])
def test_an_ended_run_is_refused(status: RunStatus, turn: bool, supports: bool, policy: UnsupportedPolicy) -> None:
    run = b.run(b.thread(), 1, status)
    with pytest.raises(DomainError) as error:
        plan_interrupt(run, turn_recorded=turn, supports_interrupt=supports, policy=policy)
    assert (error.value.code, error.value.field) == (ErrorCode.RUN_NOT_ACTIVE, "runId")


# ---- the outcomes of the plans that are decided here (END_NOW and STOP_SESSION go through the barrier) ----


def test_ask_provider_marks_the_request_and_does_not_end_the_run() -> None:
    thread = b.thread()
    run = b.run(thread, 1, RunStatus.RUNNING)
    outcome = requested(thread, run, b.NOW, b.Ids())
    assert b.event_types(outcome) == ["run.updated", "activity:run.interrupt_requested"]
    marked = b.latest(outcome.changes, type(run))[run.id]
    assert marked.status == RunStatus.RUNNING and marked.interrupt_requested_at == b.NOW
    assert [(e.kind, e.payload, e.replay_safe) for e in outcome.effects] == [
        (INTERRUPT_EFFECT, {"runId": str(run.id), "attemptId": str(run.active_attempt_id)}, False)
    ]


def test_asking_twice_changes_nothing() -> None:
    thread = b.thread()
    run = b.run(thread, 1, RunStatus.RUNNING, interrupt_requested_at=b.NOW)
    outcome = requested(thread, run, b.LATER, b.Ids())
    assert (outcome.changes, outcome.effects, outcome.result) == ([], [], {"runId": str(run.id)})


def test_unsupported_records_the_refusal_and_the_run_goes_on() -> None:
    thread = b.thread()
    run = b.run(thread, 1, RunStatus.RUNNING)
    outcome = unsupported(thread, run, b.NOW, b.Ids())
    assert b.event_types(outcome) == ["activity:run.interrupt_unsupported"]
    assert outcome.effects == [] and outcome.result == {"runId": str(run.id), "interruptUnsupported": True}
    error = unsupported_error()
    assert (error.code, error.field) == (ErrorCode.INTERRUPT_UNSUPPORTED, "runId")


@pytest.mark.parametrize(
    ("held", "events"),
    [
        pytest.param(False, ["thread.updated", "activity:queue.held"], id="holds"),
        pytest.param(True, [], id="already-held"),
    ],
)
def test_stop_holds_the_queue_once(held: bool, events: list[str]) -> None:
    thread = b.thread(queue_held=held, queue_hold_reason="earlier" if held else None)
    changes = hold(thread, b.NOW, b.Ids())
    assert [c.event_type if c.event_type != "activity.recorded" else "activity:queue.held" for c in changes] == events
    if not held:
        after = b.latest(changes, type(thread))[thread.id]
        assert after.queue_held and after.queue_hold_reason == STOP_HOLD_REASON

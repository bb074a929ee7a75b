"""Where a new message goes: `dispatch.choose`, as a table (docs/steering.md, docs/lifecycles/steering-and-queue.md).

Every dispatch mode by thread state by provider capability → the applied dispatch or the error code. Then the
two things the table's rows do not show: a steer or restart whose target already ended, and the
`expectedAttemptId` precondition. Pure: no database, no server.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable

import pytest

from tests.support import builders as b
from threadloom.domain import dispatch as dispatch_rules
from threadloom.domain.changes import Outcome
from threadloom.domain.dispatch import AppliedDispatch, Dispatch, DispatchMode, SteerAbility, choose
from threadloom.domain.effects import INTERRUPT_EFFECT, START_EFFECT, STEER_EFFECT
from threadloom.domain.entities import ConversationMessage, ExecutionNode, Run, RunAttempt, RuntimeRequest
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import (
    TERMINAL_RUN_STATUSES,
    AttemptReason,
    AttemptStatus,
    InputIntent,
    NodeStatus,
    ResponseCapability,
    RunStatus,
    RuntimeRequestStatus,
)
from threadloom.domain.threads import ThreadState

START = AppliedDispatch.START_IMMEDIATELY
QUEUE = AppliedDispatch.QUEUE_AFTER_ACTIVE
STEER = AppliedDispatch.STEER_ACTIVE
RESTART = AppliedDispatch.RESTART_ACTIVE
Expected = AppliedDispatch | ErrorCode

# What the provider can do (providerInstances.capabilities): Codex both, Claude Code steers natively only.
ABILITIES = {
    "steer+restart": SteerAbility(native=True, restart=True),
    "steer-only": SteerAbility(native=True, restart=False),
    "restart-only": SteerAbility(native=False, restart=True),
    "neither": SteerAbility(native=False, restart=False),
}

# The thread as the decision sees it.
#   idle         nothing active, nothing queued
#   held-empty   nothing active, the queue held but empty (a message starts at once and releases the hold)
#   held-queued  nothing active, the queue held with runs in it (a message waits behind them)
#   active       a run is active (the steer/restart target), nothing queued
#   active+queue a run is active and two runs wait
#   archived     archived (and idle)
STATES = ("idle", "held-empty", "held-queued", "active", "active+queue", "archived")


def _state(name: str) -> ThreadState:
    thread = b.thread()
    if name == "idle":
        return b.state(thread)
    if name == "held-empty":
        return b.state(thread.evolve(queue_held=True, queue_hold_reason="run 1 failed"))
    if name == "held-queued":
        held = thread.evolve(queue_held=True, queue_hold_reason="run 1 failed")
        return b.state(held, queued=b.queue(held, 2))
    if name == "active":
        return b.state(thread, active=b.run(thread, 1, RunStatus.RUNNING))
    if name == "active+queue":
        return b.state(thread, active=b.run(thread, 1, RunStatus.RUNNING), queued=b.queue(thread, 2))
    assert name == "archived"
    return b.state(thread.evolve(archived_at=b.NOW))


def _all(expected: Expected) -> dict[str, Expected]:
    return dict.fromkeys(ABILITIES, expected)


def _by_ability(both: Expected, steer_only: Expected, restart_only: Expected, neither: Expected) -> dict[str, Expected]:
    return {"steer+restart": both, "steer-only": steer_only, "restart-only": restart_only, "neither": neither}


# The docs' table. Steer and restart rows target the active run (when there is one) with no expected attempt.
ACTIVE_AUTO = _by_ability(STEER, STEER, RESTART, QUEUE)  # steer; else restart; else queue
ACTIVE_STEER = _by_ability(STEER, STEER, RESTART, ErrorCode.NOT_STEERABLE)  # explicit: no fallback to queue
ACTIVE_RESTART = _by_ability(RESTART, ErrorCode.NOT_STEERABLE, RESTART, ErrorCode.NOT_STEERABLE)
TABLE: dict[tuple[DispatchMode, str], dict[str, Expected]] = {
    (DispatchMode.AUTO, "idle"): _all(START),
    (DispatchMode.AUTO, "held-empty"): _all(START),
    (DispatchMode.AUTO, "held-queued"): _all(QUEUE),
    (DispatchMode.AUTO, "active"): ACTIVE_AUTO,
    (DispatchMode.AUTO, "active+queue"): ACTIVE_AUTO,
    (DispatchMode.START_IMMEDIATELY, "idle"): _all(START),
    (DispatchMode.START_IMMEDIATELY, "held-empty"): _all(START),
    (DispatchMode.START_IMMEDIATELY, "held-queued"): _all(START),  # an explicit start goes ahead of the held queue
    (DispatchMode.START_IMMEDIATELY, "active"): _all(ErrorCode.THREAD_BUSY),
    (DispatchMode.START_IMMEDIATELY, "active+queue"): _all(ErrorCode.THREAD_BUSY),
    (DispatchMode.QUEUE_AFTER_ACTIVE, "idle"): _all(START),  # nothing to wait for
    (DispatchMode.QUEUE_AFTER_ACTIVE, "held-empty"): _all(START),
    (DispatchMode.QUEUE_AFTER_ACTIVE, "held-queued"): _all(QUEUE),
    (DispatchMode.QUEUE_AFTER_ACTIVE, "active"): _all(QUEUE),
    (DispatchMode.QUEUE_AFTER_ACTIVE, "active+queue"): _all(QUEUE),
    (DispatchMode.STEER_ACTIVE, "idle"): _all(START),  # the target ended: a new run
    (DispatchMode.STEER_ACTIVE, "held-empty"): _all(START),
    (DispatchMode.STEER_ACTIVE, "held-queued"): _all(QUEUE),
    (DispatchMode.STEER_ACTIVE, "active"): ACTIVE_STEER,
    (DispatchMode.STEER_ACTIVE, "active+queue"): ACTIVE_STEER,
    (DispatchMode.RESTART_ACTIVE, "idle"): _all(START),
    (DispatchMode.RESTART_ACTIVE, "held-empty"): _all(START),
    (DispatchMode.RESTART_ACTIVE, "held-queued"): _all(QUEUE),
    (DispatchMode.RESTART_ACTIVE, "active"): ACTIVE_RESTART,
    (DispatchMode.RESTART_ACTIVE, "active+queue"): ACTIVE_RESTART,
}
for _mode in DispatchMode:  # an archived thread refuses every message, whatever else holds
    TABLE[(_mode, "archived")] = _all(ErrorCode.THREAD_ARCHIVED)

CASES = [
    pytest.param(mode, state, ability, TABLE[(mode, state)][ability], id=f"{mode}-{state}-{ability}")
    for mode, state, ability in itertools.product(DispatchMode, STATES, ABILITIES)
]


def _decide(dispatch: Dispatch, state: ThreadState, ability: SteerAbility) -> Expected:
    try:
        return choose(dispatch, state, ability)
    except DomainError as error:
        return error.code


def test_the_table_covers_every_mode_and_state() -> None:
    assert set(TABLE) == set(itertools.product(DispatchMode, STATES))
    assert len(CASES) == len(DispatchMode) * len(STATES) * len(ABILITIES)


@pytest.mark.parametrize(("mode", "state_name", "ability", "expected"), CASES)
def test_dispatch_decision_per_mode_state_and_ability(
    mode: DispatchMode, state_name: str, ability: str, expected: Expected
) -> None:
    state = _state(state_name)
    target = None if state.active is None else state.active.id
    assert _decide(Dispatch(mode, target_run_id=target), state, ABILITIES[ability]) == expected


# A steer or restart whose target is not the active run (it ended first) becomes an ordinary new run:
# started now when nothing runs, queued otherwise — never steered into the run that took its place.
@pytest.mark.parametrize("mode", [DispatchMode.STEER_ACTIVE, DispatchMode.RESTART_ACTIVE])
@pytest.mark.parametrize(
    ("state_name", "expected"),
    [("idle", START), ("held-empty", START), ("held-queued", QUEUE), ("active", QUEUE), ("active+queue", QUEUE)],
)
@pytest.mark.parametrize("ability", list(ABILITIES))
def test_a_steer_whose_target_ended_becomes_a_new_run(
    mode: DispatchMode, state_name: str, expected: AppliedDispatch, ability: str
) -> None:
    ended = uuid.UUID(int=99)  # not the active run
    dispatch = Dispatch(mode, target_run_id=ended, expected_attempt_id=uuid.UUID(int=98))
    assert _decide(dispatch, _state(state_name), ABILITIES[ability]) == expected


# `expectedAttemptId` is a precondition checked before the provider's abilities: a mismatch is refused even
# where the provider could not steer at all, and nothing else is decided.
@pytest.mark.parametrize("mode", [DispatchMode.STEER_ACTIVE, DispatchMode.RESTART_ACTIVE])
@pytest.mark.parametrize(
    ("attempt", "ability", "expected"),
    [
        pytest.param("absent", "steer-only", None, id="absent-follows-table"),
        pytest.param("matches", "steer+restart", None, id="matches-follows-table"),
        pytest.param("matches", "neither", None, id="matches-neither-follows-table"),
        pytest.param("moved-on", "steer+restart", ErrorCode.EXPECTED_ATTEMPT_MISMATCH, id="moved-on-both"),
        pytest.param("moved-on", "restart-only", ErrorCode.EXPECTED_ATTEMPT_MISMATCH, id="moved-on-restart-only"),
        pytest.param("moved-on", "neither", ErrorCode.EXPECTED_ATTEMPT_MISMATCH, id="moved-on-neither"),
    ],
)
def test_expected_attempt_is_a_precondition(
    mode: DispatchMode, attempt: str, ability: str, expected: ErrorCode | None
) -> None:
    state = _state("active")
    assert state.active is not None
    expected_attempt = {"absent": None, "matches": state.active.active_attempt_id, "moved-on": uuid.UUID(int=97)}
    dispatch = Dispatch(mode, target_run_id=state.active.id, expected_attempt_id=expected_attempt[attempt])
    want = expected if expected is not None else TABLE[(mode, "active")][ability]
    assert _decide(dispatch, state, ABILITIES[ability]) == want


def test_errors_name_the_field_to_fix() -> None:
    """A client shows the error next to the input that caused it."""
    cases = [
        (Dispatch(DispatchMode.AUTO), "archived", "threadId"),
        (Dispatch(DispatchMode.START_IMMEDIATELY), "active", "dispatch"),
        (Dispatch(DispatchMode.STEER_ACTIVE), "active", "dispatch"),
        (
            Dispatch(DispatchMode.STEER_ACTIVE, expected_attempt_id=uuid.UUID(int=97)),
            "active",
            "dispatch.steerActive.expectedAttemptId",
        ),
    ]
    for dispatch, state_name, field in cases:
        state = _state(state_name)
        target = None if state.active is None else state.active.id
        with pytest.raises(DomainError) as error:
            choose(
                Dispatch(dispatch.mode, target_run_id=target, expected_attempt_id=dispatch.expected_attempt_id),
                state,
                ABILITIES["neither"],
            )
        assert error.value.field == field


# ---- what an applied steer or restart writes (domain/dispatch.py) ------------------------------------------


def test_steer_in_place_adds_the_message_to_the_run() -> None:
    thread = b.thread()
    run = b.run(thread, 1, RunStatus.RUNNING)
    outcome = dispatch_rules.steer(thread, run, "also do this", "c1", b.NOW, b.Ids())
    assert b.event_types(outcome) == ["message.created", "activity:run.steered"]
    message = next(iter(b.latest(outcome.changes, ConversationMessage).values()))
    assert (message.run_id, message.input_intent, message.client_message_id) == (run.id, InputIntent.STEER, "c1")
    assert [(e.kind, e.payload, e.replay_safe) for e in outcome.effects] == [
        (
            STEER_EFFECT,
            {"runId": str(run.id), "attemptId": str(run.active_attempt_id), "messageId": str(message.id)},
            False,
        )
    ]
    assert outcome.result["appliedDispatch"] == STEER.value


def test_a_restart_supersedes_the_attempt_under_the_same_run() -> None:
    thread = b.thread()
    run = b.run(thread, 1, RunStatus.WAITING)
    attempt, root = b.attempt_of(run, provider_thread_id=b.uid()), b.root_of(run)
    children = [b.child_of(root), b.child_of(root)]
    request = b.approval_of(run, children[0])
    outcome = dispatch_rules.restart(
        thread, run, attempt, root, children, "first ask", "change course", None, b.NOW, b.Ids(), [request]
    )
    nodes = b.latest(outcome.changes, ExecutionNode)
    attempts = b.latest(outcome.changes, RunAttempt)
    after = b.latest(outcome.changes, Run)[run.id]
    new_attempt = attempts[after.active_attempt_id or uuid.UUID(int=0)]
    assert [nodes[n.id].status for n in [*children, root]] == [NodeStatus.INTERRUPTED] * 3
    assert (attempts[attempt.id].status, attempts[attempt.id].status_reason) == (
        AttemptStatus.SUPERSEDED,
        "steering_restart",
    )
    assert (new_attempt.attempt_ordinal, new_attempt.reason, new_attempt.status) == (
        2,
        AttemptReason.STEERING_RESTART,
        AttemptStatus.PENDING,
    )
    assert new_attempt.provider_thread_id == attempt.provider_thread_id  # same agent conversation
    assert after.id == run.id and after.status == RunStatus.PREPARING and after.root_node_id == new_attempt.root_node_id
    assert nodes[new_attempt.root_node_id].status == NodeStatus.PENDING
    expired = b.latest(outcome.changes, RuntimeRequest)[request.id]
    assert expired.status == RuntimeRequestStatus.EXPIRED
    assert expired.response_capability == ResponseCapability.NOT_RESUMABLE
    assert [(e.kind, e.payload.get("attemptId")) for e in outcome.effects] == [
        (INTERRUPT_EFFECT, str(attempt.id)),  # the old turn ends first
        (START_EFFECT, str(new_attempt.id)),
    ]
    assert outcome.effects[1].payload["input"] == "first ask\n\nchange course"
    assert outcome.result["appliedDispatch"] == RESTART.value


@pytest.mark.parametrize("text", ["", "  \n ", "x" * 200_001], ids=["empty", "blank", "too-long"])
def test_a_steering_message_must_say_something(text: str) -> None:
    thread = b.thread()
    run = b.run(thread, 1, RunStatus.RUNNING)
    calls: list[Callable[[], Outcome]] = [
        lambda: dispatch_rules.steer(thread, run, text, None, b.NOW, b.Ids()),
        lambda: dispatch_rules.restart(
            thread, run, b.attempt_of(run), b.root_of(run), [], "first", text, None, b.NOW, b.Ids()
        ),
    ]
    for call in calls:
        with pytest.raises(DomainError) as error:
            call()
        assert (error.value.code, error.value.field) == (ErrorCode.INVALID_INPUT, "text")


_NEXT = {
    "restart": (AttemptReason.STEERING_RESTART, True),  # the restart's input: every message of the run so far
    "crash-retry": (AttemptReason.PROVIDER_RECOVERY, True),  # the same after a crash
    "retryRun": (AttemptReason.RETRY, False),  # the run's first message alone: the steer would be lost
    "none": (None, False),  # the attempt it steered was the last: the turn ended, the steer becomes a run
}


@pytest.mark.parametrize("next_attempt", list(_NEXT))
def test_steer_carried_by_the_next_attempt(next_attempt: str) -> None:
    """A steer that missed its attempt's turn goes with the next attempt only when that attempt is given every
    message of the run so far (`steer_carried`); a steer of an attempt the run never had is not carried."""
    r = b.run(b.thread(), 1, RunStatus.RUNNING)
    first = b.attempt_of(r, AttemptStatus.SUPERSEDED)
    reason, carried = _NEXT[next_attempt]
    attempts = [first]
    if reason is not None:
        attempts.append(b.attempt_of(r, AttemptStatus.RUNNING, id=b.uid(), attempt_ordinal=2, reason=reason))
    assert dispatch_rules.steer_carried(first.id, attempts) is carried
    assert dispatch_rules.steer_carried(b.uid(), attempts) is False
    assert dispatch_rules.steer_carried(None, attempts) is False


@pytest.mark.parametrize("status", list(RunStatus))
@pytest.mark.parametrize("next_attempt", list(_NEXT))
def test_a_pending_steer_leaves_an_ended_run_unless_carried(status: RunStatus, next_attempt: str) -> None:
    """A steer still on its way leaves the run the log files it under exactly when that run has ended and no next
    attempt carried it: it is about to become a later run (`steer_leaves_its_run`). While the run is active its
    turn may still take it."""
    r = b.run(b.thread(), 1, status)
    first = b.attempt_of(r, AttemptStatus.SUPERSEDED)
    reason, carried = _NEXT[next_attempt]
    attempts = [first]
    if reason is not None:
        attempts.append(b.attempt_of(r, AttemptStatus.RUNNING, id=b.uid(), attempt_ordinal=2, reason=reason))
    ended = status in TERMINAL_RUN_STATUSES
    assert dispatch_rules.steer_leaves_its_run(status, first.id, attempts) is (ended and not carried)

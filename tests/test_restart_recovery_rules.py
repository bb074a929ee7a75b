"""After a restart or a lost server (`domain.recovery.after_loss`, `domain.retries.retry` with `provider_lost`):
a lost run whose attempt recorded nothing irreversible gets a PROVIDER_RECOVERY attempt on its provider thread,
a bounded number of times in a row, each later than the last; any other lost run fails. Pure: no database
(docs/lifecycles/resumption-and-recovery.md "The server stops or is killed")."""

from __future__ import annotations

import pytest

from tests.support import builders as b
from threadloom.domain.entities import ExecutionNode, ProviderThread, ProviderTurn, RunAttempt
from threadloom.domain.recovery import RecoveryAction, after_loss, first_held, lost_turns
from threadloom.domain.retries import DEFAULT_RECOVERY, RetryPolicy, retries_so_far, retry
from threadloom.domain.statuses import (
    AttemptReason,
    AttemptStatus,
    NodeKind,
    ProviderThreadStatus,
    ProviderTurnStatus,
    ResponseCapability,
    RunStatus,
    RuntimeRequestStatus,
)

INITIAL, RECOVERY = AttemptReason.INITIAL, AttemptReason.PROVIDER_RECOVERY
RETRY_, STEER = AttemptReason.RETRY, AttemptReason.STEERING_RESTART
RETRY, FAIL = RecoveryAction.RETRY, RecoveryAction.FAIL


def _attempts(*reasons: AttemptReason) -> list[RunAttempt]:
    owner = b.thread()
    r = b.run(owner, 1, RunStatus.RUNNING)
    return [b.attempt_of(r, attempt_ordinal=i + 1, reason=reason, id=b.uid()) for i, reason in enumerate(reasons)]


def _nodes(*kinds: NodeKind) -> list[ExecutionNode]:
    r = b.run(b.thread(), 1, RunStatus.RUNNING)
    root = b.root_of(r)
    return [root, *(b.child_of(root).evolve(kind=kind) for kind in kinds)]


# (id, policy retries, the run's attempts so far (the last one is the lost one), the lost attempt's node kinds)
TABLE = [
    ("first-loss-nothing-ran", 2, (INITIAL,), (), RETRY),
    ("only-text-and-reasoning", 2, (INITIAL,), (NodeKind.ASSISTANT_MESSAGE, NodeKind.REASONING), RETRY),
    ("a-plan-and-a-todo-list", 2, (INITIAL,), (NodeKind.PLAN, NodeKind.TODO_LIST), RETRY),
    ("waiting-on-an-approval-nothing-ran-yet", 2, (INITIAL,), (NodeKind.APPROVAL_REQUEST,), RETRY),
    ("a-command-ran", 2, (INITIAL,), (NodeKind.TOOL_CALL,), FAIL),  # a file change is a TOOL_CALL node too
    ("a-subagent-started", 2, (INITIAL,), (NodeKind.SUBAGENT,), FAIL),
    ("second-loss-in-a-row", 2, (INITIAL, RECOVERY), (), RETRY),
    ("bound-reached", 2, (INITIAL, RECOVERY, RECOVERY), (), FAIL),
    ("turned-off", 0, (INITIAL,), (), FAIL),
    ("bound-one", 1, (INITIAL, RECOVERY), (), FAIL),
    ("a-persons-retry-starts-the-count-again", 2, (INITIAL, RECOVERY, RECOVERY, RETRY_), (), RETRY),
    ("a-steering-restart-starts-it-again", 1, (INITIAL, RECOVERY, STEER), (), RETRY),
]


@pytest.mark.parametrize(
    ("retries", "reasons", "kinds", "action"), [row[1:] for row in TABLE], ids=[r[0] for r in TABLE]
)
def test_a_lost_run_is_retried_only_when_safe_and_allowed(
    retries: int, reasons: tuple[AttemptReason, ...], kinds: tuple[NodeKind, ...], action: str
) -> None:
    assert after_loss(RetryPolicy(retries=retries), _attempts(*reasons), _nodes(*kinds)) == action


@pytest.mark.parametrize(
    ("reasons", "count"),
    [
        ((INITIAL,), 0),
        ((INITIAL, RECOVERY), 1),
        ((INITIAL, RECOVERY, RECOVERY), 2),
        ((INITIAL, RECOVERY, RETRY_), 0),
        ((INITIAL, RECOVERY, RETRY_, RECOVERY), 1),
        ((INITIAL, STEER, RECOVERY), 1),
    ],
)
def test_retries_are_counted_in_a_row(reasons: tuple[AttemptReason, ...], count: int) -> None:
    assert retries_so_far(_attempts(*reasons)) == count


def test_recovery_is_on_by_default_and_bounded() -> None:
    assert DEFAULT_RECOVERY.retries == 2
    assert [DEFAULT_RECOVERY.delay(n) for n in (1, 2)] == [1.0, 2.0]  # doubling backoff


def test_a_lost_run_gets_a_recovery_attempt_on_its_provider_thread() -> None:
    owner = b.thread()
    r = b.run(owner, 1, RunStatus.RUNNING)
    graph = b.graph(owner, r, children=1, streaming=1, requests=1)
    ids = b.Ids()
    policy = RetryPolicy(retries=2, backoff_s=1.0)
    why = "the server that held the turn is gone"
    outcome = retry(graph, [graph.attempt], "do it", why, policy, b.LATER, ids, lost="provider_lost")

    attempts = b.latest(outcome.changes, RunAttempt)
    lost, new = attempts[graph.attempt.id], next(a for a in attempts.values() if a.id != graph.attempt.id)
    assert (lost.status, lost.status_reason) == (AttemptStatus.FAILED, "provider_lost")
    assert (new.reason, new.status, new.attempt_ordinal) == (RECOVERY, AttemptStatus.PENDING, 2)
    assert new.provider_thread_id == graph.attempt.provider_thread_id  # the same provider thread, resumed
    [run] = b.latest(outcome.changes, type(r)).values()
    assert (run.status, run.active_attempt_id, run.root_node_id) == (RunStatus.PREPARING, new.id, new.root_node_id)
    [pt] = b.latest(outcome.changes, ProviderThread).values()
    assert pt.status == ProviderThreadStatus.NOT_LOADED  # no live process holds it: the next start resumes it
    [request] = [c.entity for c in outcome.changes if c.entity.entity_type == "runtime_request"]
    assert request.status == RuntimeRequestStatus.EXPIRED  # type: ignore[attr-defined]
    assert request.response_capability == ResponseCapability.NOT_RESUMABLE  # type: ignore[attr-defined]
    assert "server that held the turn is gone" in request.not_resumable_reason  # type: ignore[attr-defined]
    [activity] = [c.entity for c in outcome.changes if c.entity.entity_type == "activity"]
    assert activity.kind == "run.retried" and activity.run_id == r.id  # type: ignore[attr-defined]
    assert activity.node_id == new.root_node_id  # type: ignore[attr-defined]
    assert activity.payload == {  # type: ignore[attr-defined]
        "attempt": 2,
        "reason": "PROVIDER_RECOVERY",
        "lost": "provider_lost",
        "retry": 1,
        "delaySeconds": 1.0,
    }
    [start] = outcome.effects
    assert start.delay_s == 1.0 and start.payload["attemptId"] == str(new.id)


# ---- the lost turn is dropped before the recovery attempt's own (domain.recovery.lost_turns, first_held) ----


def _turns(attempts: list[RunAttempt], pt: ProviderThread, *rows: tuple[int, str | None, str]) -> list[ProviderTurn]:
    """(attempt index, native ref, status) → provider turns on `pt`, ordinals in order."""
    return [
        b.turn_of(attempts[i], pt).evolve(
            id=b.uid(), ordinal=n + 1, native_turn_ref=ref, status=ProviderTurnStatus[status]
        )
        for n, (i, ref, status) in enumerate(rows)
    ]


@pytest.mark.parametrize(
    ("reasons", "rows", "dropped"),
    [
        # the one lost turn of the initial attempt, before the recovery attempt's own
        ((INITIAL, RECOVERY), [(0, "t1", "FAILED")], ["t1"]),
        # two losses in a row: both earlier turns (the second recovery attempt's own is not lost)
        ((INITIAL, RECOVERY, RECOVERY), [(0, "t1", "FAILED"), (1, "t2", "FAILED"), (2, None, "PENDING")], ["t1", "t2"]),
        # a turn that never reached the provider, or was already rolled back, is not dropped again
        ((INITIAL, RECOVERY), [(0, None, "FAILED")], []),
        ((INITIAL, RECOVERY), [(0, "t1", "ROLLED_BACK")], []),
        # only a recovery attempt drops anything (a retryRun or a steering restart keep their history)
        ((INITIAL, RETRY_), [(0, "t1", "FAILED")], []),
        ((INITIAL, STEER), [(0, "t1", "INTERRUPTED")], []),
    ],
)
def test_a_recovery_attempt_drops_the_lost_turns_of_its_run_on_its_provider_thread(
    reasons: tuple[AttemptReason, ...], rows: list[tuple[int, str | None, str]], dropped: list[str]
) -> None:
    attempts = _attempts(*reasons)
    pt = b.provider_thread_of(b.thread())
    other = b.provider_thread_of(b.thread())
    turns = _turns(attempts, pt, *rows) + _turns(attempts, other, (0, "elsewhere", "FAILED"))
    lost = lost_turns(attempts[-1], attempts, turns, pt.id)
    assert [t.native_turn_ref for t in lost] == dropped


@pytest.mark.parametrize(
    ("lost", "held", "start"),
    [
        (["t1"], ["t0", "t1"], "t1"),
        (["t1", "t2"], ["t0", "t2"], "t2"),  # t1 never made it into the agent's history
        (["t1"], ["t0"], None),  # nothing of it is held: nothing to revert
    ],
)
def test_the_revert_starts_at_the_first_lost_turn_the_provider_still_holds(
    lost: list[str], held: list[str], start: str | None
) -> None:
    attempts = _attempts(INITIAL, RECOVERY)
    pt = b.provider_thread_of(b.thread())
    turns = _turns(attempts, pt, *((0, ref, "FAILED") for ref in lost))
    assert first_held(turns, held) == start

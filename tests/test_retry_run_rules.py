"""retryRun's rules (`domain.retries.manual_retry`) as a table: which runs a person may retry and which code
each refusal carries, then what a retry changes. Pure: no database."""

from __future__ import annotations

import pytest

from tests.support import builders as b
from threadloom.domain.entities import AppThread, Run, RunAttempt
from threadloom.domain.errors import DomainError
from threadloom.domain.retries import manual_retry, newer_ran
from threadloom.domain.statuses import AttemptReason, AttemptStatus, RunStatus

FAILED = RunStatus.FAILED


def _try(
    run_status: RunStatus, later: list[tuple[RunStatus, bool]], *, busy: bool = False, archived: bool = False
) -> str:
    """The error code retryRun answers (or "ok"); `later`: the thread's runs after it (status, started)."""
    owner = b.thread(archived_at=b.NOW if archived else None)
    reason = "provider_lost" if run_status == FAILED else None
    r = b.run(owner, 1, run_status, status_reason=reason, started_at=b.NOW)
    others = [
        b.run(owner, 2 + i, status, started_at=b.LATER if started else None, queue_position=None)
        for i, (status, started) in enumerate(later)
    ]
    if busy:
        owner = owner.evolve(active_run_id=b.uid())
    last = b.attempt_of(r, AttemptStatus.FAILED)
    try:
        manual_retry(owner, r, last, "root", others, b.LATER, b.Ids(), "hi")
    except DomainError as error:
        assert error.field == "runId"
        return error.code.value
    return "ok"


TABLE = [
    ("failed-latest", FAILED, [], False, "ok"),
    ("failed-queued-runs-behind-it", FAILED, [(RunStatus.QUEUED, False), (RunStatus.QUEUED, False)], False, "ok"),
    ("failed-a-later-run-was-cancelled-in-the-queue", FAILED, [(RunStatus.CANCELLED, False)], False, "ok"),
    ("failed-a-later-run-was-rolled-back", FAILED, [(RunStatus.ROLLED_BACK, True)], False, "ok"),
    ("failed-a-later-run-completed", FAILED, [(RunStatus.COMPLETED, True)], False, "RUN_NOT_LATEST"),
    ("failed-a-later-run-failed-too", FAILED, [(RunStatus.FAILED, True)], False, "RUN_NOT_LATEST"),
    ("failed-another-run-is-active", FAILED, [], True, "THREAD_BUSY"),
    ("busy-is-said-before-not-latest", FAILED, [(RunStatus.RUNNING, True)], True, "THREAD_BUSY"),
    *[(f"{s.name.lower()}", s, [], False, "RUN_NOT_RETRYABLE") for s in RunStatus if s != FAILED],
]


@pytest.mark.parametrize(("status", "later", "busy", "code"), [r[1:] for r in TABLE], ids=[r[0] for r in TABLE])
def test_who_may_be_retried(status: RunStatus, later: list[tuple[RunStatus, bool]], busy: bool, code: str) -> None:
    assert _try(status, later, busy=busy) == code


def test_an_archived_thread_is_refused() -> None:
    assert _try(FAILED, [], archived=True) == "THREAD_ARCHIVED"


def test_newer_means_started_later_not_a_higher_ordinal() -> None:
    """A reordered queue can start run 3 before run 2: what counts is which started last."""
    owner = b.thread()
    r = b.run(owner, 3, FAILED, started_at=b.LATER)
    assert not newer_ran(r, [b.run(owner, 2, RunStatus.COMPLETED, started_at=b.NOW)])
    assert newer_ran(r.evolve(started_at=b.NOW), [b.run(owner, 2, RunStatus.COMPLETED, started_at=b.LATER)])
    assert newer_ran(r.evolve(started_at=None), [b.run(owner, 2, RunStatus.COMPLETED, started_at=b.NOW)])
    assert not newer_ran(r, [r])


def _retried() -> tuple[AppThread, Run, RunAttempt, list[object], list[object]]:
    owner = b.thread(queue_held=True, queue_hold_reason="run 1 failed: boom")
    r = b.run(owner, 1, FAILED, status_reason="model_error", completed_at=b.NOW, started_at=b.NOW)
    last = b.attempt_of(r, AttemptStatus.FAILED, attempt_ordinal=2, reason=AttemptReason.PROVIDER_RECOVERY)
    outcome = manual_retry(owner, r, last, "root", [], b.LATER, b.Ids(), "hi\n\nsteered")
    return owner, r, last, list(outcome.changes), list(outcome.effects)


def test_a_retry_opens_a_retry_attempt_and_makes_the_run_active_again() -> None:
    owner, r, last, changes, effects = _retried()
    [attempt] = b.latest(changes, RunAttempt).values()  # type: ignore[arg-type]
    assert (attempt.reason, attempt.status, attempt.attempt_ordinal) == (AttemptReason.RETRY, AttemptStatus.PENDING, 3)
    assert attempt.provider_thread_id == last.provider_thread_id
    [run] = b.latest(changes, Run).values()  # type: ignore[arg-type]
    assert (run.status, run.status_reason, run.failure_code, run.completed_at) == (
        RunStatus.PREPARING,
        None,
        None,
        None,
    )
    assert (run.active_attempt_id, run.root_node_id) == (attempt.id, attempt.root_node_id)
    [thread] = b.latest(changes, AppThread).values()  # type: ignore[arg-type]
    assert thread.active_run_id == r.id
    assert thread.queue_held and thread.queue_hold_reason == owner.queue_hold_reason  # resumeQueue releases it
    [start] = effects
    assert start.kind == "provider-turn.start" and start.payload["attemptId"] == str(attempt.id)  # type: ignore[attr-defined]
    assert start.payload["input"] == "hi\n\nsteered"  # type: ignore[attr-defined]  # the run's input, steers and all
    assert start.delay_s == 0  # type: ignore[attr-defined]


def test_a_retry_writes_one_activity_with_its_run_and_node() -> None:
    _, r, _, changes, _ = _retried()
    [attempt] = b.latest(changes, RunAttempt).values()  # type: ignore[arg-type]
    [activity] = [c.entity for c in changes if c.entity.entity_type == "activity"]  # type: ignore[attr-defined]
    assert (activity.kind, activity.run_id, activity.node_id) == ("run.retried", r.id, attempt.root_node_id)
    assert activity.payload == {"attempt": 3, "reason": "RETRY", "previousAttempt": 2, "failedWith": "model_error"}

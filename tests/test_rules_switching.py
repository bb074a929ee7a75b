"""Provider switching rules (domain/switching.py) as tables: where a run goes, what its provider thread holds,
how a message for another provider is dispatched. Pure: no database, no provider."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from tests.support import builders as b
from threadloom.domain import retries, switching
from threadloom.domain.dispatch import AppliedDispatch, Dispatch, DispatchMode
from threadloom.domain.entities import ContextHandoff, ProviderThread
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.handoffs import ChoiceReason, HandoffKind
from threadloom.domain.statuses import (
    AttemptReason,
    HandoffStatus,
    HandoffStrategy,
    NodeKind,
    ProviderThreadStatus,
    RunStatus,
)

NOW = datetime(2026, 12, 1, tzinfo=UTC)
OWNER = b.thread(provider_instance_id="a")


def pt(instance: str, *, first: int | None = None, last: int | None = None, status: str = "idle") -> ProviderThread:
    return ProviderThread(
        id=b.uid(),
        thread_id=OWNER.id,
        provider_instance_id=instance,
        status=ProviderThreadStatus(status),
        first_run_ordinal=first,
        last_run_ordinal=last,
        created_at=NOW,
        updated_at=NOW,
    )


def delivered(to: ProviderThread, covered: list[int], strategy: HandoffStrategy, minute: int) -> ContextHandoff:
    return ContextHandoff(
        id=b.uid(),
        thread_id=OWNER.id,
        to_provider_thread_id=to.id,
        covered_run_ordinals=covered,
        strategy=strategy,
        status=HandoffStatus.DELIVERED,
        text="x",
        token_estimate=1,
        created_at=NOW + timedelta(minutes=minute),
    )


FULL, DELTA = HandoffStrategy.FULL_THREAD_SUMMARY, HandoffStrategy.DELTA_SINCE_TARGET_LAST_SEEN


def held(*histories: switching.History, rolled_back: frozenset[int] = frozenset()) -> switching.Histories:
    return switching.Histories({h.provider_thread.id: h for h in histories}, rolled_back)


def test_what_a_provider_thread_holds() -> None:
    own = pt("a", first=1, last=5)
    facts = switching.target_facts(own, held(switching.History(own, frozenset(range(1, 6)))))
    assert facts.seen_run_ordinals == {1, 2, 3, 4, 5}
    handed = pt("b", first=6, last=8)  # started with a full summary of 1-5, ran 6-8
    history = switching.History(handed, frozenset({6, 7, 8}), (delivered(handed, [1, 2, 3, 4, 5], FULL, 0),))
    facts = switching.target_facts(handed, held(history))
    assert (facts.seen_run_ordinals, facts.handoffs_received) == (set(range(1, 9)), 0)
    back = pt("a", first=1, last=5)  # then got deltas of 6-8 and 10
    deltas = (delivered(back, [6, 7, 8], DELTA, 1), delivered(back, [10], DELTA, 2))
    facts = switching.target_facts(back, held(switching.History(back, frozenset(range(1, 6)), deltas)))
    assert (facts.seen_run_ordinals, facts.handoffs_received, facts.resumable) == ({*range(1, 9), 10}, 2, True)
    assert not switching.target_facts(pt("a", status="error"), held()).resumable


def test_runs_a_provider_thread_never_saw_are_missed_whatever_their_ordinal() -> None:
    """It ran 1, 2 and 4; run 3 ran elsewhere after run 4 (a queued run moved ahead): 3 is not seen."""
    a = pt("a", first=1, last=4)
    assert switching.seen_runs(a.id, held(switching.History(a, frozenset({1, 2, 4})))) == {1, 2, 4}


def test_a_handoff_accounts_for_the_runs_it_left_out_for_length() -> None:
    b_ = pt("b", first=9)
    summary = dataclasses.replace(delivered(b_, [6, 7, 8], FULL, 0), omitted_run_ordinals=[1, 2, 3, 4, 5])
    assert switching.seen_runs(b_.id, held(switching.History(b_, frozenset({9}), (summary,)))) == set(range(1, 10))


def test_a_pending_handoff_counts_it_goes_with_the_next_turn() -> None:
    c = pt("c", first=4)
    pending = dataclasses.replace(delivered(c, [1, 2, 3], FULL, 0), status=HandoffStatus.PENDING)
    facts = switching.target_facts(c, held(switching.History(c, frozenset(), (pending,))))
    assert facts.seen_run_ordinals == {1, 2, 3}


def test_a_native_fork_holds_what_its_source_held_before_its_first_run() -> None:
    """A rollback to run 4 forked a at its last kept turn: the fork holds a's runs before 5 (1, 2 and 4, not
    run 3, which ran on b), not a's undone runs 5-6; then it ran 7 itself."""
    a = pt("a", first=1, last=6)
    fork = dataclasses.replace(pt("a", first=5), forked_from_provider_thread_id=a.id)
    histories = held(switching.History(a, frozenset({1, 2, 4, 5, 6})), switching.History(fork, frozenset({7})))
    assert switching.seen_runs(fork.id, histories) == {1, 2, 4, 7}


def test_a_handoff_carried_by_an_undone_run_is_gone_with_its_turn() -> None:
    """a ran 1-2; 3-4 ran on b; back on a, run 5's first turn carried the delta of 3-4. A rollback to run 4
    drops run 5's turn natively, and the delta with it: a no longer holds 3 and 4 (they are handed again)."""
    a = pt("a", first=1, last=5)
    delta = dataclasses.replace(delivered(a, [3, 4], DELTA, 1), target_run_id=b.uid())
    history = switching.History(a, frozenset({1, 2, 5}), (delta,), {delta.id: 5})
    assert switching.seen_runs(a.id, held(history)) == {1, 2, 3, 4, 5}
    assert switching.seen_runs(a.id, held(history).undoing([5])) == {1, 2, 5}
    assert switching.seen_runs(a.id, held(history, rolled_back=frozenset({5}))) == {1, 2, 5}
    # a fork of a before run 5 never had the delta either; one before run 6 did
    for first, holds in ((5, {1, 2}), (6, {1, 2, 3, 4, 5})):
        fork = dataclasses.replace(pt("a", first=first), forked_from_provider_thread_id=a.id)
        assert switching.seen_runs(fork.id, held(history, switching.History(fork))) == holds


@pytest.mark.parametrize(
    ("current", "instance", "fresh", "continues"),
    [("a", "a", False, True), ("a", "b", False, False), ("a", "a", True, False), (None, "a", False, False)],
)
def test_a_run_continues_only_on_its_providers_thread(
    current: str | None, instance: str, fresh: bool, continues: bool
) -> None:
    run = b.run(OWNER, 2, RunStatus.PREPARING, provider_instance_id=instance, fresh_context=fresh)
    assert switching.continues(None if current is None else pt(current), run) is continues


def test_the_spec_example_new_thread_then_return() -> None:
    run = b.run(OWNER, 6, RunStatus.PREPARING, provider_instance_id="b")
    plan = switching.plan_provider(OWNER, run, [], held(), [1, 2, 3, 4, 5], NOW, uuid.uuid4)
    assert plan.choice is not None and plan.choice.reason == ChoiceReason.FIRST_TIME
    assert plan.choice.strategy == HandoffKind.FULL_THREAD_SUMMARY and plan.choice.selection.ordinals == {1, 2, 3, 4, 5}
    assert plan.provider_thread.provider_instance_id == "b" and plan.provider_thread.status == "not_loaded"
    created, moved = plan.changes
    assert created.entity == plan.provider_thread
    assert getattr(moved.entity, "active_provider_thread_id", None) == plan.provider_thread.id

    codex = pt("a", first=1, last=5)
    ran = held(switching.History(codex, frozenset(range(1, 6))))
    nine = b.run(OWNER, 9, RunStatus.PREPARING, provider_instance_id="a")
    back = switching.plan_provider(OWNER, nine, [codex], ran, range(1, 9), NOW, uuid.uuid4)
    assert back.provider_thread is codex and back.choice is not None
    assert back.choice.strategy == HandoffKind.DELTA_SINCE_TARGET_LAST_SEEN
    assert back.choice.selection.ordinals == {6, 7, 8} and len(back.changes) == 1

    fresh = dataclasses.replace(nine, fresh_context=True)
    anew = switching.plan_provider(OWNER, fresh, [codex], ran, range(1, 9), NOW, uuid.uuid4)
    assert anew.provider_thread is not codex and anew.choice is not None
    assert anew.choice.reason == ChoiceReason.FRESH_CONTEXT and anew.choice.selection.ordinals == set(range(1, 9))


@pytest.mark.parametrize(
    ("applied", "mode", "expected"),
    [
        (AppliedDispatch.START_IMMEDIATELY, DispatchMode.AUTO, AppliedDispatch.START_IMMEDIATELY),
        (AppliedDispatch.QUEUE_AFTER_ACTIVE, DispatchMode.AUTO, AppliedDispatch.QUEUE_AFTER_ACTIVE),
        (AppliedDispatch.STEER_ACTIVE, DispatchMode.AUTO, AppliedDispatch.QUEUE_AFTER_ACTIVE),
        (AppliedDispatch.RESTART_ACTIVE, DispatchMode.AUTO, AppliedDispatch.QUEUE_AFTER_ACTIVE),
        (AppliedDispatch.STEER_ACTIVE, DispatchMode.STEER_ACTIVE, None),
        (AppliedDispatch.RESTART_ACTIVE, DispatchMode.RESTART_ACTIVE, None),
    ],
)
def test_a_message_for_another_provider_never_steers(
    applied: AppliedDispatch, mode: DispatchMode, expected: AppliedDispatch | None
) -> None:
    if expected is not None:
        assert switching.dispatch_across(applied, Dispatch(mode)) == expected
        return
    with pytest.raises(DomainError) as refused:
        switching.dispatch_across(applied, Dispatch(mode))
    assert refused.value.code == ErrorCode.PROVIDER_SWITCH_UNAVAILABLE


def test_switching_takes_a_known_instance_and_the_model_asked_for() -> None:
    moved = switching.switched(OWNER.evolve(model="gpt-5"), "b", None, ["a", "b"], NOW)
    assert (moved.provider_instance_id, moved.model) == ("b", None)
    with pytest.raises(DomainError) as refused:
        switching.switched(OWNER, "nope", None, ["a", "b"], NOW)
    assert refused.value.code == ErrorCode.UNKNOWN_PROVIDER_INSTANCE


def test_retry_policy_only_before_anything_ran_and_bounded() -> None:
    run = b.run(OWNER, 1, RunStatus.RUNNING)
    attempt = b.attempt_of(run)
    root = b.root_of(run)
    policy = retries.RetryPolicy(retries=2, backoff_s=0.5)
    assert [policy.delay(n) for n in (1, 2, 3)] == [0.5, 1.0, 2.0]
    assert retries.may_retry(policy, [attempt], [root])
    tool = dataclasses.replace(b.child_of(root), kind=NodeKind.TOOL_CALL)
    assert not retries.may_retry(policy, [attempt], [root, tool])  # a command ran: never twice
    again = [attempt, dataclasses.replace(attempt, id=b.uid(), reason=AttemptReason.PROVIDER_RECOVERY)]
    assert retries.may_retry(policy, again, [root])
    assert not retries.may_retry(policy, [*again, again[1]], [root])  # two retries used
    assert not retries.may_retry(retries.RetryPolicy(), [attempt], [root])  # no policy: no retry

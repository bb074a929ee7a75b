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


def test_what_a_provider_thread_holds() -> None:
    own = pt("a", first=1, last=5)
    assert switching.target_facts(own, []).last_seen_run_ordinal == 5
    handed = pt("b", first=6, last=8)  # started with a full summary of 1-5, ran 6-8
    facts = switching.target_facts(handed, [delivered(handed, [1, 2, 3, 4, 5], FULL, 0)])
    assert (facts.last_seen_run_ordinal, facts.handoffs_received) == (8, 0)
    back = pt("a", first=1, last=5)  # then got deltas of 6-8 and 10
    deltas = [delivered(back, [6, 7, 8], DELTA, 1), delivered(back, [10], DELTA, 2)]
    facts = switching.target_facts(back, deltas)
    assert (facts.last_seen_run_ordinal, facts.handoffs_received, facts.resumable) == (10, 2, True)
    assert not switching.target_facts(pt("a", status="error"), []).resumable


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
    plan = switching.plan_provider(OWNER, run, [], [], [1, 2, 3, 4, 5], NOW, uuid.uuid4)
    assert plan.choice is not None and plan.choice.reason == ChoiceReason.FIRST_TIME
    assert plan.choice.strategy == HandoffKind.FULL_THREAD_SUMMARY and plan.choice.selection.ordinals == {1, 2, 3, 4, 5}
    assert plan.provider_thread.provider_instance_id == "b" and plan.provider_thread.status == "not_loaded"
    created, moved = plan.changes
    assert created.entity == plan.provider_thread
    assert getattr(moved.entity, "active_provider_thread_id", None) == plan.provider_thread.id

    codex = pt("a", first=1, last=5)
    nine = b.run(OWNER, 9, RunStatus.PREPARING, provider_instance_id="a")
    back = switching.plan_provider(OWNER, nine, [codex], [], range(1, 9), NOW, uuid.uuid4)
    assert back.provider_thread is codex and back.choice is not None
    assert back.choice.strategy == HandoffKind.DELTA_SINCE_TARGET_LAST_SEEN
    assert back.choice.selection.ordinals == {6, 7, 8} and len(back.changes) == 1

    fresh = dataclasses.replace(nine, fresh_context=True)
    anew = switching.plan_provider(OWNER, fresh, [codex], [], range(1, 9), NOW, uuid.uuid4)
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

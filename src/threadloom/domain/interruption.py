"""Interruption and Stop (docs/lifecycles/interruption-and-stop.md).

The request only marks "interrupt requested" and asks the provider; the terminal state
comes from the provider's lifecycle. Before the provider has the turn, the run ends at
once. A provider that cannot interrupt is handled by policy: end the run and stop its
turn's runtime, or record the refusal (an activity), answer INTERRUPT_UNSUPPORTED and
leave the run active.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from threadloom.domain.activities import ActivityKind, activity, run_activity
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.effects import InterruptTurn
from threadloom.domain.entities import AppThread, Run
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.runs import is_active
from threadloom.domain.statuses import RunStatus

STOP_HOLD_REASON = "stopped by the user"


class UnsupportedPolicy(StrEnum):
    STOP_SESSION = "stop_session"
    REJECT = "reject"


class Plan(StrEnum):
    """What an interrupt request does to a run."""

    CANCEL_QUEUED = "cancel_queued"  # not started: it simply will not run
    END_NOW = "end_now"  # the provider never got the turn
    ASK_PROVIDER = "ask_provider"  # mark requested; the provider's terminal ends it
    STOP_SESSION = "stop_session"  # no interrupt support: end the run by policy, end its turn's runtime work
    UNSUPPORTED = "unsupported"  # no interrupt support, `reject` policy: record the refusal, the run goes on


def plan_interrupt(run: Run, *, turn_recorded: bool, supports_interrupt: bool, policy: UnsupportedPolicy) -> Plan:
    if run.status == RunStatus.QUEUED:
        return Plan.CANCEL_QUEUED
    if not is_active(run):
        raise DomainError(ErrorCode.RUN_NOT_ACTIVE, f"run {run.ordinal} already ended ({run.status})", "runId")
    if not turn_recorded:
        return Plan.END_NOW
    if supports_interrupt:
        return Plan.ASK_PROVIDER
    if policy == UnsupportedPolicy.STOP_SESSION:
        return Plan.STOP_SESSION
    return Plan.UNSUPPORTED


UNSUPPORTED_MESSAGE = "this provider cannot interrupt a turn; the run goes on"


def unsupported(thread: AppThread, run: Run, now: datetime, new_id: NewId) -> Outcome:
    """The `reject` policy: the run goes on, and the thread's history says the interrupt was refused.

    The result carries `interruptUnsupported`, so the engine answers INTERRUPT_UNSUPPORTED after
    committing the record (and again on a replay of the same request)."""
    return Outcome(
        [
            run_activity(
                run,
                ActivityKind.RUN_INTERRUPT_UNSUPPORTED,
                f"interrupt of run {run.ordinal} refused: {UNSUPPORTED_MESSAGE}",
                now,
                new_id,
                node_id=run.root_node_id,
            )
        ],
        result={"runId": str(run.id), "interruptUnsupported": True},
    )


def unsupported_error() -> DomainError:
    return DomainError(ErrorCode.INTERRUPT_UNSUPPORTED, UNSUPPORTED_MESSAGE, "runId")


def requested(thread: AppThread, run: Run, now: datetime, new_id: NewId) -> Outcome:
    """Mark the request and ask the provider. The run is not terminal because of this."""
    if run.interrupt_requested_at is not None:
        return Outcome(result={"runId": str(run.id)})
    return Outcome(
        [
            Change.updated(run.evolve(interrupt_requested_at=now)),
            run_activity(
                run,
                ActivityKind.RUN_INTERRUPT_REQUESTED,
                f"interrupt of run {run.ordinal} requested",
                now,
                new_id,
                node_id=run.root_node_id,
            ),
        ],
        [InterruptTurn(run_id=run.id, attempt_id=run.active_attempt_id).envelope()],
        result={"runId": str(run.id)},
    )


def hold(thread: AppThread, now: datetime, new_id: NewId, reason: str = STOP_HOLD_REASON) -> list[Change]:
    if thread.queue_held:
        return []
    return [
        Change.updated(thread.evolve(queue_held=True, queue_hold_reason=reason, updated_at=now)),
        activity(thread.id, ActivityKind.QUEUE_HELD, reason, now, new_id),
    ]

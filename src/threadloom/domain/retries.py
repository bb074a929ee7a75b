"""Retrying a run: after its agent process or its server was lost mid-turn, and when a person asks.

Two losses give a run a new attempt (`PROVIDER_RECOVERY`) on its resumed provider thread:
- its agent process crashed or lost its connection, where the instance allows it (`crash_retries`,
  with `crash_retry_backoff_s`; off by default);
- the server that held its turn was restarted, killed or lost (a replica), by default
  (`recovery_retries`, with `recovery_backoff_s`; `recovery_retries = 0` turns it off).
Either only while the lost attempt made no irreversible progress that the server recorded: no
command or file change and no subagent started (`made_progress`), so nothing runs twice — and only
as many times in a row as the policy says, each later than the last (doubling backoff). Otherwise
the run fails as it always did (`provider_crashed`, `provider_lost`). Every attempt stays visible
under the run.

`retryRun` (`manual_retry`) gives a FAILED run a new attempt (`RETRY`) when a person asks: only the
thread's latest run that ran, and only while nothing else runs on the thread (`refuse_retry`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from threadloom.domain.activities import ActivityKind, run_activity
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.dispatch import open_attempt
from threadloom.domain.effects import StartTurn
from threadloom.domain.entities import AppThread, ExecutionNode, Run, RunAttempt
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.nodes import Place
from threadloom.domain.requests import expire
from threadloom.domain.runs import RunGraph
from threadloom.domain.statuses import (
    AttemptReason,
    AttemptStatus,
    NodeKind,
    NodeStatus,
    ProviderThreadStatus,
    ProviderTurnStatus,
    RunStatus,
)

PROGRESS_KINDS = frozenset({NodeKind.TOOL_CALL, NodeKind.SUBAGENT})  # something ran or was written


@dataclasses.dataclass(frozen=True, slots=True)
class RetryPolicy:
    retries: int = 0  # 0: a loss fails the run
    backoff_s: float = 0.5

    def delay(self, retry: int) -> float:
        """Seconds before retry number `retry` (1, 2, ...) starts."""
        return float(self.backoff_s * 2.0 ** (retry - 1))


def made_progress(nodes: Sequence[ExecutionNode]) -> bool:
    return any(node.kind in PROGRESS_KINDS for node in nodes)


# After a restart or a lost server: on unless an instance says `recovery_retries = 0`.
DEFAULT_RECOVERY = RetryPolicy(retries=2, backoff_s=1.0)
# What the lost attempt's failure says, and why its pending requests expired.
_LOSSES = {
    "provider_crashed": "the agent process exited; the run is retried",
    "provider_lost": "the server that held the turn is gone; the run is retried",
}


def retries_so_far(attempts: Sequence[RunAttempt]) -> int:
    """The `PROVIDER_RECOVERY` attempts in a row at the end of `attempts`: a person's retry (`RETRY`) or a
    steering restart starts the count again."""
    count = 0
    for attempt in reversed(attempts):
        if attempt.reason != AttemptReason.PROVIDER_RECOVERY:
            break
        count += 1
    return count


def may_retry(policy: RetryPolicy, attempts: Sequence[RunAttempt], nodes: Sequence[ExecutionNode]) -> bool:
    return retries_so_far(attempts) < policy.retries and not made_progress(nodes)


def retry(
    graph: RunGraph,
    attempts: Sequence[RunAttempt],
    text: str,
    reason: str,
    policy: RetryPolicy,
    now: datetime,
    new_id: NewId,
    *,
    lost: str = "provider_crashed",
) -> Outcome:
    """Close the lost attempt (failed with `lost`, its turn and open nodes with it) and open a
    `PROVIDER_RECOVERY` attempt that starts after the backoff with the run's input."""
    run, attempt, root = graph.run, graph.attempt, graph.root
    number = retries_so_far(attempts) + 1
    place = Place(run.thread_id, run.id, new_id(), new_id())
    new_root, new_attempt = open_attempt(
        place, attempt.attempt_ordinal + 1, AttemptReason.PROVIDER_RECOVERY, attempt.provider_thread_id, root.title, now
    )
    ended = {"status": NodeStatus.FAILED, "updated_at": now, "completed_at": now}
    changes: list[Change] = [Change.updated(m.evolve(streaming=False, updated_at=now)) for m in graph.open_messages]
    for request in graph.pending_requests:
        changes += expire(request, None, _LOSSES.get(lost, f"{lost}; the run is retried"), now)
    changes += [Change.updated(child.evolve(**ended)) for child in graph.open_children]
    changes.append(Change.updated(root.evolve(**ended)))
    changes.append(Change.updated(attempt.evolve(status=AttemptStatus.FAILED, status_reason=lost, completed_at=now)))
    if graph.turn is not None:
        changes.append(Change.updated(graph.turn.evolve(status=ProviderTurnStatus.FAILED, completed_at=now)))
    if graph.provider_thread is not None:
        pt = graph.provider_thread.evolve(status=ProviderThreadStatus.NOT_LOADED, updated_at=now)
        changes.append(Change.updated(pt))
    changes += [
        Change.created(new_root),
        Change.created(new_attempt),
        Change.updated(
            run.evolve(status=RunStatus.PREPARING, active_attempt_id=new_attempt.id, root_node_id=new_root.id)
        ),
        run_activity(
            run,
            ActivityKind.RUN_RETRIED,
            f"run {run.ordinal} retried ({number} of {policy.retries}): {reason}",
            now,
            new_id,
            node_id=new_root.id,
            payload={
                "attempt": new_attempt.attempt_ordinal,
                "reason": AttemptReason.PROVIDER_RECOVERY.name,
                "lost": lost,
                "retry": number,
                "delaySeconds": policy.delay(number),
            },
        ),
    ]
    start = StartTurn(run_id=run.id, attempt_id=new_attempt.id, input=text, thread_id=run.thread_id).envelope()
    return Outcome(changes, [dataclasses.replace(start, delay_s=policy.delay(number))])


# ---- retryRun: a person asks for a new attempt of a failed run ----------------------------------------------


def refuse_retry(thread: AppThread, run: Run, newer_ran: bool) -> None:
    """Why `run` cannot be retried now, if it cannot (`newer_ran`: another run of the thread started after it).

    Only a FAILED run is retried (RUN_NOT_RETRYABLE otherwise: a completed run's answer stands, an interrupted
    or cancelled one was stopped by a person, a rolled-back one was undone). While a run of the thread is active
    the thread is THREAD_BUSY. The conversation goes on from the run that started last, so a failed run behind
    one that started after it is RUN_NOT_LATEST (send a new message instead); runs still queued behind it are
    not newer in that sense: they wait, as the failure left them. An archived thread is THREAD_ARCHIVED.
    """
    if thread.archived_at is not None:
        raise DomainError(ErrorCode.THREAD_ARCHIVED, "the thread is archived; unarchive it first", "runId")
    if run.status != RunStatus.FAILED:
        message = f"run {run.ordinal} is {run.status.name}; only a FAILED run is retried"
        raise DomainError(ErrorCode.RUN_NOT_RETRYABLE, message, "runId")
    if thread.active_run_id is not None:
        raise DomainError(ErrorCode.THREAD_BUSY, "a run of the thread is active; retry once it ended", "runId")
    if newer_ran:
        message = f"another run of the thread started after run {run.ordinal}; send a new message instead"
        raise DomainError(ErrorCode.RUN_NOT_LATEST, message, "runId")


def newer_ran(run: Run, others: Sequence[Run]) -> bool:
    """Whether one of `others` (the thread's runs) started a turn after `run` did and was not undone since: a
    run still queued, or cancelled before it started, never did."""
    return any(
        other.id != run.id
        and other.started_at is not None
        and (run.started_at is None or other.started_at > run.started_at)
        and other.status != RunStatus.ROLLED_BACK
        for other in others
    )


def manual_retry(
    thread: AppThread,
    run: Run,
    last: RunAttempt,
    title: str | None,
    others: Sequence[Run],
    now: datetime,
    new_id: NewId,
    text: str,
) -> Outcome:
    """retryRun: a `RETRY` attempt of a failed run (after `last`, its attempt that failed), started at once
    with the run's input `text` (its message and every steer or restart message after it, as a recovery's
    retry gets: the message alone dropped what the person had steered in before the failure) on its provider
    thread (resumed where it is not loaded). The run is active again and its failure is cleared; the queue
    stays as the failure left it (held: `resumeQueue` releases it)."""
    refuse_retry(thread, run, newer_ran(run, others))
    place = Place(run.thread_id, run.id, new_id(), new_id())
    root, attempt = open_attempt(
        place, last.attempt_ordinal + 1, AttemptReason.RETRY, last.provider_thread_id, title, now
    )
    again = run.evolve(
        status=RunStatus.PREPARING,
        status_reason=None,
        failure_code=None,
        failure_http_status=None,
        completed_at=None,
        active_attempt_id=attempt.id,
        root_node_id=root.id,
    )
    summary = f"run {run.ordinal} retried (attempt {attempt.attempt_ordinal}) after it failed: {run.status_reason}"
    payload = {
        "attempt": attempt.attempt_ordinal,
        "reason": AttemptReason.RETRY.name,
        "previousAttempt": last.attempt_ordinal,
        "failedWith": run.status_reason,
    }
    changes = [
        Change.created(root),
        Change.created(attempt),
        Change.updated(again),
        Change.updated(thread.evolve(active_run_id=run.id, updated_at=now)),
        run_activity(run, ActivityKind.RUN_RETRIED, summary, now, new_id, node_id=root.id, payload=payload),
    ]
    start = StartTurn(run_id=run.id, attempt_id=attempt.id, input=text, thread_id=run.thread_id)
    return Outcome(changes, [start.envelope()])

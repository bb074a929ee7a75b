"""Retrying a run whose agent process died mid-turn.

An instance may allow retries (`crash_retries`, with `crash_retry_backoff_s`). A run whose agent
process crashes or loses its connection gets a new attempt (`PROVIDER_RECOVERY`) on its resumed
provider thread — but only while the failed attempt made no irreversible progress: no command or
file change and no subagent started (`made_progress`), so nothing runs twice — and only as many
times as the policy says, each later than the last (doubling backoff). Otherwise the run fails as
it always did. Every attempt stays visible under the run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import datetime

from threadloom.domain.activities import ActivityKind, run_activity
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.dispatch import open_attempt
from threadloom.domain.effects import StartTurn
from threadloom.domain.entities import ExecutionNode, RunAttempt
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
    retries: int = 0  # 0: a crash fails the run
    backoff_s: float = 0.5

    def delay(self, retry: int) -> float:
        """Seconds before retry number `retry` (1, 2, ...) starts."""
        return float(self.backoff_s * 2.0 ** (retry - 1))


def made_progress(nodes: Sequence[ExecutionNode]) -> bool:
    return any(node.kind in PROGRESS_KINDS for node in nodes)


def retries_so_far(attempts: Sequence[RunAttempt]) -> int:
    return sum(1 for a in attempts if a.reason == AttemptReason.PROVIDER_RECOVERY)


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
) -> Outcome:
    """Close the crashed attempt (failed, its turn and open nodes with it) and open a `PROVIDER_RECOVERY`
    attempt that starts after the backoff with the run's input."""
    run, attempt, root = graph.run, graph.attempt, graph.root
    number = retries_so_far(attempts) + 1
    place = Place(run.thread_id, run.id, new_id(), new_id())
    new_root, new_attempt = open_attempt(
        place, attempt.attempt_ordinal + 1, AttemptReason.PROVIDER_RECOVERY, attempt.provider_thread_id, root.title, now
    )
    ended = {"status": NodeStatus.FAILED, "updated_at": now, "completed_at": now}
    changes: list[Change] = [Change.updated(m.evolve(streaming=False, updated_at=now)) for m in graph.open_messages]
    for request in graph.pending_requests:
        changes += expire(request, None, "the agent process exited; the run is retried", now)
    changes += [Change.updated(child.evolve(**ended)) for child in graph.open_children]
    changes.append(Change.updated(root.evolve(**ended)))
    changes.append(
        Change.updated(attempt.evolve(status=AttemptStatus.FAILED, status_reason="provider_crashed", completed_at=now))
    )
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
            payload={"attempt": new_attempt.attempt_ordinal, "retry": number, "delaySeconds": policy.delay(number)},
        ),
    ]
    start = StartTurn(run_id=run.id, attempt_id=new_attempt.id, input=text, thread_id=run.thread_id).envelope()
    return Outcome(changes, [dataclasses.replace(start, delay_s=policy.delay(number))])

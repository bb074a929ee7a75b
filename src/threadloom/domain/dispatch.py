"""Where a new user message goes (docs/lifecycles/steering-and-queue.md).

- no run active and nothing queued → start now;
- the user asked for a new turn → queue, even if steering is available;
- the provider can steer a live turn → steer it (same run);
- it cannot, but can interrupt → restart the run with the steering message (same run, new attempt);
- a steer that arrives after its target run ended becomes a new run.

What each choice writes is here too: a new run (`new_run`, started now or queued through
`domain.queue`), a steer in place (`steer`: the message joins the active run and the provider is asked
to steer its turn), a steer by restart (`restart`: the active attempt is superseded, its root node
interrupted, and a new attempt with a new root node opens under the same run, its turn carrying the
interrupted input plus the steering message) or, for instances so configured, a restart as a new run.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum

from threadloom.domain.activities import ActivityKind, activity, run_activity
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.delegation import closable
from threadloom.domain.effects import InterruptTurn, StartTurn, SteerTurn
from threadloom.domain.entities import (
    AppThread,
    ConversationMessage,
    ExecutionNode,
    Run,
    RunAttempt,
    RuntimeRequest,
)
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.nodes import Place, open_node
from threadloom.domain.queue import order_key, start_run
from threadloom.domain.requests import expire
from threadloom.domain.statuses import (
    TERMINAL_RUN_STATUSES,
    AttemptReason,
    AttemptStatus,
    InputIntent,
    MessageRole,
    NodeKind,
    NodeStatus,
    RunStatus,
)
from threadloom.domain.threads import ThreadState, clean_text, first_message_title


class DispatchMode(StrEnum):
    AUTO = "auto"
    START_IMMEDIATELY = "start_immediately"
    QUEUE_AFTER_ACTIVE = "queue_after_active"
    STEER_ACTIVE = "steer_active"
    RESTART_ACTIVE = "restart_active"


class AppliedDispatch(StrEnum):
    """What a message's dispatch came to: a `DispatchMode` other than AUTO, spelled the same."""

    START_IMMEDIATELY = DispatchMode.START_IMMEDIATELY.value
    QUEUE_AFTER_ACTIVE = DispatchMode.QUEUE_AFTER_ACTIVE.value
    STEER_ACTIVE = DispatchMode.STEER_ACTIVE.value
    RESTART_ACTIVE = DispatchMode.RESTART_ACTIVE.value


@dataclasses.dataclass(frozen=True, slots=True)
class SteerAbility:
    native: bool  # supportsActiveSteering
    restart: bool  # supportsSteeringByInterruptRestart


@dataclasses.dataclass(frozen=True, slots=True)
class Dispatch:
    mode: DispatchMode = DispatchMode.AUTO
    target_run_id: uuid.UUID | None = None
    expected_attempt_id: uuid.UUID | None = None


def _new_run(state: ThreadState) -> AppliedDispatch:
    idle = state.active is None and not state.queue
    return AppliedDispatch.START_IMMEDIATELY if idle else AppliedDispatch.QUEUE_AFTER_ACTIVE


def choose(dispatch: Dispatch, state: ThreadState, ability: SteerAbility) -> AppliedDispatch:
    if state.thread.archived_at is not None:
        raise DomainError(ErrorCode.THREAD_ARCHIVED, "the thread is archived; unarchive it first", "threadId")
    active = state.active
    mode = dispatch.mode
    if mode == DispatchMode.START_IMMEDIATELY:
        if active is not None:
            raise DomainError(ErrorCode.THREAD_BUSY, "a run is active; queue the message or stop the run", "dispatch")
        return AppliedDispatch.START_IMMEDIATELY
    if mode == DispatchMode.QUEUE_AFTER_ACTIVE:
        blocked = active is not None or (state.thread.queue_held and bool(state.queue))
        return AppliedDispatch.QUEUE_AFTER_ACTIVE if blocked else AppliedDispatch.START_IMMEDIATELY
    if mode in (DispatchMode.STEER_ACTIVE, DispatchMode.RESTART_ACTIVE):
        if active is None or active.id != dispatch.target_run_id:
            return _new_run(state)  # the target already ended: the message becomes a new run
        if dispatch.expected_attempt_id is not None and dispatch.expected_attempt_id != active.active_attempt_id:
            raise DomainError(
                ErrorCode.EXPECTED_ATTEMPT_MISMATCH,
                "the run has moved on to another attempt; reload it and decide again",
                "dispatch.steerActive.expectedAttemptId",
            )
        if mode == DispatchMode.STEER_ACTIVE and ability.native:
            return AppliedDispatch.STEER_ACTIVE
        if ability.restart:
            return AppliedDispatch.RESTART_ACTIVE
        raise DomainError(ErrorCode.NOT_STEERABLE, "this provider can neither steer nor restart a turn", "dispatch")
    # auto
    if active is None:
        return _new_run(state)
    if ability.native:
        return AppliedDispatch.STEER_ACTIVE
    if ability.restart:
        return AppliedDispatch.RESTART_ACTIVE
    return AppliedDispatch.QUEUE_AFTER_ACTIVE


# ---- what each choice writes ------------------------------------------------------------


def new_run(
    state: ThreadState,
    *,
    applied: AppliedDispatch,
    text: str,
    now: datetime,
    new_id: NewId,
    provider_instance_id: str | None = None,
    model: str | None = None,
    client_message_id: str | None = None,
    message_id: uuid.UUID | None = None,
    supersedes: Run | None = None,
    fresh_context: bool = False,
) -> Outcome:
    """A user message becomes a run: message → run(queued) → root node → initial attempt, started
    now or queued. The run uses the thread's provider instance and model unless given others;
    `message_id` reuses an existing message (a late steer turned into a run)."""
    thread = state.thread
    text = clean_text(text)
    titled = first_message_title(thread, state.last_ordinal, text)
    if titled is not None:
        thread = thread.evolve(title=titled, updated_at=now)
    run_id, node_id, attempt_id = new_id(), new_id(), new_id()
    reused = message_id is not None
    message_id = message_id or new_id()
    starting = applied == AppliedDispatch.START_IMMEDIATELY
    intent = InputIntent.TURN_START if starting else InputIntent.QUEUED_TURN
    message = _message(message_id, thread, run_id, text, intent, client_message_id, now)
    run = Run(
        id=run_id,
        thread_id=thread.id,
        ordinal=state.last_ordinal + 1,
        provider_instance_id=provider_instance_id if provider_instance_id is not None else thread.provider_instance_id,
        model=model if model is not None else thread.model,
        status=RunStatus.QUEUED,
        user_message_id=message_id,
        root_node_id=node_id,
        active_attempt_id=attempt_id,
        queue_position=order_key(state.queue, first=supersedes is not None),
        supersedes_run_id=None if supersedes is None else supersedes.id,
        fresh_context=fresh_context,
        requested_at=now,
    )
    place = Place(thread.id, run_id, attempt_id, node_id)
    root, attempt = open_attempt(place, 1, AttemptReason.INITIAL, thread.active_provider_thread_id, _title(text), now)
    outcome = Outcome(
        [
            Change.updated(message) if reused else Change.created(message),
            Change.created(run),
            Change.created(root),
            Change.created(attempt),
        ],
        result={"runId": str(run_id), "messageId": str(message_id), "appliedDispatch": applied.value},
    )
    if starting:
        start_run(outcome, thread.evolve(queue_held=False, queue_hold_reason=None), run, now, new_id)
    else:
        if titled is not None:
            outcome.changes.append(Change.updated(thread))
        outcome.changes.append(
            activity(
                thread.id,
                ActivityKind.RUN_QUEUED,
                f"run {run.ordinal} queued at position {len(state.queue) + 1}",
                now,
                new_id,
                run_id=run_id,
            )
        )
    return outcome


def open_attempt(
    place: Place,
    ordinal: int,
    reason: AttemptReason,
    provider_thread_id: uuid.UUID | None,
    title: str | None,
    now: datetime,
) -> tuple[ExecutionNode, RunAttempt]:
    """A pending attempt at `place` and its root node: a run's first turn, or a steering restart's."""
    root = open_node(
        place, None, place.root_node_id, NodeKind.ROOT_TURN, NodeStatus.PENDING, now, counts_for_run=True, title=title
    )
    attempt = RunAttempt(
        id=place.attempt_id,
        thread_id=place.thread_id,
        run_id=place.run_id,
        attempt_ordinal=ordinal,
        root_node_id=place.root_node_id,
        provider_thread_id=provider_thread_id,
        reason=reason,
        status=AttemptStatus.PENDING,
        created_at=now,
    )
    return root, attempt


def _title(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:80]


def _message(
    message_id: uuid.UUID,
    thread: AppThread,
    run_id: uuid.UUID,
    text: str,
    intent: InputIntent,
    client_message_id: str | None,
    now: datetime,
) -> ConversationMessage:
    """The user's message, however it enters the run (a new turn, queued, a steer, a restart)."""
    return ConversationMessage(
        id=message_id,
        thread_id=thread.id,
        run_id=run_id,
        role=MessageRole.USER,
        text=clean_text(text),
        input_intent=intent,
        client_message_id=client_message_id,
        created_at=now,
        updated_at=now,
    )


def steer(
    thread: AppThread, run: Run, text: str, client_message_id: str | None, now: datetime, new_id: NewId
) -> Outcome:
    message = _message(new_id(), thread, run.id, text, InputIntent.STEER, client_message_id, now)
    return Outcome(
        [
            Change.created(message),
            run_activity(
                run,
                ActivityKind.RUN_STEERED,
                f"run {run.ordinal} steered",
                now,
                new_id,
                node_id=run.root_node_id,
            ),
        ],
        [SteerTurn(run_id=run.id, attempt_id=run.active_attempt_id, message_id=message.id).envelope()],
        result={
            "runId": str(run.id),
            "messageId": str(message.id),
            "appliedDispatch": AppliedDispatch.STEER_ACTIVE.value,
        },
    )


def restart(
    thread: AppThread,
    run: Run,
    attempt: RunAttempt,
    root: ExecutionNode,
    open_children: Sequence[ExecutionNode],
    original_input: str,
    text: str,
    client_message_id: str | None,
    now: datetime,
    new_id: NewId,
    pending_requests: Sequence[RuntimeRequest] = (),
) -> Outcome:
    """Supersede the active attempt and open a new one under the same run. The superseded turn's
    open requests (approvals, questions) end with it: expired, not resumable."""
    message = _message(new_id(), thread, run.id, text, InputIntent.RESTART, client_message_id, now)
    new_root_id, new_attempt_id = new_id(), new_id()
    place = Place(thread.id, run.id, new_attempt_id, new_root_id)
    new_root, new_attempt = open_attempt(
        place, attempt.attempt_ordinal + 1, AttemptReason.STEERING_RESTART, attempt.provider_thread_id, root.title, now
    )
    changes = [Change.created(message)]
    for request in pending_requests:
        changes += expire(request, None, "the turn was restarted by a steering message", now)
    for child in closable(open_children):  # a delegated task goes on: its node ends when its child does
        changes.append(Change.updated(child.evolve(status=NodeStatus.INTERRUPTED, updated_at=now, completed_at=now)))
    changes += [
        Change.updated(root.evolve(status=NodeStatus.INTERRUPTED, updated_at=now, completed_at=now)),
        Change.updated(
            attempt.evolve(status=AttemptStatus.SUPERSEDED, status_reason="steering_restart", completed_at=now),
        ),
        Change.created(new_root),
        Change.created(new_attempt),
        Change.updated(
            run.evolve(status=RunStatus.PREPARING, active_attempt_id=new_attempt_id, root_node_id=new_root_id),
        ),
        run_activity(
            run,
            ActivityKind.RUN_RESTARTED,
            f"run {run.ordinal} restarted with a steering message",
            now,
            new_id,
            node_id=new_root_id,
        ),
    ]
    text_for_turn = f"{original_input}\n\n{message.text}"
    effects = [
        InterruptTurn(run_id=run.id, attempt_id=attempt.id).envelope(),
        StartTurn(run_id=run.id, attempt_id=new_attempt_id, input=text_for_turn, thread_id=run.thread_id).envelope(),
    ]
    return Outcome(
        changes,
        effects,
        result={
            "runId": str(run.id),
            "messageId": str(message.id),
            "appliedDispatch": AppliedDispatch.RESTART_ACTIVE.value,
        },
    )


# New attempts whose input is every message of the run so far (`store.runs.run_input`): a restart's, a retry's
# after a crash. `retryRun`'s (RETRY) starts from the run's first message alone.
_CARRY_THE_RUN_SO_FAR = frozenset({AttemptReason.STEERING_RESTART, AttemptReason.PROVIDER_RECOVERY})


def steer_carried(steered_attempt_id: uuid.UUID | None, attempts: Sequence[RunAttempt]) -> bool:
    """Whether a steer that never reached the turn of the attempt it steered is in the run's next attempt
    already: the steer was that attempt's while it was active, so the next one opened after the steer's message,
    and a restart or a crash retry gives it every message of the run so far. Such a steer must not also become
    a run of its own (the agent would be asked it twice)."""
    steered = next((a for a in attempts if a.id == steered_attempt_id), None)
    if steered is None:
        return False
    after = [a for a in attempts if a.attempt_ordinal == steered.attempt_ordinal + 1]
    return bool(after) and after[0].reason in _CARRY_THE_RUN_SO_FAR


def steer_leaves_its_run(
    run_status: RunStatus, steered_attempt_id: uuid.UUID | None, attempts: Sequence[RunAttempt]
) -> bool:
    """Whether a steer whose delivery is still pending will leave the run the log files it under: once that run
    has ended, the turn it steered is over, so the message becomes a run of its own (`steer.became_run`), a
    later one, unless the run's next attempt carried it (`steer_carried`). A context built meanwhile (a fork's,
    frozen at `forkThread`) must not count it as said in the ended run: the source would say it again later."""
    return run_status in TERMINAL_RUN_STATUSES and not steer_carried(steered_attempt_id, attempts)


def steer_target(run: Run | None) -> uuid.UUID | None:
    return None if run is None else run.id


def restart_as_new_run(
    state: ThreadState,
    active: Run,
    text: str,
    client_message_id: str | None,
    model: str | None,
    now: datetime,
    new_id: NewId,
) -> Outcome:
    """The alternative representation: the interrupted run stays a counted turn (it ends `interrupted`), and
    the steering message becomes a new run, first in the queue, linked by `supersedesRunId`."""
    outcome = new_run(
        state,
        applied=AppliedDispatch.QUEUE_AFTER_ACTIVE,
        text=text,
        provider_instance_id=active.provider_instance_id,
        model=model,
        client_message_id=client_message_id,
        now=now,
        new_id=new_id,
        supersedes=active,
    )
    outcome.result["appliedDispatch"] = AppliedDispatch.RESTART_ACTIVE.value
    if active.interrupt_requested_at is None:
        outcome.changes.append(Change.updated(active.evolve(interrupt_requested_at=now)))
        outcome.effects.append(InterruptTurn(run_id=active.id, attempt_id=active.active_attempt_id).envelope())
    return outcome

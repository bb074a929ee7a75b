"""Queue rules as tables (docs/lifecycles/steering-and-queue.md "The queue"): enqueue, reorder, cancel, edit,
promote, drain, hold and resume. After every operation the queued runs' order keys strictly increase in
queue order (the place a client sees, 1..n, is counted from them when read); only a reorder rewrites
another run's key. Pure: no database, no server.
"""

from __future__ import annotations

import itertools

import pytest

from tests.support import builders as b
from threadloom.domain import dispatch as dispatch_rules
from threadloom.domain import queue as queue_rules
from threadloom.domain.changes import Outcome
from threadloom.domain.dispatch import AppliedDispatch, new_run
from threadloom.domain.effects import INTERRUPT_EFFECT, START_EFFECT, STEER_EFFECT
from threadloom.domain.entities import AppThread, ConversationMessage, Run, RunAttempt
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.interruption import hold
from threadloom.domain.queue import drain_queue, resume_queue
from threadloom.domain.statuses import AttemptStatus, InputIntent, NodeStatus, RunStatus


def _places(queue: list[Run]) -> list[int]:
    """The places `Run.queuePosition` shows (1..n in key order), once the keys are checked to order the queue."""
    keys = [r.queue_position for r in queue]
    assert None not in keys and keys == sorted(set(keys), key=lambda k: k or 0), keys
    return list(range(1, len(queue) + 1))


def _runs_written(outcome: Outcome) -> set[object]:
    return {c.entity.id for c in outcome.changes if c.event_type == "run.updated"}


def _ordinals(queue: list[Run]) -> list[int]:
    return [r.ordinal for r in queue]


def _code(error: pytest.ExceptionInfo[DomainError]) -> tuple[ErrorCode, str | None]:
    return error.value.code, error.value.field


# ---- enqueue ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("waiting", [0, 1, 3])
def test_a_queued_message_goes_last(waiting: int) -> None:
    thread = b.thread()
    active = b.run(thread, 1, RunStatus.RUNNING)
    queued = b.queue(thread, waiting)
    state = b.state(thread, active=active, queued=queued)
    outcome = new_run(
        state,
        applied=AppliedDispatch.QUEUE_AFTER_ACTIVE,
        text="next",
        provider_instance_id="scripted",
        model=None,
        client_message_id="c1",
        now=b.NOW,
        new_id=b.Ids(),
    )
    after = b.apply_to_queue(queued, outcome)
    assert _places(after) == list(range(1, waiting + 2))
    assert _ordinals(after) == [*_ordinals(queued), waiting + 2]  # the new run's ordinal follows the last
    assert b.event_types(outcome) == [
        "message.created",
        "run.created",
        "node.created",
        "attempt.created",
        "activity:run.queued",
    ]
    message = next(iter(b.latest(outcome.changes, ConversationMessage).values()))
    assert message.input_intent == InputIntent.QUEUED_TURN and outcome.effects == []


def test_a_started_message_becomes_the_active_run_and_releases_an_empty_held_queue() -> None:
    thread = b.thread(queue_held=True, queue_hold_reason="run 1 failed")
    outcome = new_run(
        b.state(thread),
        applied=AppliedDispatch.START_IMMEDIATELY,
        text="go",
        provider_instance_id="scripted",
        model="m",
        client_message_id=None,
        now=b.NOW,
        new_id=b.Ids(),
    )
    run = next(iter(b.latest(outcome.changes, Run).values()))
    after = b.latest(outcome.changes, AppThread)[thread.id]
    assert run.status == RunStatus.PREPARING and run.queue_position is None and run.model == "m"
    assert after.active_run_id == run.id and not after.queue_held and after.queue_hold_reason is None
    assert [e.kind for e in outcome.effects] == [START_EFFECT]


@pytest.mark.parametrize("waiting", [0, 2])
def test_a_restart_as_a_new_run_goes_first(waiting: int) -> None:
    """The steering message of a `restart_as = "new_run"` instance is queued first; the others move down."""
    thread = b.thread()
    active = b.run(thread, 1, RunStatus.RUNNING)
    queued = b.queue(thread, waiting)
    outcome = dispatch_rules.restart_as_new_run(
        b.state(thread, active=active, queued=queued), active, "change course", None, None, b.NOW, b.Ids()
    )
    after = b.apply_to_queue(queued, outcome)
    assert _places(after) == list(range(1, waiting + 2)) and _runs_written(outcome) <= {active.id}
    assert after[0].supersedes_run_id == active.id and _ordinals(after[1:]) == _ordinals(queued)
    assert outcome.result["appliedDispatch"] == AppliedDispatch.RESTART_ACTIVE.value
    assert [e.kind for e in outcome.effects] == [INTERRUPT_EFFECT]
    again = dispatch_rules.restart_as_new_run(
        b.state(thread, active=active.evolve(interrupt_requested_at=b.NOW), queued=queued),
        active.evolve(interrupt_requested_at=b.NOW),
        "and again",
        None,
        None,
        b.NOW,
        b.Ids(),
    )
    assert again.effects == []  # the interrupt was asked for already


# ---- reorder ---------------------------------------------------------------------------------------------

SIZE = 4


@pytest.mark.parametrize(
    ("index", "position"),
    [pytest.param(i, p, id=f"run{i + 1}-to-{p}") for i, p in itertools.product(range(SIZE), range(1, SIZE + 1))],
)
def test_reorder_moves_one_run_and_keeps_positions_places(index: int, position: int) -> None:
    thread = b.thread()
    queued = b.queue(thread, SIZE)
    moved = queued[index]
    outcome = queue_rules.reorder(thread, queued, moved, position, b.NOW, b.Ids())
    after = b.apply_to_queue(queued, outcome)
    expected = [r for r in queued if r.id != moved.id]
    expected.insert(position - 1, moved)
    assert _ordinals(after) == _ordinals(expected) and _places(after) == list(range(1, SIZE + 1))
    written = [c.entity.id for c in outcome.changes if c.event_type == "run.updated"]
    assert len(written) == sum(1 for i, r in enumerate(expected, 1) if r.queue_position != i)  # only what moved
    assert b.event_types(outcome)[-1] == "activity:queue.reordered"


@pytest.mark.parametrize("position", [0, -1, SIZE + 1, 100])
def test_reorder_outside_the_queue_is_refused(position: int) -> None:
    thread = b.thread()
    queued = b.queue(thread, SIZE)
    with pytest.raises(DomainError) as error:
        queue_rules.reorder(thread, queued, queued[0], position, b.NOW, b.Ids())
    assert _code(error) == (ErrorCode.INVALID_INPUT, "position")


# ---- cancel ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("index", range(SIZE), ids=[f"run{i + 1}" for i in range(SIZE)])
def test_cancel_closes_the_run_and_the_rest_move_up(index: int) -> None:
    thread = b.thread()
    queued = b.queue(thread, SIZE)
    run = queued[index]
    attempt = b.attempt_of(run, AttemptStatus.PENDING)
    root = b.root_of(run, NodeStatus.PENDING)
    outcome = queue_rules.cancel(thread, queued, run, attempt, root, b.NOW, b.Ids())
    after = b.apply_to_queue(queued, outcome)
    assert _ordinals(after) == _ordinals([r for r in queued if r.id != run.id])
    assert _places(after) == list(range(1, SIZE)) and _runs_written(outcome) == {run.id}  # the rest keep their keys
    cancelled = b.latest(outcome.changes, Run)[run.id]
    assert (cancelled.status, cancelled.status_reason, cancelled.queue_position, cancelled.completed_at) == (
        RunStatus.CANCELLED,
        "cancelled by the user",
        None,
        b.NOW,
    )
    assert b.latest(outcome.changes, RunAttempt)[attempt.id].status == AttemptStatus.CANCELLED
    assert b.latest(outcome.changes, type(root))[root.id].status == NodeStatus.CANCELLED
    assert b.event_types(outcome)[-1] == "activity:run.cancelled"


# ---- edit ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        pytest.param("better words", None, id="replaced"),
        pytest.param("   ", (ErrorCode.INVALID_INPUT, "text"), id="blank"),
        pytest.param("x" * 200_001, (ErrorCode.INVALID_INPUT, "text"), id="too-long"),
    ],
)
def test_editing_a_queued_message_replaces_its_text_or_refuses(
    text: str, expected: tuple[ErrorCode, str] | None
) -> None:
    thread = b.thread()
    run = b.queue(thread, 1)[0]
    message = b.message_of(run, "first words")
    if expected is not None:
        with pytest.raises(DomainError) as error:
            queue_rules.edit(thread, run, message, text, b.NOW, b.Ids())
        assert _code(error) == expected
        return
    outcome = queue_rules.edit(thread, run, message, text, b.NOW, b.Ids())
    assert b.latest(outcome.changes, ConversationMessage)[message.id].text == text
    assert b.event_types(outcome) == ["message.updated", "activity:queue.edited"]


# ---- only queued runs are managed --------------------------------------------------------------------------

NOT_QUEUED = [s for s in RunStatus if s != RunStatus.QUEUED]


@pytest.mark.parametrize("status", NOT_QUEUED)
@pytest.mark.parametrize("operation", ["cancel", "reorder", "edit"])
def test_only_queued_runs_are_managed(status: RunStatus, operation: str) -> None:
    thread = b.thread()
    queued = b.queue(thread, 2)
    run = b.run(thread, 9, status)
    calls = {
        "cancel": lambda: queue_rules.cancel(thread, queued, run, b.attempt_of(run), b.root_of(run), b.NOW, b.Ids()),
        "reorder": lambda: queue_rules.reorder(thread, queued, run, 1, b.NOW, b.Ids()),
        "edit": lambda: queue_rules.edit(thread, run, b.message_of(run), "text", b.NOW, b.Ids()),
    }
    with pytest.raises(DomainError) as error:
        calls[operation]()
    assert _code(error) == (ErrorCode.RUN_NOT_QUEUED, "runId")


# ---- promote to a steer (the engine composes queue.cancel with steering.steer / steering.restart) ---------


@pytest.mark.parametrize("native", [True, False], ids=["steer-in-place", "restart"])
def test_promote_cancels_the_queued_run_and_steers_the_active_one(native: bool) -> None:
    thread = b.thread()
    active = b.run(thread, 1, RunStatus.RUNNING)
    queued = b.queue(thread, 3)
    promoted = queued[1]
    thread = thread.evolve(active_run_id=active.id)
    cancelled = queue_rules.cancel(
        thread,
        queued,
        promoted,
        b.attempt_of(promoted, AttemptStatus.PENDING),
        b.root_of(promoted, NodeStatus.PENDING),
        b.NOW,
        b.Ids(),
        reason="promoted to a steer of the active run",
    )
    if native:
        steered = dispatch_rules.steer(thread, active, "do this instead", None, b.NOW, b.Ids())
    else:
        steered = dispatch_rules.restart(
            thread,
            active,
            b.attempt_of(active),
            b.root_of(active),
            [],
            "first",
            "do this instead",
            None,
            b.NOW,
            b.Ids(),
        )
    outcome = Outcome([*cancelled.changes, *steered.changes], steered.effects)
    after = b.apply_to_queue(queued, outcome)
    assert _ordinals(after) == [queued[0].ordinal, queued[2].ordinal] and _places(after) == [1, 2]
    assert b.latest(outcome.changes, Run)[promoted.id].status_reason == "promoted to a steer of the active run"
    kinds = [e.kind for e in outcome.effects]
    assert kinds == ([STEER_EFFECT] if native else [INTERRUPT_EFFECT, START_EFFECT])


# ---- drain, hold, resume -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("held", "active", "waiting", "starts"),
    [
        pytest.param(False, False, 3, True, id="free-idle-starts-first"),
        pytest.param(False, False, 0, False, id="free-idle-empty"),
        pytest.param(False, True, 3, False, id="free-busy-waits"),
        pytest.param(True, False, 3, False, id="held-idle-waits"),
        pytest.param(True, True, 3, False, id="held-busy-waits"),
    ],
)
def test_drain_starts_the_first_queued_run_only_when_free(held: bool, active: bool, waiting: int, starts: bool) -> None:
    thread = b.thread(queue_held=held, active_run_id=b.uid() if active else None)
    queued = b.queue(thread, waiting)
    outcome = drain_queue(thread, queued, b.NOW, b.Ids())
    after = b.apply_to_queue(queued, outcome)
    if not starts:
        assert (outcome.changes, outcome.effects) == ([], [])
        return
    first = b.latest(outcome.changes, Run)[queued[0].id]
    assert first.status == RunStatus.PREPARING and first.queue_position is None
    assert b.latest(outcome.changes, AppThread)[thread.id].active_run_id == first.id
    assert _ordinals(after) == _ordinals(queued[1:]) and _places(after) == list(range(1, waiting))
    assert _runs_written(outcome) == {first.id}  # the others move up without an event each
    assert [(e.kind, e.payload["runId"]) for e in outcome.effects] == [(START_EFFECT, str(first.id))]


@pytest.mark.parametrize(
    ("held", "active", "waiting", "expected"),
    [
        pytest.param(True, False, 2, "starts", id="held-idle-starts-first"),
        pytest.param(True, False, 0, "released", id="held-idle-empty"),
        pytest.param(True, True, 2, "released", id="held-busy-released-only"),
        pytest.param(False, False, 2, ErrorCode.QUEUE_NOT_HELD, id="not-held"),
    ],
)
def test_resume_releases_a_held_queue_and_starts_its_first_run(
    held: bool, active: bool, waiting: int, expected: str | ErrorCode
) -> None:
    thread = b.thread(queue_held=held, queue_hold_reason="stopped by the user" if held else None)
    running = b.run(thread, 1, RunStatus.RUNNING) if active else None
    queued = b.queue(thread, waiting)
    state = b.state(thread, active=running, queued=queued)
    if isinstance(expected, ErrorCode):
        with pytest.raises(DomainError) as error:
            resume_queue(state, b.NOW, b.Ids())
        assert _code(error) == (expected, "threadId")
        return
    outcome = resume_queue(state, b.NOW, b.Ids())
    released = b.latest(outcome.changes, AppThread)[thread.id]
    assert not released.queue_held and released.queue_hold_reason is None
    assert b.event_types(outcome)[:2] == ["thread.updated", "activity:queue.resumed"]
    assert [e.kind for e in outcome.effects] == ([START_EFFECT] if expected == "starts" else [])
    assert _places(b.apply_to_queue(queued, outcome)) == list(range(1, waiting + (0 if expected == "starts" else 1)))


def test_a_held_queue_survives_until_resumed() -> None:
    """Hold → nothing drains → resume → the first run starts."""
    thread = b.thread()
    queued = b.queue(thread, 2)
    held = b.latest(hold(thread, b.NOW, b.Ids()), AppThread)[thread.id]
    assert held.queue_held
    assert drain_queue(held, queued, b.NOW, b.Ids()).effects == []
    resumed = resume_queue(b.state(held, queued=queued), b.LATER, b.Ids())
    assert [e.payload["runId"] for e in resumed.effects] == [str(queued[0].id)]

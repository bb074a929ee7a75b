"""The completion barrier, `runs.finish_run`, as tables (docs/lifecycles/threads-and-runs.md and
steering-and-queue.md "When the queue is held"): the ordered steps, the status each part of the run ends in,
and whether the queue drains or is held. A failed run always holds the queue, a crash too. Pure: no database.
"""

from __future__ import annotations

import pytest

from tests.support import builders as b
from threadloom.domain.effects import DELIVER_EFFECT, START_EFFECT
from threadloom.domain.entities import (
    AppThread,
    ConversationMessage,
    ExecutionNode,
    PlanArtifact,
    ProviderThread,
    ProviderTurn,
    Run,
    RunAttempt,
    RuntimeRequest,
)
from threadloom.domain.runs import RunGraph, finalize_plan, finish_run
from threadloom.domain.statuses import (
    AttemptStatus,
    LineageRelationship,
    NodeStatus,
    PlanStatus,
    ProviderThreadStatus,
    ProviderTurnStatus,
    ResponseCapability,
    RunStatus,
    RuntimeRequestStatus,
)

# run status → (root node, open child nodes, attempt, provider turn)
ENDS = [
    (
        RunStatus.COMPLETED,
        NodeStatus.COMPLETED,
        NodeStatus.COMPLETED,
        AttemptStatus.COMPLETED,
        ProviderTurnStatus.COMPLETED,
    ),
    (
        RunStatus.INTERRUPTED,
        NodeStatus.INTERRUPTED,
        NodeStatus.INTERRUPTED,
        AttemptStatus.INTERRUPTED,
        ProviderTurnStatus.INTERRUPTED,
    ),
    (RunStatus.FAILED, NodeStatus.FAILED, NodeStatus.CANCELLED, AttemptStatus.FAILED, ProviderTurnStatus.FAILED),
    (
        RunStatus.CANCELLED,
        NodeStatus.CANCELLED,
        NodeStatus.CANCELLED,
        AttemptStatus.CANCELLED,
        ProviderTurnStatus.FAILED,
    ),
]

# The documented order: requests end with the turn → streaming messages closed → plans finalized → open child
# nodes closed → checkpoint step → root node, attempt, turn, provider thread → run → thread → drain or hold.
ORDER = [
    "request.updated",
    "message.updated",
    "message.updated",
    "plan.updated",
    "node.updated",
    "node.updated",
    "activity:checkpoint.skipped",
    "node.updated",
    "attempt.updated",
    "provider_turn.updated",
    "provider_thread.updated",
    "run.updated",
]
# Then, when the queue is free: the thread lets the run go, the second queued run moves up to position 1, the
# first becomes PREPARING and the thread's active run.
DRAINS = ["thread.updated", "run.updated", "thread.updated", "activity:run.preparing"]  # the others keep their keys


def _graph(status: RunStatus = RunStatus.RUNNING, *, queued: int = 2, **kw: object) -> RunGraph:
    thread = b.thread(**kw)
    run = b.run(thread, 1, status)
    plans = [b.todo_of(run, [{"text": "a", "status": "completed"}, {"text": "b", "status": "in_progress"}])]
    return b.graph(thread, run, queued=b.queue(thread, queued), children=2, streaming=2, plans=plans, requests=1)


@pytest.mark.parametrize(
    ("status", "root", "child", "attempt", "turn"), [pytest.param(*row, id=str(row[0])) for row in ENDS]
)
def test_every_part_of_the_run_ends(
    status: RunStatus,
    root: NodeStatus,
    child: NodeStatus,
    attempt: AttemptStatus,
    turn: ProviderTurnStatus,
) -> None:
    g = _graph()
    outcome = finish_run(g, status, "why", b.NOW, b.Ids())
    nodes = b.latest(outcome.changes, ExecutionNode)
    assert nodes[g.root.id].status == root and nodes[g.root.id].completed_at == b.NOW
    assert [nodes[c.id].status for c in g.open_children] == [child, child]
    ended = b.latest(outcome.changes, RunAttempt)[g.attempt.id]
    assert (ended.status, ended.status_reason, ended.completed_at) == (attempt, "why", b.NOW)
    assert g.turn is not None and b.latest(outcome.changes, ProviderTurn)[g.turn.id].status == turn
    run = b.latest(outcome.changes, Run)[g.run.id]
    assert (run.status, run.status_reason, run.completed_at) == (status, "why", b.NOW)
    assert all(not m.streaming for m in b.latest(outcome.changes, ConversationMessage).values())
    assert len(b.latest(outcome.changes, ConversationMessage)) == 2
    request = b.latest(outcome.changes, RuntimeRequest)[g.pending_requests[0].id]
    assert (request.status, request.response_capability) == (
        RuntimeRequestStatus.EXPIRED,
        ResponseCapability.NOT_RESUMABLE,
    )
    assert b.latest(outcome.changes, PlanArtifact)[g.active_plans[0].id].status == PlanStatus.FINALIZED


@pytest.mark.parametrize(
    ("status", "hold_reason", "after_run"),
    [
        pytest.param(
            RunStatus.COMPLETED,
            None,
            ["activity:run.completed", *DRAINS],
            id="completed-drains",
        ),
        pytest.param(
            RunStatus.INTERRUPTED,
            None,
            ["activity:run.interrupted", *DRAINS],
            id="interrupted-drains",
        ),
        pytest.param(
            RunStatus.INTERRUPTED,
            "stopped by the user",
            ["activity:run.interrupted", "activity:queue.held", "thread.updated"],
            id="stopped-holds",
        ),
        pytest.param(
            RunStatus.FAILED,
            None,
            ["activity:run.failed", "activity:queue.held", "thread.updated"],
            id="failed-holds",
        ),
    ],
)
def test_the_steps_come_in_the_documented_order(
    status: RunStatus, hold_reason: str | None, after_run: list[str]
) -> None:
    outcome = finish_run(_graph(), status, None, b.NOW, b.Ids(), hold_reason=hold_reason)
    assert b.event_types(outcome) == ORDER + after_run


# Whatever failed the run, the queue is held with a reason that says why; nothing queued starts.
@pytest.mark.parametrize(
    ("reason", "hold"),
    [
        pytest.param("provider_crashed", "run 1 failed: the agent process exited", id="crash"),
        pytest.param("provider_lost", "run 1 failed: the server that held the turn is gone", id="lost"),
        pytest.param("server_stopped", "run 1 failed: the server stopped during the turn", id="server-stopped"),
        pytest.param("the model refused", "run 1 failed: the model refused", id="agent-error"),
        pytest.param(None, "run 1 failed: no reason given", id="no-reason"),
    ],
)
@pytest.mark.parametrize("queued", [0, 2], ids=["empty-queue", "two-queued"])
def test_a_failed_run_always_holds_the_queue(reason: str | None, hold: str, queued: int) -> None:
    g = _graph(queued=queued)
    outcome = finish_run(g, RunStatus.FAILED, reason, b.NOW, b.Ids())
    thread = b.latest(outcome.changes, AppThread)[g.thread.id]
    assert (thread.queue_held, thread.queue_hold_reason, thread.active_run_id) == (True, hold, None)
    assert [e.kind for e in outcome.effects] == []
    assert b.apply_to_queue(g.queue, outcome) == list(g.queue)  # untouched


@pytest.mark.parametrize(
    ("status", "hold_reason", "already_held", "starts"),
    [
        pytest.param(RunStatus.COMPLETED, None, False, True, id="completed"),
        pytest.param(RunStatus.INTERRUPTED, None, False, True, id="interrupted"),
        pytest.param(RunStatus.CANCELLED, None, False, True, id="cancelled"),
        pytest.param(RunStatus.INTERRUPTED, "stopped by the user", False, False, id="stopped"),
        pytest.param(RunStatus.FAILED, None, False, False, id="failed"),
        pytest.param(RunStatus.COMPLETED, None, True, False, id="completed-while-held"),
    ],
)
def test_the_queue_drains_or_is_held(
    status: RunStatus, hold_reason: str | None, already_held: bool, starts: bool
) -> None:
    g = _graph(queued=3, queue_held=already_held, queue_hold_reason="held before" if already_held else None)
    outcome = finish_run(g, status, None, b.NOW, b.Ids(), hold_reason=hold_reason)
    thread = b.latest(outcome.changes, AppThread)[g.thread.id]
    remaining = b.apply_to_queue(g.queue, outcome)
    if starts:
        assert thread.active_run_id == g.queue[0].id and not thread.queue_held
        assert [(e.kind, e.payload["runId"]) for e in outcome.effects] == [(START_EFFECT, str(g.queue[0].id))]
        assert [r.id for r in remaining] == [r.id for r in g.queue[1:]]
        assert remaining == list(g.queue[1:])  # the others keep their order keys: no event each
    else:
        assert thread.active_run_id is None and thread.queue_held
        assert outcome.effects == [] and remaining == list(g.queue)


@pytest.mark.parametrize(
    ("reason", "status"),
    [
        pytest.param("provider_crashed", ProviderThreadStatus.NOT_LOADED, id="crash-unloads"),
        pytest.param("provider_lost", ProviderThreadStatus.IDLE, id="lost"),
        pytest.param(None, ProviderThreadStatus.IDLE, id="completed"),
    ],
)
def test_the_provider_thread_after_the_turn(reason: str | None, status: ProviderThreadStatus) -> None:
    g = _graph()
    end = RunStatus.COMPLETED if reason is None else RunStatus.FAILED
    outcome = finish_run(g, end, reason, b.NOW, b.Ids())
    assert g.provider_thread is not None
    pt = b.latest(outcome.changes, ProviderThread)[g.provider_thread.id]
    assert (pt.status, pt.first_run_ordinal, pt.last_run_ordinal) == (status, 1, 1)


@pytest.mark.parametrize(
    ("reason", "why"),
    [
        ("provider_crashed", "the agent process exited"),
        ("provider_lost", "the server that held the turn is gone"),
        ("server_stopped", "the server stopped during the turn"),
        (None, "the turn ended"),
    ],
)
def test_pending_requests_expire_with_the_turn(reason: str | None, why: str) -> None:
    g = _graph()
    outcome = finish_run(g, RunStatus.FAILED if reason else RunStatus.COMPLETED, reason, b.NOW, b.Ids())
    request = b.latest(outcome.changes, RuntimeRequest)[g.pending_requests[0].id]
    assert (request.not_resumable_reason, request.resolved_at) == (why, b.NOW)


def test_a_run_without_a_recorded_turn_ends_without_one() -> None:
    """Interrupted before the provider got the turn: no provider turn to close."""
    thread = b.thread()
    run = b.run(thread, 1, RunStatus.PREPARING)
    outcome = finish_run(b.graph(thread, run, turn=False), RunStatus.INTERRUPTED, "early", b.NOW, b.Ids())
    assert "provider_turn.updated" not in b.event_types(outcome)
    assert b.latest(outcome.changes, Run)[run.id].status == RunStatus.INTERRUPTED


@pytest.mark.parametrize(
    ("lineage", "delivers"),
    [(LineageRelationship.SUBAGENT, True), (None, False)],
    ids=["subagent-delivers", "top-level"],
)
def test_a_delegated_task_reports_to_its_parent(lineage: LineageRelationship | None, delivers: bool) -> None:
    parent = b.uid()
    g = _graph(queued=0, parent_thread_id=parent if lineage else None, lineage_relationship=lineage)
    outcome = finish_run(g, RunStatus.COMPLETED, None, b.NOW, b.Ids())
    expected = (
        [(DELIVER_EFFECT, {"parentThreadId": str(parent), "childThreadId": str(g.thread.id), "runId": str(g.run.id)})]
        if delivers
        else []
    )
    assert [(e.kind, e.payload) for e in outcome.effects] == expected


@pytest.mark.parametrize(
    ("status", "items"),
    [
        (RunStatus.COMPLETED, ["completed", "completed", "completed"]),
        (RunStatus.INTERRUPTED, ["completed", "interrupted", "interrupted"]),
        (RunStatus.FAILED, ["completed", "failed", "failed"]),
    ],
)
def test_a_todo_list_ends_with_its_run(status: RunStatus, items: list[str]) -> None:
    run = b.run(b.thread(), 1, RunStatus.RUNNING)
    todo = b.todo_of(
        run,
        [
            {"text": "a", "status": "completed"},
            {"text": "b", "status": "in_progress"},
            {"text": "c", "status": "pending"},
        ],
    )
    final = finalize_plan(todo, status, b.NOW)
    assert [i["status"] for i in final.items] == items and final.status == PlanStatus.FINALIZED

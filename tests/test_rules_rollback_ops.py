"""The rules of a rollback as a durable operation (domain/rollback_ops.py): what a client may do meanwhile,
what a process that finds an abandoned operation does, and the plan's record surviving a round trip."""

from __future__ import annotations

import uuid

import pytest

from tests.support import builders as b
from threadloom.domain import rollback_ops as ops
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.rollback import ProviderThreadRollback, RollbackPlan, Strategy

ME, OTHER, GONE = (uuid.UUID(int=n) for n in (1, 2, 3))


@pytest.mark.parametrize(
    ("command", "refused"),
    [
        ("sendMessage", True),
        ("rollbackToRun", True),
        ("undoRollback", True),
        ("switchProvider", True),
        ("resumeQueue", True),
        ("forkThread", True),
        ("renameThread", False),
        ("stopThread", False),
        ("archiveThread", False),
    ],
)
def test_a_thread_rolling_back_refuses_what_could_interfere(command: str, refused: bool) -> None:
    rolling = b.thread().evolve(rollback_operation_id=uuid.uuid4())
    if refused:
        with pytest.raises(DomainError) as error:
            ops.refuse_while_rolling_back(rolling, command)
        assert (error.value.code, error.value.field) == (ErrorCode.THREAD_ROLLING_BACK, "threadId")
    else:
        ops.refuse_while_rolling_back(rolling, command)
    ops.refuse_while_rolling_back(b.thread(), command)  # the twin: not rolling back, nothing is refused


def _step(status: str, strategy: Strategy, undo: str | None = None) -> dict[str, object]:
    return {"status": status, "strategy": strategy.value, "undoNativeRef": undo}


@pytest.mark.parametrize(
    ("steps", "action"),
    [
        ([], ops.Resume.ROLL_FORWARD),  # nothing of the provider's: every step runs again
        ([_step("pending", Strategy.NATIVE_ROLLBACK, "undo-1")], ops.Resume.ROLL_FORWARD),
        ([_step("done", Strategy.NATIVE_ROLLBACK, "undo-1")], ops.Resume.ROLL_FORWARD),
        ([_step("running", Strategy.NATIVE_FORK)], ops.Resume.ROLL_FORWARD),  # a second fork; the first is unused
        ([_step("running", Strategy.REPLACE)], ops.Resume.ROLL_FORWARD),
        # in doubt, with an undo fork: taken back, the undo fork holds the conversation as it was
        ([_step("running", Strategy.NATIVE_ROLLBACK, "undo-1")], ops.Resume.COMPENSATE),
        # in doubt, no undo fork (it runs last, after the files): carried on, a repeat that fails is reported
        ([_step("running", Strategy.NATIVE_ROLLBACK)], ops.Resume.ROLL_FORWARD),
    ],
)
def test_what_a_process_does_with_an_abandoned_rollback(steps: list[dict[str, object]], action: ops.Resume) -> None:
    assert ops.resume_action(steps) == action


def test_abandoned_means_its_process_is_gone() -> None:
    records = [{"workerId": str(ME)}, {"workerId": str(OTHER)}, {"workerId": str(GONE)}, {"workerId": None}]
    found = ops.abandoned(records, alive={OTHER}, me=ME)
    assert found == [{"workerId": str(GONE)}, {"workerId": None}]


@pytest.mark.parametrize(
    ("files", "touched"),
    [("pending", False), ("skipped", False), ("running", True), ("done", True), ("failed", True)],
)
def test_the_files_are_put_back_only_once_their_restore_may_have_started(files: str, touched: bool) -> None:
    assert ops.files_touched({"capture": "done", "files": files}) is touched


def test_the_plan_is_recorded_and_read_back_unchanged() -> None:
    plan = RollbackPlan(
        2,
        (3, 4),
        (
            ProviderThreadRollback(uuid.uuid4(), Strategy.NATIVE_ROLLBACK, (3, 4), before_turn_ref="t3", turn_count=2),
            ProviderThreadRollback(uuid.uuid4(), Strategy.NATIVE_FORK, (5,), fork_at_turn_ref="t2"),
        ),
        (uuid.uuid4(), uuid.uuid4()),
        uuid.uuid4(),
    )
    assert ops.plan_from(ops.plan_record(plan)) == plan
    bare = RollbackPlan(0, (), (), (), None)
    assert ops.plan_from(ops.plan_record(bare)) == bare

"""The fork rules as tables (domain/forks.py): stable points, native or portable, the fork's lineage. Pure."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest

from tests.support import builders as b
from threadloom.domain import forks
from threadloom.domain.entities import Activity, AppThread, Checkpoint, ContextTransfer
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import CheckpointStatus, LineageRelationship, RunStatus, TransferStatus, TransferType

NOW = datetime(2026, 12, 1, tzinfo=UTC)
OWNER = b.thread()


def checkpoint(status: CheckpointStatus) -> Checkpoint:
    return Checkpoint(id=b.uid(), thread_id=OWNER.id, scope_id=b.uid(), ordinal=1, status=status, created_at=NOW)


READY, MISSING = CheckpointStatus.READY, CheckpointStatus.MISSING


@pytest.mark.parametrize(
    ("status", "files", "stable"),
    [
        (RunStatus.COMPLETED, None, True),
        (RunStatus.COMPLETED, MISSING, True),
        (RunStatus.INTERRUPTED, READY, True),
        (RunStatus.FAILED, READY, True),
        (RunStatus.INTERRUPTED, None, False),
        (RunStatus.FAILED, MISSING, False),
        (RunStatus.QUEUED, None, False),
        (RunStatus.PREPARING, None, False),
        (RunStatus.RUNNING, READY, False),
        (RunStatus.WAITING, None, False),
        (RunStatus.CANCELLED, READY, False),
        (RunStatus.ROLLED_BACK, READY, False),
    ],
)
def test_which_runs_are_stable_fork_points(status: RunStatus, files: CheckpointStatus | None, stable: bool) -> None:
    run = b.run(OWNER, 1, status)
    found = None if files is None else checkpoint(files)
    assert forks.is_stable(run, found) is stable
    if stable:
        forks.require_stable(run, found, None, "source.run")
    else:
        with pytest.raises(DomainError) as refused:
            forks.require_stable(run, found, b.run(OWNER, 7, RunStatus.COMPLETED), "source.run")
        assert refused.value.code == ErrorCode.UNSTABLE_FORK_POINT and refused.value.field == "source.run"
        assert refused.value.message.endswith("the latest stable point is run 7")


def test_the_hint_is_the_newest_stable_run() -> None:
    runs = [
        (b.run(OWNER, 1, RunStatus.COMPLETED), None),
        (b.run(OWNER, 2, RunStatus.FAILED), checkpoint(READY)),
        (b.run(OWNER, 3, RunStatus.FAILED), None),
        (b.run(OWNER, 4, RunStatus.RUNNING), None),
    ]
    hint = forks.latest_stable(runs)
    assert hint is not None and hint.ordinal == 2
    assert forks.latest_stable([(b.run(OWNER, 1, RunStatus.RUNNING), None)]) is None
    assert forks.unstable("x", None, "f").message.endswith("the thread has no stable run yet")


POINT = forks.ForkPoint(
    source_thread_id=OWNER.id,
    run_ordinal=2,
    run_id=b.uid(),
    provider_thread_id=b.uid(),
    provider_instance_id="codex",
    native_thread_ref="thr-1",
    native_turn_ref="turn-2",
    checkpoint_id=b.uid(),
)
N, P = forks.Resolution.NATIVE, forks.Resolution.PORTABLE


@pytest.mark.parametrize(
    ("point", "instance", "can_fork", "from_turn", "expected"),
    [
        (POINT, "codex", True, True, N),
        (POINT, "claude", True, True, P),  # another provider: the log is the only common ground
        (POINT, "codex", False, False, P),
        (POINT, "codex", True, False, P),  # can fork, but only a whole thread: the point is a turn
        # no turn: a whole-thread fork would copy what the source did after the point (not frozen)
        (dataclasses.replace(POINT, native_turn_ref=None), "codex", True, False, P),
        (dataclasses.replace(POINT, native_thread_ref=None), "codex", True, True, P),  # never reached the provider
    ],
)
def test_fork_point_resolves_native_or_portable(
    point: forks.ForkPoint, instance: str, can_fork: bool, from_turn: bool, expected: forks.Resolution
) -> None:
    assert forks.resolve(point, OWNER, instance, can_fork, from_turn) == expected
    if expected == N:  # a fork working in another folder than the source cannot take the provider's thread
        elsewhere = OWNER.evolve(workspace_path=".threadloom/forks/x")
        assert forks.resolve(point, elsewhere, instance, can_fork, from_turn) == P


def test_the_point_survives_its_json() -> None:
    assert forks.ForkPoint.from_json(POINT.to_json()) == POINT
    empty = forks.ForkPoint(source_thread_id=OWNER.id, run_ordinal=0)
    assert forks.ForkPoint.from_json(empty.to_json()) == empty


def test_a_fork_records_lineage_and_a_pending_transfer_only() -> None:
    root_id = uuid.uuid4()
    source = dataclasses.replace(OWNER, root_thread_id=root_id, title="Main")
    fork, changes = forks.create_fork(source, POINT, None, NOW, uuid.uuid4)
    assert [type(c.entity) for c in changes] == [AppThread, ContextTransfer, Activity]
    transfer, said = changes[1].entity, changes[2].entity
    assert isinstance(transfer, ContextTransfer) and isinstance(said, Activity)
    assert (said.thread_id, said.kind, said.run_id) == (fork.id, "lineage.forked", POINT.run_id)
    assert fork.title == "Fork of Main" and fork.project_id == source.project_id
    assert (fork.parent_thread_id, fork.root_thread_id) == (source.id, root_id)
    assert fork.lineage_relationship == LineageRelationship.FORK and fork.forked_from_transfer_id == transfer.id
    assert fork.active_provider_thread_id is None
    assert (transfer.type, transfer.status) == (TransferType.FORK, TransferStatus.PENDING)
    assert (transfer.source_thread_id, transfer.thread_id) == (source.id, fork.id)
    assert transfer.source_point == POINT.to_json()
    top, _ = forks.create_fork(OWNER, POINT, "  named  ", NOW, uuid.uuid4)
    assert top.root_thread_id == OWNER.id and top.title == "named"


def test_resolution_and_the_message_with_a_handoff() -> None:
    _, changes = forks.create_fork(OWNER, POINT, None, NOW, uuid.uuid4)
    transfer = changes[1].entity
    assert isinstance(transfer, ContextTransfer)
    run_id = uuid.uuid4()
    native = forks.resolved(transfer, N, run_id, NOW).entity
    portable = forks.resolved(transfer, P, run_id, NOW).entity
    assert isinstance(native, ContextTransfer) and isinstance(portable, ContextTransfer)
    assert (native.status, native.resolution_fidelity, native.target_run_id) == (
        TransferStatus.RESOLVED_NATIVE,
        "exact",
        run_id,
    )
    assert (portable.status, portable.resolution_fidelity) == (TransferStatus.RESOLVED_PORTABLE, "summary")
    assert forks.with_handoff("# context\n", "hello") == "# context\n\nhello"


def _fork_and_transfer() -> tuple[AppThread, ContextTransfer]:
    fork, changes = forks.create_fork(OWNER, POINT, None, NOW, uuid.uuid4)
    transfer = changes[1].entity
    assert isinstance(transfer, ContextTransfer)
    return fork, transfer


def test_merge_back_covers_the_forks_runs_since_its_last_merge() -> None:
    fork, transfer = _fork_and_transfer()
    latest = b.run(fork, 3, RunStatus.COMPLETED)
    first = forks.merge_back(fork, transfer, latest, [], NOW, uuid.uuid4)
    assert (first.type, first.status) == (TransferType.MERGE_BACK, TransferStatus.PENDING)
    assert (first.source_thread_id, first.thread_id) == (fork.id, OWNER.id)
    assert first.base_point == POINT.to_json()
    assert forks.merge_range(first) == (fork.id, 0, 3)
    later = forks.merge_back(fork, transfer, b.run(fork, 5, RunStatus.COMPLETED), [first], NOW, uuid.uuid4)
    assert forks.merge_range(later) == (fork.id, 3, 5)
    failed = first.evolve(status=TransferStatus.FAILED)
    assert forks.merge_range(forks.merge_back(fork, transfer, latest, [failed], NOW, uuid.uuid4)) == (fork.id, 0, 3)


@pytest.mark.parametrize(
    ("latest", "merged_before", "code"),
    [(None, 0, ErrorCode.NOTHING_TO_MERGE), (3, 3, ErrorCode.NOTHING_TO_MERGE), (2, 3, ErrorCode.NOTHING_TO_MERGE)],
)
def test_merge_back_refuses_when_nothing_is_new(latest: int | None, merged_before: int, code: ErrorCode) -> None:
    fork, transfer = _fork_and_transfer()
    done = b.run(fork, merged_before, RunStatus.COMPLETED)
    earlier = [forks.merge_back(fork, transfer, done, [], NOW, uuid.uuid4)] if merged_before else []
    stable = None if latest is None else b.run(fork, latest, RunStatus.COMPLETED)
    with pytest.raises(DomainError) as refused:
        forks.merge_back(fork, transfer, stable, earlier, NOW, uuid.uuid4)
    assert refused.value.code == code


def test_only_a_fork_merges_back() -> None:
    _, transfer = _fork_and_transfer()
    with pytest.raises(DomainError) as refused:
        forks.merge_back(OWNER, transfer, b.run(OWNER, 1, RunStatus.COMPLETED), [], NOW, uuid.uuid4)
    assert refused.value.code == ErrorCode.NOT_A_FORK


@pytest.mark.parametrize("status", list(CheckpointStatus))
def test_only_a_ready_checkpoint_is_a_fork_point(status: CheckpointStatus) -> None:
    if status == CheckpointStatus.READY:
        forks.require_ready_checkpoint(checkpoint(status), "source.checkpoint")
        return
    with pytest.raises(DomainError) as refused:
        forks.require_ready_checkpoint(checkpoint(status), "source.checkpoint")
    assert refused.value.code == ErrorCode.UNSTABLE_FORK_POINT and refused.value.field == "source.checkpoint"

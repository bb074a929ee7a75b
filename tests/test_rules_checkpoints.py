"""The pure checkpoint rules: the exclude list, the base a capture diffs against, what gets recorded."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from threadloom.domain import checkpoints as rules
from threadloom.domain.activities import ActivityKind
from threadloom.domain.entities import Activity, Checkpoint
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import CheckpointScopeKind, CheckpointStatus, RunStatus

NOW = datetime(2026, 1, 1, tzinfo=UTC)
THREAD = uuid.uuid4()


def _checkpoint(ordinal: int, status: CheckpointStatus = CheckpointStatus.READY) -> Checkpoint:
    return Checkpoint(
        id=new_id(),
        thread_id=THREAD,
        scope_id=uuid.uuid4(),
        ordinal=ordinal,
        status=status,
        ref=None if status == CheckpointStatus.ERROR else f"refs/threadloom/t/root/{ordinal}",
        created_at=NOW,
    )


def test_excludes_add_and_drop_defaults() -> None:
    assert rules.excludes(None) == (*rules.DEFAULT_EXCLUDES, "/.threadloom/forks/")
    chosen = rules.excludes("dist/, *.log\n-node_modules/,,node_modules/x,-/.threadloom/forks/")
    assert "node_modules/" not in chosen
    assert chosen[-4:] == ("dist/", "*.log", "node_modules/x", "/.threadloom/forks/")  # forks' folders stay out


def test_the_base_is_the_latest_ready_checkpoint_before() -> None:
    checkpoints = [
        _checkpoint(0),
        _checkpoint(1),
        _checkpoint(2, CheckpointStatus.STALE),  # rolled back
        _checkpoint(3, CheckpointStatus.ERROR),
    ]
    base = rules.base_of(checkpoints, 4)
    assert base is not None and base.ordinal == 1
    assert rules.base_of(checkpoints, 0) is None


def test_files_round_trip_as_the_stored_json() -> None:
    renamed = rules.CheckpointFile("b.txt", rules.CheckpointFileStatus.RENAMED, 0, 0, old_path="a.txt")
    binary = rules.CheckpointFile("x.bin", rules.CheckpointFileStatus.ADDED, 0, 0, binary=True)
    assert renamed.to_json() == {
        "path": "b.txt",
        "status": "renamed",
        "additions": 0,
        "deletions": 0,
        "oldPath": "a.txt",
    }
    checkpoint = _checkpoint(1).evolve(files=[renamed.to_json(), binary.to_json(), "junk"])
    assert rules.files_of(checkpoint) == [renamed, binary]


def test_recording_a_capture_and_a_failure() -> None:
    scope, created = rules.ensure_root_scope(None, THREAD, NOW, new_id)
    assert scope.kind == CheckpointScopeKind.ROOT_RUN and scope.advances_run_count and len(created) == 1
    assert rules.ensure_root_scope(scope, THREAD, NOW, new_id) == (scope, [])
    run = uuid.uuid4()
    files = (rules.CheckpointFile("a", rules.CheckpointFileStatus.ADDED, 2, 0),)
    done = rules.record(
        scope,
        None,
        3,
        rules.Captured("refs/threadloom/t/root/3", files, 2),
        NOW,
        new_id,
        run_id=run,
        run_status=RunStatus.INTERRUPTED,
    )
    assert (done.checkpoint.status, done.checkpoint.ordinal, done.checkpoint.run_id) == (CheckpointStatus.READY, 3, run)
    recorded = done.changes[1].entity
    assert isinstance(recorded, Activity) and recorded.kind == ActivityKind.CHECKPOINT_CAPTURED
    assert recorded.summary == "checkpoint 3 captured: 1 file changed (run interrupted)"

    failed = rules.record(scope, done.checkpoint, 3, rules.CaptureFailed("gone", missing=True), NOW, new_id, run_id=run)
    assert failed.checkpoint.id == done.checkpoint.id  # the same row, updated
    assert (failed.checkpoint.status, failed.checkpoint.ref, failed.checkpoint.files) == (
        CheckpointStatus.MISSING,
        None,
        None,
    )
    activity = failed.changes[1].entity
    assert isinstance(activity, Activity) and activity.kind == ActivityKind.CHECKPOINT_FAILED

    quiet = rules.record(scope, None, 0, rules.Captured("r", (), None), NOW, new_id, run_id=None, announce=False)
    assert len(quiet.changes) == 1  # a baseline is bookkeeping: no activity

"""The rules that freeze a fork at its point (domain/forks.py), as tables. Pure.

`freeze_context` builds, at forkThread, the text the fork's first run will receive; `require_workspace` says
which workspaces a fork may have. The live tests are tests/test_forks_frozen.py and tests/test_fork_workspace.py.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from tests.support import builders as b
from threadloom.domain import forks
from threadloom.domain.entities import Checkpoint
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.handoffs import RunFacts
from threadloom.domain.statuses import CheckpointStatus, RunStatus

NOW = datetime(2026, 12, 1, tzinfo=UTC)
SOURCE = b.thread()
OWN, SHARED = forks.Workspace.OWN, forks.Workspace.SHARED


def facts(ordinal: int, text: str, status: RunStatus = RunStatus.COMPLETED) -> RunFacts:
    return RunFacts(ordinal, status, "scripted", user_messages=(text,), assistant_messages=(f"re {text}",))


def point(upto: int, provider_thread: uuid.UUID | None = None) -> forks.ForkPoint:
    return forks.ForkPoint(source_thread_id=SOURCE.id, run_ordinal=upto, provider_thread_id=provider_thread)


def test_the_frozen_context_holds_the_source_runs_up_to_the_point_and_survives_its_json() -> None:
    pt = uuid.uuid4()
    frozen = forks.freeze_context(point(2, pt), None, [(2, [facts(1, "alpha"), facts(2, "beta")])])
    assert "alpha" in frozen.text and "beta" in frozen.text
    assert frozen.covered == (1, 2) and frozen.came_from == (str(pt),)
    assert forks.FrozenContext.from_json(frozen.to_json()) == frozen
    handoff = frozen.handoff()
    assert handoff.text == frozen.text and handoff.covered_run_ordinals == (1, 2)


def test_a_fork_of_a_fork_starts_from_its_sources_frozen_context_not_from_the_log() -> None:
    above = forks.freeze_context(point(2), None, [(2, [facts(1, "alpha"), facts(2, "beta")])])
    # The grandparent's log may since have been rolled back: only the child's own runs are read.
    frozen = forks.freeze_context(point(1), above, [(1, [facts(1, "child")])])
    assert frozen.parts[: len(above.parts)] == above.parts and "child" in frozen.parts[-1]
    assert frozen.text == "\n".join([*above.parts, frozen.parts[-1]]) and frozen.covered == (1,)


def test_a_point_before_the_first_run_freezes_the_empty_context_and_adds_no_part() -> None:
    empty = forks.freeze_context(point(0), None, [(0, [])])
    assert empty.parts == () and empty.covered == () and empty.text  # the "no history" text
    above = forks.freeze_context(point(1), None, [(1, [facts(1, "alpha")])])
    assert forks.freeze_context(point(0), above, [(0, [])]).parts == above.parts


@pytest.mark.parametrize("stored", [None, {}, {"text": "old"}, "nonsense", {"parts": "not a list"}])
def test_a_transfer_made_before_contexts_were_frozen_has_none(stored: object) -> None:
    assert forks.FrozenContext.from_json(stored) is None


def checkpoint(status: CheckpointStatus) -> Checkpoint:
    return Checkpoint(id=b.uid(), thread_id=SOURCE.id, scope_id=b.uid(), ordinal=1, status=status, created_at=NOW)


OWN_FOLDER = SOURCE.evolve(workspace_path="forks/x")


@pytest.mark.parametrize(
    ("source", "workspace", "files", "refused"),
    [
        (SOURCE, OWN, CheckpointStatus.READY, None),
        (SOURCE, OWN, None, ErrorCode.CHECKPOINT_MISSING),  # no checkpoint: the point's files are unknown
        (SOURCE, OWN, CheckpointStatus.ERROR, ErrorCode.CHECKPOINT_MISSING),
        (SOURCE, OWN, CheckpointStatus.MISSING, ErrorCode.CHECKPOINT_MISSING),
        (SOURCE, SHARED, None, None),  # sharing needs no checkpoint
        (SOURCE, SHARED, CheckpointStatus.READY, None),
        (OWN_FOLDER, OWN, CheckpointStatus.READY, None),
        (OWN_FOLDER, SHARED, CheckpointStatus.READY, ErrorCode.INVALID_INPUT),  # a folder is one thread's
    ],
)
def test_which_workspace_a_fork_may_have(
    source: object, workspace: forks.Workspace, files: CheckpointStatus | None, refused: ErrorCode | None
) -> None:
    assert isinstance(source, type(SOURCE))
    found = None if files is None else checkpoint(files)
    if refused is None:
        forks.require_workspace(source, workspace, found, "workspace")
        return
    with pytest.raises(DomainError) as error:
        forks.require_workspace(source, workspace, found, "workspace")
    assert error.value.code == refused and error.value.field == "workspace"

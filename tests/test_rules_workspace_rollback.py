"""The rules of a rollback in a shared workspace (domain/workspace_rollback.py): which paths are this
thread's to put back, which are conflicts and whose, and the refusals."""

from __future__ import annotations

import uuid

import pytest

from threadloom.domain import workspace_rollback as ws
from threadloom.domain.errors import DomainError, ErrorCode

B = ws.Writer(uuid.UUID(int=2), "thread B", uuid.UUID(int=20), 1)
C = ws.Writer(uuid.UUID(int=3), "thread C", None, None)


def own(blob: str | None, previous: str | None) -> ws.Capture:
    return ws.Capture(None, blob, previous)


def other(writer: ws.Writer, blob: str | None, previous: str | None) -> ws.Capture:
    return ws.Capture(writer, blob, previous)


@pytest.mark.parametrize(
    ("captures", "held", "now", "restore", "delete", "conflict"),
    [
        # this thread changed it, nobody else did: put back (the target has it) or removed (it has not)
        ([own("x2", "x1")], True, False, True, False, None),
        ([own("x2", None)], False, False, False, True, None),
        # another thread wrote it before this thread's checkpoint saw it: not this thread's change, left alone
        ([other(B, "b", None), own("b", None)], False, False, False, False, None),
        # another thread wrote it, then this thread changed it again: this thread's change
        ([other(B, "b", None), own("a", None)], False, False, False, True, None),
        # this thread changed it, then another thread did: a conflict naming that thread's run
        ([own("x2", "x1"), other(B, "b", "x2")], True, False, True, False, B),
        # ... the newest of several is named
        ([own("x2", "x1"), other(B, "b", "x2"), other(C, "c", "b")], True, False, True, False, C),
        # a capture of another thread that left it as it was is no conflict
        ([own("x2", "x1"), other(B, "x2", "x2")], True, False, True, False, None),
        # no capture says who, but the workspace differs from this thread's last checkpoint: no run did it
        ([own("x2", "x1")], True, True, True, False, "outside"),
    ],
)  # fmt: skip
def test_which_paths_are_this_threads_and_what_stands_in_the_way(
    captures: list[ws.Capture], held: bool, now: bool, restore: bool, delete: bool, conflict: object
) -> None:
    plan = ws.plan_files({"f.txt": captures}, ["f.txt"] if held else [], ["f.txt"] if now else [])
    assert ("f.txt" in plan.restore, "f.txt" in plan.delete) == (restore, delete)
    found = [c.writer if c.writer is not None else "outside" for c in plan.conflicts]
    assert found == ([] if conflict is None else [conflict])


def test_a_conflict_is_refused_with_each_path_and_who_unless_overwritten() -> None:
    plan = ws.plan_files(
        {"a.txt": [own("2", "1"), other(B, "b", "2")], "b.txt": [own("2", "1")]}, ["a.txt", "b.txt"], ["b.txt"]
    )
    with pytest.raises(DomainError) as error:
        ws.refuse_conflicts(plan, overwrite=False)
    assert error.value.code == ErrorCode.WORKSPACE_CONFLICT
    assert "a.txt (changed by thread 'thread B' run 1)" in error.value.message
    assert "b.txt (changed outside any run)" in error.value.message
    ws.refuse_conflicts(plan, overwrite=True)  # the twin: the caller said OVERWRITE
    ws.refuse_conflicts(ws.plan_files({"c.txt": [own("2", "1")]}, ["c.txt"], []), overwrite=False)


def test_another_threads_active_run_makes_the_workspace_busy() -> None:
    with pytest.raises(DomainError) as error:
        ws.refuse_busy({uuid.UUID(int=2): "thread B"})
    assert error.value.code == ErrorCode.WORKSPACE_BUSY and "thread B" in error.value.message
    ws.refuse_busy({})


def test_a_preview_token_names_one_plan() -> None:
    plan = {"rolledBackRunOrdinals": [2], "files": {"restore": ["a.txt"]}}
    token = ws.preview_token(plan)
    assert token == ws.preview_token(dict(reversed(list(plan.items()))))  # key order does not matter
    ws.refuse_stale(token, plan)
    ws.refuse_stale(None, plan)  # no token given: nothing to compare
    with pytest.raises(DomainError) as error:
        ws.refuse_stale(token, {**plan, "files": {"restore": ["a.txt", "b.txt"]}})
    assert (error.value.code, error.value.field) == (ErrorCode.STALE_PREVIEW, "previewToken")

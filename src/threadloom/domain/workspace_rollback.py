"""A rollback in a workspace with more than one writer: which paths go back, and what refuses it.

Every thread of a project (and every fork that shares its folder) writes in the same workspace. A rollback
of one thread restores only the paths its undone runs changed (the difference between the target's
checkpoint and the thread's last one) — each to the target's content, or removed where the target has
none — and leaves every other path alone. A path that someone else changed since the target (another
thread's run that captured it, or a change no run captured: the user, a process outside Threadloom) is a
conflict: the rollback is refused with WORKSPACE_CONFLICT naming each path and who changed it, unless the
caller says `onConflict: OVERWRITE`. While another thread's run is active in the same workspace the
rollback is refused with WORKSPACE_BUSY naming that thread. A dry run returns the plan and a
`previewToken`; a call passing the token is refused with STALE_PREVIEW if anything in the plan changed.
Pure: facts in, plan out.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

import orjson

from threadloom.domain.errors import DomainError, ErrorCode


class ConflictPolicy(StrEnum):
    """What a rollback does with a path someone else changed since the runs it undoes."""

    REFUSE = "refuse"  # WORKSPACE_CONFLICT, naming each path and who changed it
    OVERWRITE = "overwrite"  # put it back anyway


@dataclasses.dataclass(frozen=True, slots=True)
class Writer:
    """Another thread's run whose checkpoint captured the workspace since the target."""

    thread_id: uuid.UUID
    thread_title: str
    run_id: uuid.UUID | None
    run_ordinal: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class Conflict:
    path: str
    writer: Writer | None  # None: changed outside any run that captured it (the user, another process)

    def said(self) -> str:
        if self.writer is None:
            return f"{self.path} (changed outside any run)"
        run = f" run {self.writer.run_ordinal}" if self.writer.run_ordinal is not None else ""
        return f"{self.path} (changed by thread {self.writer.thread_title!r}{run})"


@dataclasses.dataclass(frozen=True, slots=True)
class FilePlan:
    restore: tuple[str, ...]  # written back as the target has them
    delete: tuple[str, ...]  # the target has none: removed
    conflicts: tuple[Conflict, ...]

    @property
    def paths(self) -> tuple[str, ...]:
        return tuple(sorted((*self.restore, *self.delete)))

    def record(self) -> dict[str, Any]:
        return {
            "restore": list(self.restore),
            "delete": list(self.delete),
            "conflicts": [
                {
                    "path": c.path,
                    "threadId": str(c.writer.thread_id) if c.writer else None,
                    "runId": str(c.writer.run_id) if c.writer and c.writer.run_id else None,
                    "runOrdinal": c.writer.run_ordinal if c.writer else None,
                }
                for c in self.conflicts
            ],
        }


@dataclasses.dataclass(frozen=True, slots=True)
class Capture:
    """One checkpoint's view of a path, in capture order: who captured it (None: the thread rolled back), the
    path's content there and in that thread's checkpoint before it (blob ids; None: no such file)."""

    writer: Writer | None
    blob: str | None
    previous: str | None

    @property
    def changed(self) -> bool:
        return self.blob != self.previous


def captured_at(created_at: datetime, run_ended_at: datetime | None) -> datetime:
    """When a root checkpoint's files were captured, for ordering the captures of every thread in one
    workspace: as its run ended (a run's capture is made then), else (a baseline) when its record was made.
    The record's own time is not enough: a run that ran ahead of its queue takes a baseline at the ordinal
    before it, and that record is updated in place when the run of that ordinal ends, later. Ordered by
    record, that run's capture came before captures made while it ran, or before the rollback's target and
    so out of sight: a change it made looked like the next capture's own, and a rollback put it back."""
    return run_ended_at or created_at


def plan_files(
    history: Mapping[str, Sequence[Capture]], at_target: Iterable[str], changed_now: Iterable[str]
) -> FilePlan:
    """The paths to put back and what stands in the way.

    `history`: for each path that differs between the target's checkpoint and this thread's last one, every
    capture since the target (this thread's and the others'), oldest first. A change of this thread's is one
    its checkpoint shows and no other thread's capture made first with the same content (another thread's
    write that this thread's next checkpoint merely saw). A path this thread never changed is left alone; a
    path another thread changed after this thread's last change is a conflict naming that thread's run; a
    path that differs in the workspace now from this thread's last checkpoint (`changed_now`) with no
    capture to say who is a conflict of no run (the user, another process)."""
    held = set(at_target)
    now = set(changed_now)
    restore: list[str] = []
    delete: list[str] = []
    conflicts: list[Conflict] = []
    for path in sorted(history):
        captures = list(history[path])
        own = [i for i, c in enumerate(captures) if c.writer is None and c.changed and not _seen(captures, i)]
        if not own:
            continue  # only others changed it: not this thread's to put back
        later = [c for c in captures[own[-1] + 1 :] if c.writer is not None and c.changed]
        if later:
            conflicts.append(Conflict(path, later[-1].writer))
        elif path in now:
            conflicts.append(Conflict(path, None))
        (restore if path in held else delete).append(path)
    return FilePlan(tuple(restore), tuple(delete), tuple(conflicts))


def _seen(captures: Sequence[Capture], i: int) -> bool:
    """Whether this thread's capture `i` only saw another thread's write: one of theirs since this thread's
    capture before it left the path as it is here."""
    start = max((j for j in range(i) if captures[j].writer is None), default=-1)
    return any(c.writer is not None and c.changed and c.blob == captures[i].blob for c in captures[start + 1 : i])


def refuse_conflicts(plan: FilePlan, overwrite: bool) -> None:
    if plan.conflicts and not overwrite:
        listed = "; ".join(c.said() for c in plan.conflicts)
        raise DomainError(
            ErrorCode.WORKSPACE_CONFLICT,
            f"{len(plan.conflicts)} path(s) the undone runs changed were changed since by someone else: {listed}; "
            "roll back with onConflict: OVERWRITE to put them back anyway",
            "runOrdinal",
        )


def refuse_busy(active: Mapping[uuid.UUID, str]) -> None:
    """Other threads of the same workspace with an active run (id → title): their agent is writing there."""
    if active:
        named = ", ".join(f"{title!r} ({thread})" for thread, title in sorted(active.items(), key=lambda x: str(x[0])))
        raise DomainError(
            ErrorCode.WORKSPACE_BUSY,
            f"another thread's run is active in this workspace: {named}; wait for it or stop it first",
            "threadId",
        )


def preview_token(plan: Mapping[str, Any]) -> str:
    """A token naming this exact plan: the same facts give the same token, any change another one."""
    return hashlib.sha256(orjson.dumps(plan, option=orjson.OPT_SORT_KEYS)).hexdigest()[:32]


def refuse_stale(expected: str | None, plan: Mapping[str, Any]) -> None:
    if expected is not None and expected != preview_token(plan):
        raise DomainError(
            ErrorCode.STALE_PREVIEW,
            "the rollback's plan changed since its preview (runs, provider threads or files); preview it again",
            "previewToken",
        )

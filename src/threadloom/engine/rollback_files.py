"""Which files a rollback puts back in a workspace that more than one thread writes in (rules in
`domain.workspace_rollback`): the paths between the target's checkpoint and the thread's last one, the
other threads' runs that changed some of them since (read from their checkpoints), and what differs in the
workspace now. Git work on the shadow repository and reads only, outside any transaction."""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from threadloom.checkpoints.repo import ShadowRepo
from threadloom.domain import rollback as plan_rules
from threadloom.domain import workspace_rollback as ws
from threadloom.domain.entities import AppThread, Project
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import CheckpointScopeKind, CheckpointStatus
from threadloom.domain.threads import index_key
from threadloom.store import rollback_facts as facts
from threadloom.store import workspace_facts
from threadloom.store.db import Database


@dataclasses.dataclass(frozen=True, slots=True)
class Files:
    plan: ws.FilePlan
    busy: dict[uuid.UUID, str]  # other threads of the workspace with an active run: id → title


async def read_plan(
    database: Database,
    thread: AppThread,
    project: Project,
    target: int,
    repo_of: Callable[[uuid.UUID, Path, str | None], ShadowRepo],
    workspace_of: Callable[[AppThread, Project], Path],
) -> Files:
    """The file plan of a rollback of `thread` to run `target`: the reads first, then the git work."""
    async with database.read() as db:
        roots = [
            c
            for c, scope in await facts.checkpoints_of(db, thread.id)
            if scope.kind == CheckpointScopeKind.ROOT_RUN and c.status == CheckpointStatus.READY and c.ref
        ]
        runs = await facts.runs_of(db, thread.id)
        others = await workspace_facts.sharing(db, thread)
        busy = await workspace_facts.active_in(db, others)
    at_target = [c for c in roots if c.ordinal == target]
    if not at_target:
        raise DomainError(
            ErrorCode.CHECKPOINT_MISSING,
            f"no checkpoint to restore files from for run {target}; roll back without restoreFiles",
            "restoreFiles",
        )
    target_cp = at_target[-1]
    undone_runs = [r.ordinal for r in runs if r.ordinal > target and r.status in plan_rules.RAN]
    later = {c.ordinal: c for c in roots if c.ordinal > target}
    complete = all(o in later for o in undone_runs)  # every undone run's files were captured
    # A run's checkpoint holds its files as it left them, captured as it ended; its record may be made before
    # (when it was next in line). So the captures are ordered by when their runs ended: runs can run out of
    # ordinal order (a queued run moved ahead), and the record made last is then not the newest capture.
    ended = {r.ordinal: r.completed_at for r in runs}

    def captured_at(c: Any) -> Any:
        return ws.captured_at(c.created_at, ended.get(c.ordinal))

    last = max(later.values(), key=captured_at) if later and complete else None
    async with database.read() as db:  # the others' captures, by the same clock as this thread's
        captured = await workspace_facts.captured_since(db, others, captured_at(target_cp))

    repo = repo_of(project.id, workspace_of(thread, project), index_key(thread))
    target_commit = await repo.resolve(str(target_cp.ref))
    if target_commit is None:
        raise DomainError(ErrorCode.CHECKPOINT_MISSING, f"the checkpoint of run {target} has no commit any more")
    last_commit = await repo.resolve(str(last.ref)) if last is not None else None
    if last_commit is not None:
        undone = await repo.changed_paths(target_commit, last_commit)
        changed_now = await repo.differs_now(last_commit, sorted(undone))
    else:  # a run without a checkpoint: whatever differs from the target now is put back
        undone, changed_now = await repo.differs_now(target_commit, None), set()
    paths = sorted(undone)
    # Every capture since the target, in order: this thread's (each against its previous one) and the others'.
    timeline: list[tuple[Any, ws.Writer | None, str, str | None]] = []
    previous = target_cp.ref
    for own in sorted(later.values(), key=captured_at) if last is not None else []:
        timeline.append((captured_at(own), None, str(own.ref), previous))
        previous = own.ref
    for capture in captured:
        if capture.previous_ref is None:
            continue  # a thread's first capture records the workspace, not a change
        who = ws.Writer(capture.thread_id, capture.thread_title, capture.run_id, capture.run_ordinal)
        timeline.append((capture.captured_at, who, capture.ref, capture.previous_ref))
    timeline.sort(key=lambda entry: entry[0])
    history: dict[str, list[ws.Capture]] = {p: [] for p in paths}
    if last is None:  # no checkpoint of the thread's own: its change is what differs now, before any other's
        for p in paths:
            history[p].append(ws.Capture(None, "now", "target"))
    for _, writer, ref, before in timeline:
        after_commit = await repo.resolve(ref)
        before_commit = await repo.resolve(before) if before else None
        if after_commit is None:
            continue
        after_blobs = await repo.blobs(after_commit, paths)
        before_blobs = await repo.blobs(before_commit, paths) if before_commit else {}
        for p in paths:
            history[p].append(ws.Capture(writer, after_blobs.get(p), before_blobs.get(p)))
    present = await repo.present(target_commit, paths)
    return Files(ws.plan_files(history, present, changed_now), busy)

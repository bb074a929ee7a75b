"""Checkpoints in the engine: when the workspace is captured, and recording what the capture returned.

Git never runs inside a database transaction (`threadloom.io_guard` counts, and under the tests refuses,
any call that does). Each capture reads what it needs in a short read, does the git work
(`threadloom.checkpoints`, serialized per project by the store's lock), and then records the result: the
run's checkpoint inside the completion barrier's transaction (`RunFinish.finish` in `engine.run_finish`
hands the capture to `record_run_end`), a baseline or a subagent's checkpoint in a step of its own. Rules are in
`domain.checkpoints`; what users see is in docs/lifecycles/checkpoints-and-rollback.md.

- before run N's turn starts: `ensure_baseline` captures ordinal N-1 if the thread has no such checkpoint
  (ordinal 0 before the first run);
- at run N's end: `capture_run_end` captures ordinal N and diffs it against the latest ready root checkpoint
  before it; interrupted and failed runs are captured too (their activity says so); a capture that fails is
  recorded as an `error` (or `missing`, when the workspace is gone) checkpoint with the reason;
- a subagent node: `node_started` captures its scope's ordinal 0, `node_ended` ordinal 1 with the diff.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import shutil
import stat
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path

from threadloom import unprivileged
from threadloom.checkpoints import CheckpointError, CheckpointErrorCode, CheckpointStore, ShadowRepo, checkpoint_ref
from threadloom.domain import checkpoints as rules
from threadloom.domain import projects as project_rules
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import AppThread, Checkpoint, CheckpointScope, ExecutionNode, Project, Run
from threadloom.domain.ids import new_id
from threadloom.domain.runs import is_active
from threadloom.domain.statuses import RunStatus
from threadloom.domain.threads import WORKSPACES_DIR, index_key, workspace_of
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.store import checkpoints as stored
from threadloom.store import entities
from threadloom.store import projects as project_store
from threadloom.store.db import Reader

log = logging.getLogger("threadloom.checkpoints")


@dataclasses.dataclass(frozen=True, slots=True)
class RunCapture:
    """A run's end capture, made before the barrier's transaction and recorded inside it."""

    run_id: uuid.UUID
    ordinal: int
    result: rules.CaptureResult


@dataclasses.dataclass(frozen=True, slots=True)
class _Where:
    thread_id: uuid.UUID
    project_id: uuid.UUID
    workspace: Path
    index_key: str | None = None  # a fork's own workspace has its own index


class Checkpoints:
    """Capture and record checkpoints; `store` None keeps none (runs end with `checkpoint.skipped`)."""

    def __init__(
        self,
        pipeline: Pipeline,
        store: CheckpointStore | None,
        excludes: tuple[str, ...],
        data_dir: Path | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.store = store
        self.excludes = excludes
        # Threads' own workspaces (forks'): `<data dir>/workspaces/<project>/forks/<thread>`. The data dir is
        # resolved once, here: every path below it is then made and opened without following a symlink.
        self.data_dir = None if data_dir is None else data_dir.resolve()
        self._making: dict[uuid.UUID, asyncio.Lock] = {}  # one materialisation of a fork's folder at a time
        # Each project's own exclude list as last read (None: the server's `excludes`). `repo()` is called
        # outside any read (the rollback steps hold only the project's id), so the lists are read ahead:
        # all at start (`load_project_excludes`), again with every capture's read, and after updateProject.
        self._own_excludes: dict[uuid.UUID, tuple[str, ...] | None] = {}

    @classmethod
    def open(cls, pipeline: Pipeline, data_dir: Path, excludes: tuple[str, ...]) -> Checkpoints:
        """Checkpoints in `<data dir>/checkpoints`; without git on PATH the server keeps none (and says so)."""
        try:
            return cls(pipeline, CheckpointStore(data_dir), excludes, data_dir)
        except CheckpointError as error:
            log.warning("checkpoints are off: %s", error)
            return cls(pipeline, None, excludes, data_dir)

    @property
    def workspaces_root(self) -> Path | None:
        """`<data dir>/workspaces`, the folder of threads' own workspaces (None: this engine has no data dir)."""
        return None if self.data_dir is None else self.data_dir / WORKSPACES_DIR

    def workspace_of(self, thread: AppThread, project: Project) -> Path:
        """The folder `thread`'s agent works in (and its checkpoints capture): the project's workspace, or
        the thread's own folder under the data dir."""
        root = self.workspaces_root
        if thread.workspace_path and root is None:
            raise CheckpointError(CheckpointErrorCode.WORKSPACE_MISSING, "this server has no data dir for forks")
        return Path(workspace_of(thread, project.workspace_root, str(root)))

    async def load_project_excludes(self) -> None:
        """Read every project's own exclude list (at start, before recovery may resume a rollback)."""
        async with self.pipeline.db.read() as db:
            self._own_excludes.update(await project_store.own_excludes(db))

    def remember(self, project: Project) -> None:
        """The project as just read: its exclude list is the one its next repository uses."""
        self._own_excludes[project.id] = project.excludes

    def excludes_of(self, project_id: uuid.UUID) -> tuple[str, ...]:
        """What the project's checkpoints leave out: its own list, else the server's."""
        return project_rules.effective_excludes(self._own_excludes.get(project_id), self.excludes)

    def repo(self, project_id: uuid.UUID, workspace: Path, index_key: str | None = None) -> ShadowRepo:
        """The project's shadow repository over `workspace`, with the project's exclude list."""
        if self.store is None:
            raise CheckpointError(CheckpointErrorCode.GIT_NOT_FOUND, "this server keeps no checkpoints (no git)")
        return self.store.repo(str(project_id), workspace, self.excludes_of(project_id), index_key)

    async def _where(self, db: Reader, thread_id: uuid.UUID) -> _Where | None:
        thread = await entities.get(db, AppThread, thread_id)
        project = await entities.get(db, Project, thread.project_id if thread else None)
        if thread is None or project is None:
            return None
        self.remember(project)
        return _Where(thread.id, project.id, self.workspace_of(thread, project), index_key(thread))

    async def _capture(
        self, where: _Where, scope: str, ordinal: int, base: Checkpoint | None, message: str
    ) -> rules.CaptureResult:
        """The git work of one capture; every failure becomes a `CaptureFailed` (a capture never breaks a run)."""
        try:
            repo = self.repo(where.project_id, where.workspace, where.index_key)
            ref = checkpoint_ref(str(where.thread_id), scope, ordinal)
            parent_ref = base.ref if base is not None and base.ref else None
            capture, changes = await repo.capture_changes(ref, message, parent_ref=parent_ref)
        except CheckpointError as error:
            log.warning("checkpoint %s/%s/%s not captured: %s", where.thread_id, scope, ordinal, error)
            return rules.CaptureFailed(str(error), missing=error.code == CheckpointErrorCode.WORKSPACE_MISSING)
        except Exception as error:
            log.exception("checkpoint %s/%s/%s failed", where.thread_id, scope, ordinal)
            return rules.CaptureFailed(f"capture failed: {error}")
        base_ordinal = base.ordinal if capture.parent is not None and base is not None else None
        return rules.Captured(ref, tuple(changes), base_ordinal)

    # ---- a fork's own workspace ---------------------------------------------------------------

    async def ensure_own_workspace(self, thread_id: uuid.UUID, before_ordinal: int | None = None) -> None:
        """A thread with a workspace of its own (a fork's): its folder under the data dir, made once.

        The files are those the thread's next run starts from: its latest ready root checkpoint before
        `before_ordinal` (None: its latest), else the fork point's checkpoint. So a fork made by an older
        release, whose folder was `.threadloom/forks/<id>` inside the project's workspace, gets its folder
        here again from its own checkpoints on its next run or rollback; the old folder is never read
        (any agent of the project can rewrite it) nor deleted (see docs/lifecycles/forks.md).

        The folders on the way are made with mode 0o711 (`_open_folders`: the agent user passes through,
        never lists or renames) and every folder is opened without following symlinks. The files go to a
        `.partial` folder (0o700) that is renamed when complete and then granted to the agent user, so a
        crash midway leaves nothing a run would mistake for the fork's files; the next call starts again.
        """
        lock = self._making.setdefault(thread_id, asyncio.Lock())
        async with lock:
            await self._make_own_workspace(thread_id, before_ordinal)

    async def _make_own_workspace(self, thread_id: uuid.UUID, before_ordinal: int | None) -> None:
        async with self.pipeline.db.read() as db:
            thread = await entities.get(db, AppThread, thread_id)
            if thread is None or not thread.workspace_path:
                return
            project = await entities.require(db, Project, thread.project_id)
            self.remember(project)
            scope = await stored.root_scope(db, thread.id)
            own = await stored.of_scope(db, scope.id) if scope is not None else []
            source = rules.base_of(own, sys.maxsize if before_ordinal is None else before_ordinal)
            if source is None:
                source = await stored.fork_point_checkpoint(db, thread)
        root = self.workspaces_root
        if root is None:
            raise CheckpointError(CheckpointErrorCode.WORKSPACE_MISSING, "this server has no data dir for forks")
        folder = self.workspace_of(thread, project)
        parts = folder.relative_to(root.parent).parts  # ("workspaces", <project>, "forks", <thread>)
        partial = folder.with_name(f"{folder.name}.partial")
        if not await asyncio.to_thread(_fresh_own_folder, root.parent, parts):
            return  # made already
        if source is not None and source.ref and self.store is not None:
            repo = self.repo(project.id, partial, f"{thread.id}-partial")
            commit = await repo.resolve(source.ref)
            if commit is None:
                raise CheckpointError(CheckpointErrorCode.UNKNOWN_COMMIT, f"checkpoint {source.id} has no commit")
            await repo.restore(commit)
        await asyncio.to_thread(_publish_own_folder, root.parent, parts)
        await asyncio.to_thread(unprivileged.grant_workspace, folder)  # the agent user's to work in

    # ---- the root scope: a run's start and end ---------------------------------------------

    def baseline_due(self, run: Run, present: bool) -> bool:
        """Whether `ensure_baseline` has work for `run`, given whether the thread's root scope holds the
        checkpoint of its previous ordinal (`present`, read with the run: `store.runs.turn_start`)."""
        return self.store is not None and run.ordinal >= 1 and not present

    async def ensure_baseline(self, run_id: uuid.UUID) -> None:
        """Before run N's turn starts: the checkpoint N-1 exists (captured now if the thread has none)."""
        if self.store is None:
            return
        async with self.pipeline.db.read() as db:
            run = await entities.get(db, Run, run_id)
            where = await self._where(db, run.thread_id) if run is not None else None
            scope = await stored.root_scope(db, run.thread_id) if run is not None else None
            known = await stored.of_scope(db, scope.id) if scope is not None else []
        if run is None or where is None or run.ordinal < 1:
            return
        ordinal = run.ordinal - 1
        if any(c.ordinal == ordinal for c in known):
            return
        base = rules.base_of(known, ordinal)
        result = await self._capture(where, rules.ROOT_SCOPE_NAME, ordinal, base, f"baseline before run {run.ordinal}")
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            current = await stored.root_scope(db, thread.id)
            scope, changes = rules.ensure_root_scope(current, thread.id, now, new_id)
            checkpoints = await stored.of_scope(db, scope.id) if current is not None else []
            if any(c.ordinal == ordinal for c in checkpoints):
                return Outcome()  # recorded meanwhile
            recorded = rules.record(scope, None, ordinal, result, now, new_id, run_id=None, announce=False)
            return Outcome(changes + recorded.changes)

        await self.pipeline.execute(
            Command(command_type="checkpoint.baseline", thread_id=where.thread_id, decide=decide)
        )

    async def capture_run_end(self, run_id: uuid.UUID, attempt_id: uuid.UUID | None = None) -> RunCapture | None:
        """Before the barrier: capture the workspace as run N leaves it (None: the run is not active, or
        `attempt_id` is a superseded attempt's, whose end does not end the run)."""
        if self.store is None:
            return None
        async with self.pipeline.db.statements() as db:  # one statement, no BEGIN: a run's end waits for it
            found = await stored.run_end_facts(db, run_id)
        if found is None:
            return None
        run, thread, project, base = found
        if not is_active(run) or (attempt_id is not None and run.active_attempt_id != attempt_id):
            return None
        where = _Where(thread.id, project.id, self.workspace_of(thread, project), index_key(thread))
        result = await self._capture(where, rules.ROOT_SCOPE_NAME, run.ordinal, base, f"after run {run.ordinal}")
        return RunCapture(run.id, run.ordinal, result)

    def record_run_end(
        self,
        thread: AppThread,
        run: Run,
        root_node_id: uuid.UUID,
        capture: RunCapture | None,
        status: RunStatus,
        slot: tuple[CheckpointScope | None, Checkpoint | None],
    ) -> rules.Recorded | None:
        """Inside the barrier's transaction: the run's checkpoint from the capture made before it. `slot` is
        the thread's root scope and its checkpoint of the run's ordinal (`store.runs.finish_facts`)."""
        if capture is None or capture.run_id != run.id or capture.ordinal != run.ordinal:
            return None
        current, existing = slot
        now = self.pipeline.clock.now()
        scope, changes = rules.ensure_root_scope(current, thread.id, now, new_id)
        recorded = rules.record(
            scope,
            existing,
            capture.ordinal,
            capture.result,
            now,
            new_id,
            run_id=run.id,
            node_id=root_node_id,
            run_status=status,
        )
        return rules.Recorded(recorded.checkpoint, changes + recorded.changes)

    # ---- reads ---------------------------------------------------------------------------

    async def file_diff(self, checkpoint: Checkpoint, path: str) -> str | None:
        """The unified diff of one path of a checkpoint against the checkpoint it was captured after."""
        if self.store is None or not checkpoint.ref:
            return None
        async with self.pipeline.db.read() as db:
            where = await self._where(db, checkpoint.thread_id)
        if where is None:
            return None
        repo = self.repo(where.project_id, where.workspace, where.index_key)
        commit = await repo.resolve(checkpoint.ref)
        if commit is None:
            return None
        old_path = next((f.old_path for f in rules.files_of(checkpoint) if f.path == path), None)
        return await repo.file_diff(await repo.parent(commit), commit, path, old_path)

    # ---- child scopes ----------------------------------------------------------------------

    async def node_started(self, node_id: uuid.UUID) -> None:
        """A subagent node started: its scope's ordinal 0 is the workspace as it found it."""
        await self._node_capture(node_id, 0)

    async def node_ended(self, node_id: uuid.UUID) -> None:
        """A subagent node ended: ordinal 1 and what it changed since ordinal 0."""
        await self._node_capture(node_id, 1)

    async def close_scopes(self, run_id: uuid.UUID) -> None:
        """After a run ended: a subagent whose end was never reported (the run was interrupted or failed
        around it) gets its end checkpoint now, the workspace as the run left it."""
        if self.store is None:
            return
        async with self.pipeline.db.statements() as db:  # one statement: no transaction around it
            scopes = await stored.child_scopes_of_run(db, run_id)
        for scope in scopes:
            if scope.node_id is not None:
                await self._node_capture(scope.node_id, 1)

    async def _node_capture(self, node_id: uuid.UUID, ordinal: int) -> None:
        if self.store is None:
            return
        async with self.pipeline.db.read() as db:
            node = await entities.get(db, ExecutionNode, node_id)
            if node is None or not rules.has_scope(node):
                return
            where = await self._where(db, node.thread_id)
            scope = await stored.node_scope(db, node.id)
            known = await stored.of_scope(db, scope.id) if scope is not None else []
        if where is None or any(c.ordinal == ordinal for c in known):
            return
        if ordinal > 0 and not known:
            return  # never saw it start: no baseline to diff against
        base = rules.base_of(known, ordinal)
        result = await self._capture(where, str(node.id), ordinal, base, f"subagent {node.id} {ordinal}")
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            current = await stored.node_scope(db, node_id)
            fresh = await entities.require(db, ExecutionNode, node_id)
            root, changes = rules.ensure_root_scope(await stored.root_scope(db, thread.id), thread.id, now, new_id)
            scope = current or rules.child_scope(root, fresh, now, new_id)
            if current is None:
                changes.append(Change.created(scope, run_id=fresh.run_id, node_id=fresh.id))
                changes.append(
                    Change.updated(fresh.evolve(checkpoint_scope_id=scope.id, updated_at=now), node_id=fresh.id)
                )
            checkpoints = await stored.of_scope(db, scope.id) if current is not None else []
            if any(c.ordinal == ordinal for c in checkpoints):
                return Outcome()
            recorded = rules.record(
                scope, None, ordinal, result, now, new_id, run_id=fresh.run_id, node_id=fresh.id, announce=ordinal > 0
            )
            return Outcome(changes + recorded.changes)

        await self.pipeline.execute(Command(command_type="checkpoint.node", thread_id=where.thread_id, decide=decide))


_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC  # a folder, never through a symlink


def _open_folders(base: Path, parts: Sequence[str]) -> int:
    """An fd of `base/parts...`, each folder made (mode 0o711: the agent user passes through to its forks'
    folders, never lists or renames them) if missing and opened from the one before with O_NOFOLLOW: a
    symlink or a file anywhere on the way is refused (OSError), never followed."""
    fd = os.open(base, _DIR)
    try:
        for part in parts:
            with contextlib.suppress(FileExistsError):
                os.mkdir(part, 0o711, dir_fd=fd)
            inner = os.open(part, _DIR, dir_fd=fd)
            os.close(fd)
            fd = inner
    except BaseException:
        os.close(fd)
        raise
    return fd


def _fresh_own_folder(base: Path, parts: Sequence[str]) -> bool:
    """False if the own folder `base/parts...` is made already; else True, with an empty `<name>.partial`
    beside it (a leftover of an interrupted attempt is removed first, a symlink unlinked, not followed)."""
    *parents, name = parts
    fd = _open_folders(base, parents)
    try:
        try:
            found = os.lstat(name, dir_fd=fd)
        except FileNotFoundError:
            found = None
        if found is not None:
            if stat.S_ISDIR(found.st_mode):
                return False
            raise NotADirectoryError(f"{base.joinpath(*parts)} is not a folder; the fork's files are not put there")
        partial = f"{name}.partial"
        try:
            leftover = os.lstat(partial, dir_fd=fd)
        except FileNotFoundError:
            leftover = None
        if leftover is not None and stat.S_ISDIR(leftover.st_mode):
            shutil.rmtree(partial, dir_fd=fd)  # fd-based: never leaves the folder through a symlink
        elif leftover is not None:
            os.unlink(partial, dir_fd=fd)
        os.mkdir(partial, 0o700, dir_fd=fd)
        return True
    finally:
        os.close(fd)


def _publish_own_folder(base: Path, parts: Sequence[str]) -> None:
    """Rename the complete `<name>.partial` to the own folder's name (within the same opened folder)."""
    *parents, name = parts
    fd = _open_folders(base, parents)
    try:
        os.rename(f"{name}.partial", name, src_dir_fd=fd, dst_dir_fd=fd)
    finally:
        os.close(fd)

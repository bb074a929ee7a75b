"""Commands on projects and threads: create, rename, archive, unarchive.

Each handler checks access, then hands the pipeline a decision that calls `domain/`.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Callable, Collection
from datetime import datetime
from pathlib import Path

from threadloom.domain import projects as project_rules
from threadloom.domain import settings_compat, switching
from threadloom.domain import threads as thread_rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.effects import EnsureThread
from threadloom.domain.entities import AppThread, Project
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import TokenScope
from threadloom.domain.threads import clean_model
from threadloom.engine.pipeline import Command, GlobalCommand, Pipeline
from threadloom.store import entities, receipts
from threadloom.store import threads as thread_store
from threadloom.store.db import Reader


def _existing_directory(path: str) -> str:
    """The folder's real path (symlinks resolved: the rules compare where it really is).

    The path as given must pass the system-folder rule too (`/proc/self/cwd` is a link into the
    server's own folder); a path that cannot be resolved or read is refused, not an internal error.
    """
    project_rules.check_not_system(path)
    try:
        real = os.path.realpath(path, strict=True)
        is_dir = os.path.isdir(real)
    except (OSError, RuntimeError):
        is_dir = False
    if not is_dir:
        raise DomainError(
            ErrorCode.INVALID_WORKSPACE_ROOT, "workspaceRoot must be an existing directory", "workspaceRoot"
        )
    return real


def _install_dirs() -> tuple[str, ...]:
    """The server's virtualenv and package folder: never inside or around a workspace."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))
    return (os.path.realpath(sys.prefix), package)


class Catalog:
    def __init__(
        self,
        pipeline: Pipeline,
        *,
        provider_instances: Collection[str],
        default_instance: str,
        eager_instances: Collection[str] = (),
        data_dir: Path | None = None,
        full_access_instances: Collection[str] = (),
        agents_dir: Path | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.data_dir = None if data_dir is None else os.path.realpath(data_dir)  # never in a workspace
        self.agents_dir = None if agents_dir is None else os.path.realpath(agents_dir)  # nor the agents' state
        self.full_access_instances = frozenset(full_access_instances)  # may run `full_access` threads
        self.provider_instances = provider_instances
        self.default_instance = default_instance
        self.eager_instances = frozenset(eager_instances)

    async def create_project(
        self, principal: Principal, *, name: str, workspace_root: str, key: str | None
    ) -> uuid.UUID:
        principal.require_global_admin()
        now = self.pipeline.clock.now()
        root = _existing_directory(project_rules.clean_workspace_root(workspace_root))

        async def decide(db: Reader) -> Outcome:
            await receipts.lock_key(db, "workspace roots")  # one project creation at a time: no racing overlap
            existing = [p.workspace_root for p in await entities.where(db, Project)]  # stored resolved
            project_rules.check_workspace_root(
                root,
                existing=existing,
                data_dir=self.data_dir,
                install_dirs=_install_dirs(),
                agents_dir=self.agents_dir,
            )
            change = project_rules.create_project(new_id(), name, root, now)
            return Outcome([change], result={"projectId": str(change.entity.id)})

        result = await self.pipeline.execute(
            GlobalCommand(
                command_type="createProject",
                principal=principal,
                key=key,
                input={"name": name, "workspaceRoot": workspace_root},
                decide=decide,
            )
        )
        return uuid.UUID(result["projectId"])

    async def create_thread(
        self,
        principal: Principal,
        *,
        project_id: uuid.UUID,
        title: str | None,
        provider_instance_id: str | None,
        model: str | None,
        runtime_mode: str,
        key: str | None,
    ) -> uuid.UUID:
        principal.require_project(project_id, TokenScope.OPERATE, "projectId")
        now = self.pipeline.clock.now()

        async def decide(db: Reader) -> Outcome:
            project = await thread_store.get_project(db, project_id)
            if project is None:
                raise not_found("projectId")
            project_rules.check_open(project, "projectId")
            instance = thread_rules.choose_provider_instance(
                provider_instance_id, self.default_instance, self.provider_instances
            )
            thread_rules.check_runtime_mode(runtime_mode, instance, self.full_access_instances)
            change = thread_rules.create_thread(
                thread_id=new_id(),
                project=project,
                title=title,
                provider_instance_id=instance,
                model=model,
                runtime_mode=runtime_mode,
                now=now,
            )
            effects = []
            if instance in self.eager_instances:  # the instance wants its provider thread now
                effects.append(EnsureThread(thread_id=change.entity.id).envelope())
            return Outcome([change], effects, result={"threadId": str(change.entity.id)}, project_id=project.id)

        data = {
            "projectId": str(project_id),
            "title": title,
            "providerInstanceId": provider_instance_id,
            "model": model,
            "runtimeMode": runtime_mode,
        }
        result = await self.pipeline.execute(
            GlobalCommand(command_type="createThread", principal=principal, key=key, input=data, decide=decide)
        )
        return uuid.UUID(result["threadId"])

    async def _update_thread(
        self,
        principal: Principal,
        command_type: str,
        thread_id: uuid.UUID,
        key: str | None,
        data: dict[str, str],
        rule: Callable[[AppThread, datetime], Change | list[Change]],
    ) -> uuid.UUID:
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            made = rule(thread, now)
            return Outcome(made if isinstance(made, list) else [made], result={"threadId": str(thread.id)})

        data = {"threadId": str(thread_id), **data}
        cmd = Command(
            command_type=command_type, principal=principal, key=key, input=data, decide=decide, thread_id=thread_id
        )
        await self.pipeline.execute(cmd)
        return thread_id

    async def rename_thread(self, principal: Principal, thread_id: uuid.UUID, title: str, key: str | None) -> uuid.UUID:
        return await self._update_thread(
            principal,
            "renameThread",
            thread_id,
            key,
            {"title": title},
            lambda th, now: thread_rules.rename_thread(th, title, now),
        )

    async def switch_provider(
        self, principal: Principal, thread_id: uuid.UUID, instance: str, model: str | None, key: str | None
    ) -> uuid.UUID:
        """The thread's later runs go to `instance` (its next run gets the handoff it needs)."""
        known = self.provider_instances
        return await self._update_thread(
            principal,
            "switchProvider",
            thread_id,
            key,
            {"providerInstanceId": instance, "model": model or ""},
            lambda th, now: switching.switch(th, instance, clean_model(model), known, now, new_id)[1],
        )

    async def set_runtime_mode(
        self, principal: Principal, thread_id: uuid.UUID, runtime_mode: str, key: str | None
    ) -> uuid.UUID:
        """The thread's later runs use `runtime_mode` (`domain.settings_compat.set_runtime_mode`)."""
        allowed = self.full_access_instances
        return await self._update_thread(
            principal,
            "setRuntimeMode",
            thread_id,
            key,
            {"runtimeMode": runtime_mode},
            lambda th, now: settings_compat.set_runtime_mode(th, runtime_mode, allowed, now),
        )

    async def archive_thread(self, principal: Principal, thread_id: uuid.UUID, key: str | None) -> uuid.UUID:
        return await self._update_thread(principal, "archiveThread", thread_id, key, {}, thread_rules.archive_thread)

    async def unarchive_thread(self, principal: Principal, thread_id: uuid.UUID, key: str | None) -> uuid.UUID:
        return await self._update_thread(
            principal, "unarchiveThread", thread_id, key, {}, thread_rules.unarchive_thread
        )

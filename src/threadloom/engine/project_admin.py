"""Managing projects and tokens through the API: updateProject, archive/unarchiveProject, the token
commands, and the gate a message passes before it may start a run in a project.

Project commands go through the pipeline like every other (idempotency keys, the project's log).
Token commands do not: a replayed createToken could not show its secret again (it is never stored),
so they run as one transaction of their own, like `threadloom token` on the database host.
"""

from __future__ import annotations

import os
import stat
import uuid
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import Any

from threadloom.domain import projects as rules
from threadloom.domain import tokens as token_rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import Project
from threadloom.domain.errors import not_found
from threadloom.domain.statuses import TokenScope
from threadloom.engine.checkpoints import Checkpoints
from threadloom.engine.pipeline import GlobalCommand, Pipeline
from threadloom.store import projects as project_store
from threadloom.store import threads as thread_store
from threadloom.store import tokens as token_store
from threadloom.store.db import Reader
from threadloom.store.tokens import TokenInfo

# Asked before a command that would start a run on a thread (sendMessage, retryRun, resumeQueue): refuses with
# PROJECT_ARCHIVED or WORKSPACE_MISSING, else returns. `ProjectAdmin.check_runnable`.
Gate = Callable[[Principal, uuid.UUID], Awaitable[None]]


def probe_workspace(path: str) -> rules.WorkspaceStatus:
    """What is at a workspace root now (links followed: a dangling one is MISSING). One `stat`, no lock."""
    try:
        mode = os.stat(path).st_mode
    except OSError:  # gone, a path through a file, or unreadable: no agent could work there
        return rules.WorkspaceStatus.MISSING
    return rules.WorkspaceStatus.OK if stat.S_ISDIR(mode) else rules.WorkspaceStatus.NOT_A_DIRECTORY


class ProjectAdmin:
    def __init__(self, pipeline: Pipeline, checkpoints: Checkpoints) -> None:
        self.pipeline = pipeline
        self.checkpoints = checkpoints  # told each project's exclude list (its repositories are made without a read)

    async def start(self) -> None:
        """Read every project's own exclude list before anything (a resumed rollback) opens a repository."""
        await self.checkpoints.load_project_excludes()

    async def _update(
        self,
        principal: Principal,
        command_type: str,
        project_id: uuid.UUID,
        key: str | None,
        data: dict[str, Any],
        rule: Callable[[Project, datetime], Change],
    ) -> uuid.UUID:
        principal.require_project(project_id, TokenScope.ADMIN, "projectId")
        now = self.pipeline.clock.now()

        async def decide(db: Reader) -> Outcome:
            project = await project_store.lock_project(db, project_id)
            if project is None:
                raise not_found("projectId")
            return Outcome([rule(project, now)], result={"projectId": str(project.id)}, project_id=project.id)

        data = {"projectId": str(project_id), **data}
        command = GlobalCommand(command_type=command_type, principal=principal, key=key, input=data, decide=decide)
        await self.pipeline.execute(command)
        return project_id

    async def update_project(
        self,
        principal: Principal,
        project_id: uuid.UUID,
        name: str | None,
        excludes: list[str] | None,
        key: str | None,
    ) -> uuid.UUID:
        """The fields given change; the others stay (no field: nothing changes but `updatedAt`).

        A new exclude list holds from the project's next capture or restore: this process's repositories
        learn it here, after the commit (a capture also reads it afresh with its thread)."""

        def rule(project: Project, now: datetime) -> Change:
            return rules.update_project(project, name, excludes, now)

        data = {"name": name or "", "excludes": excludes}
        await self._update(principal, "updateProject", project_id, key, data, rule)
        if excludes is not None:
            async with self.pipeline.db.read() as db:
                project = await thread_store.get_project(db, project_id)
            if project is not None:
                self.checkpoints.remember(project)
        return project_id

    async def archive_project(self, principal: Principal, project_id: uuid.UUID, key: str | None) -> uuid.UUID:
        return await self._update(principal, "archiveProject", project_id, key, {}, rules.archive_project)

    async def unarchive_project(self, principal: Principal, project_id: uuid.UUID, key: str | None) -> uuid.UUID:
        return await self._update(principal, "unarchiveProject", project_id, key, {}, rules.unarchive_project)

    async def check_runnable(self, principal: Principal, thread_id: uuid.UUID) -> None:
        """Refuse a message that would start work in an archived project or a missing workspace.

        Asked before the command, outside its transaction (the workspace is looked at on disk). A thread
        the caller may not operate on passes: the command itself answers NOT_FOUND or FORBIDDEN, so this
        tells nothing about another project.
        """
        async with self.pipeline.db.statements() as db:  # one statement: no transaction around it
            found = await project_store.project_of_thread(db, thread_id)
        if found is None or not principal.sees(found[0].id) or not principal.has(TokenScope.OPERATE):
            return
        project, own_folder = found
        status = None if own_folder else probe_workspace(project.workspace_root)
        rules.check_runnable(project, status, "threadId")


class TokenAdmin:
    def __init__(self, pipeline: Pipeline) -> None:
        self.pipeline = pipeline

    async def _project_exists(self, db: Reader, project_id: uuid.UUID | None) -> bool:
        return project_id is None or await thread_store.get_project(db, project_id) is not None

    async def list_tokens(
        self, principal: Principal, project_id: uuid.UUID | None, include_revoked: bool
    ) -> list[TokenInfo]:
        token_rules.require_manager(principal, project_id, "projectId")
        async with self.pipeline.db.read() as db:
            if not await self._project_exists(db, project_id):
                raise not_found("projectId")
            return await token_store.list_tokens(db, project_id, include_revoked=include_revoked)

    async def create_token(
        self,
        principal: Principal,
        *,
        project_id: uuid.UUID | None,
        name: str,
        scope: TokenScope,
        expires_in: int | None,
    ) -> tuple[TokenInfo, str]:
        """The new token and its secret (shown this once: only its hash is stored)."""
        now = self.pipeline.clock.now()
        wanted = token_rules.new_token(
            principal, name=name, scope=scope, project_id=project_id, expires_in=expires_in, now=now
        )
        async with self.pipeline.db.transaction() as db:
            if not await self._project_exists(db, project_id):
                raise not_found("projectId")
            return await token_store.create_token(
                db,
                name=wanted.name,
                scope=wanted.scope,
                project_id=wanted.project_id,
                now=now,
                expires_at=wanted.expires_at,
            )

    async def revoke_token(self, principal: Principal, token_id: uuid.UUID) -> TokenInfo:
        """Revoked at once: the next request with it is refused and its open sockets close."""
        now = self.pipeline.clock.now()
        async with self.pipeline.db.transaction() as db:
            found = await token_store.get_token(db, token_id, lock=True)
            token_rules.require_revocable(
                principal,
                None if found is None else found.project_id,
                None if found is None else found.revoked_at,
                exists=found is not None,
            )
            assert found is not None
            await token_store.revoke_token(db, token_id, now)
            return TokenInfo(
                found.id, found.name, found.scope, found.project_id, found.created_at, now, found.expires_at
            )

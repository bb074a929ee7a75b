"""Rules for projects."""

from __future__ import annotations

import posixpath
import uuid
from datetime import datetime

from threadloom.domain.changes import Change
from threadloom.domain.entities import Project
from threadloom.domain.errors import DomainError, ErrorCode

MAX_NAME = 200


def clean_name(name: str) -> str:
    cleaned = " ".join(name.split())
    if not cleaned:
        raise DomainError(ErrorCode.INVALID_INPUT, "name must not be blank", "name")
    if len(cleaned) > MAX_NAME:
        raise DomainError(ErrorCode.INVALID_INPUT, f"name is longer than {MAX_NAME} characters", "name")
    return cleaned


def clean_workspace_root(path: str) -> str:
    """An absolute, normalized POSIX path; the workspace agents work in."""
    if "\x00" in path or not path.startswith("/"):
        raise DomainError(ErrorCode.INVALID_INPUT, "workspaceRoot must be an absolute path", "workspaceRoot")
    if len(path) > 4096:
        raise DomainError(ErrorCode.INVALID_INPUT, "workspaceRoot is too long", "workspaceRoot")
    return posixpath.normpath(path)


def create_project(project_id: uuid.UUID, name: str, workspace_root: str, now: datetime) -> Change:
    project = Project(
        id=project_id,
        name=clean_name(name),
        workspace_root=clean_workspace_root(workspace_root),
        created_at=now,
        updated_at=now,
    )
    return Change("project.created", project)

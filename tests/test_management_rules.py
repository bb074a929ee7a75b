"""The management rules in `domain.projects` and `domain.tokens`, as tables: who may manage which tokens,
what a new token may be, and when a project may run. Pure functions: no server, no database."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from threadloom.domain import projects as rules
from threadloom.domain import tokens as token_rules
from threadloom.domain.access import Principal
from threadloom.domain.entities import Project
from threadloom.domain.errors import DomainError
from threadloom.domain.projects import WorkspaceStatus
from threadloom.domain.statuses import TokenScope
from threadloom.domain.tokens import TokenState

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
A, B = uuid.uuid4(), uuid.uuid4()


def who(scope: str, project: uuid.UUID | None) -> Principal:
    return Principal(token_id=uuid.uuid4(), scope=TokenScope(scope), project_id=project)


def code(action: object) -> str | None:
    try:
        action()  # type: ignore[operator]
    except DomainError as error:
        return error.code.value
    return None


def project(archived: bool = False) -> Project:
    return Project(
        id=A,
        name="A",
        workspace_root="/srv/a",
        created_at=NOW,
        updated_at=NOW,
        archived_at=NOW if archived else None,
    )


@pytest.mark.parametrize(
    ("caller", "target", "expected"),
    [
        (who("admin", None), A, None),  # an all-projects admin manages every project's tokens
        (who("admin", None), None, None),  # ... and the all-projects ones
        (who("admin", A), A, None),  # a project's admin manages its own
        (who("admin", A), B, "NOT_FOUND"),  # another project's: as if it did not exist
        (who("admin", A), None, "FORBIDDEN"),  # all-projects tokens: not a project's admin
        (who("operate", A), A, "FORBIDDEN"),  # below admin: visible, refused
        (who("read", None), A, "FORBIDDEN"),
        (who("operate", None), None, "FORBIDDEN"),
    ],
)
def test_who_manages_which_tokens(caller: Principal, target: uuid.UUID | None, expected: str | None) -> None:
    assert code(lambda: token_rules.require_manager(caller, target, "projectId")) == expected


@pytest.mark.parametrize(
    ("name", "expires_in", "expected"),
    [
        ("ci", None, None),
        ("ci", 1, None),
        ("ci", token_rules.MAX_EXPIRES_IN, None),
        ("ci", 0, "INVALID_INPUT"),
        ("ci", -5, "INVALID_INPUT"),
        ("ci", token_rules.MAX_EXPIRES_IN + 1, "INVALID_INPUT"),
        ("   ", None, "INVALID_INPUT"),
        ("x" * 201, None, "INVALID_INPUT"),
    ],
)
def test_what_a_new_token_may_be(name: str, expires_in: int | None, expected: str | None) -> None:
    def make() -> token_rules.NewToken:
        return token_rules.new_token(
            who("admin", A), name=name, scope=TokenScope.READ, project_id=A, expires_in=expires_in, now=NOW
        )

    assert code(make) == expected
    if expected is None:
        made = make()
        assert made.expires_at == (None if expires_in is None else NOW + timedelta(seconds=expires_in))


@pytest.mark.parametrize(
    ("caller", "token_project", "revoked", "exists", "expected"),
    [
        (who("admin", A), A, False, True, None),
        (who("admin", A), A, True, True, "TOKEN_REVOKED"),
        (who("admin", A), B, False, True, "NOT_FOUND"),
        (who("admin", A), None, False, True, "NOT_FOUND"),  # all-projects tokens are out of its reach
        (who("admin", A), A, False, False, "NOT_FOUND"),
        (who("operate", A), A, False, True, "FORBIDDEN"),
        (who("operate", A), B, False, True, "NOT_FOUND"),  # invisible before under-scoped
        (who("admin", None), None, False, True, None),
    ],
)
def test_who_may_revoke_which_token(
    caller: Principal, token_project: uuid.UUID | None, revoked: bool, exists: bool, expected: str | None
) -> None:
    revoked_at = NOW if revoked else None
    assert code(lambda: token_rules.require_revocable(caller, token_project, revoked_at, exists=exists)) == expected


@pytest.mark.parametrize(
    ("revoked_at", "expires_at", "state"),
    [
        (None, None, TokenState.ACTIVE),
        (None, NOW + timedelta(seconds=1), TokenState.ACTIVE),
        (None, NOW, TokenState.EXPIRED),
        (NOW, None, TokenState.REVOKED),
        (NOW, NOW - timedelta(days=1), TokenState.REVOKED),  # revoked wins over expired
    ],
)
def test_token_state_follows_revocation_then_expiry(
    revoked_at: datetime | None, expires_at: datetime | None, state: TokenState
) -> None:
    assert token_rules.token_state(revoked_at, expires_at, NOW) == state


@pytest.mark.parametrize(
    ("archived", "workspace", "expected"),
    [
        (False, WorkspaceStatus.OK, None),
        (False, None, None),  # a fork works in its own folder: the project's is not looked at
        (False, WorkspaceStatus.MISSING, "WORKSPACE_MISSING"),
        (False, WorkspaceStatus.NOT_A_DIRECTORY, "WORKSPACE_MISSING"),
        (True, WorkspaceStatus.OK, "PROJECT_ARCHIVED"),
        (True, WorkspaceStatus.MISSING, "PROJECT_ARCHIVED"),  # archived is said first
    ],
)
def test_when_a_project_may_run(archived: bool, workspace: WorkspaceStatus | None, expected: str | None) -> None:
    assert code(lambda: rules.check_runnable(project(archived), workspace, "threadId")) == expected


def test_archive_and_unarchive_each_refuse_twice_and_rename_keeps_the_root() -> None:
    archived = rules.archive_project(project(), NOW).entity
    assert isinstance(archived, Project) and archived.archived_at == NOW
    assert code(lambda: rules.archive_project(archived, NOW)) == "ALREADY_ARCHIVED"
    back = rules.unarchive_project(archived, NOW).entity
    assert isinstance(back, Project) and back.archived_at is None
    assert code(lambda: rules.unarchive_project(back, NOW)) == "NOT_ARCHIVED"
    renamed = rules.rename_project(project(), "  New   name ", NOW)
    assert renamed.event_type == "project.updated"
    assert isinstance(renamed.entity, Project)
    assert (renamed.entity.name, renamed.entity.workspace_root) == ("New name", "/srv/a")
    assert code(lambda: rules.rename_project(project(), "", NOW)) == "INVALID_INPUT"

"""Pure rules: no database, no server."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import orjson
import pytest

from threadloom.domain import projects, threads
from threadloom.domain.access import Principal
from threadloom.domain.entities import ENTITY_TYPES, AppThread, Project, Run
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import RunStatus, ThreadStatus, TokenScope

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def _project() -> Project:
    return projects.create_project(new_id(), "Demo", "/srv/demo", NOW).entity  # type: ignore[return-value]


def _thread(**kw: object) -> AppThread:
    change = threads.create_thread(
        thread_id=new_id(),
        project=_project(),
        title=kw.pop("title", "T"),  # type: ignore[arg-type]
        provider_instance_id="scripted",
        model=None,
        runtime_mode="full_access",
        now=NOW,
    )
    return change.entity.evolve(**kw)  # type: ignore[return-value]


def test_ids_are_time_ordered_and_unique() -> None:
    ids = [new_id() for _ in range(5000)]
    assert len(set(ids)) == 5000
    assert ids == sorted(ids)
    assert all(i.version == 7 for i in ids[:10])


def test_project_name_and_root_are_cleaned() -> None:
    change = projects.create_project(new_id(), "  My   project ", "/srv/a/../b/", NOW)
    assert isinstance(change.entity, Project)
    assert change.entity.name == "My project"
    assert change.entity.workspace_root == "/srv/b"
    assert change.event_type == "project.created"


@pytest.mark.parametrize(
    ("name", "root", "field"),
    [
        ("", "/srv", "name"),
        ("   ", "/srv", "name"),
        ("x" * 201, "/srv", "name"),
        ("ok", "relative/path", "workspaceRoot"),
        ("ok", "/bad\x00path", "workspaceRoot"),
    ],
)
def test_create_project_refuses_a_bad_name_or_root(name: str, root: str, field: str) -> None:
    with pytest.raises(DomainError) as err:
        projects.create_project(new_id(), name, root, NOW)
    assert err.value.code == ErrorCode.INVALID_INPUT
    assert err.value.field == field


def test_new_thread_is_lazy_and_titled() -> None:
    thread = _thread(title=None)
    assert thread.title == threads.DEFAULT_TITLE
    assert thread.active_provider_thread_id is None
    assert thread.active_run_id is None
    assert thread.root_thread_id == thread.id


def test_unknown_provider_instance_is_refused() -> None:
    with pytest.raises(DomainError) as err:
        threads.choose_provider_instance("nope", "scripted", ["scripted"])
    assert err.value.code == ErrorCode.UNKNOWN_PROVIDER_INSTANCE
    assert threads.choose_provider_instance(None, "scripted", ["scripted"]) == "scripted"


def test_archive_and_unarchive_refuse_a_wrong_state_or_busy_thread() -> None:
    thread = _thread()
    archived = threads.archive_thread(thread, NOW).entity
    assert isinstance(archived, AppThread) and archived.archived_at == NOW
    with pytest.raises(DomainError) as err:
        threads.archive_thread(archived, NOW)
    assert err.value.code == ErrorCode.ALREADY_ARCHIVED
    with pytest.raises(DomainError) as err:
        threads.unarchive_thread(thread, NOW)
    assert err.value.code == ErrorCode.NOT_ARCHIVED
    busy = thread.evolve(active_run_id=new_id())
    with pytest.raises(DomainError) as err:
        threads.archive_thread(busy, NOW)
    assert err.value.code == ErrorCode.THREAD_BUSY


def test_rename_rejects_a_blank_title() -> None:
    with pytest.raises(DomainError) as err:
        threads.rename_thread(_thread(), "  ", NOW)
    assert err.value.field == "title"


def test_thread_status_is_derived() -> None:
    assert threads.thread_status(None) == ThreadStatus.IDLE
    assert threads.thread_status("waiting") == ThreadStatus.WAITING


def test_token_scope_and_project_decide_access() -> None:
    project = uuid.uuid4()
    other = uuid.uuid4()
    reader = Principal(uuid.uuid4(), TokenScope.READ, project)
    with pytest.raises(DomainError) as err:
        reader.require_project(project, TokenScope.OPERATE, "threadId")
    assert err.value.code == ErrorCode.FORBIDDEN
    with pytest.raises(DomainError) as err:
        reader.require_project(other, TokenScope.READ, "threadId")
    assert err.value.code == ErrorCode.NOT_FOUND  # invisible looks absent
    admin = Principal(uuid.uuid4(), TokenScope.ADMIN, None)
    admin.require_global_admin()
    with pytest.raises(DomainError):
        Principal(uuid.uuid4(), TokenScope.ADMIN, project).require_global_admin()


def test_every_entity_round_trips_through_json() -> None:
    run = Run(
        id=new_id(),
        thread_id=new_id(),
        ordinal=3,
        provider_instance_id="scripted",
        model=None,
        status=RunStatus.QUEUED,
        requested_at=NOW,
    )
    again = Run.from_mapping(orjson.loads(orjson.dumps(run.to_payload())))
    assert again == run
    assert again.status is RunStatus.QUEUED
    assert {cls.entity_type for cls in ENTITY_TYPES} >= {"project", "thread", "run", "activity"}

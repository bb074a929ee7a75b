"""Rules for app threads: creation (provider work is lazy), rename, archive."""

from __future__ import annotations

import dataclasses
import posixpath
import uuid
from collections.abc import Collection, Sequence
from datetime import datetime

from threadloom.domain.changes import Change, EventVerb, NewId
from threadloom.domain.entities import AppThread, Project, ProviderThread, Run
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.labels import clean_label
from threadloom.domain.statuses import LineageRelationship, ProviderThreadStatus, ThreadStatus

MAX_TITLE = 200
MAX_MESSAGE = 200_000
MAX_MODEL = 200
DEFAULT_TITLE = "New thread"
FIRST_MESSAGE_TITLE = 60  # characters of a first message that title a thread created without one
# What an agent's commands may do (docs/providers.md, "Runtime modes"):
# workspace_write: run without asking, sandboxed to the project's workspace, no network (the default);
# approval_required: every command and file change asks first; read_only: nothing is written;
# full_access: no prompts and the network, only on instances whose configuration allows it.
RUNTIME_MODES = ("workspace_write", "approval_required", "read_only", "full_access")
DEFAULT_RUNTIME_MODE = "workspace_write"


def clean_title(title: str) -> str:
    return clean_label(title, "title", MAX_TITLE)


def clean_model(model: str | None) -> str | None:
    if model is None:
        return None
    cleaned = model.strip()
    if not cleaned or len(cleaned) > MAX_MODEL or any(c.isspace() for c in cleaned):
        raise DomainError(ErrorCode.INVALID_INPUT, "model must be a non-empty name without spaces", "model")
    return cleaned


def choose_provider_instance(requested: str | None, default: str, known: Collection[str]) -> str:
    instance = default if requested is None else requested
    if instance not in known:
        raise DomainError(
            ErrorCode.UNKNOWN_PROVIDER_INSTANCE,
            f"unknown provider instance {instance!r}; configured: {', '.join(sorted(known))}",
            "providerInstanceId",
        )
    return instance


def check_runtime_mode(runtime_mode: str, instance: str, full_access_instances: Collection[str]) -> None:
    """A known mode, and `full_access` only on an instance whose configuration allows it."""
    if runtime_mode not in RUNTIME_MODES:
        raise DomainError(ErrorCode.INVALID_INPUT, f"runtimeMode must be one of {RUNTIME_MODES}", "runtimeMode")
    if runtime_mode == "full_access" and instance not in full_access_instances:
        raise DomainError(
            ErrorCode.RUNTIME_MODE_NOT_ALLOWED,
            f"provider instance {instance!r} does not allow full_access (its configuration must set "
            "allow_full_access = true)",
            "runtimeMode",
        )


def create_thread(
    *,
    thread_id: uuid.UUID,
    project: Project,
    title: str | None,
    provider_instance_id: str,
    model: str | None,
    runtime_mode: str,
    now: datetime,
) -> Change:
    """A new thread holds no provider session or provider thread: both are made by the first run."""
    if runtime_mode not in RUNTIME_MODES:
        raise DomainError(ErrorCode.INVALID_INPUT, f"runtimeMode must be one of {RUNTIME_MODES}", "runtimeMode")
    thread = AppThread(
        id=thread_id,
        project_id=project.id,
        title=DEFAULT_TITLE if title is None else clean_title(title),
        provider_instance_id=provider_instance_id,
        model=clean_model(model),
        runtime_mode=runtime_mode,
        root_thread_id=thread_id,
        created_at=now,
        updated_at=now,
    )
    return Change.created(thread)


def descendant_thread(
    parent: AppThread,
    thread_id: uuid.UUID,
    title: str,
    lineage: LineageRelationship,
    now: datetime,
    forked_from_transfer_id: uuid.UUID | None = None,
) -> AppThread:
    """A thread made from `parent` (a subagent's, a fork): its project, provider, model and runtime mode,
    under `parent` in the lineage tree."""
    return AppThread(
        id=thread_id,
        project_id=parent.project_id,
        title=clean_title(title)[:MAX_TITLE],
        provider_instance_id=parent.provider_instance_id,
        model=parent.model,
        runtime_mode=parent.runtime_mode,
        parent_thread_id=parent.id,
        lineage_relationship=lineage,
        root_thread_id=parent.root_thread_id or parent.id,
        forked_from_transfer_id=forked_from_transfer_id,
        created_at=now,
        updated_at=now,
    )


def rename_thread(thread: AppThread, title: str, now: datetime) -> Change:
    return Change.of(EventVerb.RENAMED, thread.evolve(title=clean_title(title), updated_at=now))


def archive_thread(thread: AppThread, now: datetime) -> Change:
    if thread.archived_at is not None:
        raise DomainError(ErrorCode.ALREADY_ARCHIVED, "thread is already archived", "threadId")
    if thread.active_run_id is not None:
        raise DomainError(ErrorCode.THREAD_BUSY, "thread has an active run; stop it first", "threadId")
    return Change.of(EventVerb.ARCHIVED, thread.evolve(archived_at=now, updated_at=now))


def unarchive_thread(thread: AppThread, now: datetime) -> Change:
    if thread.archived_at is None:
        raise DomainError(ErrorCode.NOT_ARCHIVED, "thread is not archived", "threadId")
    return Change.of(EventVerb.UNARCHIVED, thread.evolve(archived_at=None, updated_at=now))


def thread_status(active_run_status: str | None) -> ThreadStatus:
    """Thread status is derived: idle, or the status of its active run.

    A run that has ended counts as none: an event's thread snapshot (replayed, or delivered late) names the
    run active then, and that run, read now, may be over — the thread is idle now, not an error.
    """
    if active_run_status is None or active_run_status not in _ACTIVE_STATUSES:
        return ThreadStatus.IDLE
    return ThreadStatus(active_run_status)


_ACTIVE_STATUSES = frozenset(s.value for s in ThreadStatus) - {ThreadStatus.IDLE.value}


@dataclasses.dataclass(frozen=True, slots=True)
class ThreadState:
    """What a run decision needs to know about a thread, read under its row lock."""

    thread: AppThread
    active: Run | None
    queue: Sequence[Run]  # queued runs by queue_position
    last_ordinal: int


def first_message_title(thread: AppThread, last_ordinal: int, text: str) -> str | None:
    """The title a thread gets from its first message, or None to keep the one it has.

    A thread created without a title (an ACP client's, the dashboard's with an empty field) is "New thread";
    its first message names it, so a list of threads is not a column of "New thread". Only the default title
    and only before the first run: a title someone chose, or one already earned, is never overwritten.
    """
    if thread.title != DEFAULT_TITLE or last_ordinal != 0:
        return None
    words = " ".join(text.split())
    if not words:
        return None
    if len(words) <= FIRST_MESSAGE_TITLE:
        return words
    cut = words[: FIRST_MESSAGE_TITLE - 1]
    if " " in cut[FIRST_MESSAGE_TITLE // 2 :]:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,.;:") + "…"


def clean_text(text: str) -> str:
    if not text.strip():
        raise DomainError(ErrorCode.INVALID_INPUT, "text must not be blank", "text")
    if len(text) > MAX_MESSAGE:
        raise DomainError(ErrorCode.INVALID_INPUT, f"text is longer than {MAX_MESSAGE} characters", "text")
    return text


# A thread's own workspace (a fork's, `forkThread(ownWorkspace: true)`) lives under the server's data dir,
# `<data dir>/workspaces/<project id>/forks/<thread id>`: never inside a tree any agent can write, so no
# agent can swap it (or a folder on its path) for a symlink to somewhere else.
WORKSPACES_DIR = "workspaces"  # the data dir's folder of threads' own workspaces
OWN_WORKSPACE_PREFIX = "forks"  # `AppThread.workspace_path` of a fork with its own folder: `forks/<thread id>`


def own_workspace_path(thread_id: uuid.UUID) -> str:
    """What a fork with a folder of its own stores as `workspace_path` (relative to its project's folder
    under the data dir); only whether it is set matters to where the folder is (`workspace_of`)."""
    return f"{OWN_WORKSPACE_PREFIX}/{thread_id}"


def own_workspaces_of(workspaces_root: str, project_id: uuid.UUID) -> str:
    """The folder holding a project's threads' own workspaces (`workspaces_root`: `<data dir>/workspaces`)."""
    return posixpath.join(workspaces_root, str(project_id), OWN_WORKSPACE_PREFIX)


def workspace_of(thread: AppThread, project_root: str, workspaces_root: str) -> str:
    """The folder the thread's agent works in: the project's workspace, or its own folder under the data dir.

    The own folder is derived from the project's and the thread's ids alone, never from the stored
    `workspace_path`: a fork made by an older release stored `.threadloom/forks/<id>`, a folder inside the
    project's workspace that any agent of the project can replace with a symlink, so that text is not a
    path the server follows (the fork's folder is made again under the data dir, `engine.checkpoints`).
    """
    if not thread.workspace_path:
        return project_root
    return posixpath.join(own_workspaces_of(workspaces_root, thread.project_id), str(thread.id))


def index_key(thread: AppThread) -> str | None:
    """The checkpoint index of a thread's own workspace (None: the project's shared index)."""
    return str(thread.id) if thread.workspace_path else None


def new_provider_thread(
    thread: AppThread, instance: str, now: datetime, new_id: NewId, *, first_run_ordinal: int | None = None
) -> ProviderThread:
    """A provider thread of `instance` for `thread`, not yet loaded: the agent's native thread is created lazily,
    by the first turn sent to it."""
    return ProviderThread(
        id=new_id(),
        provider_instance_id=instance,
        thread_id=thread.id,
        status=ProviderThreadStatus.NOT_LOADED,
        first_run_ordinal=first_run_ordinal,
        created_at=now,
        updated_at=now,
    )


def attach_provider_thread(
    thread: AppThread, current: ProviderThread | None, instance: str, now: datetime, new_id: NewId
) -> tuple[ProviderThread, list[Change]]:
    """The thread's provider thread for `instance`: `current` if it is of that instance, else a new one
    (not yet loaded: the agent's native thread is created lazily) made the thread's active one."""
    if current is not None and current.provider_instance_id == instance:
        return current, []
    created = new_provider_thread(thread, instance, now, new_id)
    return created, [
        Change.created(created),
        Change.updated(thread.evolve(active_provider_thread_id=created.id, updated_at=now)),
    ]


def replace_provider_thread(
    thread: AppThread, broken: ProviderThread, now: datetime, new_id: NewId
) -> tuple[ProviderThread, list[Change]]:
    """The native thread is gone for good: mark it broken and give the thread a fresh one."""
    replacement, changes = attach_provider_thread(thread, None, broken.provider_instance_id, now, new_id)
    return replacement, [Change.updated(broken.evolve(status=ProviderThreadStatus.ERROR, updated_at=now)), *changes]

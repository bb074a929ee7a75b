"""GraphQL object types for every entity of `threadloom.domain.entities`.

Scalars are plain attributes copied from the entity (cheap to resolve); relations are
async resolvers that go through the request's loaders. Every type is a Relay `Node`
with an opaque global id.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import operator
import typing
import uuid
from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime
from types import CoroutineType
from typing import Annotated, Any, ClassVar, Self, TypeVar, dataclass_transform

import sqlalchemy as sa
import strawberry
from strawberry.scalars import JSON

from threadloom.api import enums, vocab
from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.errors import ApiError
from threadloom.api.feed_cursor import encode_feed_cursor
from threadloom.api.pagination import paged
from threadloom.api.providers import ProviderInstance, provider_instances
from threadloom.api.usage import BigInt, Usage, load_usage, usage_of
from threadloom.domain import budgets as budget_rules
from threadloom.domain import checkpoints as checkpoint_rules
from threadloom.domain import entities as e
from threadloom.domain import leases
from threadloom.domain.activities import ActivityKind
from threadloom.domain.errors import DomainError
from threadloom.domain.projects import WorkspaceStatus
from threadloom.domain.records import Record
from threadloom.domain.statuses import BudgetWindow, RunStatus
from threadloom.domain.threads import thread_status
from threadloom.domain.usage import Totals
from threadloom.engine.project_admin import probe_workspace
from threadloom.store import entities as store_entities
from threadloom.store import tables as t
from threadloom.store import usage as ledger
from threadloom.store.events import project_head

E = TypeVar("E", bound="_Entity")


@strawberry.interface(description="An object with a global id (Relay).")
class Node:
    id: strawberry.ID


class _Entity:
    """Builds a GraphQL object from a projection row."""

    _record: ClassVar[type[Record]]
    _init_fields: ClassVar[tuple[str, ...]]

    @classmethod
    def table(cls) -> sa.Table:
        return t.PROJECTIONS[cls._record]

    @classmethod
    def from_row(cls, row: Mapping[Any, Any]) -> Self:
        if type(row) is not dict:
            row = dict(row)  # a database row's `in` and `[]` are slow: read every column once
        rec = cls._record.from_mapping(row)
        found = _INIT.get(cls)
        if found is None:
            record_fields = set(cls._record.field_names())
            fields = dataclasses.fields(cls)  # type: ignore[arg-type]
            names = tuple(f.name for f in fields if f.init and f.name in record_fields and f.name != "id")
            read: Callable[[Any], Any] | None = operator.attrgetter(*names) if names else None
            found = _INIT[cls] = (names, read, getattr(cls, "_row_extras", ()))
        names, read, extras = found
        values = {} if read is None else dict(zip(names, read(rec) if len(names) > 1 else (read(rec),), strict=True))
        for k in extras:
            if k in row:
                values[k] = row[k]
        return cls(id=gid.encode(cls.__name__, rec.id), rec=rec, **values)  # type: ignore[call-arg]


# By GraphQL type: the record fields its constructor takes, a getter of their values, and its row extras.
_INIT: dict[type, tuple[tuple[str, ...], Callable[[Any], Any] | None, tuple[str, ...]]] = {}


def _is_reference(hint: Any) -> bool:
    return hint is uuid.UUID or hint == uuid.UUID | None


@dataclass_transform(kw_only_default=True)
def _entity(record: type[Record], *, hide: tuple[str, ...] = ()) -> Callable[[type[E]], type[E]]:
    """The GraphQL type of `record`: a Strawberry type exposing the record's own fields.

    A field is declared once, on its entity. The type gets every field of the record except
    `id` (the global id replaces it), references (UUID fields: the class names those objects
    as relation fields), `hide`, and what the class declares itself (a description, a resolver).
    Json fields become the JSON scalar. The schema drift test shows any change this makes.
    """

    def wrap(cls: type[E]) -> type[E]:
        hints = typing.get_type_hints(record)
        own = inspect.get_annotations(cls)
        derived = {
            f.name: JSON | None if hints[f.name] is Any else hints[f.name]
            for f in dataclasses.fields(record)
            if f.name != "id"
            and f.name not in hide
            and f.name not in own
            and f.name not in cls.__dict__
            and not _is_reference(hints[f.name])
        }
        cls.__annotations__ = {**derived, **own}
        cls._record = record
        return strawberry.type(cls)

    return wrap


async def _load(info: Info, cls: type[E], entity_id: uuid.UUID | None) -> E | None:
    """Load an object of the same project as its parent (no visibility re-check needed)."""
    found = _load_now(info, cls, entity_id)
    return await found if _pending(found) else typing.cast("E | None", found)


def _pending(value: object) -> typing.TypeGuard[Awaitable[Any]]:
    """Whether `_load_now` answered with a pending load (its coroutine): cheaper to ask than
    `inspect.isawaitable`, which goes through the Awaitable ABC for every object of a page."""
    return isinstance(value, CoroutineType)


def _load_now(info: Info, cls: type[E], entity_id: uuid.UUID | None) -> E | Awaitable[E | None] | None:
    """`_load`, answered at once when the id is null or the request's loader already holds the row.

    A page of threads names the same project (and often no active run) on every item: answering
    those without a coroutine saves graphql-core a task per field per item.
    """
    if entity_id is None:
        return None
    pending = info.context.loaders.rows(cls.table()).load(entity_id)
    if isinstance(pending, asyncio.Future) and pending.done() and not pending.cancelled():
        row = pending.result()
        if row is None:
            return None
        built = info.context.loaders.built
        found = built.get((cls, entity_id))
        if found is not None and found[0] is row:
            return typing.cast(E, found[1])
        obj = cls.from_row(row)
        built[(cls, entity_id)] = (row, obj)
        return obj
    return _built(pending, cls)


def link(info: Info, type_name: str, entity_id: uuid.UUID | None) -> Any:
    """The object of `type_name` with this id through the request's loaders (batched; no visibility check:
    for objects of the parent's own thread). A value, or an awaitable graphql-core awaits."""
    return _load_now(info, NODE_TYPES[type_name], entity_id)


async def _built(pending: Awaitable[Any], cls: type[E]) -> E | None:
    row = await pending
    return None if row is None else cls.from_row(row)


async def _load_visible(info: Info, cls: type[E], entity_id: uuid.UUID | None) -> E | None:
    """Load an object that may live in another project: checked against the token."""
    row = await info.context.load_visible(cls.table(), entity_id)
    return None if row is None else cls.from_row(row)


async def _children(info: Info, cls: type[E], relation: str, parent: uuid.UUID) -> list[E]:
    rows = await info.context.loaders.children(relation).load(parent)
    return [cls.from_row(r) for r in rows]


def _one(
    type_name: str, attr: str, *, visible: bool = False, required: bool = False, description: str | None = None
) -> Any:
    """A field naming one object by the id in `self.rec.<attr>` (the field's annotation gives its type).

    `visible`: the object may live in another project, so it is checked against the token.
    `required`: the id is never null (the annotation is non-null).
    """

    async def resolve_visible(self: Any, info: Info) -> Any:
        found = await _load_visible(info, NODE_TYPES[type_name], getattr(self.rec, attr))
        assert found is not None or not required, f"{type_name} {attr} missing"
        return found

    def resolve(self: Any, info: Info) -> Any:
        # Synchronous when the loader already holds the row (see `_load_now`), else a coroutine.
        found = _load_now(info, NODE_TYPES[type_name], getattr(self.rec, attr))
        if _pending(found):
            return _required(found, type_name, attr) if required else found
        assert found is not None or not required, f"{type_name} {attr} missing"
        return found

    chosen = resolve_visible if visible else resolve
    chosen.__name__ = attr
    return strawberry.field(resolver=chosen, description=description)


async def _required(found: Awaitable[Any], type_name: str, attr: str) -> Any:
    value = await found
    assert value is not None, f"{type_name} {attr} missing"
    return value


def _many(type_name: str, relation: str, *, description: str | None = None) -> Any:
    """A list field of the children of `self` along a loader relation."""

    async def resolve(self: Any, info: Info) -> Any:
        return await _children(info, NODE_TYPES[type_name], relation, self.rec.id)

    resolve.__name__ = relation.replace(".", "_")
    return strawberry.field(resolver=resolve, description=description)


def _many_ids(info: Info, cls: type[E], ids: object) -> Awaitable[list[E | None]] | list[E | None]:
    """The objects named by a JSON list of ids, in its order (one batched load for every parent)."""
    found = [_load_now(info, cls, _uuid_or_none(i)) for i in ids] if isinstance(ids, list) else []
    if not any(_pending(f) for f in found):
        return typing.cast("list[E | None]", found)
    return _gathered(found)


async def _gathered(found: list[Any]) -> list[Any]:
    return [await f if _pending(f) else f for f in found]


def _uuid_or_none(value: object) -> uuid.UUID | None:
    try:
        return uuid.UUID(str(value)) if value is not None else None
    except ValueError:
        return None


def _provider_instance(
    description: str = "The configured provider instance of `providerInstanceId`; null when this server no longer "
    "configures it.",
) -> Any:
    """`providerInstance` beside a `providerInstanceId`: read from the server's configuration (no statement)."""

    def resolve(self: Any, info: Info) -> ProviderInstance | None:
        built = info.context.loaders.built
        found = built.get((ProviderInstance, None))
        if found is None:
            found = built[(ProviderInstance, None)] = (None, {p.id: p for p in provider_instances(info)})
        return typing.cast("dict[str, ProviderInstance]", found[1]).get(self.rec.provider_instance_id)

    resolve.__name__ = "provider_instance"
    return strawberry.field(resolver=resolve, description=description)


def _mode(attr: str = "runtime_mode", description: str | None = None) -> Any:
    """The typed `RuntimeMode` of a stored runtime mode string."""

    def resolve(self: Any) -> vocab.RuntimeMode | None:
        return vocab.runtime_mode(getattr(self.rec, attr))

    resolve.__name__ = "mode"
    return strawberry.field(resolver=resolve, description=description)


_MODE_STRING = "Use `mode` (the RuntimeMode enum)."


@_entity(e.Project)
class Project(Node, _Entity):
    rec: strawberry.Private[e.Project]
    archived_at: datetime | None = strawberry.field(
        description="Set while the project is archived (`archiveProject`): left out of `projects`, runs refused."
    )
    excludes: list[str] | None = strawberry.field(
        description="The project's own checkpoint exclude list (gitignore patterns), set by "
        "`updateProject(excludes:)`; null: its checkpoints use the server's THREADLOOM_CHECKPOINT_EXCLUDES."
    )

    @strawberry.field(
        description="What the server finds at `workspaceRoot` now: OK, MISSING (deleted, or a link to nothing) or "
        "NOT_A_DIRECTORY. Unless OK, a message to a thread working there is refused with WORKSPACE_MISSING."
    )
    def workspace_status(self) -> WorkspaceStatus:
        return probe_workspace(self.rec.workspace_root)

    @paged("project.threads", "Thread")
    def threads(self, info: Info, include_archived: bool = False) -> dict[str, Any]:
        return {"include_archived": include_archived}

    @strawberry.field(
        description="What every model call of the project's threads used and cost (docs/usage.md); by day, thread, "
        "model or instance: `usage(projectId:)`."
    )
    async def usage(self, info: Info) -> Usage:
        return await load_usage(info, "projects", self.rec.id)

    @strawberry.field(description="The project's own budgets (`setBudget(projectId:)`), not cleared, oldest first.")
    async def budgets(self, info: Info) -> list[Budget]:
        return await budgets_of(info, self.rec.id, None)

    @strawberry.field(description="The projectThreads position now: query, then subscribe with after: feedCursor.")
    async def feed_cursor(self, info: Info) -> str:
        async with info.context.loaders.reader() as db:  # the query's snapshot: agrees with its data
            head = await project_head(db, self.rec.id)
        return encode_feed_cursor(head)


@strawberry.type
class Lineage:
    relationship: enums.LineageRelationship | None
    rec: strawberry.Private[e.AppThread]
    parent_thread: Thread | None = _one("Thread", "parent_thread_id", visible=True)
    root_thread: Thread | None = _one("Thread", "root_thread_id", visible=True)
    forked_from: ContextTransfer | None = _one(
        "ContextTransfer",
        "forked_from_transfer_id",
        visible=True,
        description="The transfer this thread was forked through, if it is a fork.",
    )

    @paged("thread.forks", "Thread", description="The threads forked from this one, oldest first.")
    def forks(self, info: Info, include_archived: bool = False) -> dict[str, Any]:
        return {"include_archived": include_archived}

    @paged(
        "thread.delegated",
        "Thread",
        description="The threads this one delegated tasks to (`delegateTask`, or its agent's subagents), oldest first.",
    )
    def delegated_children(self, info: Info, include_archived: bool = False) -> dict[str, Any]:
        return {"include_archived": include_archived}

    @paged(
        "thread.transfers",
        "ContextTransfer",
        description="The merge-backs this thread made (a fork merging into its source) or received (a source a "
        "fork merged into), oldest first.",
    )
    def merge_backs(self, info: Info) -> dict[str, Any]:
        return {"type": enums.TransferType.MERGE_BACK.value}


@strawberry.type(
    description="Who drives a thread (its writer lease): while it is live, writes from anyone else are refused with "
    "WRITER_LEASE_HELD; watching is open to all (docs/leases.md)."
)
class ThreadLease:
    device_id: str = strawberry.field(description="The device the holder named (`Threadloom-Device`, `deviceId`).")
    token_name: str = strawberry.field(description="The name of the holder's API token (never the token itself).")
    expires_at: datetime = strawberry.field(description="When the lease runs out unless `renewThreadLease` extends it.")


_LEASE_FIELDS = ("lease_token_name", "lease_device_id", "lease_expires_at")


@_entity(e.AppThread, hide=("lineage_relationship", *_LEASE_FIELDS))  # `lineage`, `lease`
class Thread(Node, _Entity):
    _row_extras = ("last_sequence",)
    rec: strawberry.Private[e.AppThread]
    last_sequence: strawberry.Private[int] = 0
    runtime_mode: str = strawberry.field(
        description="The runtime mode of the thread's next runs, as a string.", deprecation_reason=_MODE_STRING
    )
    mode: vocab.RuntimeMode = _mode(description="The runtime mode of the thread's next runs (`setRuntimeMode`).")
    provider_instance: ProviderInstance | None = _provider_instance()
    project: Project = _one("Project", "project_id", required=True)
    active_run: Run | None = _one("Run", "active_run_id")
    queue: list[Run] = _many("Run", "thread.queue", description="Queued runs in the order they will start.")
    pending_requests: list[RuntimeRequest] = _many(
        "RuntimeRequest", "thread.pendingRequests", description="Approvals and questions waiting for an answer."
    )
    provider_threads: list[ProviderThread] = _many("ProviderThread", "thread.providerThreads")

    @strawberry.field(
        description="What the thread's model calls used and cost, its delegated tasks' (and theirs) included; its "
        "forks are counted apart, in `forksUsage`."
    )
    async def usage(self, info: Info) -> Usage:
        return await load_usage(info, "threads", self.rec.id)

    @strawberry.field(
        description="The thread's own budgets (`setBudget(threadId:)`), not cleared, oldest first; the project's "
        "are on `project.budgets`."
    )
    async def budgets(self, info: Info) -> list[Budget]:
        return await budgets_of(info, self.rec.project_id, self.rec.id)

    @strawberry.field(
        description="What the threads forked from this one used and cost: its forks, their forks and their delegated "
        "tasks (not in `usage`)."
    )
    async def forks_usage(self, info: Info) -> Usage:
        return await load_usage(info, "forks", self.rec.id)

    @paged("thread.checkpoints", "Checkpoint", description="Every checkpoint of the thread's files, oldest first.")
    def checkpoints(self, info: Info) -> dict[str, Any]:
        return {}

    @strawberry.field(
        description="The thread's live writer lease: who drives it and until when; null when no one does."
    )
    def lease(self, info: Info) -> ThreadLease | None:
        # Nothing here depends on who asks: stream cohorts share one execution among subscribers
        # (api/cohorts.py), so a client tells its own lease by its device id.
        live = leases.holder(self.rec, info.context.services.clock.now())
        if live is None:
            return None
        return ThreadLease(device_id=live.device_id, token_name=live.token_name, expires_at=live.expires_at)

    @strawberry.field(description="The sequence of the newest event in this thread's log.")
    def latest_sequence(self) -> int:
        return self.last_sequence

    @strawberry.field(
        description="IDLE, or the status of the active run; ROLLING_BACK while a rollbackToRun is carried out.",
        graphql_type=enums.ThreadStatus,
    )
    def status(self, info: Info) -> Any:
        if self.rec.rollback_operation_id is not None:
            return enums.ThreadStatus.ROLLING_BACK
        # Synchronous for an idle thread or a run already loaded (see `_load_now`).
        run = _load_now(info, Run, self.rec.active_run_id)
        if _pending(run):
            return _status_of(run)
        return thread_status(None if run is None else typing.cast(Run, run).rec.status.value)

    @paged("thread.runs", "Run")
    def runs(self, info: Info) -> dict[str, Any]:
        return {}

    @paged("thread.messages", "ConversationMessage")
    def messages(self, info: Info) -> dict[str, Any]:
        return {}

    @paged("thread.activities", "Activity")
    def activities(
        self, info: Info, run_id: strawberry.ID | None = None, node_id: strawberry.ID | None = None
    ) -> dict[str, Any]:
        return {
            "run_id": None if run_id is None else gid.maybe_as(run_id, "Run") or uuid.UUID(int=0),
            "node_id": None if node_id is None else gid.maybe_as(node_id, "ExecutionNode") or uuid.UUID(int=0),
        }

    @strawberry.field(description="The thread's plan view: the newest todo list of a run's root turn.")
    async def todo_list(self, info: Info) -> PlanArtifact | None:
        for plan in reversed(await _children(info, PlanArtifact, "thread.todoLists", self.rec.id)):
            run = await _load(info, Run, plan.rec.run_id)
            if run is not None and plan.rec.node_id == run.rec.root_node_id:
                return plan
        return None

    @strawberry.field
    def lineage(self) -> Lineage:
        return Lineage(relationship=self.rec.lineage_relationship, rec=self.rec)

    @paged(
        "thread.transfers",
        "ContextTransfer",
        description="Context transfers into and out of this thread (forks, provider handoffs, merge-backs, delegated "
        "tasks and their results), oldest first; `type` filters.",
    )
    def context_transfers(self, info: Info, type: enums.TransferType | None = None) -> dict[str, Any]:
        return {"type": None if type is None else enums.member(enums.TransferType, type).value}

    @strawberry.field(
        description="Context transfers into and out of this thread, oldest first; `type` filters. Unpaged.",
        deprecation_reason="Use `contextTransfers`, a connection with the same items and `type` filter.",
    )
    async def transfers(self, info: Info, type: enums.TransferType | None = None) -> list[ContextTransfer]:
        both = [
            *await _children(info, ContextTransfer, "thread.transfersIn", self.rec.id),
            *await _children(info, ContextTransfer, "thread.transfersOut", self.rec.id),
        ]
        wanted = None if type is None else enums.member(enums.TransferType, type)
        unique = {x.rec.id: x for x in both if wanted is None or x.rec.type == wanted}
        return sorted(unique.values(), key=lambda x: (x.rec.created_at, str(x.rec.id)))


async def _status_of(pending: Awaitable[Run | None]) -> enums.ThreadStatus:
    run = await pending
    return thread_status(None if run is None else run.rec.status.value)


@strawberry.type(description="A parent→child link of the execution graph; both ends are nodes of the graph.")
class ExecutionEdge:
    # The graph primed the row loader with its nodes: no statement unless the parent lives
    # outside this run.
    rec: strawberry.Private[e.ExecutionNode]
    parent: ExecutionNode = _one("ExecutionNode", "parent_node_id", required=True)
    child: ExecutionNode = _one("ExecutionNode", "id", required=True)


@strawberry.type
class ExecutionGraph:
    nodes: list[ExecutionNode]
    edges: list[ExecutionEdge]


@strawberry.type(description="Why a FAILED run failed: a stable code, and what the agent said.")
class RunFailure:
    code: enums.RunFailureCode
    http_status: int | None = strawberry.field(
        description="The model API's HTTP status when the agent's CLI reported one (MODEL_* codes only)."
    )
    message: str | None = strawberry.field(description="The run's statusReason: the agent's or engine's words.")


@_entity(e.Run, hide=("failure_code", "failure_http_status"))
class Run(Node, _Entity):
    rec: strawberry.Private[e.Run]
    thread: Thread = _one("Thread", "thread_id", required=True)
    attempts: list[RunAttempt] = _many("RunAttempt", "run.attempts")
    active_attempt: RunAttempt | None = _one("RunAttempt", "active_attempt_id")
    root_node: ExecutionNode | None = _one("ExecutionNode", "root_node_id")
    user_message: ConversationMessage | None = _one("ConversationMessage", "user_message_id")
    supersedes_run: Run | None = _one("Run", "supersedes_run_id")
    provider_thread: ProviderThread | None = _one("ProviderThread", "provider_thread_id")
    checkpoint: Checkpoint | None = _one("Checkpoint", "checkpoint_id")
    provider_instance: ProviderInstance | None = _provider_instance()
    plans: list[PlanArtifact] = _many("PlanArtifact", "run.plans")
    runtime_requests: list[RuntimeRequest] = _many("RuntimeRequest", "run.requests")
    usage_records: list[UsageRecord] = _many(
        "UsageRecord", "run.usageRecords", description="The run's model calls, one record each, oldest first."
    )
    context_transfers: list[ContextTransfer] = _many(
        "ContextTransfer", "run.contextTransfers", description="The transfers this run resolved or consumed."
    )

    @strawberry.field(
        description="The context handoff this run received with its first turn, whatever made it: a provider switch, "
        "a fork, a merge-back, a rollback or a provider thread replaced for new settings. Null: the run's provider "
        "thread already held the conversation."
    )
    async def context_handoff(self, info: Info) -> ContextHandoff | None:
        if self.rec.context_handoff_id is not None:
            return await _load(info, ContextHandoff, self.rec.context_handoff_id)
        found = await _children(info, ContextHandoff, "run.handoffs", self.rec.id)
        return found[-1] if found else None

    @strawberry.field(
        description="The threads forked at this run (`forkThread` with this run as the point), oldest "
        "first, archived ones included."
    )
    async def forks(self, info: Info) -> list[Thread]:
        rows = await info.context.loaders.forks_of_runs().load(self.rec.id)
        return [Thread.from_row(r) for r in rows]

    @strawberry.field
    def queue_position(self, info: Info) -> int | None:
        # Counted at read time from the queue's order (`store.runs.queue_positions`): the stored
        # column is an order key that starting or cancelling another run does not rewrite.
        if self.rec.status != RunStatus.QUEUED:
            return None
        return _queue_position(info, self.rec)  # type: ignore[return-value]  # graphql-core awaits it

    @strawberry.field(
        description="Set on a FAILED run (null otherwise, and on runs that failed before failure codes were "
        "recorded): why it failed, as a stable code a client can act on. Recorded when the run ended."
    )
    def failure(self) -> RunFailure | None:
        if self.rec.failure_code is None:
            return None
        return RunFailure(
            code=self.rec.failure_code, http_status=self.rec.failure_http_status, message=self.rec.status_reason
        )

    @strawberry.field(
        description="What the run's model calls used and cost, every attempt's, the tasks it delegated included "
        "(docs/usage.md)."
    )
    async def usage(self, info: Info) -> Usage:
        return await load_usage(info, "runs", self.rec.id)

    @strawberry.field(description="Every node of every attempt of this run, and the parent→child edges.")
    async def execution_graph(self, info: Info) -> ExecutionGraph:
        rows = await info.context.loaders.children("run.nodes").load(self.rec.id)
        info.context.loaders.rows(t.execution_nodes).prime_many({r["id"]: r for r in rows})
        nodes = [ExecutionNode.from_row(r) for r in rows]
        edges = [ExecutionEdge(rec=n.rec) for n in nodes if n.rec.parent_node_id is not None]
        return ExecutionGraph(nodes=nodes, edges=edges)


async def _queue_position(info: Info, run: e.Run) -> int | None:
    places = await info.context.loaders.queue_positions().load(run.thread_id)
    return places.get(run.id)


@_entity(e.RunAttempt)
class RunAttempt(Node, _Entity):
    rec: strawberry.Private[e.RunAttempt]
    run: Run = _one("Run", "run_id", required=True)
    thread: Thread = _one("Thread", "thread_id", required=True)
    root_node: ExecutionNode | None = _one("ExecutionNode", "root_node_id")
    provider_turns: list[ProviderTurn] = _many("ProviderTurn", "attempt.turns")
    provider_thread: ProviderThread | None = _one(
        "ProviderThread", "provider_thread_id", description="The provider thread the attempt ran its turn on."
    )
    provider_turn: ProviderTurn | None = _one(
        "ProviderTurn", "provider_turn_id", description="The attempt's own provider turn (its root turn)."
    )

    @strawberry.field(description="What this attempt's model calls used and cost (its subagents' included).")
    async def usage(self, info: Info) -> Usage:
        return await load_usage(info, "attempts", self.rec.id)


@_entity(e.ExecutionNode)
class ExecutionNode(Node, _Entity):
    rec: strawberry.Private[e.ExecutionNode]
    parent: ExecutionNode | None = _one("ExecutionNode", "parent_node_id")
    children: list[ExecutionNode] = _many("ExecutionNode", "node.children")
    run: Run = _one("Run", "run_id", required=True)
    thread: Thread = _one("Thread", "thread_id", required=True)
    attempt: RunAttempt | None = _one("RunAttempt", "attempt_id")
    provider_turn: ProviderTurn | None = _one(
        "ProviderTurn", "provider_turn_id", description="The provider turn this node is (turn and subagent nodes)."
    )
    runtime_request: RuntimeRequest | None = _one("RuntimeRequest", "runtime_request_id")
    checkpoint_scope: CheckpointScope | None = _one(
        "CheckpointScope",
        "checkpoint_scope_id",
        description="The checkpoint scope of this node's work: the run's root scope, or a subagent's own.",
    )
    child_thread: Thread | None = _one(
        "Thread", "child_thread_id", visible=True, description="The delegated child thread of a subagent node."
    )

    @strawberry.field(
        description="What the model calls of this node and every node below it used and cost, a delegated task's "
        "thread included when this node started it."
    )
    async def usage(self, info: Info) -> Usage:
        return await load_usage(info, "nodes", self.rec.id)


@_entity(e.ConversationMessage)
class ConversationMessage(Node, _Entity):
    rec: strawberry.Private[e.ConversationMessage]
    run: Run | None = _one("Run", "run_id")
    thread: Thread = _one("Thread", "thread_id", required=True)


@_entity(e.ProviderSession, hide=("lease_expires_at",))  # ownership has no expiry: see `owner`
class ProviderSession(Node, _Entity):
    rec: strawberry.Private[e.ProviderSession]
    provider_instance: ProviderInstance | None = _provider_instance()
    owner: str | None = strawberry.field(
        description="The server process holding the live runtime. Ownership lasts as long as that process holds "
        "its advisory lock in PostgreSQL, so it has no expiry time."
    )


@strawberry.type
class _InRun:
    """The fields of objects made within a run, at one of its nodes (not a schema type itself)."""

    run: Run | None = _one("Run", "run_id")
    node: ExecutionNode | None = _one("ExecutionNode", "node_id")
    thread: Thread = _one("Thread", "thread_id", required=True)


@_entity(e.ProviderThread)
class ProviderThread(Node, _Entity):
    rec: strawberry.Private[e.ProviderThread]
    model: str | None = strawberry.field(
        description="The model it last ran a turn with; null: the instance's default model, or no turn yet."
    )
    runtime_mode: str | None = strawberry.field(
        description="The runtime mode it last ran a turn with; null: no turn yet.", deprecation_reason=_MODE_STRING
    )
    mode: vocab.RuntimeMode | None = _mode(
        description="The runtime mode it last ran a turn with; null: no turn yet. A run asking for a model or "
        "runtime mode its driver cannot change on a live provider thread starts a new one (docs/providers.md)."
    )
    provider_instance: ProviderInstance | None = _provider_instance()
    thread: Thread = _one("Thread", "thread_id", required=True)
    owner_node: ExecutionNode | None = _one(
        "ExecutionNode",
        "owner_node_id",
        description="The subagent node whose provider thread this is; null for the thread's own.",
    )
    forked_from: ProviderThread | None = _one("ProviderThread", "forked_from_provider_thread_id", visible=True)
    session: ProviderSession | None = _one("ProviderSession", "session_id", visible=True)

    @paged("providerThread.turns", "ProviderTurn", description="Its provider turns, in order.")
    def turns(self, info: Info) -> dict[str, Any]:
        return {}

    @paged("providerThread.runs", "Run", description="The runs that ran on it (`Run.providerThread`), in order.")
    def runs(self, info: Info) -> dict[str, Any]:
        return {}


@_entity(e.ProviderTurn)
class ProviderTurn(Node, _Entity):
    rec: strawberry.Private[e.ProviderTurn]
    attempt: RunAttempt | None = _one("RunAttempt", "run_attempt_id")
    node: ExecutionNode | None = _one("ExecutionNode", "node_id")
    provider_thread: ProviderThread | None = _one("ProviderThread", "provider_thread_id")
    thread: Thread = _one("Thread", "thread_id", required=True)


@strawberry.type(description="A point at a run: the run, and the checkpoint of its files the point names (a fork's).")
class RunPoint:
    run: Run
    checkpoint: Checkpoint | None = strawberry.field(
        description="The checkpoint the point names (a fork point's files); null when it names none."
    )


@strawberry.type(description="A point at one node of a run's execution graph.")
class NodePoint:
    node: ExecutionNode


@strawberry.type(description="A point inside a provider thread's conversation, after the turn `turnIndex`.")
class ProviderTurnPoint:
    provider_thread: ProviderThread
    turn_index: int | None = strawberry.field(
        description="The ordinal of the provider turn the point is after (`ProviderTurn.ordinal`); null: its latest."
    )


@strawberry.type(description="A point at a checkpoint of a thread's files.")
class CheckpointPoint:
    checkpoint: Checkpoint


TransferPoint = Annotated[
    RunPoint | NodePoint | ProviderTurnPoint | CheckpointPoint,
    strawberry.union(
        "TransferPoint",
        description="Where a context transfer starts or is based: a run, a node, a provider turn or a checkpoint.",
    ),
]


async def _point(info: Info, stored: object) -> RunPoint | NodePoint | ProviderTurnPoint | CheckpointPoint | None:
    """The typed point of a transfer's stored `sourcePoint`/`basePoint` JSON (ids as UUID strings): the most
    specific place it names, a run, else a node, a checkpoint, a provider thread; null when it names none of
    them (a provider switch records a reason, not a place) or the object is not visible. Each point is
    `strawberry.cast`: the union's type resolver then needs no structural match (as for `ActivityItem`)."""
    point = stored if isinstance(stored, Mapping) else {}
    run_id, checkpoint_id = _uuid_or_none(point.get("runId")), _uuid_or_none(point.get("checkpointId"))
    node_id, provider_thread_id = _uuid_or_none(point.get("nodeId")), _uuid_or_none(point.get("providerThreadId"))
    if run_id is not None:
        run, checkpoint = await asyncio.gather(
            _load_visible(info, Run, run_id), _load_visible(info, Checkpoint, checkpoint_id)
        )
        return None if run is None else strawberry.cast(RunPoint, RunPoint(run=run, checkpoint=checkpoint))
    if node_id is not None:
        node = await _load_visible(info, ExecutionNode, node_id)
        return None if node is None else strawberry.cast(NodePoint, NodePoint(node=node))
    if checkpoint_id is not None:
        checkpoint = await _load_visible(info, Checkpoint, checkpoint_id)
        return None if checkpoint is None else strawberry.cast(CheckpointPoint, CheckpointPoint(checkpoint=checkpoint))
    if provider_thread_id is not None:
        pt = await _load_visible(info, ProviderThread, provider_thread_id)
        index = point.get("turnIndex")
        turn_index = index if isinstance(index, int) and not isinstance(index, bool) else None
        if pt is None:
            return None
        return strawberry.cast(ProviderTurnPoint, ProviderTurnPoint(provider_thread=pt, turn_index=turn_index))
    return None


_POINT_JSON = "Use `{}` (a typed TransferPoint whose objects resolve without ids)."


@_entity(e.ContextTransfer, hide=("fork_context",))  # the fork's frozen context: `handoff` shows what went
class ContextTransfer(Node, _Entity):
    rec: strawberry.Private[e.ContextTransfer]
    source_point: JSON | None = strawberry.field(
        description="Where the transfer starts, as stored JSON (raw UUIDs).",
        deprecation_reason=_POINT_JSON.format("source"),
    )
    base_point: JSON | None = strawberry.field(
        description="What the transfer is based on, as stored JSON (raw UUIDs).",
        deprecation_reason=_POINT_JSON.format("base"),
    )
    source_thread: Thread | None = _one("Thread", "source_thread_id", visible=True)
    target_thread: Thread | None = _one("Thread", "thread_id", visible=True)
    target_run: Run | None = _one("Run", "target_run_id", visible=True)

    @strawberry.field(
        description="Where the transfer starts: a fork's point (a run and its checkpoint), a merge-back's latest "
        "run of the fork, a delegated task's finished run; null when it names no place (a provider switch)."
    )
    async def source(self, info: Info) -> TransferPoint | None:
        return await _point(info, self.rec.source_point)

    @strawberry.field(
        description="What the transfer is based on: a merge-back's fork point in the thread merged into; null "
        "for the other types."
    )
    async def base(self, info: Info) -> TransferPoint | None:
        return await _point(info, self.rec.base_point)

    @strawberry.field(description="The run of the source thread the transfer starts from (a fork point), if any.")
    async def source_run(self, info: Info) -> Run | None:
        point = self.rec.source_point if isinstance(self.rec.source_point, dict) else {}
        try:
            run_id = uuid.UUID(str(point["runId"]))
        except (KeyError, ValueError):
            return None
        return await _load_visible(info, Run, run_id)

    @strawberry.field(description="Exactly the context given to the provider for this transfer (portable resolution).")
    async def handoff(self, info: Info) -> ContextHandoff | None:
        found = await _children(info, ContextHandoff, "transfer.handoffs", self.rec.id)
        return found[-1] if found else None


@_entity(e.ContextHandoff, hide=("from_provider_thread_ids", "covered_run_ordinals", "omitted_run_ordinals"))
class ContextHandoff(Node, _Entity):
    rec: strawberry.Private[e.ContextHandoff]
    text: str = strawberry.field(description="Exactly the context the provider received.")
    transfer: ContextTransfer | None = _one("ContextTransfer", "transfer_id", visible=True)
    target_run: Run | None = _one("Run", "target_run_id")
    thread: Thread = _one("Thread", "thread_id", required=True)
    to_provider_thread: ProviderThread | None = _one(
        "ProviderThread", "to_provider_thread_id", description="The provider thread the handoff went (or goes) to."
    )

    @strawberry.field(description="The provider threads the covered runs ran on, as the handoff recorded them.")
    def from_provider_threads(self, info: Info) -> list[ProviderThread]:
        found = _many_ids(info, ProviderThread, self.rec.from_provider_thread_ids)
        if _pending(found):
            return _present(found)  # type: ignore[return-value]  # graphql-core awaits it
        return [f for f in typing.cast("list[ProviderThread | None]", found) if f is not None]

    @strawberry.field(description="The ordinals of the runs whose conversation the handoff carries, in order.")
    def covered_run_ordinals(self) -> list[int]:
        return _ints(self.rec.covered_run_ordinals)

    @strawberry.field(
        description="The ordinals of runs selected but left out for length: accounted for, never sent again."
    )
    def omitted_run_ordinals(self) -> list[int]:
        return _ints(self.rec.omitted_run_ordinals)


def _ints(value: object) -> list[int]:
    return [int(v) for v in value] if isinstance(value, list | tuple) else []


async def _present(found: Awaitable[list[Any]]) -> list[Any]:
    return [f for f in await found if f is not None]


@_entity(e.CheckpointScope)
class CheckpointScope(_InRun, Node, _Entity):
    rec: strawberry.Private[e.CheckpointScope]
    parent_scope: CheckpointScope | None = _one("CheckpointScope", "parent_scope_id")

    @paged("scope.checkpoints", "Checkpoint", description="The checkpoints taken in this scope, oldest first.")
    def checkpoints(self, info: Info) -> dict[str, Any]:
        return {}


@strawberry.type(description="One path a checkpoint changed against the checkpoint before it in its scope.")
class CheckpointFile:
    path: str
    status: enums.CheckpointFileStatus
    additions: int = strawberry.field(description="Lines added (0 for a binary file).")
    deletions: int = strawberry.field(description="Lines removed (0 for a binary file).")
    old_path: str | None = strawberry.field(description="Where a renamed file was before.")
    binary: bool


@_entity(e.Checkpoint)
class Checkpoint(Node, _Entity):
    rec: strawberry.Private[e.Checkpoint]
    scope: CheckpointScope | None = _one("CheckpointScope", "scope_id")
    run: Run | None = _one("Run", "run_id")
    thread: Thread = _one("Thread", "thread_id", required=True)

    @strawberry.field(description="What changed against the previous checkpoint of its scope, by path.")
    def files(self) -> list[CheckpointFile]:
        return [
            CheckpointFile(
                path=f.path,
                status=f.status,
                additions=f.additions,
                deletions=f.deletions,
                old_path=f.old_path,
                binary=f.binary,
            )
            for f in checkpoint_rules.files_of(self.rec)
        ]

    @strawberry.field(description="The unified diff of one path (as listed in `files`); null if not captured.")
    async def diff(self, info: Info, path: str) -> str | None:
        try:
            checkpoint_rules.check_file_path(path)
        except DomainError as error:
            raise ApiError(error) from None  # a bad path is the caller's error, typed with its field
        return await info.context.services.runs.checkpoints.file_diff(self.rec, path)

    @strawberry.field(
        description="A root checkpoint's child scopes: the checkpoints its run's subagents left when they ended."
    )
    async def children(self, info: Info) -> list[Checkpoint]:
        if self.rec.run_id is None:
            return []
        found = await _children(info, Checkpoint, "run.checkpoints", self.rec.run_id)
        return [c for c in found if c.rec.scope_id != self.rec.scope_id and c.rec.ordinal > 0]


@_entity(e.RuntimeRequest, hide=("native_request_ref",))
class RuntimeRequest(_InRun, Node, _Entity):
    rec: strawberry.Private[e.RuntimeRequest]

    @strawberry.field(
        description="What was asked: the command, path or questions; for a BUDGET request the budget (`budgetId`, "
        "`window`, `maxCostUsd`, `maxTokens`), what was spent against it (`spentCostUsd`, `spentTokens`) and why."
    )
    def payload(self) -> JSON | None:
        return _global_ids(self.rec.payload)


@_entity(e.PlanArtifact)
class PlanArtifact(_InRun, Node, _Entity):
    rec: strawberry.Private[e.PlanArtifact]


# Keys of activity payloads that name an object, and the type of their global id. The log
# keeps raw UUIDs (it is internal and rebuildable); the API gives ids that node() resolves,
# at any depth of the payload (a rollback's record nests its runs, checkpoints and provider threads).
_PAYLOAD_IDS: dict[str, str] = {
    "threadId": "Thread",
    "childThreadId": "Thread",
    "parentThreadId": "Thread",
    "sourceThreadId": "Thread",
    "targetThreadId": "Thread",
    "runId": "Run",
    "targetRunId": "Run",
    "supersedesRunId": "Run",
    "attemptId": "RunAttempt",
    "nodeId": "ExecutionNode",
    "messageId": "ConversationMessage",
    "requestId": "RuntimeRequest",
    "budgetId": "Budget",
    "transferId": "ContextTransfer",
    "handoffId": "ContextHandoff",
    "rebridgeHandoffId": "ContextHandoff",
    "checkpointId": "Checkpoint",
    "restoreCheckpointId": "Checkpoint",
    "planId": "PlanArtifact",
    "providerThreadId": "ProviderThread",
    "replacementId": "ProviderThread",
    "previousActiveProviderThreadId": "ProviderThread",
}
# Keys holding a list of ids of one type.
_PAYLOAD_ID_LISTS: dict[str, str] = {
    "rolledBackRunIds": "Run",
    "staleCheckpointIds": "Checkpoint",
    "staleProviderThreadIds": "ProviderThread",
    "droppedHandoffIds": "ContextHandoff",
    "restoredHandoffIds": "ContextHandoff",
}
# Keys holding a list of objects whose own `id` is of one type.
_PAYLOAD_ID_OWNERS: dict[str, str] = {
    "runs": "Run",
    "staleCheckpoints": "Checkpoint",
    "providerThreads": "ProviderThread",
    "staleProviderThreads": "ProviderThread",
}


def _global_id(type_name: str, value: object) -> object:
    if isinstance(value, str):
        with contextlib.suppress(ValueError):  # not a UUID (a provider's own reference): left as it is
            return gid.encode(type_name, uuid.UUID(value))
    return value


def _globalized(value: object, own_id: str | None = None) -> object:
    """`value` with every object id it names as a global id; `own_id` types a mapping's own `id` key."""
    if isinstance(value, list):
        return [_globalized(item, own_id) for item in value]
    if not isinstance(value, Mapping):
        return value
    out: dict[str, object] = {}
    for key, item in value.items():
        if key in _PAYLOAD_IDS:
            out[key] = _global_id(_PAYLOAD_IDS[key], item)
        elif key in _PAYLOAD_ID_LISTS and isinstance(item, list):
            out[key] = [_global_id(_PAYLOAD_ID_LISTS[key], one) for one in item]
        elif key == "id" and own_id is not None:
            out[key] = _global_id(own_id, item)
        else:
            out[key] = _globalized(item, _PAYLOAD_ID_OWNERS.get(key))
    return out


def _global_ids(payload: object) -> JSON | None:
    """The payload with every object id (see `_PAYLOAD_IDS`) as a global id, at any depth."""
    if payload is None:
        return None
    return JSON(_globalized(payload))


@_entity(e.Activity)
class Activity(Node, _Entity):
    rec: strawberry.Private[e.Activity]
    kind: str = strawberry.field(
        description="What the activity records, as a string (`run.started`).",
        deprecation_reason="Use `activityKind` (the ActivityKind enum).",
    )
    run: Run | None = _one("Run", "run_id", description="The run the activity belongs to; null for a thread's own.")
    node: ExecutionNode | None = _one("ExecutionNode", "node_id", description="The node of the run it came from.")
    thread: Thread = _one("Thread", "thread_id", required=True)

    @strawberry.field(description="What the activity records; null only for a kind this server no longer names.")
    def activity_kind(self) -> ActivityKind | None:
        return vocab.activity_kind(self.rec.kind)

    @strawberry.field(
        description="Details of the activity. Ids of objects in it (`runId`, `childThreadId`, `transferId`, "
        "`requestId` …) are global ids that `node` resolves."
    )
    def payload(self) -> JSON | None:
        return _global_ids(self.rec.payload)

    @strawberry.field
    def run_id(self) -> strawberry.ID | None:
        return None if self.rec.run_id is None else strawberry.ID(gid.encode("Run", self.rec.run_id))

    @strawberry.field
    def node_id(self) -> strawberry.ID | None:
        rid = self.rec.node_id
        return None if rid is None else strawberry.ID(gid.encode("ExecutionNode", rid))


@_entity(e.UsageRecord, hide=("cost_nano_usd",))
class UsageRecord(Node, _Entity):
    rec: strawberry.Private[e.UsageRecord]
    thread: Thread = _one("Thread", "thread_id", required=True)
    run: Run = _one("Run", "run_id", required=True)
    attempt: RunAttempt = _one("RunAttempt", "attempt_id", required=True)
    node: ExecutionNode = _one(
        "ExecutionNode", "node_id", required=True, description="The node whose turn made the call."
    )
    provider_instance: ProviderInstance | None = _provider_instance()

    @strawberry.field(description="The call's cost in USD; null when its cost is UNKNOWN (never 0 for unknown).")
    def cost_usd(self) -> float | None:
        nano = self.rec.cost_nano_usd
        return None if nano is None else nano / 1_000_000_000


@_entity(e.Budget, hide=("time_window", "max_cost_nano_usd", "max_tokens"))
class Budget(Node, _Entity):
    rec: strawberry.Private[e.Budget]
    project: Project = _one("Project", "project_id", required=True)
    thread: Thread | None = _one(
        "Thread", "thread_id", description="The thread it limits, with its delegated tasks; null: a project budget."
    )
    cleared_at: datetime | None = strawberry.field(description="Set once `clearBudget` cleared it: checked no more.")

    @strawberry.field(description="The window it counts spending over.")
    def window(self) -> BudgetWindow:
        return self.rec.time_window

    @strawberry.field(description="The limit in USD; null: no cost limit.")
    def max_cost_usd(self) -> float | None:
        nano = self.rec.max_cost_nano_usd
        return None if nano is None else nano / 1_000_000_000

    @strawberry.field(description="The limit in tokens (input and output); null: no token limit.")
    def max_tokens(self) -> BigInt | None:
        return None if self.rec.max_tokens is None else BigInt(self.rec.max_tokens)

    @strawberry.field(
        description="What was spent against it in its window now: the UTC day or month so far, or everything; for "
        "a RUN budget of a thread, its active run (null while idle; a project's RUN budget: null)."
    )
    async def spent(self, info: Info) -> Usage | None:
        totals = await _budget_spent(info, self.rec)
        return None if totals is None else usage_of(totals)

    @strawberry.field(description="True when `spent` is past a limit: its action has fired or is about to.")
    async def exceeded(self, info: Info) -> bool:
        totals = await _budget_spent(info, self.rec)
        return totals is not None and budget_rules.past(self.rec, totals)


async def _budget_spent(info: Info, budget: e.Budget) -> Totals | None:
    now = info.context.services.pipeline.clock.now()
    async with info.context.loaders.reader() as db:
        if budget.time_window == BudgetWindow.RUN:
            if budget.thread_id is None:
                return None
            thread = await store_entities.get(db, e.AppThread, budget.thread_id)
            if thread is None or thread.active_run_id is None:
                return None
            return await ledger.totals(db, run_id=thread.active_run_id)
        since = budget_rules.since(budget.time_window, now)
        if budget.thread_id is None:
            return await ledger.totals(db, project_id=budget.project_id, since=since)
        return await ledger.totals(db, thread_id=budget.thread_id, since=since)


async def budgets_of(info: Info, project_id: uuid.UUID, thread_id: uuid.UUID | None) -> list[Budget]:
    """A project's own budgets (thread_id None) or a thread's, not cleared, oldest first."""
    scope = t.budgets.c.thread_id.is_(None) if thread_id is None else t.budgets.c.thread_id == thread_id
    stmt = sa.select(t.budgets).where(t.budgets.c.project_id == project_id, scope, t.budgets.c.cleared_at.is_(None))
    async with info.context.loaders.reader() as db:
        rows = await db.rows(stmt.order_by(t.budgets.c.id))
    return [Budget.from_row(row) for row in rows]


# One GraphQL type per entity, in the entities' order (`_entity` set each type's record).
_BY_RECORD: dict[type[Record], Any] = {cls._record: cls for cls in _Entity.__subclasses__()}
NODE_TYPES: dict[str, Any] = {_BY_RECORD[record].__name__: _BY_RECORD[record] for record in e.ENTITY_TYPES}

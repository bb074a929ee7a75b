"""GraphQL object types for every entity of `threadloom.domain.entities`.

Scalars are plain attributes copied from the entity (cheap to resolve); relations are
async resolvers that go through the request's loaders. Every type is a Relay `Node`
with an opaque global id.
"""

from __future__ import annotations

import contextlib
import dataclasses
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any, ClassVar, Self, TypeVar

import sqlalchemy as sa
import strawberry
from strawberry.scalars import JSON

from threadloom.api import enums
from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.api.feed_cursor import encode_feed_cursor
from threadloom.api.pagination import Connection, connect
from threadloom.domain import entities as e
from threadloom.domain.records import Record
from threadloom.domain.threads import thread_status
from threadloom.store import tables as t
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
        rec = cls._record.from_mapping(row)
        names = cls.__dict__.get("_init_names")
        if names is None:
            record_fields = set(cls._record.field_names())
            fields = dataclasses.fields(cls)  # type: ignore[arg-type]
            names = tuple(f.name for f in fields if f.init and f.name in record_fields and f.name != "id")
            cls._init_names = names  # type: ignore[attr-defined]
        values = {n: getattr(rec, n) for n in names}
        extra = {k: row[k] for k in getattr(cls, "_row_extras", ()) if k in row}
        return cls(id=gid.encode(cls.__name__, rec.id), rec=rec, **values, **extra)  # type: ignore[call-arg]


async def _load(info: Info, cls: type[E], entity_id: uuid.UUID | None) -> E | None:
    """Load an object of the same project as its parent (no visibility re-check needed)."""
    if entity_id is None:
        return None
    row = await info.context.loaders.rows(cls.table()).load(entity_id)
    return None if row is None else cls.from_row(row)


async def _load_visible(info: Info, cls: type[E], entity_id: uuid.UUID | None) -> E | None:
    """Load an object that may live in another project: checked against the token."""
    row = await info.context.load_visible(cls.table(), entity_id)
    return None if row is None else cls.from_row(row)


async def _children(info: Info, cls: type[E], relation: str, parent: uuid.UUID) -> list[E]:
    rows = await info.context.loaders.children(relation).load(parent)
    return [cls.from_row(r) for r in rows]


@strawberry.type
class Project(Node, _Entity):
    _record = e.Project
    rec: strawberry.Private[e.Project]
    name: str
    workspace_root: str
    created_at: datetime
    updated_at: datetime

    @strawberry.field
    async def threads(
        self,
        info: Info,
        first: int | None = None,
        after: str | None = None,
        last: int | None = None,
        before: str | None = None,
        include_archived: bool = False,
    ) -> Connection[Thread]:
        return await connect(
            info,
            "project.threads",
            self.rec.id,
            Thread.from_row,
            first=first,
            after=after,
            last=last,
            before=before,
            filters={"include_archived": include_archived},
        )

    @strawberry.field(description="The projectThreads position now: query, then subscribe with after: feedCursor.")
    async def feed_cursor(self, info: Info) -> str:
        async with info.context.services.db.read(info.context.counter) as db:
            head = await project_head(db, self.rec.id)
        return encode_feed_cursor(head)


@strawberry.type
class Lineage:
    relationship: enums.LineageRelationship | None
    _parent_id: strawberry.Private[uuid.UUID | None]
    _root_id: strawberry.Private[uuid.UUID | None]
    _transfer_id: strawberry.Private[uuid.UUID | None]

    @strawberry.field
    async def parent_thread(self, info: Info) -> Thread | None:
        return await _load_visible(info, Thread, self._parent_id)

    @strawberry.field
    async def root_thread(self, info: Info) -> Thread | None:
        return await _load_visible(info, Thread, self._root_id)

    @strawberry.field(description="The transfer this thread was forked through, if it is a fork.")
    async def forked_from(self, info: Info) -> ContextTransfer | None:
        return await _load_visible(info, ContextTransfer, self._transfer_id)


@strawberry.type
class Thread(Node, _Entity):
    _record = e.AppThread
    _row_extras = ("last_sequence",)
    rec: strawberry.Private[e.AppThread]
    title: str
    provider_instance_id: str
    model: str | None
    runtime_mode: str
    queue_held: bool
    queue_hold_reason: str | None
    archived_at: datetime | None
    created_at: datetime
    updated_at: datetime
    last_sequence: strawberry.Private[int] = 0

    @strawberry.field(description="The sequence of the newest event in this thread's log.")
    def latest_sequence(self) -> int:
        return self.last_sequence

    @strawberry.field(description="IDLE, or the status of the active run.")
    async def status(self, info: Info) -> enums.ThreadStatus:
        run = await _load(info, Run, self.rec.active_run_id)
        return thread_status(None if run is None else run.status.value)

    @strawberry.field
    async def project(self, info: Info) -> Project:
        project: Project | None = await _load(info, Project, self.rec.project_id)
        assert project is not None
        return project

    @strawberry.field
    async def active_run(self, info: Info) -> Run | None:
        return await _load(info, Run, self.rec.active_run_id)

    @strawberry.field
    async def runs(
        self,
        info: Info,
        first: int | None = None,
        after: str | None = None,
        last: int | None = None,
        before: str | None = None,
    ) -> Connection[Run]:
        return await connect(
            info, "thread.runs", self.rec.id, Run.from_row, first=first, after=after, last=last, before=before
        )

    @strawberry.field(description="Queued runs in the order they will start.")
    async def queue(self, info: Info) -> list[Run]:
        return await _children(info, Run, "thread.queue", self.rec.id)

    @strawberry.field
    async def messages(
        self,
        info: Info,
        first: int | None = None,
        after: str | None = None,
        last: int | None = None,
        before: str | None = None,
    ) -> Connection[ConversationMessage]:
        return await connect(
            info,
            "thread.messages",
            self.rec.id,
            ConversationMessage.from_row,
            first=first,
            after=after,
            last=last,
            before=before,
        )

    @strawberry.field
    async def activities(
        self,
        info: Info,
        first: int | None = None,
        after: str | None = None,
        last: int | None = None,
        before: str | None = None,
        run_id: strawberry.ID | None = None,
        node_id: strawberry.ID | None = None,
    ) -> Connection[Activity]:
        filters = {
            "run_id": None if run_id is None else gid.maybe_as(run_id, "Run") or uuid.UUID(int=0),
            "node_id": None if node_id is None else gid.maybe_as(node_id, "ExecutionNode") or uuid.UUID(int=0),
        }
        return await connect(
            info,
            "thread.activities",
            self.rec.id,
            Activity.from_row,
            first=first,
            after=after,
            last=last,
            before=before,
            filters=filters,
        )

    @strawberry.field(description="Approvals and questions waiting for an answer.")
    async def pending_requests(self, info: Info) -> list[RuntimeRequest]:
        return await _children(info, RuntimeRequest, "thread.pendingRequests", self.rec.id)

    @strawberry.field(description="The thread's plan view: the newest todo list of a run's root turn.")
    async def todo_list(self, info: Info) -> PlanArtifact | None:
        for plan in reversed(await _children(info, PlanArtifact, "thread.todoLists", self.rec.id)):
            run = await _load(info, Run, plan.rec.run_id)
            if run is not None and plan.rec.node_id == run.rec.root_node_id:
                return plan
        return None

    @strawberry.field
    async def provider_threads(self, info: Info) -> list[ProviderThread]:
        return await _children(info, ProviderThread, "thread.providerThreads", self.rec.id)

    @strawberry.field
    def lineage(self) -> Lineage:
        return Lineage(
            relationship=self.rec.lineage_relationship,
            _parent_id=self.rec.parent_thread_id,
            _root_id=self.rec.root_thread_id,
            _transfer_id=self.rec.forked_from_transfer_id,
        )


@strawberry.type(description="A parent→child link of the execution graph; both ends are nodes of the graph.")
class ExecutionEdge:
    _parent_id: strawberry.Private[uuid.UUID]
    _child_id: strawberry.Private[uuid.UUID]

    @strawberry.field
    async def parent(self, info: Info) -> ExecutionNode:
        # The graph primed the row loader with its nodes: no statement unless the parent
        # lives outside this run.
        node = await _load(info, ExecutionNode, self._parent_id)
        assert node is not None
        return node

    @strawberry.field
    async def child(self, info: Info) -> ExecutionNode:
        node = await _load(info, ExecutionNode, self._child_id)
        assert node is not None
        return node


@strawberry.type
class ExecutionGraph:
    nodes: list[ExecutionNode]
    edges: list[ExecutionEdge]


@strawberry.type
class Run(Node, _Entity):
    _record = e.Run
    rec: strawberry.Private[e.Run]
    ordinal: int
    status: enums.RunStatus
    status_reason: str | None
    queue_position: int | None
    provider_instance_id: str
    model: str | None
    interrupt_requested_at: datetime | None
    requested_at: datetime
    started_at: datetime | None
    completed_at: datetime | None

    @strawberry.field
    async def thread(self, info: Info) -> Thread:
        thread: Thread | None = await _load(info, Thread, self.rec.thread_id)
        assert thread is not None
        return thread

    @strawberry.field
    async def attempts(self, info: Info) -> list[RunAttempt]:
        return await _children(info, RunAttempt, "run.attempts", self.rec.id)

    @strawberry.field
    async def active_attempt(self, info: Info) -> RunAttempt | None:
        return await _load(info, RunAttempt, self.rec.active_attempt_id)

    @strawberry.field
    async def root_node(self, info: Info) -> ExecutionNode | None:
        return await _load(info, ExecutionNode, self.rec.root_node_id)

    @strawberry.field
    async def user_message(self, info: Info) -> ConversationMessage | None:
        return await _load(info, ConversationMessage, self.rec.user_message_id)

    @strawberry.field
    async def supersedes_run(self, info: Info) -> Run | None:
        return await _load(info, Run, self.rec.supersedes_run_id)

    @strawberry.field
    async def provider_thread(self, info: Info) -> ProviderThread | None:
        return await _load(info, ProviderThread, self.rec.provider_thread_id)

    @strawberry.field
    async def checkpoint(self, info: Info) -> Checkpoint | None:
        return await _load(info, Checkpoint, self.rec.checkpoint_id)

    @strawberry.field
    async def context_handoff(self, info: Info) -> ContextHandoff | None:
        return await _load(info, ContextHandoff, self.rec.context_handoff_id)

    @strawberry.field(description="Every node of every attempt of this run, and the parent→child edges.")
    async def execution_graph(self, info: Info) -> ExecutionGraph:
        rows = await info.context.loaders.children("run.nodes").load(self.rec.id)
        info.context.loaders.rows(t.execution_nodes).prime_many({r["id"]: r for r in rows})
        nodes = [ExecutionNode.from_row(r) for r in rows]
        edges = [
            ExecutionEdge(_parent_id=n.rec.parent_node_id, _child_id=n.rec.id)
            for n in nodes
            if n.rec.parent_node_id is not None
        ]
        return ExecutionGraph(nodes=nodes, edges=edges)

    @strawberry.field
    async def plans(self, info: Info) -> list[PlanArtifact]:
        return await _children(info, PlanArtifact, "run.plans", self.rec.id)

    @strawberry.field
    async def runtime_requests(self, info: Info) -> list[RuntimeRequest]:
        return await _children(info, RuntimeRequest, "run.requests", self.rec.id)


@strawberry.type
class RunAttempt(Node, _Entity):
    _record = e.RunAttempt
    rec: strawberry.Private[e.RunAttempt]
    attempt_ordinal: int
    reason: enums.AttemptReason
    status: enums.AttemptStatus
    status_reason: str | None
    created_at: datetime
    completed_at: datetime | None

    @strawberry.field
    async def run(self, info: Info) -> Run:
        run: Run | None = await _load(info, Run, self.rec.run_id)
        assert run is not None
        return run

    @strawberry.field
    async def root_node(self, info: Info) -> ExecutionNode | None:
        return await _load(info, ExecutionNode, self.rec.root_node_id)

    @strawberry.field
    async def provider_turns(self, info: Info) -> list[ProviderTurn]:
        return await _children(info, ProviderTurn, "attempt.turns", self.rec.id)


@strawberry.type
class ExecutionNode(Node, _Entity):
    _record = e.ExecutionNode
    rec: strawberry.Private[e.ExecutionNode]
    kind: enums.NodeKind
    status: enums.NodeStatus
    counts_for_run: bool
    title: str | None
    detail: JSON | None
    created_at: datetime
    updated_at: datetime
    completed_at: datetime | None

    @strawberry.field
    async def parent(self, info: Info) -> ExecutionNode | None:
        return await _load(info, ExecutionNode, self.rec.parent_node_id)

    @strawberry.field
    async def children(self, info: Info) -> list[ExecutionNode]:
        return await _children(info, ExecutionNode, "node.children", self.rec.id)

    @strawberry.field
    async def run(self, info: Info) -> Run:
        run: Run | None = await _load(info, Run, self.rec.run_id)
        assert run is not None
        return run

    @strawberry.field
    async def attempt(self, info: Info) -> RunAttempt | None:
        return await _load(info, RunAttempt, self.rec.attempt_id)

    @strawberry.field
    async def runtime_request(self, info: Info) -> RuntimeRequest | None:
        return await _load(info, RuntimeRequest, self.rec.runtime_request_id)

    @strawberry.field(description="The delegated child thread of a subagent node.")
    async def child_thread(self, info: Info) -> Thread | None:
        return await _load_visible(info, Thread, self.rec.child_thread_id)


@strawberry.type
class ConversationMessage(Node, _Entity):
    _record = e.ConversationMessage
    rec: strawberry.Private[e.ConversationMessage]
    role: enums.MessageRole
    text: str
    streaming: bool
    input_intent: enums.InputIntent | None
    client_message_id: str | None
    created_at: datetime
    updated_at: datetime

    @strawberry.field
    async def run(self, info: Info) -> Run | None:
        return await _load(info, Run, self.rec.run_id)

    @strawberry.field
    async def thread(self, info: Info) -> Thread:
        thread: Thread | None = await _load(info, Thread, self.rec.thread_id)
        assert thread is not None
        return thread


@strawberry.type
class ProviderSession(Node, _Entity):
    _record = e.ProviderSession
    rec: strawberry.Private[e.ProviderSession]
    provider_instance_id: str
    status: enums.ProviderSessionStatus
    owner: str | None = strawberry.field(
        description="The server process holding the live runtime. Ownership lasts as long as that process holds "
        "its advisory lock in PostgreSQL, so it has no expiry time."
    )
    capabilities: JSON | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime


@strawberry.type
class ProviderThread(Node, _Entity):
    _record = e.ProviderThread
    rec: strawberry.Private[e.ProviderThread]
    provider_instance_id: str
    native_thread_ref: str | None
    status: enums.ProviderThreadStatus
    first_run_ordinal: int | None
    last_run_ordinal: int | None
    created_at: datetime
    updated_at: datetime

    @strawberry.field
    async def thread(self, info: Info) -> Thread:
        thread: Thread | None = await _load(info, Thread, self.rec.app_thread_id)
        assert thread is not None
        return thread

    @strawberry.field
    async def forked_from(self, info: Info) -> ProviderThread | None:
        return await _load_visible(info, ProviderThread, self.rec.forked_from_provider_thread_id)

    @strawberry.field
    async def session(self, info: Info) -> ProviderSession | None:
        return await _load_visible(info, ProviderSession, self.rec.session_id)


@strawberry.type
class ProviderTurn(Node, _Entity):
    _record = e.ProviderTurn
    rec: strawberry.Private[e.ProviderTurn]
    native_turn_ref: str | None
    ordinal: int
    status: enums.ProviderTurnStatus
    created_at: datetime
    completed_at: datetime | None

    @strawberry.field
    async def attempt(self, info: Info) -> RunAttempt | None:
        return await _load(info, RunAttempt, self.rec.run_attempt_id)

    @strawberry.field
    async def node(self, info: Info) -> ExecutionNode | None:
        return await _load(info, ExecutionNode, self.rec.node_id)

    @strawberry.field
    async def provider_thread(self, info: Info) -> ProviderThread | None:
        return await _load(info, ProviderThread, self.rec.provider_thread_id)


@strawberry.type
class ContextTransfer(Node, _Entity):
    _record = e.ContextTransfer
    rec: strawberry.Private[e.ContextTransfer]
    type: enums.TransferType
    source_point: JSON | None
    base_point: JSON | None
    status: enums.TransferStatus
    resolution_strategy: str | None
    resolution_fidelity: str | None
    created_at: datetime
    updated_at: datetime

    @strawberry.field
    async def source_thread(self, info: Info) -> Thread | None:
        return await _load_visible(info, Thread, self.rec.source_thread_id)

    @strawberry.field
    async def target_thread(self, info: Info) -> Thread | None:
        return await _load_visible(info, Thread, self.rec.target_thread_id)

    @strawberry.field
    async def target_run(self, info: Info) -> Run | None:
        return await _load_visible(info, Run, self.rec.target_run_id)


@strawberry.type
class ContextHandoff(Node, _Entity):
    _record = e.ContextHandoff
    rec: strawberry.Private[e.ContextHandoff]
    strategy: enums.HandoffStrategy
    status: enums.HandoffStatus
    text: str = strawberry.field(description="Exactly the context the provider received.")
    token_estimate: int
    covered_run_ordinals: JSON | None
    created_at: datetime

    @strawberry.field
    async def transfer(self, info: Info) -> ContextTransfer | None:
        return await _load_visible(info, ContextTransfer, self.rec.transfer_id)

    @strawberry.field
    async def target_run(self, info: Info) -> Run | None:
        return await _load(info, Run, self.rec.target_run_id)


@strawberry.type
class CheckpointScope(Node, _Entity):
    _record = e.CheckpointScope
    rec: strawberry.Private[e.CheckpointScope]
    kind: enums.CheckpointScopeKind
    advances_run_count: bool
    created_at: datetime

    @strawberry.field
    async def run(self, info: Info) -> Run | None:
        return await _load(info, Run, self.rec.run_id)

    @strawberry.field
    async def node(self, info: Info) -> ExecutionNode | None:
        return await _load(info, ExecutionNode, self.rec.node_id)

    @strawberry.field
    async def parent_scope(self, info: Info) -> CheckpointScope | None:
        return await _load(info, CheckpointScope, self.rec.parent_scope_id)


@strawberry.type
class Checkpoint(Node, _Entity):
    _record = e.Checkpoint
    rec: strawberry.Private[e.Checkpoint]
    ordinal: int
    ref: str | None
    status: enums.CheckpointStatus
    files: JSON | None
    created_at: datetime

    @strawberry.field
    async def scope(self, info: Info) -> CheckpointScope | None:
        return await _load(info, CheckpointScope, self.rec.scope_id)

    @strawberry.field
    async def run(self, info: Info) -> Run | None:
        return await _load(info, Run, self.rec.run_id)


@strawberry.type
class RuntimeRequest(Node, _Entity):
    _record = e.RuntimeRequest
    rec: strawberry.Private[e.RuntimeRequest]
    kind: enums.RuntimeRequestKind
    status: enums.RuntimeRequestStatus
    response_capability: enums.ResponseCapability
    not_resumable_reason: str | None
    payload: JSON | None
    response: JSON | None
    created_at: datetime
    resolved_at: datetime | None

    @strawberry.field
    async def node(self, info: Info) -> ExecutionNode | None:
        return await _load(info, ExecutionNode, self.rec.node_id)

    @strawberry.field
    async def run(self, info: Info) -> Run | None:
        return await _load(info, Run, self.rec.run_id)


@strawberry.type
class PlanArtifact(Node, _Entity):
    _record = e.PlanArtifact
    rec: strawberry.Private[e.PlanArtifact]
    kind: enums.PlanKind
    items: JSON | None
    text: str | None
    status: enums.PlanStatus
    created_at: datetime
    updated_at: datetime

    @strawberry.field
    async def run(self, info: Info) -> Run | None:
        return await _load(info, Run, self.rec.run_id)

    @strawberry.field
    async def node(self, info: Info) -> ExecutionNode | None:
        return await _load(info, ExecutionNode, self.rec.node_id)


# Keys of activity payloads that name an object, and the type of their global id. The log
# keeps raw UUIDs (it is internal and rebuildable); the API gives ids that node() resolves.
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
    "transferId": "ContextTransfer",
    "handoffId": "ContextHandoff",
    "checkpointId": "Checkpoint",
    "planId": "PlanArtifact",
}


def _global_ids(payload: object) -> JSON | None:
    """The payload with every object id (see `_PAYLOAD_IDS`) as a global id."""
    if not isinstance(payload, Mapping):
        return None if payload is None else JSON(payload)
    out = dict(payload)
    for key, type_name in _PAYLOAD_IDS.items():
        value = out.get(key)
        if isinstance(value, str):
            with contextlib.suppress(ValueError):  # not a UUID (a provider's own reference): left as it is
                out[key] = gid.encode(type_name, uuid.UUID(value))
    return JSON(out)


@strawberry.type
class Activity(Node, _Entity):
    _record = e.Activity
    rec: strawberry.Private[e.Activity]
    sequence: int
    kind: str
    summary: str
    created_at: datetime

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


NODE_TYPES: dict[str, Any] = {
    cls.__name__: cls
    for cls in (
        Project,
        Thread,
        Run,
        RunAttempt,
        ExecutionNode,
        ConversationMessage,
        ProviderSession,
        ProviderThread,
        ProviderTurn,
        ContextTransfer,
        ContextHandoff,
        CheckpointScope,
        Checkpoint,
        RuntimeRequest,
        PlanArtifact,
        Activity,
    )
}

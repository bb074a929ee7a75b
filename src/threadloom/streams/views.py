"""What a live view delivers: the rules behind grouped subscriptions, pure (no I/O).

A dashboard draws a project, a thread, a run or one node's subtree, so a stream is scoped by
one of those (`choose_scope`) and its rows are kept by `ViewMatch`: the caller's project
(checked per row, from the row itself), an entity type, a run, a node or its subtree. A
subtree grows while the stream runs — a subagent's tool call is created after the subagent's
node — so `NodeTree` learns each node's parent from the node's own rows as they pass, and
starts from one read of the run's nodes: no row costs a query.

`graph_change` says whether a node's new state is worth an `executionGraph` item: only what a
graph drawing shows (status, kind, parent, created and completed times), not a tool's growing
output.
"""

from __future__ import annotations

import dataclasses
import enum
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any, Protocol

NODE_ENTITY = "execution_node"


class ScopeKind(enum.StrEnum):
    PROJECT = "project"
    THREAD = "thread"
    RUN = "run"
    NODE = "node"


def choose_scope(project: bool, thread: bool, run: bool, node: bool) -> ScopeKind | None:
    """Which feed serves a stream given which of projectId, threadId, runId and nodeId were passed: the widest
    one (the others then filter it). None: none was passed."""
    for given, kind in (
        (project, ScopeKind.PROJECT),
        (thread, ScopeKind.THREAD),
        (run, ScopeKind.RUN),
        (node, ScopeKind.NODE),
    ):
        if given:
            return kind
    return None


class NodeTree:
    """Nodes' parents as far as they are known, and which of them lie in the subtree of `root`.

    Membership is decided once per node and cached: a node is in the subtree if it is the root or its
    parent is. A parent that changes is learnt again (it never does today, but the rule does not assume it).
    """

    def __init__(self, root: uuid.UUID, parents: Mapping[uuid.UUID, uuid.UUID | None] | None = None) -> None:
        self.root = root
        self.parents: dict[uuid.UUID, uuid.UUID | None] = dict(parents or {})
        self._inside: dict[uuid.UUID, bool] = {}

    def learn(self, node: uuid.UUID, parent: uuid.UUID | None) -> None:
        if node in self.parents and self.parents[node] == parent:
            return
        self.parents[node] = parent
        self._inside.clear()  # a moved node moves its own subtree too

    def contains(self, node: uuid.UUID | None) -> bool:
        if node is None:
            return False
        found = self._inside.get(node)
        if found is not None:
            return found
        path: list[uuid.UUID] = []
        current: uuid.UUID | None = node
        answer = False
        while current is not None:
            if current == self.root:
                answer = True
                break
            known = self._inside.get(current)
            if known is not None:
                answer = known
                break
            if current in path:  # a cycle: no valid graph has one, and no walk may loop on it
                break
            path.append(current)
            current = self.parents.get(current)
        for step in path:
            self._inside[step] = answer
        return answer


def subtree(root: uuid.UUID, parents: Mapping[uuid.UUID, uuid.UUID | None]) -> frozenset[uuid.UUID]:
    """Every node of `parents` under `root`, `root` included."""
    tree = NodeTree(root, parents)
    return frozenset(n for n in {root, *parents} if tree.contains(n))


class Row(Protocol):
    """What a view reads of a log row (store.events.LogEvent has it)."""

    @property
    def project_id(self) -> uuid.UUID | None: ...
    @property
    def entity_type(self) -> str: ...
    @property
    def run_id(self) -> uuid.UUID | None: ...
    @property
    def node_id(self) -> uuid.UUID | None: ...
    @property
    def payload(self) -> dict[str, Any]: ...


def _uuid(value: Any) -> uuid.UUID | None:
    return None if value is None else value if isinstance(value, uuid.UUID) else uuid.UUID(str(value))


@dataclasses.dataclass(slots=True)
class ViewMatch:
    """Which rows of its feed a view delivers, in feed order (it learns node parents from the rows it sees, so
    it must be called on every row, in order, delivered or not).

    `sees` is the caller's visibility of a project; its answer is cached per project, so checking every row
    costs nothing after the first of each project. A row of a thread's log that names no project (none is
    written so today) belongs to the thread's: `home`, on a view of one thread. `impossible` (an id of the
    wrong type) matches nothing.
    """

    sees: Callable[[uuid.UUID], bool]
    entity_type: str | None = None
    run: uuid.UUID | None = None
    node: uuid.UUID | None = None
    tree: NodeTree | None = None  # with `node`: the node's subtree instead of the node alone
    impossible: bool = False
    home: uuid.UUID | None = None
    _seen: dict[uuid.UUID | None, bool] = dataclasses.field(default_factory=dict)

    def visible(self, project: uuid.UUID | None) -> bool:
        found = self._seen.get(project)
        if found is None:
            found = self._seen[project] = project is not None and self.sees(project)
        return found

    def __call__(self, row: Row) -> bool:
        if self.tree is not None and row.entity_type == NODE_ENTITY and row.node_id is not None:
            self.tree.learn(row.node_id, _uuid(row.payload.get("parent_node_id")))
        if self.impossible or not self.visible(row.project_id or self.home):
            return False
        if self.entity_type is not None and row.entity_type != self.entity_type:
            return False
        if self.run is not None and row.run_id != self.run:
            return False
        if self.node is None:
            return True
        if self.tree is not None:
            return self.tree.contains(row.node_id)
        return row.node_id == self.node


@dataclasses.dataclass(frozen=True, slots=True)
class NodeShape:
    """What a graph drawing shows of a node: an `executionGraph` item is sent when this changes."""

    kind: str
    status: str
    parent: uuid.UUID | None
    created_at: datetime | None
    completed_at: datetime | None

    @classmethod
    def of(cls, node: Any) -> NodeShape:
        return cls(str(node.kind), str(node.status), node.parent_node_id, node.created_at, node.completed_at)


def graph_change(known: Mapping[uuid.UUID, NodeShape], node_id: uuid.UUID, shape: NodeShape) -> bool:
    """Whether a node's new shape is news to a client that holds `known` (a node it has not seen always is)."""
    return known.get(node_id) != shape


def ordered_graph(nodes: Iterable[Any]) -> list[Any]:
    """A graph's nodes, each after its parent (else by creation, then id), so a client can draw each as it
    arrives. Nodes of one transaction share their creation time, so time alone does not put parents first."""
    by_id = {n.id: n for n in sorted(nodes, key=lambda n: (n.created_at, str(n.id)))}
    done: set[uuid.UUID] = set()
    out: list[Any] = []
    for start in by_id:
        chain: list[Any] = []
        current = by_id.get(start)
        while current is not None and current.id not in done and all(c.id != current.id for c in chain):
            chain.append(current)
            current = by_id.get(current.parent_node_id) if current.parent_node_id is not None else None
        for node in reversed(chain):
            done.add(node.id)
            out.append(node)
    return out

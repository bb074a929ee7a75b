"""Per-request DataLoaders over `store.reads`.

Every relation a GraphQL type exposes is named here once, with its table, parent column,
ordering key and filters. Loaders batch by relation, so the statements a query costs
depend on its shape, not on how many objects a page holds. A query operation's reads share
one snapshot (`Database.snapshot`, see `Loaders.snapshot`), so the objects it returns agree
with each other; other operations (a mutation's payload, read after its command committed, a
subscription event's nested fields) read outside a transaction, one statement per batch.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Hashable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import sqlalchemy as sa
from strawberry.dataloader import DataLoader

from threadloom.domain.statuses import RunStatus, RuntimeRequestStatus
from threadloom.domain.usage import Totals
from threadloom.store import links as link_reads
from threadloom.store import reads
from threadloom.store import runs as run_reads
from threadloom.store import tables as t
from threadloom.store import usage as usage_reads
from threadloom.store.db import Database, Reader, Snapshot, StatementCounter

Filters = tuple[tuple[str, Any], ...]


def _no_filters(_: Mapping[str, Any]) -> list[sa.ColumnElement[bool]]:
    return []


@dataclasses.dataclass(frozen=True, slots=True)
class Relation:
    table: reads.Source
    parent: str | None
    key: str  # ordering (and cursor) column
    key_type: type = uuid.UUID
    filters: Callable[[Mapping[str, Any]], list[sa.ColumnElement[bool]]] = _no_filters


# One expression for every page: its cache key (which finds the page's statement) is worked out once.
_UNARCHIVED = t.threads.c.archived_at.is_(None)


def _thread_filters(f: Mapping[str, Any]) -> list[sa.ColumnElement[bool]]:
    return [] if f.get("include_archived") else [_UNARCHIVED]


_PROJECT_UNARCHIVED = t.projects.c.archived_at.is_(None)


def _project_filters(f: Mapping[str, Any]) -> list[sa.ColumnElement[bool]]:
    only = f.get("only_project")
    shown: list[sa.ColumnElement[bool]] = [] if f.get("include_archived") else [_PROJECT_UNARCHIVED]
    return shown if only is None else [t.projects.c.id == only, *shown]


def _activity_filters(f: Mapping[str, Any]) -> list[sa.ColumnElement[bool]]:
    out: list[sa.ColumnElement[bool]] = []
    if f.get("run_id") is not None:
        out.append(t.activities.c.run_id == f["run_id"])
    if f.get("node_id") is not None:
        out.append(t.activities.c.node_id == f["node_id"])
    return out


def _fork_filters(f: Mapping[str, Any]) -> list[sa.ColumnElement[bool]]:
    return [t.threads.c.lineage_relationship == "fork", *_thread_filters(f)]


def _delegated_filters(f: Mapping[str, Any]) -> list[sa.ColumnElement[bool]]:
    return [t.threads.c.lineage_relationship == "subagent", *_thread_filters(f)]


def _transfer_filters(f: Mapping[str, Any]) -> list[sa.ColumnElement[bool]]:
    kind = f.get("type")
    return [] if kind is None else [link_reads.THREAD_TRANSFERS.c.type == str(kind)]


PAGED: dict[str, Relation] = {
    "projects": Relation(t.projects, None, "id", filters=_project_filters),
    "project.threads": Relation(t.threads, "project_id", "id", filters=_thread_filters),
    "thread.runs": Relation(t.runs, "thread_id", "ordinal", key_type=int),
    "thread.messages": Relation(t.conversation_messages, "thread_id", "id"),
    "thread.activities": Relation(t.activities, "thread_id", "sequence", key_type=int, filters=_activity_filters),
    "thread.checkpoints": Relation(t.checkpoints, "thread_id", "id"),
    "thread.forks": Relation(t.threads, "parent_thread_id", "id", filters=_fork_filters),
    "thread.delegated": Relation(t.threads, "parent_thread_id", "id", filters=_delegated_filters),
    # A transfer into or out of the thread (or both: a provider handoff's source is its target).
    "thread.transfers": Relation(link_reads.THREAD_TRANSFERS, "owner_thread_id", "id", filters=_transfer_filters),
    "providerThread.turns": Relation(t.provider_turns, "provider_thread_id", "ordinal", key_type=int),
    "providerThread.runs": Relation(t.runs, "provider_thread_id", "ordinal", key_type=int),
    "scope.checkpoints": Relation(t.checkpoints, "scope_id", "id"),
}

_queued = [t.runs.c.status == RunStatus.QUEUED.value]
_pending = [t.runtime_requests.c.status == RuntimeRequestStatus.PENDING.value]

# (table, parent column, order column, fixed filters) for small, bounded child lists.
LISTS: dict[str, tuple[sa.Table, str, str, list[sa.ColumnElement[bool]]]] = {
    "thread.queue": (t.runs, "thread_id", "queue_position", _queued),
    "thread.pendingRequests": (t.runtime_requests, "thread_id", "id", _pending),
    "thread.providerThreads": (t.provider_threads, "thread_id", "id", []),
    "thread.todoLists": (t.plan_artifacts, "thread_id", "id", [t.plan_artifacts.c.kind == "todo_list"]),
    "run.attempts": (t.run_attempts, "run_id", "attempt_ordinal", []),
    "run.nodes": (t.execution_nodes, "run_id", "id", []),
    "run.plans": (t.plan_artifacts, "run_id", "id", []),
    "run.requests": (t.runtime_requests, "run_id", "id", []),
    "run.checkpoints": (t.checkpoints, "run_id", "ordinal", []),
    "run.usageRecords": (t.usage_records, "run_id", "id", []),
    "node.children": (t.execution_nodes, "parent_node_id", "id", []),
    "attempt.turns": (t.provider_turns, "run_attempt_id", "ordinal", []),
    "thread.transfersIn": (t.context_transfers, "thread_id", "created_at", []),
    "thread.transfersOut": (t.context_transfers, "source_thread_id", "created_at", []),
    "run.contextTransfers": (t.context_transfers, "target_run_id", "created_at", []),
    "transfer.handoffs": (t.context_handoffs, "transfer_id", "created_at", []),
    # The handoffs a run received (set when one went out with its first turn): switch, fork, merge-back,
    # rollback or a replaced provider thread alike.
    "run.handoffs": (t.context_handoffs, "target_run_id", "created_at", []),
}

PageKey = tuple[Hashable, reads.PageArgs, Filters]
CountKey = tuple[Hashable, Filters]


USAGE_SCOPES = {
    "runs": usage_reads.of_runs,
    "attempts": usage_reads.of_attempts,
    "nodes": usage_reads.of_nodes,
    "threads": usage_reads.of_threads,
    "forks": usage_reads.forks_of_threads,
    "projects": usage_reads.of_projects,
}


class Loaders:
    def __init__(self, db: Database, counter: StatementCounter) -> None:
        self._db = db
        self._counter = counter
        self._loaders: dict[Any, DataLoader[Any, Any]] = {}
        # GraphQL objects built from loaded rows, by (type, id): (row, object). A page of
        # threads names one project a hundred times; it is built once per request.
        self.built: dict[tuple[type, Hashable], tuple[Any, Any]] = {}
        self._snapshot: Snapshot | None = None

    def snapshot(self) -> Snapshot:
        """From now on, every read of these loaders sees one snapshot (the caller closes it)."""
        self._snapshot = self._db.snapshot(self._counter)
        return self._snapshot

    def reader(self) -> AbstractAsyncContextManager[Reader]:
        """A connection for one batch of reads: the operation's snapshot if it has one."""
        if self._snapshot is not None:
            return self._snapshot.reader()
        return self._db.statements(self._counter)

    def _get(self, key: Any, make: Callable[[], DataLoader[Any, Any]]) -> DataLoader[Any, Any]:
        loader = self._loaders.get(key)
        if loader is None:
            loader = self._loaders[key] = make()
        return loader

    def rows(self, table: sa.Table) -> DataLoader[uuid.UUID, Mapping[Any, Any] | None]:
        made = self._loaders.get(("rows", table.name))
        if made is not None:  # asked once per object of a page: no closure made for the usual case
            return made
        return self._new_rows(table)

    def _new_rows(self, table: sa.Table) -> DataLoader[uuid.UUID, Mapping[Any, Any] | None]:
        async def load(ids: list[uuid.UUID]) -> list[Mapping[Any, Any] | None]:
            async with self.reader() as db:
                found = await reads.by_ids(db, table, ids)
            return [found.get(i) for i in ids]

        return self._get(("rows", table.name), lambda: DataLoader(load_fn=load))

    def page(self, relation: str) -> DataLoader[PageKey, reads.Page]:
        rel = PAGED[relation]

        async def load(keys: list[PageKey]) -> list[reads.Page]:
            groups: dict[tuple[reads.PageArgs, Filters], list[Hashable]] = {}
            for parent, args, filters in keys:
                groups.setdefault((args, filters), []).append(parent)
            results: dict[PageKey, reads.Page] = {}
            async with self.reader() as db:
                for (args, filters), parents in groups.items():
                    pages = await reads.pages(
                        db,
                        rel.table,
                        key=rel.key,
                        args=args,
                        parent=rel.parent,
                        parents=parents,
                        where=rel.filters(dict(filters)),
                    )
                    for p in parents:
                        results[(p, args, filters)] = pages[p]
            return [results[k] for k in keys]

        return self._get(("page", relation), lambda: DataLoader(load_fn=load))

    def count(self, relation: str) -> DataLoader[CountKey, int]:
        rel = PAGED[relation]

        async def load(keys: list[CountKey]) -> list[int]:
            groups: dict[Filters, list[Hashable]] = {}
            for parent, filters in keys:
                groups.setdefault(filters, []).append(parent)
            results: dict[CountKey, int] = {}
            async with self.reader() as db:
                for filters, parents in groups.items():
                    found = await reads.counts(
                        db, rel.table, parent=rel.parent, parents=parents, where=rel.filters(dict(filters))
                    )
                    for p in parents:
                        results[(p, filters)] = found[p]
            return [results[k] for k in keys]

        return self._get(("count", relation), lambda: DataLoader(load_fn=load))

    def children(self, relation: str) -> DataLoader[uuid.UUID, list[sa.RowMapping]]:
        table, parent, order, where = LISTS[relation]

        async def load(parents: list[uuid.UUID]) -> Sequence[list[sa.RowMapping]]:
            async with self.reader() as db:
                found = await reads.rows_by_parent(
                    db, table, parent=parent, parents=parents, order_by=order, where=where
                )
            return [found[p] for p in parents]

        return self._get(("children", relation), lambda: DataLoader(load_fn=load))

    def forks_of_runs(self) -> DataLoader[uuid.UUID, list[dict[str, Any]]]:
        """By run: the threads forked from it, oldest first (one statement for all the runs asked)."""

        async def load(run_ids: list[uuid.UUID]) -> list[list[dict[str, Any]]]:
            async with self.reader() as db:
                found = await link_reads.forks_of_runs(db, run_ids)
            return [found[i] for i in run_ids]

        return self._get("forks_of_runs", lambda: DataLoader(load_fn=load))

    def usage(self, scope: str) -> DataLoader[uuid.UUID, Totals]:
        """By key of `scope` (runs, attempts, nodes, threads, forks, projects): its usage totals, one statement
        for every key asked (`store.usage`)."""
        read = USAGE_SCOPES[scope]

        async def load(keys: list[uuid.UUID]) -> list[Totals]:
            async with self.reader() as db:
                found = await read(db, keys)
            return [found[k] for k in keys]

        return self._get(("usage", scope), lambda: DataLoader(load_fn=load))

    def queue_positions(self) -> DataLoader[uuid.UUID, dict[uuid.UUID, int]]:
        """By thread: each queued run's place in the queue (one statement for all the threads asked)."""

        async def load(thread_ids: list[uuid.UUID]) -> list[dict[uuid.UUID, int]]:
            async with self.reader() as db:
                found = await run_reads.queue_positions(db, thread_ids)
            return [found[i] for i in thread_ids]

        return self._get("queue_positions", lambda: DataLoader(load_fn=load))

"""A compiled page: `threads(projectId: …)` answered straight from its rows.

`compiled.CompiledObjects` still builds a domain record and a strawberry object per thread of a
page and runs the `status` and `project` resolvers for each, which left a page of 100 threads at
~30 µs a thread. For the root `threads` field whose selection this module knows (the
connection's `edges`, `nodes`, `pageInfo` and `__typename`; an edge's `cursor` and `node`; a
thread's id, its record's own scalar and enum fields, `latestSequence`, `status`, and its
`project` with the project's id and own fields), the selection is compiled once per cached
document into functions that read the page's row dicts and return the response's dicts, in the
key order and with the values graphql-core gives:

- the project and the page are read as `Query.threads` reads them: the same loaders (so the
  same statements, in the operation's snapshot), the same visibility check, the same page
  arguments (`page_args`);
- a value is what the strawberry object would hold (the record's converter of that column)
  serialized as graphql-core's leaf completion does (`compiled.leaf_reader`); a thread's status
  reads its active run through the run loader as `Thread.status` does (one statement for the
  page, as before);
- list items are counted against the operation's list budget like any list.

Anything else declines before a read: another field, a field with arguments below the root, a
document with directives (its plans are not shared, see `compiled.SharedPlans`), a resolver that
is not the one this module mirrors (checked by name, so an edit to `types.py` falls back rather
than diverges). And at run time anything unexpected — a refused argument, a missing row, a null
where the schema says non-null, a value the scalar refuses, a list over the budget — declines
the whole field, and graphql-core's own path answers it from the loaders' cache, errors and
all. `tests/test_fast_paths_queries.py` compares both paths byte for byte.

One assumption: the general path converts every column of a thread row into its record (and
would fail on a value its record refuses); this path converts only the columns asked for. Rows
are written from those same records, so they convert.
"""

from __future__ import annotations

import inspect
import operator
import typing
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson
from graphql import (
    GraphQLBoolean,
    GraphQLID,
    GraphQLInt,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLString,
    get_named_type,
    is_leaf_type,
)
from graphql.execution.values import get_argument_values

from threadloom.api import ids as gid
from threadloom.api.compiled import leaf_reader
from threadloom.api.context import Context
from threadloom.api.loaders import PAGED
from threadloom.api.pagination import encode_cursor, page_args
from threadloom.api.types import NODE_TYPES
from threadloom.domain.statuses import RunStatus
from threadloom.domain.threads import thread_status
from threadloom.store import tables as t

RELATION = "project.threads"
Row = dict[str, Any]


class Decline(Exception):
    """The compiled page does not answer this request: graphql-core's path does."""


def _uuid(value: Any) -> uuid.UUID:
    """A loader key as the records hold it (asyncpg returns its own UUID subclass)."""
    return value if value.__class__ is uuid.UUID else uuid.UUID(int=value.int)


class _Request:
    """What the row readers of one page share: the loaders, the active runs, the project dicts."""

    __slots__ = ("loaders", "projects", "runs")

    def __init__(self, loaders: Any) -> None:
        self.loaders = loaders
        self.runs: dict[Any, Any] = {}
        self.projects: dict[Any, Any] = {}


Reader = Callable[[Row, _Request], Any]


def _resolver(field_def: Any) -> Any:
    """The strawberry definition of a field without arguments or field extensions, else None."""
    definition = (field_def.extensions or {}).get("strawberry-definition")
    if definition is None or definition.extensions or field_def.args:
        return None
    return definition


def _named(definition: Any, qualname: str) -> bool:
    resolver = definition.base_resolver
    func = getattr(resolver, "wrapped_func", None)
    return (
        func is not None
        and getattr(func, "__qualname__", "") == qualname
        and getattr(func, "__module__", "").startswith("threadloom.api.")
    )


def _attribute(field_def: Any, definition: Any) -> bool:
    return definition.base_resolver is None and bool(getattr(field_def.resolve, "_is_default", False))


def _subfields(executor: Any, object_type: GraphQLObjectType, group: Any) -> Any:
    """The collected selection of `group` on `object_type` (None with a deferred part)."""
    if any(d.node.directives for d in group):
        return None
    grouped, defer_usages, _ = executor.collect_subfields(object_type, group)
    return None if defer_usages else grouped


def _object_type(field_type: Any) -> GraphQLObjectType | None:
    inner = field_type.of_type if isinstance(field_type, GraphQLNonNull) else field_type
    return inner if isinstance(inner, GraphQLObjectType) else None


def _entity_fields(executor: Any, object_type: Any, group: Any, uses: set[str]) -> Node | None:
    """A function of a thread's or a project's row giving its selection's dict, or None."""
    if not isinstance(object_type, GraphQLObjectType) or object_type.name not in ("Thread", "Project"):
        return None
    cls = NODE_TYPES[object_type.name]
    grouped = _subfields(executor, object_type, group)
    if grouped is None:
        return None
    record = cls._record
    record_names = set(record.field_names())
    converters = {name: (convert, nullable) for name, convert, nullable in record._field_converters()[1]}
    init_names = {f.name for f in cls.__dataclass_fields__.values() if f.init}
    type_name = object_type.name
    specs: list[_Spec] = []
    for key, fields in grouped.items():
        node = fields[0].node
        name = node.name.value
        if name == "__typename":
            specs.append((key, _constant(type_name), "constant", type_name))
            continue
        field_def = object_type.fields.get(name)
        definition = _resolver(field_def) if field_def is not None and not node.arguments else None
        if field_def is None or definition is None:
            return None
        field_type = field_def.type
        leaf = get_named_type(field_type)
        python_name = definition.python_name
        fast: tuple[str, Any] = ("", None)
        if is_leaf_type(leaf) and _attribute(field_def, definition):
            if python_name == "id":
                read, fast = _global_id(type_name), ("id", type_name)
            elif python_name in record_names and python_name in init_names:
                convert, nullable = converters.get(python_name, (None, False))
                read, fast = _column(python_name, convert, nullable), _fast_column(python_name, convert, leaf)
            else:
                return None
        elif type_name == "Thread" and _named(definition, "Thread.latest_sequence"):
            read, fast = _latest_sequence, ("int", None) if leaf is GraphQLInt else ("", None)
        elif type_name == "Thread" and _named(definition, "Thread.status"):
            read = _status
            uses.add("runs")
        elif type_name == "Thread" and _is_project_field(definition):
            project = _entity_fields(executor, _object_type(field_type), fields, uses)
            if project is None or not isinstance(field_type, GraphQLNonNull):
                return None
            specs.append((key, _project(project), "", None))
            continue
        else:
            return None
        if not is_leaf_type(leaf):
            return None
        specs.append((key, leaf_reader(read, leaf, field_type, type_name, name), *fast))
    return _node_function(type_name, specs)


# A field of a compiled node: (response key, its reader, how it is read inline, what with).
_Spec = tuple[str, Reader, str, Any]
Node = Callable[[Row, "_Request"], dict[str, Any]]


def _fast_column(name: str, convert: Any, leaf: Any) -> tuple[str, Any]:
    """How a column's usual value is completed inline (its reader does the rest): a str or a bool
    as it is, a UTC datetime as `isoformat()` writes it when the scalar serializes it so."""
    if convert is None and leaf in (GraphQLString, GraphQLID):
        return "str", name
    if convert is None and leaf is GraphQLBoolean:
        return "bool", name
    if convert is not None and convert.__name__ == "_to_datetime" and repr(leaf.serialize) == _ISOFORMAT:
        return "datetime", name
    return "", None


_ISOFORMAT = repr(operator.methodcaller("isoformat"))


def _node_function(type_name: str, specs: list[_Spec]) -> Node:
    """The node's dict in one generated function: the usual values inline, anything else (a null,
    another type, a resolver's field) through the field's reader."""
    namespace: dict[str, Any] = {
        "datetime": datetime,
        "UTC": UTC,
        "dumps": orjson.dumps,
        "encode": gid.encode,
        "MIN": -(2**31),
        "MAX": 2**31 - 1,
    }
    lines = ["def node(row, request):\n"]
    for i, (_, reader, fast, what) in enumerate(specs):
        namespace[f"r{i}"] = reader
        v = f"v{i}"
        slow = f"r{i}(row, request)"
        if fast == "constant":
            namespace[f"k{i}"] = what
            lines.append(f"    {v} = k{i}\n")
        elif fast == "id":
            namespace[f"t{i}"] = what
            lines.append(f"    {v} = encode(t{i}, row['id'])\n")
            lines.append(f"    if {v}.__class__ is not str:\n        {v} = {slow}\n")
        elif fast in ("str", "bool"):
            lines.append(f"    {v} = row[{what!r}]\n")
            lines.append(f"    if {v}.__class__ is not {fast}:\n        {v} = {slow}\n")
        elif fast == "datetime":
            lines.append(f"    {v} = row[{what!r}]\n")
            # orjson writes a UTC datetime exactly as `isoformat()` does, four times faster.
            utc = f"{v}.__class__ is datetime and {v}.tzinfo is UTC"
            lines.append(f"    {v} = dumps({v})[1:-1].decode() if {utc} else {slow}\n")
        elif fast == "int":
            lines.append(f"    {v} = row.get('last_sequence', 0)\n")
            lines.append(f"    if {v}.__class__ is not int or not MIN <= {v} <= MAX:\n        {v} = {slow}\n")
        else:
            lines.append(f"    {v} = {slow}\n")
    items = ", ".join(f"{key!r}: v{i}" for i, (key, *_) in enumerate(specs))
    lines.append(f"    return {{{items}}}\n")
    exec(compile("".join(lines), f"<{type_name} row>", "exec"), namespace)  # keys are GraphQL names
    return typing.cast(Node, namespace["node"])


def _is_project_field(definition: Any) -> bool:
    """Whether the field is `_one("Project", "project_id", required=True)` (not the visible kind)."""
    if not _named(definition, "_one.<locals>.resolve"):
        return False
    found = inspect.getclosurevars(definition.base_resolver.wrapped_func).nonlocals
    return found.get("type_name") == "Project" and found.get("attr") == "project_id"


def _constant(value: Any) -> Reader:
    return lambda _row, _request: value


def _global_id(type_name: str) -> Reader:
    encode = gid.encode
    return lambda row, _request: encode(type_name, row["id"])


def _column(name: str, convert: Any, nullable: bool) -> Reader:
    """The record's value of a column, converted as `Record.from_mapping` converts it."""
    if convert is None:
        return lambda row, _request: row[name]
    if nullable:

        def read_nullable(row: Row, _request: _Request) -> Any:
            value = row[name]
            return None if value is None else convert(value)

        return read_nullable
    return lambda row, _request: convert(row[name])


def _latest_sequence(row: Row, _request: _Request) -> Any:
    """`Thread.latest_sequence`: the row's `last_sequence` (0 when the row has none)."""
    return row.get("last_sequence", 0)


def _status(row: Row, request: _Request) -> Any:
    """`Thread.status`: idle, or the status of its active run (read beforehand, see `_runs`)."""
    run_id = row["active_run_id"]
    if run_id is None:
        return thread_status(None)
    run = request.runs[run_id]
    return thread_status(None if run is None else RunStatus(run["status"]).value)


def _project(node: Node) -> Reader:
    """`Thread.project`: the project's row from the row loader (read already: the page's parent)."""

    def read(row: Row, request: _Request) -> Any:
        project_id = row["project_id"]
        found = request.projects.get((node, project_id))  # one dict per project and selection
        if found is not None:
            return found
        pending = request.loaders.rows(t.projects).load(_uuid(project_id))
        if not pending.done() or pending.cancelled() or pending.exception() is not None:
            raise Decline
        project = pending.result()
        if project is None:
            raise Decline
        if type(project) is not dict:
            project = dict(project)
        found = request.projects[(node, project_id)] = node(project, request)
        return found

    return read


class ThreadsPage:
    """The compiled `threads` field of one cached document."""

    def __init__(
        self,
        field_def: Any,
        parts: tuple[tuple[str, str, Any], ...],
        needs_runs: bool,
        lists: int,
    ) -> None:
        self.field_def = field_def
        self.parts = parts
        self.needs_runs = needs_runs
        self.lists = lists  # how many lists of the page's items the selection holds

    async def __call__(self, executor: Any, field_details_list: Any) -> Any:
        context = executor.context_value
        if not isinstance(context, Context):
            raise Decline
        first = field_details_list[0]
        args = get_argument_values(
            self.field_def,
            first.node,
            executor.variable_values,
            first.fragment_variable_values,
            executor.hide_suggestions,
        )
        # `Query.threads` → `_typed` → `resolve_node`: a Project id the token sees, else null.
        found = gid.decode(args["projectId"])
        if found is None or found[0] != "Project":
            return None
        project_type = NODE_TYPES["Project"]
        row = await context.load_visible(project_type.table(), found[1])
        if row is None:
            return None
        parent = project_type.from_row(row).rec.id
        # `Project.threads` → `connect`.
        rel = PAGED[RELATION]
        limit = context.services.settings.limits.max_page_size
        page_arguments = page_args(
            args.get("first"), args.get("after"), args.get("last"), args.get("before"), rel.key_type, limit
        )
        frozen = tuple(sorted({"include_archived": args.get("includeArchived", False)}.items()))
        loaders = context.loaders
        page = await loaders.page(RELATION).load((parent, page_arguments, frozen))
        rows = page.rows
        request = _Request(loaders)
        if self.needs_runs:
            await _runs(request, rows)
        left = getattr(executor, "list_items_left", None)
        if self.lists and (left is None or left() < self.lists * len(rows)):
            raise Decline  # graphql-core counts (and refuses) them itself
        key = rel.key
        cursors = [encode_cursor(r[key]) for r in rows]
        completed: dict[str, Any] = {}
        for response_key, kind, plan in self.parts:
            if kind == "typename":
                completed[response_key] = plan
            elif kind == "edges":
                completed[response_key] = _edges(plan, rows, cursors, request)
            elif kind == "nodes":
                completed[response_key] = [plan(r, request) for r in rows]
            else:
                completed[response_key] = _page_info(plan, page, cursors)
        count = getattr(executor, "count_list_items", None)
        for _ in range(self.lists):
            if count is not None:
                count(rows)
        return completed


async def _runs(request: _Request, rows: list[Row]) -> None:
    """The active runs of the page's threads, through the run loader (one statement, as the
    `status` resolvers batch theirs)."""
    ids = {r["active_run_id"] for r in rows if r["active_run_id"] is not None}
    if ids:
        ordered = list(ids)
        found = await request.loaders.rows(t.runs).load_many([_uuid(i) for i in ordered])
        request.runs = dict(zip(ordered, found, strict=True))


def _edges(edge: Any, rows: list[Row], cursors: list[str], request: _Request) -> list[Any]:
    return [edge(row, cursor, request) for row, cursor in zip(rows, cursors, strict=True)]


def _page_info(plan: tuple[tuple[str, str], ...], page: Any, cursors: list[str]) -> dict[str, Any]:
    if page.has_next.__class__ is not bool or page.has_previous.__class__ is not bool:
        raise Decline
    values = {
        "hasNextPage": page.has_next,
        "hasPreviousPage": page.has_previous,
        "startCursor": cursors[0] if cursors else None,
        "endCursor": cursors[-1] if cursors else None,
    }
    return {key: values[name] if name in values else name[1:] for key, name in plan}


def compile_threads(executor: Any, parent_type: GraphQLObjectType, field_details_list: Any) -> ThreadsPage | None:
    """The compiled root `threads` field for this selection, or None (graphql-core's path)."""
    if any(d.node.directives for d in field_details_list):
        return None
    field_def = parent_type.fields.get("threads")
    definition = (field_def.extensions or {}).get("strawberry-definition") if field_def is not None else None
    if definition is None or definition.extensions or not _named(definition, "Query.threads"):
        return None
    connection = _object_type(field_def.type)
    grouped = _subfields(executor, connection, field_details_list) if connection is not None else None
    if grouped is None or connection is None:
        return None
    parts: list[tuple[str, str, Any]] = []
    lists = 0
    uses: set[str] = set()
    for key, group in grouped.items():
        name = group[0].node.name.value
        if name == "__typename":
            parts.append((key, "typename", connection.name))
            continue
        sub_def = connection.fields.get(name)
        sub = _resolver(sub_def) if sub_def is not None and not group[0].node.arguments else None
        if sub_def is None or sub is None:
            return None
        if name == "edges" and _attribute(sub_def, sub):
            edge_type = get_named_type(sub_def.type)
            edge = _edge_plan(executor, edge_type, group, uses) if isinstance(edge_type, GraphQLObjectType) else None
            if edge is None:
                return None
            parts.append((key, "edges", edge))
        elif name == "nodes" and _named(sub, "Connection.nodes"):
            node_type = get_named_type(sub_def.type)
            fields = _entity_fields(executor, node_type, group, uses)
            if fields is None:
                return None
            parts.append((key, "nodes", fields))
        elif name == "pageInfo" and _attribute(sub_def, sub):
            info_type = get_named_type(sub_def.type)
            info = _page_info_plan(executor, info_type, group) if isinstance(info_type, GraphQLObjectType) else None
            if info is None:
                return None
            parts.append((key, "pageInfo", info))
        else:
            return None
        lists += name in ("edges", "nodes")
    return ThreadsPage(field_def, tuple(parts), "runs" in uses, lists)


def _edge_plan(executor: Any, edge_type: GraphQLObjectType, group: Any, uses: set[str]) -> Any:
    """A generated function of (row, cursor, request) giving an edge's dict, or None."""
    grouped = _subfields(executor, edge_type, group)
    if grouped is None:
        return None
    namespace: dict[str, Any] = {"typename": edge_type.name}
    items: list[str] = []
    for key, fields in grouped.items():
        name = fields[0].node.name.value
        if name == "__typename":
            items.append(f"{key!r}: typename")
            continue
        field_def = edge_type.fields.get(name)
        definition = _resolver(field_def) if field_def is not None and not fields[0].node.arguments else None
        if field_def is None or definition is None or not _attribute(field_def, definition):
            return None
        if name == "cursor":
            items.append(f"{key!r}: cursor")
        elif name == "node":
            node = _entity_fields(executor, get_named_type(field_def.type), fields, uses)
            if node is None:
                return None
            namespace[f"node{len(items)}"] = node
            items.append(f"{key!r}: node{len(items)}(row, request)")
        else:
            return None
    source = f"def edge(row, cursor, request):\n    return {{{', '.join(items)}}}\n"
    exec(compile(source, f"<{edge_type.name} row>", "exec"), namespace)  # keys are GraphQL names
    return namespace["edge"]


def _page_info_plan(executor: Any, info_type: GraphQLObjectType, group: Any) -> Any:
    grouped = _subfields(executor, info_type, group)
    if grouped is None:
        return None
    plan: list[tuple[str, str]] = []
    for key, fields in grouped.items():
        name = fields[0].node.name.value
        if name == "__typename":
            plan.append((key, "=" + info_type.name))
            continue
        field_def = info_type.fields.get(name)
        definition = _resolver(field_def) if field_def is not None and not fields[0].node.arguments else None
        if (
            field_def is None
            or definition is None
            or not _attribute(field_def, definition)
            or name not in ("hasNextPage", "hasPreviousPage", "startCursor", "endCursor")
        ):
            return None
        plan.append((key, name))
    return tuple(plan)

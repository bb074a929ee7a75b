"""Fast paths for queries: cached parse/validation and compiled object completion.

A page of 100 threads with a dozen fields each is ~1,500 field executions. graphql-core
runs every one through `execute_field` (a resolve info, strawberry's resolver wrapper, the
argument machinery) and `complete_value`, which made the `threads(first: 100)` page ~12 times
the cost of a raw asyncpg + orjson floor. Three things here cut that without changing a byte
of any response:

- `CachedDocuments` (a schema extension) keeps the parsed document per query text and the
  verdict of the validation rules that do not depend on variables. The rules that read the
  request's variables (the cost and page-argument rules, see `cost.CostVariables`) run on
  every request whose document declares variables, unless the same variable values passed
  them before (only passes are kept). A document the static rules refuse is validated in
  full on every request, as before, so its errors are unchanged.
- `CompiledObjects` (an execution-context mixin) completes an object value from a plan
  made once per selection: a field that is a plain attribute (strawberry's
  default resolver: no resolver, no arguments, no field extension, no resolve middleware)
  of a scalar or enum type, possibly non-null, is read and serialized inline, exactly as
  `complete_value`/`complete_leaf_value` would (same coercion, same errors, same paths);
  `__typename` is the type's name. A field without arguments or field extensions whose
  resolver is synchronous (or an attribute of object or list type) is run as `execute_field`
  runs it, with its function called directly instead of through strawberry's wrapper
  (argument conversion, extension chain). Such a field of an object type, or of a list of one
  (without directives, of a type with no `is_type_of` but strawberry's own, which reads no
  info), is completed inline too: the object's dict comes from the plan of its own selection,
  a list's items one by one, with `complete_value`'s null checks, type check, error paths and
  list-item count (`count_list_items`), so a page's edges, nodes and their objects pass through
  no `complete_value`, `complete_list_value` or resolve info of their own; a value that is
  awaitable, or a list that is not a list or tuple, goes back to graphql-core's completion.
  Every other field goes through graphql-core's own `execute_field`, and `@defer` selections or
  incremental delivery take graphql-core's path entirely, and so do mutations and
  subscriptions (only query operations are compiled). Key order is the response-key
  order of the collected fields, aliases included, as in `execute_fields`.
- `SharedPlans` keeps those plans across the requests of one cached document when it has no
  directives (collecting its selections then depends on nothing else), so a repeated page
  builds none.

`Settings.fast_paths` (`THREADLOOM_FAST_PATHS=0` turns it off) decides whether `GraphQLView`
applies them; tests compare responses byte for byte with and without them.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterator, Mapping
from enum import Enum
from typing import Any

import orjson
import strawberry
from graphql import (
    DocumentNode,
    GraphQLBoolean,
    GraphQLEnumType,
    GraphQLID,
    GraphQLInt,
    GraphQLList,
    GraphQLNonNull,
    GraphQLObjectType,
    GraphQLString,
    OperationDefinitionNode,
    OperationType,
    Undefined,
    get_named_type,
    is_leaf_type,
    validate,
)
from graphql.execution.executor import invalid_return_type_error
from graphql.pyutils import Path
from graphql.pyutils import inspect as inspect_value
from graphql.pyutils.gather_with_cancel import gather_with_cancel
from strawberry.extensions import SchemaExtension
from strawberry.schema.schema import validate_document


class _Lru:
    """A small least-recently-used map (documents and verdicts of the queries a service sees)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._items: OrderedDict[Any, Any] = OrderedDict()

    def get(self, key: Any) -> Any:
        found = self._items.get(key)
        if found is not None:
            self._items.move_to_end(key)
        return found

    def put(self, key: Any, value: Any) -> None:
        self._items[key] = value
        self._items.move_to_end(key)
        if len(self._items) > self.size:
            self._items.popitem(last=False)


# The modules whose validation rules read the request's variables (`cost.request_variables`).
VARIABLE_RULE_MODULES = frozenset({"threadloom.api.cost", "threadloom.api.pagination", "threadloom.api.input_text"})


class DocumentCache:
    """Parsed documents and validation verdicts of one schema (its limits are fixed)."""

    def __init__(self, size: int = 512) -> None:
        self.documents = _Lru(size)
        self.verdicts = _Lru(size)
        # (query, rules, variables) the variable rules passed: the same values pass again.
        self.passed = _Lru(size)


def _variables_key(variables: Any) -> bytes | None:
    """The request's variables as a cache key (None when they are not plain JSON)."""
    try:
        return orjson.dumps(variables, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


def _declares_variables(document: DocumentNode) -> bool:
    return any(isinstance(d, OperationDefinitionNode) and d.variable_definitions for d in document.definitions)


class CachedDocuments(SchemaExtension):
    """Reuses a query's parsed document and its variable-independent validation verdict."""

    def __init__(self, cache: DocumentCache) -> None:
        self.cache = cache

    def on_parse(self) -> Iterator[None]:
        context = self.execution_context
        query = context.query
        if query is not None and context.graphql_document is None:
            context.graphql_document = self.cache.documents.get(query)
        yield
        # A verdict given at parse time (api.bounds, a big text) left the part that runs or an outline, not
        # the whole document: it is not kept here (api.validation_process keeps what passed).
        if query is not None and context.graphql_document is not None and context.pre_execution_errors is None:
            self.cache.documents.put(query, context.graphql_document)

    def on_validate(self) -> Iterator[None]:
        context = self.execution_context
        document, query, rules = context.graphql_document, context.query, context.validation_rules
        if document is None or query is None or context.pre_execution_errors is not None or not rules:
            yield
            return
        schema = context.schema._schema
        dynamic = tuple(r for r in rules if r.__module__ in VARIABLE_RULE_MODULES)
        key = (query, rules)
        verdict = self.cache.verdicts.get(key)
        if verdict is None:
            static_ok = not validate_document(schema, document, tuple(r for r in rules if r not in dynamic))
            fixed = not _declares_variables(document)
            dynamic_ok = static_ok and fixed and not (dynamic and validate(schema, document, dynamic))
            verdict = (static_ok, dynamic_ok)
            self.cache.verdicts.put(key, verdict)
        static_ok, dynamic_ok = verdict
        if static_ok and (dynamic_ok or not dynamic):
            context.pre_execution_errors = []
        elif static_ok:
            # Only the variable rules can still refuse: their errors are what a full validation
            # reports. They read nothing but the document and the variables, so a pass is kept
            # per variable values (a client repeating a page sends the same ones); a refusal is
            # validated again every time.
            values = _variables_key(context.variables)
            if values is not None and self.cache.passed.get((key, values)):
                context.pre_execution_errors = []
            else:
                errors = validate(schema, document, dynamic)
                if not errors and values is not None:
                    self.cache.passed.put((key, values), True)
                context.pre_execution_errors = errors
        yield


# Compiles a root query field for one cached selection: (execution context, Query type, field
# group) -> an async function of (execution context, field group) giving the field's completed
# value, or None when it does not serve that selection. Any exception it raises means "not served".
RootCompiler = Callable[[Any, GraphQLObjectType, Any], Callable[[Any, Any], Awaitable[Any]] | None]


def with_fast_paths(
    schema: strawberry.Schema, root_fields: Mapping[str, RootCompiler] | None = None
) -> strawberry.Schema:
    """`schema` with the fast paths: compiled object completion, the document cache, and the
    compiled root fields named in `root_fields` (see `CompiledObjects.execute_field`)."""
    base = schema.execution_context_class
    settings: dict[str, Any] = {
        "info_class": schema.config.info_class,
        "exception_handlers": bool(getattr(schema.schema_converter, "_exception_handler_specs", True)),
        "root_fields": dict(root_fields or {}),
    }
    settings["shared_plans"] = SharedPlans()
    schema.execution_context_class = type(base.__name__, (CompiledObjects, base), settings)
    schema.extensions = (*schema.extensions, functools.partial(CachedDocuments, DocumentCache()))
    return schema


# Plan entries: (ATTR, key, field name, python name, getter, leaf type, field type, field group)
# (CALL, key, field group, field, function), (CALL_LEAF, key, field name, leaf type, field type,
# field group, field, function, whether it takes info) and (GENERAL, key, field group).
# __typename is (TYPENAME, key, type name). Object and list-of-object fields whose selection has a
# plan are completed inline: (OBJECT | LIST, key, field name, field type, field group, field,
# function, whether it takes info, object type, its plan, the list's item type, whether the plan is pure).
_ATTR, _TYPENAME, _CALL, _GENERAL, _CALL_LEAF, _OBJECT, _LIST = 0, 1, 2, 3, 4, 5, 6



class _IntLeaf:
    """Stands for Int in `_SAME`: an int is serialized as it is only within 32 bits."""


# Scalars whose serialization returns a value of this exact Python type unchanged.
_SAME: dict[int, type] = {
    id(GraphQLString): str,
    id(GraphQLID): str,
    id(GraphQLBoolean): bool,
    id(GraphQLInt): _IntLeaf,
}
_INT_MIN, _INT_MAX = -(2**31), 2**31 - 1

# Classes whose instances `is_awaitable` has called not awaitable and that cannot become so: strawberry
# object types and enums without `__await__`, `__getattr__` or their own `__getattribute__`. Asking
# `is_awaitable` about each of a page's objects costs a failed `hasattr` every time.
_PLAIN: set[type] = set()


def _pending(value: Any, is_awaitable: Any) -> bool:
    """`is_awaitable(value)`, remembered per class for the classes of `_PLAIN`."""
    cls = value.__class__
    if cls in _PLAIN:
        return False
    if is_awaitable(value):
        return True
    if (
        (hasattr(cls, "__strawberry_definition__") or isinstance(value, Enum))
        and cls.__getattribute__ is object.__getattribute__
        and not hasattr(cls, "__getattr__")
        and not hasattr(cls, "__await__")
    ):
        _PLAIN.add(cls)
    return False


def _inline_type_check(object_type: GraphQLObjectType) -> bool:
    """Whether the type's `is_type_of` (if any) is strawberry's own, which never reads its info."""
    check = object_type.is_type_of
    return check is None or (
        getattr(check, "__module__", "") == "strawberry.schema.schema_converter"
        and getattr(check, "__qualname__", "").endswith("_get_is_type_of.<locals>.is_type_of")
    )


class SharedPlans:
    """Plans kept across the operations of one cached document (an operation node is the same
    object every time its document comes from `CachedDocuments`).

    Only for documents without directives: collecting a selection then depends on nothing but the
    document and the schema (no @skip/@include variable, no @defer), so the plan made for the first
    request is the plan every later request would make.
    """

    def __init__(self, size: int = 256) -> None:
        self._items = _Lru(size)

    def get(self, operation: OperationDefinitionNode, fragments: Any) -> tuple[dict[Any, Any], set[int], bool] | None:
        found = self._items.get(id(operation))
        if found is not None and found[0] is operation:
            return found[1]  # type: ignore[no-any-return]
        fragment_nodes = [getattr(f, "definition", f) for f in (fragments or {}).values()]
        if _has_directives([operation, *fragment_nodes]):
            return None
        store: tuple[dict[Any, Any], set[int], bool] = ({}, set(), True)
        self._items.put(id(operation), (operation, store))  # holds the operation: its id is not reused
        return store


def _has_directives(nodes: list[Any]) -> bool:
    """Whether any of these definitions or their selections carry a directive."""
    pending = list(nodes)
    while pending:
        node = pending.pop()
        if getattr(node, "directives", None):
            return True
        selection_set = getattr(node, "selection_set", None)
        if selection_set is not None:
            pending.extend(selection_set.selections)
    return False


class CompiledObjects:
    """Execution-context mixin: object values completed from a per-selection plan (module docstring)."""

    schema: Any
    operation: OperationDefinitionNode
    middleware_manager: Any
    is_awaitable: Any
    info_class: Any = None
    exception_handlers: bool = True
    shared_plans: SharedPlans
    root_fields: Mapping[str, RootCompiler] = {}
    _failures = 0  # attribute fields that failed in `_complete` (see the memo in `_object`)

    def execute_field(
        self, parent_type: GraphQLObjectType, source: Any, field_details_list: Any, path: Path, position_context: Any
    ) -> Any:
        """A root query field named in `root_fields` is answered by its compiled function when that
        serves the selection; if it declines (raises), graphql-core's own `execute_field` answers."""
        compile_root = (
            self.root_fields.get(field_details_list[0].node.name.value)
            if path.prev is None and position_context is None and self.root_fields
            else None
        )
        if compile_root is not None and self.operation.operation is OperationType.QUERY:
            served = self._root_plan(parent_type, field_details_list, compile_root)
            if served is not None:
                return self._served(served, parent_type, source, field_details_list, path)
        return super().execute_field(parent_type, source, field_details_list, path, position_context)  # type: ignore[misc]

    def _root_plan(self, parent_type: GraphQLObjectType, field_details_list: Any, compile_root: RootCompiler) -> Any:
        """The compiled root field, kept with the shared plans of a cached document without
        directives (None otherwise: a plan made per request would cost more than it saves)."""
        plans, _, shared = self._store()
        if not shared or self.exception_handlers or parent_type is not self.schema.query_type:
            return None
        key = ("root", tuple([id(d.node) for d in field_details_list]))
        cached = plans.get(key)
        if cached is None:
            cached = plans[key] = (field_details_list, compile_root(self, parent_type, field_details_list))
        return cached[1]

    async def _served(
        self, served: Any, parent_type: GraphQLObjectType, source: Any, field_details_list: Any, path: Path
    ) -> Any:
        with contextlib.suppress(Exception):  # declined (or failed): graphql-core's path answers, errors and all
            return await served(self, field_details_list)
        result = super().execute_field(parent_type, source, field_details_list, path, None)  # type: ignore[misc]
        return await result if self.is_awaitable(result) else result

    def complete_object_value(
        self,
        return_type: GraphQLObjectType,
        field_details_list: Any,
        info: Any,
        path: Path,
        result: Any,
        position_context: Any,
    ) -> Any:
        compiled = position_context is None and self.operation.operation is OperationType.QUERY
        plan = self._plan(return_type, field_details_list) if compiled else None
        if plan is None or (
            return_type.is_type_of is not None and return_type.is_type_of(result, info) is not True
        ):
            # Not compiled, or an async or failing check: graphql-core's path raises the same error.
            return super().complete_object_value(  # type: ignore[misc]
                return_type, field_details_list, info, path, result, position_context
            )
        return self._object(return_type, plan, path, result, id(plan) in self._pure_plans)

    def _object(
        self, return_type: GraphQLObjectType, plan: tuple[Any, ...], path: Path, result: Any, pure: bool
    ) -> Any:
        """The object's dict (type already checked), from its plan (`pure`: one of `_pure_plans`)."""
        if not pure:
            return self._complete(return_type, plan, path, result)
        # A selection of attributes only, met again on the same object (a page's threads all
        # name one project): the same values, so the dict completed the first time is reused.
        memo: dict[tuple[int, int], tuple[Any, Any]] = self.__dict__.setdefault("_memo", {})
        found = memo.get((id(plan), id(result)))
        if found is not None and found[0] is result:
            return found[1]
        failures = self._failures
        completed = self._complete(return_type, plan, path, result)
        if self._failures == failures:  # a field error names its path: such a dict is not reused
            memo[(id(plan), id(result))] = (result, completed)  # holds `result`, so its id is not reused
        return completed

    @property
    def _pure_plans(self) -> set[int]:
        """The ids of the plans made only of attribute fields and __typename."""
        return self._store()[1]

    def _store(self) -> tuple[dict[Any, Any], set[int], bool]:
        """This operation's plans, pure plan ids, and whether they are shared with later operations
        of the same (cached) document."""
        store: tuple[dict[Any, Any], set[int], bool] | None = self.__dict__.get("_plan_store")
        if store is None:
            middleware = self.middleware_manager
            plain = middleware is None or not getattr(middleware, "middlewares", None)
            shared = self.shared_plans.get(self.operation, self.fragments) if plain else None  # type: ignore[attr-defined]
            store = self.__dict__["_plan_store"] = shared or ({}, set(), False)
        return store

    def _plan(self, return_type: GraphQLObjectType, field_details_list: Any) -> tuple[Any, ...] | None:
        plans, pure, shared = self._store()
        # Shared plans are found by the field nodes (of the cached document, so alive and the same
        # objects every time); an operation's own by the list, kept alive with its plan.
        key = (return_type, tuple([id(d.node) for d in field_details_list]) if shared else id(field_details_list))
        cached = plans.get(key)
        if cached is not None:
            return cached[1]  # type: ignore[no-any-return]
        grouped, new_defer_usages, _ = self.collect_subfields(return_type, field_details_list)  # type: ignore[attr-defined]
        plan = None if new_defer_usages else tuple(self._entries(return_type, grouped))
        plans[key] = (field_details_list, plan)
        if plan is not None and all(entry[0] in (_ATTR, _TYPENAME) for entry in plan):
            pure.add(id(plan))  # the plan is kept in `plans`, so its id stays its own
        return plan

    def _entries(self, return_type: GraphQLObjectType, grouped: Any) -> Iterator[tuple[Any, ...]]:
        middleware = self.middleware_manager
        plain_allowed = middleware is None or not getattr(middleware, "middlewares", None)
        for key, group in grouped.items():
            node = group[0].node
            name = node.name.value
            if name == "__typename":
                yield (_TYPENAME, key, return_type.name)
                continue
            field_def = self.schema.get_field(return_type, name)
            definition = (field_def.extensions or {}).get("strawberry-definition") if field_def else None
            field_type = field_def.type if field_def else None
            leaf = get_named_type(field_type) if field_type is not None else None
            is_leaf = is_leaf_type(leaf) and (
                field_type is leaf or (isinstance(field_type, GraphQLNonNull) and field_type.of_type is leaf)
            )
            plain = (
                plain_allowed
                and field_def is not None
                and getattr(field_def.resolve, "_is_default", False)
                and definition is not None
                and not definition.extensions
                and not field_def.args
                and not node.arguments
                and is_leaf
            )
            if plain and definition is not None:
                getter = definition.default_resolver
                same = _SAME.get(id(leaf))
                yield (_ATTR, key, name, definition.python_name, getter, leaf, field_type, group, same)
                continue
            direct = self._direct_call(field_def, definition, node) if plain_allowed else None
            if direct is not None and is_leaf:
                # A resolver of a scalar or enum (latestSequence, status): its value is completed
                # inline as an attribute's is, and its info built only if it takes one.
                call, takes_info = direct
                same = _SAME.get(id(leaf))
                yield (_CALL_LEAF, key, name, leaf, field_type, group, field_def, call, takes_info, same)
                continue
            inline = self._inline_entry(key, name, field_type, group, field_def, direct) if direct else None
            if inline is not None:
                yield inline
            elif direct is not None:
                yield (_CALL, key, group, field_def, direct[0])
            else:
                yield (_GENERAL, key, group)

    def _inline_entry(
        self, key: str, name: str, field_type: Any, group: Any, field_def: Any, direct: tuple[Any, bool]
    ) -> tuple[Any, ...] | None:
        """An OBJECT or LIST entry for a field of an object type (or a list of one) whose selection
        has a plan, or None (a field with directives, an abstract type, a custom type check)."""
        if any(d.node.directives for d in group):
            return None  # @stream and the like: graphql-core's path
        inner = field_type.of_type if isinstance(field_type, GraphQLNonNull) else field_type
        kind, item_type = _OBJECT, None
        if isinstance(inner, GraphQLList):
            kind, item_type = _LIST, inner.of_type
            inner = item_type.of_type if isinstance(item_type, GraphQLNonNull) else item_type
        if not isinstance(inner, GraphQLObjectType) or not _inline_type_check(inner):
            return None
        plan = self._plan(inner, group)
        if plan is None:
            return None
        call, takes_info = direct
        pure = id(plan) in self._pure_plans
        return (kind, key, name, field_type, group, field_def, call, takes_info, inner, plan, item_type, pure)

    def _direct_call(self, field_def: Any, definition: Any, node: Any) -> tuple[Any, bool] | None:
        """The field's own function, called as strawberry's wrapper would, when nothing else may run,
        and whether it reads its info.

        Only for fields without arguments or field extensions, with a synchronous resolver (or
        none: an attribute of object type), in a schema without exception handlers.
        """
        if (
            field_def is None
            or definition is None
            or definition.extensions
            or field_def.args
            or node.arguments
            or self.exception_handlers
        ):
            return None
        resolver = definition.base_resolver
        if resolver is None:
            getter, name = definition.default_resolver, definition.python_name
            return (lambda source, _info: getter(source, name)), False
        if definition.is_async or resolver.arguments or not callable(resolver.wrapped_func):
            return None
        func = resolver.wrapped_func
        pass_self = resolver.self_parameter is not None
        sources = [p.name for p in (resolver.parent_parameter, resolver.root_parameter) if p is not None]
        info_name = resolver.info_parameter.name if resolver.info_parameter is not None else None
        info_class = self.info_class
        if not sources and pass_self:
            # The usual shapes, `(self)` and `(self, info)`, called without a keyword dict.
            params = list(inspect.signature(func).parameters.values())
            if info_name is None and len(params) == 1:
                return (lambda source, _info: func(source)), False
            if (
                info_name is not None
                and len(params) == 2
                and params[1].name == info_name
                and params[1].kind is inspect.Parameter.POSITIONAL_OR_KEYWORD
            ):
                return (lambda source, info: func(source, info_class(_raw_info=info, _field=definition))), True

        def call(source: Any, info: Any) -> Any:
            kwargs = dict.fromkeys(sources, source)
            if info_name is not None:
                kwargs[info_name] = info_class(_raw_info=info, _field=definition)
            return func(source, **kwargs) if pass_self else func(**kwargs)

        return call, info_name is not None

    def _call_field(self, parent_type: Any, source: Any, group: Any, path: Path, field_def: Any, call: Any) -> Any:
        """graphql-core's `execute_field` with the field's function called directly."""
        info = self.build_resolve_info(field_def, [d.node for d in group], parent_type, path)  # type: ignore[attr-defined]
        return_type = field_def.type
        try:
            result = call(source, info)
            if self.is_awaitable(result):
                return self.complete_awaitable_value(return_type, group, info, path, result, None)  # type: ignore[attr-defined]
            completed = self.complete_value(return_type, group, info, path, result, None)  # type: ignore[attr-defined]
            if self.is_awaitable(completed):
                return self._await_completed(completed, return_type, group, path)
        except Exception as raw_error:
            self.handle_field_error(raw_error, return_type, group, path)  # type: ignore[attr-defined]
            return None
        return completed

    def _inline(self, parent_type: GraphQLObjectType, entry: tuple[Any, ...], source: Any, path: Path) -> Any:
        """An OBJECT or LIST field, as `execute_field` and `complete_value` would complete it, with its
        object(s) completed from their plan (no resolve info unless the resolver takes one)."""
        kind, _, name, field_type, group, field_def, call, takes_info, object_type, plan, item_type, pure = entry
        info = self.build_resolve_info(field_def, [d.node for d in group], parent_type, path) if takes_info else None  # type: ignore[attr-defined]
        try:
            value = call(source, info)
            if _pending(value, self.is_awaitable):
                if info is None:
                    info = self.build_resolve_info(field_def, [d.node for d in group], parent_type, path)  # type: ignore[attr-defined]
                return self.complete_awaitable_value(field_type, group, info, path, value, None)  # type: ignore[attr-defined]
            if isinstance(value, Exception):
                raise value
            if value is None or value is Undefined:
                if isinstance(field_type, GraphQLNonNull):
                    raise TypeError(f"Cannot return null for non-nullable field {parent_type.name}.{name}.")
                return None
            if kind == _OBJECT:
                check = object_type.is_type_of
                if check is not None and not check(value, None):
                    raise invalid_return_type_error(object_type, value, group)
                completed = self._object(object_type, plan, path, value, pure)
            elif isinstance(value, list | tuple):
                completed = self._inline_items(
                    parent_type, name, item_type, object_type, plan, pure, group, path, value
                )
            else:
                # Not a plain list (an async or odd iterable, or none): graphql-core's completion.
                if info is None:
                    info = self.build_resolve_info(field_def, [d.node for d in group], parent_type, path)  # type: ignore[attr-defined]
                completed = self.complete_value(field_type, group, info, path, value, None)  # type: ignore[attr-defined]
            if self.is_awaitable(completed):
                return self._await_completed(completed, field_type, group, path)
            return completed
        except Exception as raw_error:
            self.handle_field_error(raw_error, field_type, group, path)  # type: ignore[attr-defined]
            return None

    def _inline_items(
        self,
        parent_type: GraphQLObjectType,
        name: str,
        item_type: Any,
        object_type: GraphQLObjectType,
        plan: tuple[Any, ...],
        pure: bool,
        group: Any,
        path: Path,
        items: list[Any] | tuple[Any, ...],
    ) -> Any:
        """`complete_iterable_value` for a list of objects of one type (no @stream: no directives)."""
        count = getattr(self, "count_list_items", None)  # the execution context's list budget, if any
        if count is not None:
            count(items)
        is_awaitable = self.is_awaitable
        check = object_type.is_type_of
        non_null = isinstance(item_type, GraphQLNonNull)
        completed: list[Any] = []
        append = completed.append
        pending: list[int] = []
        try:
            for index, item in enumerate(items):
                item_path = Path(path, index, None)
                if _pending(item, is_awaitable):
                    info = self.build_resolve_info(  # type: ignore[attr-defined]
                        self.schema.get_field(parent_type, name), [d.node for d in group], parent_type, path
                    )
                    complete = self.complete_awaitable_list_item_value  # type: ignore[attr-defined]
                    append(complete(item, item_type, group, info, item_path, None))
                    pending.append(index)
                    continue
                try:
                    if isinstance(item, Exception):
                        raise item
                    if item is None or item is Undefined:
                        if non_null:
                            raise TypeError(f"Cannot return null for non-nullable field {parent_type.name}.{name}.")
                        append(None)
                        continue
                    if check is not None and not check(item, None):  # type: ignore[arg-type]  # strawberry's: no info
                        raise invalid_return_type_error(object_type, item, group)
                    value = self._object(object_type, plan, item_path, item, pure)
                    if is_awaitable(value):
                        append(self._await_completed(value, item_type, group, item_path))
                        pending.append(index)
                    else:
                        append(value)
                except Exception as raw_error:
                    self.handle_field_error(raw_error, item_type, group, item_path)  # type: ignore[attr-defined]
                    append(None)
        except Exception:
            self._abandon(completed, pending)
            raise
        return _settled(completed, pending)

    async def _await_completed(self, completed: Any, return_type: Any, group: Any, path: Path) -> Any:
        try:
            return await completed
        except Exception as raw_error:
            self.handle_field_error(raw_error, return_type, group, path)  # type: ignore[attr-defined]
            return None

    def _complete(self, return_type: GraphQLObjectType, plan: tuple[Any, ...], path: Path, source: Any) -> Any:
        type_name = return_type.name
        results: dict[str, Any] = {}
        awaitable_keys: list[str] = []
        is_awaitable = self.is_awaitable
        execute_field = self.execute_field
        try:
            for entry in plan:
                kind = entry[0]
                if kind == _ATTR:
                    _, key, name, python_name, getter, leaf, field_type, group, same = entry
                    try:
                        value = getter(source, python_name)
                        if value.__class__ is same:  # a str or bool: serialized as it is
                            results[key] = value
                        elif value is None and field_type is leaf:
                            results[key] = None
                        elif same is _IntLeaf and value.__class__ is int and _INT_MIN <= value <= _INT_MAX:
                            results[key] = value
                        else:
                            results[key] = _leaf_value(value, leaf, field_type, type_name, name)
                    except Exception as raw_error:
                        self._failures += 1
                        self.handle_field_error(raw_error, field_type, group, Path(path, key, type_name))  # type: ignore[attr-defined]
                        results[key] = None
                elif kind == _CALL_LEAF:
                    _, key, name, leaf, field_type, group, field_def, call, takes_info, same = entry
                    field_path = Path(path, key, type_name)
                    nodes = [d.node for d in group] if takes_info else None
                    info = self.build_resolve_info(field_def, nodes, return_type, field_path) if takes_info else None  # type: ignore[attr-defined]
                    try:
                        value = call(source, info)
                        if value.__class__ is same or (
                            same is _IntLeaf and value.__class__ is int and _INT_MIN <= value <= _INT_MAX
                        ):
                            results[key] = value
                            continue
                        if _pending(value, is_awaitable):
                            if info is None:
                                nodes = [d.node for d in group]
                                info = self.build_resolve_info(field_def, nodes, return_type, field_path)  # type: ignore[attr-defined]
                            complete = self.complete_awaitable_value  # type: ignore[attr-defined]
                            results[key] = complete(field_type, group, info, field_path, value, None)
                            awaitable_keys.append(key)
                            continue
                        results[key] = _leaf_value(value, leaf, field_type, type_name, name)
                    except Exception as raw_error:
                        self.handle_field_error(raw_error, field_type, group, field_path)  # type: ignore[attr-defined]
                        results[key] = None
                elif kind in (_OBJECT, _LIST):
                    key = entry[1]
                    result = self._inline(return_type, entry, source, Path(path, key, type_name))
                    results[key] = result
                    if is_awaitable(result):
                        awaitable_keys.append(key)
                elif kind == _TYPENAME:
                    results[entry[1]] = entry[2]
                elif kind == _CALL:
                    key = entry[1]
                    result = self._call_field(return_type, source, entry[2], Path(path, key, type_name), *entry[3:])
                    results[key] = result
                    if is_awaitable(result):
                        awaitable_keys.append(key)
                else:
                    key, group = entry[1], entry[2]
                    result = execute_field(return_type, source, group, Path(path, key, type_name), None)
                    if result is not Undefined:
                        results[key] = result
                        if is_awaitable(result):
                            awaitable_keys.append(key)
        except Exception:
            self._abandon(results, awaitable_keys)
            raise
        return _settled(results, awaitable_keys)

    def _abandon(self, values: Any, pending: list[Any]) -> None:
        """A field or item failed the whole object or list: its values still pending settle in the
        background, as graphql-core's own `execute_fields` and list completion leave them."""
        if pending:
            self.settle_in_background([values[k] for k in pending])  # type: ignore[attr-defined]


def leaf_reader(read: Callable[[Any, Any], Any], leaf: Any, field_type: Any, type_name: str, name: str) -> Any:
    """`read`'s value completed as a scalar or enum field's (as `_complete` completes an attribute);
    a value graphql-core would refuse raises."""
    same = _SAME.get(id(leaf))
    nullable = field_type is leaf
    # An enum's few members, serialized once each (by class too: a str enum equals its value).
    members: dict[tuple[type, Any], Any] | None = {} if isinstance(leaf, GraphQLEnumType) else None

    def complete(source: Any, extra: Any) -> Any:
        value = read(source, extra)
        if value.__class__ is same:  # a str or bool: serialized as it is
            return value
        if value is None and nullable:
            return None
        if same is _IntLeaf and value.__class__ is int and _INT_MIN <= value <= _INT_MAX:
            return value
        if members is not None and isinstance(value, Enum):
            key = (value.__class__, value)
            found = members.get(key)
            if found is None:
                found = members[key] = _leaf_value(value, leaf, field_type, type_name, name)
            return found
        return _leaf_value(value, leaf, field_type, type_name, name)

    return complete


def _leaf_value(value: Any, leaf: Any, field_type: Any, type_name: str, name: str) -> Any:
    """A scalar or enum field's value completed as `complete_value`/`complete_leaf_value` would."""
    if isinstance(value, Exception):
        raise value
    if value is None or value is Undefined:
        if field_type is not leaf:
            raise TypeError(f"Cannot return null for non-nullable field {type_name}.{name}.")
        return None
    coerced = leaf.coerce_output_value(value)
    if coerced is Undefined or coerced is None:
        raise TypeError(
            f"Expected `{inspect_value(leaf)}.coerce_output_value({inspect_value(value)})` "
            f"to return non-nullable value, returned: {inspect_value(coerced)}"
        )
    return coerced


def _settled(values: Any, pending: list[Any]) -> Any:
    """An object's dict or a list's items (`values`) as they are when none is pending, else an
    awaitable of them with the pending ones (by key or index) settled together in place: the tail
    of `execute_fields` and of `complete_iterable_value`."""
    if not pending:
        return values
    return _settle(values, pending)


async def _settle(values: Any, pending: list[Any]) -> Any:
    if len(pending) == 1:
        values[pending[0]] = await values[pending[0]]
    else:
        for key, value in zip(pending, await gather_with_cancel(*(values[k] for k in pending)), strict=True):
            values[key] = value
    return values

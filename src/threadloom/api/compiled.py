"""Fast paths for queries: cached parse/validation and compiled object completion.

A page of 100 threads with a dozen fields each is ~1,500 field executions. graphql-core
runs every one through `execute_field` (a resolve info, strawberry's resolver wrapper, the
argument machinery) and `complete_value`, which made the `threads(first: 100)` page ~12 times
the cost of a raw asyncpg + orjson floor. Two things here cut that without changing a byte
of any response:

- `CachedDocuments` (a schema extension) keeps the parsed document per query text and the
  verdict of the validation rules that do not depend on variables. The rules that read the
  request's variables (the cost and page-argument rules, see `cost.CostVariables`) run on
  every request whose document declares variables, unless the same variable values passed
  them before (only passes are kept). A document the static rules refuse is validated in
  full on every request, as before, so its errors are unchanged.
- `CompiledObjects` (an execution-context mixin) completes an object value from a plan
  made once per selection (per operation): a field that is a plain attribute (strawberry's
  default resolver: no resolver, no arguments, no field extension, no resolve middleware)
  of a scalar or enum type, possibly non-null, is read and serialized inline, exactly as
  `complete_value`/`complete_leaf_value` would (same coercion, same errors, same paths);
  `__typename` is the type's name. A field without arguments or field extensions whose
  resolver is synchronous (or an attribute of object or list type) is run as `execute_field`
  runs it, with its function called directly instead of through strawberry's wrapper
  (argument conversion, extension chain); every other field goes through graphql-core's own
  `execute_field`, and `@defer` selections or
  incremental delivery take graphql-core's path entirely, and so do mutations and
  subscriptions (only query operations are compiled). Key order is the response-key
  order of the collected fields, aliases included, as in `execute_fields`.

`Settings.fast_paths` (`THREADLOOM_FAST_PATHS=0` turns it off) decides whether `GraphQLView`
applies them; tests compare responses byte for byte with and without them.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import orjson
import strawberry
from graphql import (
    DocumentNode,
    GraphQLNonNull,
    GraphQLObjectType,
    OperationDefinitionNode,
    OperationType,
    Undefined,
    get_named_type,
    is_leaf_type,
    validate,
)
from graphql.pyutils import Path, inspect
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
VARIABLE_RULE_MODULES = frozenset({"threadloom.api.cost", "threadloom.api.pagination"})


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
        if query is not None and context.graphql_document is not None:
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


def with_fast_paths(schema: strawberry.Schema) -> strawberry.Schema:
    """`schema` with both fast paths: compiled object completion and the document cache."""
    base = schema.execution_context_class
    settings = {
        "info_class": schema.config.info_class,
        "exception_handlers": bool(getattr(schema.schema_converter, "_exception_handler_specs", True)),
    }
    schema.execution_context_class = type(base.__name__, (CompiledObjects, base), settings)
    schema.extensions = (*schema.extensions, functools.partial(CachedDocuments, DocumentCache()))
    return schema


# Plan entries: (ATTR, key, field name, python name, getter, leaf type, field type, field group)
# (CALL, key, field group, field, function), (CALL_LEAF, key, field name, leaf type, field type,
# field group, field, function, whether it takes info) and (GENERAL, key, field group).
# __typename is (TYPENAME, key, type name).
_ATTR, _TYPENAME, _CALL, _GENERAL, _CALL_LEAF = 0, 1, 2, 3, 4


class CompiledObjects:
    """Execution-context mixin: object values completed from a per-selection plan (module docstring)."""

    schema: Any
    operation: OperationDefinitionNode
    middleware_manager: Any
    is_awaitable: Any
    info_class: Any = None
    exception_handlers: bool = True
    _failures = 0  # attribute fields that failed in `_complete` (see the memo in complete_object_value)

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
        if plan is None:
            return super().complete_object_value(  # type: ignore[misc]
                return_type, field_details_list, info, path, result, position_context
            )
        pure = id(plan) in self._pure_plans
        if pure:
            # A selection of attributes only, met again on the same object (a page's threads all
            # name one project): the same values, so the dict completed the first time is reused.
            memo: dict[tuple[int, int], tuple[Any, Any]] = self.__dict__.setdefault("_memo", {})
            found = memo.get((id(plan), id(result)))
            if found is not None and found[0] is result:
                return found[1]
        if return_type.is_type_of is not None and return_type.is_type_of(result, info) is not True:
            # An async or failing check: graphql-core's path raises the same error.
            return super().complete_object_value(  # type: ignore[misc]
                return_type, field_details_list, info, path, result, position_context
            )
        if not pure:
            return self._complete(return_type, plan, path, result)
        failures = self._failures
        completed = self._complete(return_type, plan, path, result)
        if self._failures == failures:  # a field error names its path: such a dict is not reused
            memo[(id(plan), id(result))] = (result, completed)  # holds `result`, so its id is not reused
        return completed

    @property
    def _pure_plans(self) -> set[int]:
        """The ids of the plans (per operation) made only of attribute fields and __typename."""
        found: set[int] | None = self.__dict__.get("_pure")
        if found is None:
            found = self.__dict__["_pure"] = set()
        return found

    def _plan(self, return_type: GraphQLObjectType, field_details_list: Any) -> tuple[Any, ...] | None:
        plans: dict[Any, Any] | None = self.__dict__.get("_plans")
        if plans is None:
            plans = self.__dict__["_plans"] = {}
        key = (return_type, id(field_details_list))
        cached = plans.get(key)
        if cached is not None:
            return cached[1]  # type: ignore[no-any-return]
        grouped, new_defer_usages, _ = self.collect_subfields(return_type, field_details_list)  # type: ignore[attr-defined]
        plan = None if new_defer_usages else tuple(self._entries(return_type, grouped))
        plans[key] = (field_details_list, plan)  # keeps the list alive, so its id is not reused
        if plan is not None and all(entry[0] in (_ATTR, _TYPENAME) for entry in plan):
            self._pure_plans.add(id(plan))  # the plan is kept in `plans`, so its id stays its own
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
                yield (_ATTR, key, name, definition.python_name, getter, leaf, field_type, group)
                continue
            direct = self._direct_call(field_def, definition, node) if plain_allowed else None
            if direct is not None and is_leaf:
                # A resolver of a scalar or enum (latestSequence, status): its value is completed
                # inline as an attribute's is, and its info built only if it takes one.
                call, takes_info = direct
                yield (_CALL_LEAF, key, name, leaf, field_type, group, field_def, call, takes_info)
            elif direct is not None:
                yield (_CALL, key, group, field_def, direct[0])
            else:
                yield (_GENERAL, key, group)

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
        execute_field = self.execute_field  # type: ignore[attr-defined]
        try:
            for entry in plan:
                kind = entry[0]
                if kind == _ATTR:
                    _, key, name, python_name, getter, leaf, field_type, group = entry
                    try:
                        results[key] = _leaf_value(getter(source, python_name), leaf, field_type, type_name, name)
                    except Exception as raw_error:
                        self._failures += 1
                        self.handle_field_error(raw_error, field_type, group, Path(path, key, type_name))  # type: ignore[attr-defined]
                        results[key] = None
                elif kind == _CALL_LEAF:
                    _, key, name, leaf, field_type, group, field_def, call, takes_info = entry
                    field_path = Path(path, key, type_name)
                    nodes = [d.node for d in group]
                    info = self.build_resolve_info(field_def, nodes, return_type, field_path) if takes_info else None  # type: ignore[attr-defined]
                    try:
                        value = call(source, info)
                        if is_awaitable(value):
                            if info is None:
                                info = self.build_resolve_info(field_def, nodes, return_type, field_path)  # type: ignore[attr-defined]
                            complete = self.complete_awaitable_value  # type: ignore[attr-defined]
                            results[key] = complete(field_type, group, info, field_path, value, None)
                            awaitable_keys.append(key)
                            continue
                        results[key] = _leaf_value(value, leaf, field_type, type_name, name)
                    except Exception as raw_error:
                        self.handle_field_error(raw_error, field_type, group, field_path)  # type: ignore[attr-defined]
                        results[key] = None
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
            if awaitable_keys:
                self.settle_in_background([results[k] for k in awaitable_keys])  # type: ignore[attr-defined]
            raise
        if not awaitable_keys:
            return results
        return _awaited(results, awaitable_keys)


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
            f"Expected `{inspect(leaf)}.coerce_output_value({inspect(value)})` "
            f"to return non-nullable value, returned: {inspect(coerced)}"
        )
    return coerced


async def _awaited(results: dict[str, Any], keys: list[str]) -> dict[str, Any]:
    """`execute_fields`' tail: the awaitable fields settled together, in place."""
    if len(keys) == 1:
        results[keys[0]] = await results[keys[0]]
    else:
        results.update(zip(keys, await gather_with_cancel(*(results[k] for k in keys)), strict=True))
    return results


"""Static query cost: how many objects an operation may return, computed before execution.

Like GitHub's node limit: every list or connection field may return up to its page size
(`first`/`last`, or the default page size when absent, never more than the maximum page
size) items for each item of the lists above it, so it costs the product of the page sizes
down the tree. The cost of an operation is the sum over its list and connection fields.
`edges`/`nodes` of a connection are the connection's items (no extra factor); scalar
lists and introspection (`__schema`, `__type`) cost nothing (the schema bounds them).
Aliases each count, fragments are expanded, variables are read from the request.

The validation rule class is built once per budget (graphql-core's validation is then as
cheap as for the other rules); the request's variables reach it through a context
variable that `CostVariables` sets around validation.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from graphql import (
    FieldNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLList,
    GraphQLSchema,
    InlineFragmentNode,
    IntValueNode,
    ListValueNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
    VariableNode,
    get_named_type,
    get_nullable_type,
    is_leaf_type,
)
from graphql import (
    FragmentDefinitionNode as FragmentNode,
)
from graphql.language import ValueNode, VisitorAction
from strawberry.extensions import SchemaExtension

DEFAULT_PAGE = 20
CODE = "QUERY_TOO_COSTLY"
SATURATED = 10**15  # a cost stops growing here (a fragment bomb's would take memory and time)

_variables: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "cost_variables", default=MappingProxyType({})
)


def request_variables() -> Mapping[str, Any]:
    """The variables of the request being validated (empty outside validation)."""
    return _variables.get()


@dataclasses.dataclass(frozen=True, slots=True)
class Pages:
    default: int = DEFAULT_PAGE
    maximum: int = 100


def _int_value(node: ValueNode | None, variables: Mapping[str, Any], defaults: Mapping[str, Any]) -> Any:
    if isinstance(node, IntValueNode):
        return int(node.value)
    if isinstance(node, VariableNode):
        name = node.name.value
        return variables.get(name, defaults.get(name))
    if isinstance(node, ListValueNode):
        return list(node.values)
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class _Walker:
    """Walks one operation's selections with the schema's types (cycles in fragments stop; each
    fragment is walked once per parent type, so spreading one many times costs no extra walk)."""

    schema: GraphQLSchema
    fragments: Mapping[str, FragmentNode]
    variables: Mapping[str, Any]
    defaults: Mapping[str, Any]
    pages: Pages
    memo: dict[tuple[str, str | None], int] = dataclasses.field(default_factory=dict)

    def _page(self, field: FieldNode) -> int:
        """The most items one execution of this list field may return."""
        sizes: list[int] = []
        for argument in field.arguments or ():
            name = argument.name.value
            value = _int_value(argument.value, self.variables, self.defaults)
            if name in ("first", "last") and isinstance(value, int) and not isinstance(value, bool):
                sizes.append(value)
            elif name == "ids" and isinstance(value, list):
                sizes.append(len(value))
        if not sizes:
            return self.pages.default
        return max(0, min(max(sizes), self.pages.maximum))

    def cost(self, selection_set: SelectionSetNode | None, parent: Any, multiplier: int, seen: frozenset[str]) -> int:
        """The cost of a selection under `multiplier` items: linear in it, so the cost per item is
        what is computed (and memoized per fragment and parent type)."""
        return min(multiplier * self._unit(selection_set, parent, seen), SATURATED)

    def _unit(self, selection_set: SelectionSetNode | None, parent: Any, seen: frozenset[str]) -> int:
        """The cost of a selection for one item of its parent; each fragment is priced once per
        parent type (a fragment spread twice costs twice, but is walked once)."""
        if selection_set is None:
            return 0
        total = 0
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                total += self._field(selection, parent, seen)
            elif isinstance(selection, InlineFragmentNode):
                cond = selection.type_condition
                narrowed = self.schema.get_type(cond.name.value) if cond is not None else parent
                total += self._unit(selection.selection_set, narrowed or parent, seen)
            elif isinstance(selection, FragmentSpreadNode):
                name = selection.name.value
                fragment = self.fragments.get(name)
                if fragment is None or name in seen:
                    continue  # unknown, or a cycle (other rules report both)
                narrowed = self.schema.get_type(fragment.type_condition.name.value) or parent
                key = (name, getattr(narrowed, "name", None))
                found = self.memo.get(key)
                if found is None:
                    found = self.memo[key] = self._unit(fragment.selection_set, narrowed, seen | {name})
                total += found
            total = min(total, SATURATED)
        return total

    def _field(self, field: FieldNode, parent_type: Any, seen: frozenset[str]) -> int:
        name = field.name.value
        if name.startswith("__"):
            return 0
        fields = getattr(parent_type, "fields", None)
        definition = fields.get(name) if fields else None
        if definition is None:
            return 0  # unknown fields are other rules' business
        out = get_nullable_type(definition.type)
        named = get_named_type(definition.type)
        if is_leaf_type(named):
            return 0
        is_list = isinstance(out, GraphQLList)
        arg_names = definition.args.keys()
        connection = "first" in arg_names or "last" in arg_names
        in_connection = getattr(parent_type, "name", "").endswith("Connection") and name in ("edges", "nodes")
        if (connection or is_list) and not in_connection:
            page = self._page(field)
            return min(page + page * self._unit(field.selection_set, named, seen), SATURATED)
        return self._unit(field.selection_set, named, seen)


def operation_cost(
    schema: GraphQLSchema,
    operation: OperationDefinitionNode,
    fragments: Mapping[str, FragmentNode],
    variables: Mapping[str, Any] | None = None,
    pages: Pages | None = None,
) -> int:
    """The number of objects the operation may return at most (see the module docstring)."""
    root = schema.get_root_type(operation.operation)
    if root is None:
        return 0
    defaults: dict[str, Any] = {}
    for definition in operation.variable_definitions or ():
        if definition.default_value is not None:
            defaults[definition.variable.name.value] = _int_value(definition.default_value, {}, {})
    walker = _Walker(schema, fragments, variables or {}, defaults, pages or Pages())
    return walker.cost(operation.selection_set, root, 1, frozenset())


def too_costly(cost: int, max_cost: int, node: OperationDefinitionNode | None = None) -> GraphQLError:
    return GraphQLError(
        f"query cost {cost} is over the limit of {max_cost} (page sizes multiplied down the tree); "
        "ask for smaller pages or fewer nested lists",
        node,
        extensions={"code": CODE, "cost": cost, "maxCost": max_cost},
    )


@functools.cache
def cost_rule(max_cost: int, default_page: int = DEFAULT_PAGE, max_page: int = 100) -> type[ValidationRule]:
    """The validation rule for one budget, built once (a new class per request defeats caching)."""
    pages = Pages(default_page, max_page)

    class QueryCostRule(ValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            fragments = {d.name.value: d for d in context.document.definitions if isinstance(d, FragmentNode)}
            self._fragments = fragments

        def enter_operation_definition(self, node: OperationDefinitionNode, *_: Any) -> VisitorAction:
            cost = operation_cost(self.context.schema, node, self._fragments, _variables.get(), pages)
            if cost > max_cost:
                self.report_error(too_costly(cost, max_cost, node))
            return self.SKIP

    return QueryCostRule


@contextlib.contextmanager
def variables_bound(variables: Any) -> Iterator[None]:
    """The cost and page-argument rules read `variables` while this lasts."""
    token = _variables.set(variables if isinstance(variables, Mapping) else {})
    try:
        yield
    finally:
        _variables.reset(token)


class CostVariables(SchemaExtension):
    """Hands the request's variables to the cost and page-argument rules for the time of validation."""

    def on_validate(self) -> Iterator[None]:
        with variables_bound(self.execution_context.variables):
            yield

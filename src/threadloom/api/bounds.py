"""A linear pre-check of a document's shape, and validation that never stalls the event loop.

graphql-core's validation walks the document as written, but some rules expand it: the depth,
alias and cost rules follow fragment spreads, and OverlappingFieldsCanBeMergedRule compares
every pair of fields sharing a response name (and, for each pair, their sub-selections). A
884-character fragment bomb (`fragment F0 on Query { ...F1 ...F1 }` 25 levels deep) or 1,240
copies of one field held the event loop, and so every tenant, for seconds to minutes.

`measure` walks the document once, each fragment once (its summary is memoized by name; a
spread of a fragment being measured counts as empty, so a cycle cannot loop: NoFragmentCycles
reports it). Counts saturate at `SATURATED`, so a bomb costs neither time nor memory. It gives:

- `fields`: field selections after expanding fragments (a bomb has millions);
- `width`: the most fields one selection set holds, fragments at its level expanded;
- `overlap`: a bound on the pairs OverlappingFieldsCanBeMergedRule compares: for every selection
  set and every response name it holds more than once, (the expanded sizes of those fields)²/2
  (two fields of sizes a and b compare at most a·b pairs of their descendants);
- `aliases` and `depth` as the alias and depth rules count them.

`BoundedValidation` (a schema extension, after `CostVariables`) refuses a document over
`MAX_EXPANDED_FIELDS`, `MAX_SELECTION_FIELDS` or `MAX_OVERLAP` with `QUERY_TOO_COSTLY` before
any rule runs, and validates a document bigger than `INLINE_FIELDS` / `INLINE_QUERY_CHARS` on
a worker thread (its passes kept per query text and variables), so the event loop waits for it
instead of running it. The token limit (`Limits.max_tokens`, graphql-core's parser) is reported
with the same code. Small documents are validated inline as before (the document cache of
`compiled.CachedDocuments` keeps their verdicts).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLSyntaxError,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    ValidationContext,
    ValidationRule,
)
from strawberry.extensions import SchemaExtension
from strawberry.schema.schema import validate_document

from threadloom.api.compiled import _Lru, _variables_key
from threadloom.api.cost import CODE
from threadloom.config import Limits

# The documented limits (docs/security.md, "Query cost and time"); like `Limits.max_tokens`, not settings.
MAX_EXPANDED_FIELDS = 20_000
MAX_SELECTION_FIELDS = 500
MAX_OVERLAP = 50_000
# Documents at most this big are validated on the event loop (a few milliseconds at most).
INLINE_FIELDS = 64
INLINE_QUERY_CHARS = 2048
SATURATED = 1 << 40


def _add(a: int, b: int) -> int:
    return min(a + b, SATURATED)


def _mul(a: int, b: int) -> int:
    return min(a * b, SATURATED)


@dataclasses.dataclass(slots=True)
class _Summary:
    """One selection set, fragments expanded: its totals and its level's response names."""

    fields: int = 0
    aliases: int = 0
    depth: int = 0
    # response name -> (fields with it at this level, their expanded sizes summed)
    level: dict[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    width: int = 0

    def merge(self, other: _Summary) -> None:
        self.fields = _add(self.fields, other.fields)
        self.aliases = _add(self.aliases, other.aliases)
        self.depth = max(self.depth, other.depth)
        self.width = _add(self.width, other.width)
        for name, (count, size) in other.level.items():
            mine = self.level.get(name, (0, 0))
            self.level[name] = (_add(mine[0], count), _add(mine[1], size))


@dataclasses.dataclass(frozen=True, slots=True)
class Shape:
    """What `measure` found (see the module docstring); `depths` by operation name."""

    fields: int
    width: int
    overlap: int
    aliases: int
    depths: Mapping[str, int]


class _Over(Exception):
    """A selection set passed the width or expanded-fields limit: measuring stops there."""


class _Measure:
    def __init__(self, document: DocumentNode, max_width: int, max_fields: int) -> None:
        self.fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
        self.memo: dict[str, _Summary] = {}
        self.active: set[str] = set()
        self.max_width = max_width
        self.max_fields = max_fields
        self.fields = 0
        self.width = 0
        self.overlap = 0

    def fragment(self, name: str) -> _Summary | None:
        found = self.memo.get(name)
        if found is not None:
            return found
        definition = self.fragments.get(name)
        if definition is None or name in self.active:
            return None  # unknown (KnownFragmentNames) or a cycle (NoFragmentCycles)
        self.active.add(name)
        try:
            summary = self.selection_set(definition.selection_set)
        finally:
            self.active.discard(name)
        self.memo[name] = summary
        return summary

    def selection_set(self, selection_set: SelectionSetNode) -> _Summary:
        summary = _Summary()
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                key = (selection.alias or selection.name).value
                size, aliases, depth = 1, 1 if selection.alias else 0, 0
                if selection.selection_set is not None:
                    sub = self.selection_set(selection.selection_set)
                    size, aliases = _add(size, sub.fields), _add(aliases, sub.aliases)
                    if not selection.name.value.startswith("__"):
                        depth = 1 + sub.depth
                count, sizes = summary.level.get(key, (0, 0))
                summary.level[key] = (count + 1, _add(sizes, size))
                summary.merge(_Summary(size, aliases, depth, {}, 1))
            elif isinstance(selection, InlineFragmentNode):
                summary.merge(self.selection_set(selection.selection_set))
            elif isinstance(selection, FragmentSpreadNode):
                found = self.fragment(selection.name.value)
                if found is not None:
                    summary.merge(found)
            if summary.width > self.max_width or summary.fields > self.max_fields:
                self.width, self.fields = max(self.width, summary.width), summary.fields
                raise _Over
        self.width = max(self.width, summary.width)
        for count, sizes in summary.level.values():
            if count > 1:
                self.overlap = _add(self.overlap, _mul(sizes, sizes) // 2)
        return summary


def measure(document: DocumentNode, max_width: int = SATURATED, max_fields: int = SATURATED) -> Shape:
    """The document's shape, in one pass over its nodes (each fragment once).

    Measuring stops at the first selection set wider than `max_width` or holding more than
    `max_fields` expanded fields (the figures are then partial, and that one is over its limit),
    so merging the response names of fragments never costs more than the limits allow. A
    document nested deeper than the interpreter's recursion allows is reported as infinitely wide."""
    walk = _Measure(document, max_width, max_fields)
    fields = aliases = 0
    depths: dict[str, int] = {}
    try:
        for definition in document.definitions:
            if isinstance(definition, OperationDefinitionNode):
                summary = walk.selection_set(definition.selection_set)
                fields, aliases = _add(fields, summary.fields), _add(aliases, summary.aliases)
                name = definition.name.value if definition.name else "anonymous"
                depths[name] = max(depths.get(name, 0), summary.depth)
            elif isinstance(definition, FragmentDefinitionNode):
                walk.fragment(definition.name.value)  # validated too, so measured too
    except _Over:
        fields = max(fields, walk.fields)
    except RecursionError:
        walk.width = SATURATED
    return Shape(fields, walk.width, walk.overlap, aliases, depths)


def refusal(shape: Shape) -> GraphQLError | None:
    """The QUERY_TOO_COSTLY error for a shape over a limit, or None."""
    for limit, count, maximum, what in (
        ("selectionFields", shape.width, MAX_SELECTION_FIELDS, "fields in one selection set"),
        ("expandedFields", shape.fields, MAX_EXPANDED_FIELDS, "field selections with fragments expanded"),
        ("overlappingFields", shape.overlap, MAX_OVERLAP, "comparisons of fields sharing a response name"),
    ):
        if count > maximum:
            return too_big(limit, what, maximum, count)
    return None


def too_big(limit: str, what: str, maximum: int, count: int | None = None) -> GraphQLError:
    extensions: dict[str, Any] = {"code": CODE, "limit": limit, "max": maximum}
    shown = "more than" if count is None or count >= SATURATED else f"{count},"
    if count is not None and count < SATURATED:
        extensions["count"] = count
    return GraphQLError(
        f"the document has {shown} {what} over the limit of {maximum}; send a smaller document",
        extensions=extensions,
    )


def check(document: DocumentNode) -> GraphQLError | None:
    """The pre-check alone: a refusal, or None when the document may be validated."""
    return refusal(measure(document, MAX_SELECTION_FIELDS, MAX_EXPANDED_FIELDS))


def inline(document: DocumentNode, query: str | None) -> bool:
    """Whether the document passes the pre-check and is small enough to validate on the event loop."""
    shape = measure(document, MAX_SELECTION_FIELDS, MAX_EXPANDED_FIELDS)
    return refusal(shape) is None and shape.fields <= INLINE_FIELDS and len(query or "") <= INLINE_QUERY_CHARS


# --- the depth and alias rules, each fragment counted once --------------------------------------


@functools.cache
def depth_rule(max_depth: int) -> type[ValidationRule]:
    """Strawberry's depth limit (same message) with fragments measured once each."""

    class DepthRule(ValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            shape = measure(context.document)
            operations = {
                (d.name.value if d.name else "anonymous"): d
                for d in context.document.definitions
                if isinstance(d, OperationDefinitionNode)
            }
            for name, depth in shape.depths.items():
                if depth > max_depth:
                    message = f"'{name}' exceeds maximum operation depth of {max_depth}"
                    context.report_error(GraphQLError(message, operations[name]))

    return DepthRule


@functools.cache
def alias_rule(max_aliases: int) -> type[ValidationRule]:
    """Strawberry's alias limit (same message) with fragments counted once each."""

    class AliasRule(ValidationRule):
        def __init__(self, context: ValidationContext) -> None:
            super().__init__(context)
            aliases = measure(context.document).aliases
            if aliases > max_aliases:
                context.report_error(GraphQLError(f"{aliases} aliases found. Allowed: {max_aliases}"))

    return AliasRule


# --- the extension ------------------------------------------------------------------------------

# Validation of big documents runs here: two threads, so one client's documents cannot take a
# whole core from the event loop for long, nor wait behind an unrelated pool's work.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=2, thread_name_prefix="threadloom-validate")
_TOKENS = "Document contains more than"
_PASSED = _Lru(256)  # (query, rules, variables) whose validation passed on the pool


class BoundedValidation(SchemaExtension):
    """Pre-checks every document and validates the big ones off the event loop (module docstring)."""

    def __init__(self, limits: Limits, passed: _Lru | None = None) -> None:
        self.limits = limits
        self.passed = passed if passed is not None else _PASSED

    def on_parse(self) -> Iterator[None]:
        yield
        for error in self.execution_context.pre_execution_errors or ():
            if isinstance(error, GraphQLSyntaxError) and _TOKENS in error.message:
                error.extensions = {"code": CODE, "limit": "tokens", "max": self.limits.max_tokens}

    async def on_validate(self) -> AsyncIterator[None]:
        context = self.execution_context
        document, query, rules = context.graphql_document, context.query, context.validation_rules
        if document is None or context.pre_execution_errors is not None or not rules:
            yield
            return
        shape = measure(document, MAX_SELECTION_FIELDS, MAX_EXPANDED_FIELDS)
        refused = refusal(shape)
        if refused is not None:
            context.pre_execution_errors = [refused]
        elif shape.fields > INLINE_FIELDS or len(query or "") > INLINE_QUERY_CHARS:
            values = _variables_key(context.variables)
            key = (query, rules, values)
            if values is not None and self.passed.get(key):
                context.pre_execution_errors = []
            else:
                schema = context.schema._schema
                loop = asyncio.get_running_loop()
                # The cost and page rules read the request's variables from a context variable.
                run = contextvars.copy_context().run
                errors = await loop.run_in_executor(_POOL, run, validate_document, schema, document, tuple(rules))
                if not errors and values is not None:
                    self.passed.put(key, True)
                context.pre_execution_errors = errors
        yield

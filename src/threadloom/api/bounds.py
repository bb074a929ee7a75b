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
any rule runs, and validates a document bigger than `INLINE_FIELDS` / `INLINE_NODES` / `INLINE_QUERY_CHARS` on
a worker thread (its passes kept per query text and variables), so the event loop waits for it
instead of running it; for a text longer than `INLINE_QUERY_CHARS` the pre-check runs there too.
The token limit (`Limits.max_tokens`, graphql-core's parser) is reported with the same code.
Small documents are validated inline as before (the document cache of
`compiled.CachedDocuments` keeps their verdicts).

Parsing is bounded by the body limit (256 KiB) and the token limit, but a 256 KiB comment, string
or run of tokens still takes graphql-core's pure-Python lexer 50-150 ms. `BoundedSchema` (the
schema class `build_schema` makes) parses a text longer than `INLINE_QUERY_CHARS` on the same
pool, on every path (HTTP queries and mutations, multipart and graphql-transport-ws
subscriptions all go through strawberry's `_prepare_operation_async`; the subscription fast path
of `api.cohorts` leaves big texts to it), into an `IndexedSource` so that a later error's
location is found without scanning the text again. The pool shares the GIL: while it works the
event loop gets the interpreter back every `POOL_SWITCH_INTERVAL` (1 ms), so it is slowed but
not held (`bench/validation_worst.py` measures the longest gap).
"""

from __future__ import annotations

import array
import asyncio
import bisect
import concurrent.futures
import contextvars
import dataclasses
import functools
import re
import sys
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import strawberry
from graphql import (
    ASTValidationRule,
    DocumentNode,
    FieldNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLSyntaxError,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
    Source,
    SourceLocation,
    ValidationContext,
    ValidationRule,
    parse,
)
from strawberry.exceptions import MissingQueryError
from strawberry.extensions import SchemaExtension
from strawberry.extensions.runner import SchemaExtensionsRunner
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.schema.schema import _parse_operation_document, _run_validation, validate_document
from strawberry.types.execution import ExecutionContext, PreExecutionError

from threadloom.api.compiled import _Lru, _variables_key
from threadloom.api.cost import CODE
from threadloom.config import Limits

# The documented limits (docs/security.md, "Query cost and time"); like `Limits.max_tokens`, not settings.
MAX_EXPANDED_FIELDS = 20_000
MAX_SELECTION_FIELDS = 500
MAX_OVERLAP = 50_000
# Documents at most this big are parsed and validated on the event loop (about a millisecond each at most,
# bench/validation_worst.py): a text of at most INLINE_QUERY_CHARS (graphql-core lexes ~3.5 µs a token, so a
# 2 KiB run of tokens took 3.5 ms), expanding to at most INLINE_FIELDS fields and written with at most
# INLINE_NODES selections and definitions (every rule visits each written node: 47 unused fragments in 2 KiB
# took 7 ms to validate, 60 nested inline fragments 3.4 ms).
INLINE_FIELDS = 32
INLINE_NODES = 32
INLINE_QUERY_CHARS = 1024
SATURATED = 1 << 40
T = TypeVar("T")


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
    written: int = 0  # selections and definitions as written (each fragment's once)


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
        self.written = 0

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
        self.written += len(selection_set.selections)
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
    walk.written = len(document.definitions)
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
    return Shape(fields, walk.width, walk.overlap, aliases, depths, walk.written)


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


def small(shape: Shape) -> bool:
    """Whether a document of this shape is validated on the event loop (see INLINE_FIELDS)."""
    return shape.fields <= INLINE_FIELDS and shape.written <= INLINE_NODES


def inline(document: DocumentNode, query: str | None) -> bool:
    """Whether the document passes the pre-check and is small enough to validate on the event loop."""
    shape = measure(document, MAX_SELECTION_FIELDS, MAX_EXPANDED_FIELDS)
    return refusal(shape) is None and small(shape) and len(query or "") <= INLINE_QUERY_CHARS


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


# --- the extension and the schema ---------------------------------------------------------------

# Parsing and validation of big documents run here, in a pool of its own (they never wait behind
# unrelated work). One thread: graphql-core is pure Python, so under the GIL a second thread adds no
# throughput, only a second contender the event loop must beat to the interpreter (it doubled the
# longest hold, bench/validation_worst.py). While the thread works, the interpreter is handed over
# every POOL_SWITCH_INTERVAL seconds instead of every 5 ms, so the loop waits less for it each time.
_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="threadloom-validate")
POOL_SWITCH_INTERVAL = 0.001
_TOKENS = "Document contains more than"
_PASSED = _Lru(256)  # (query, rules, variables) whose validation passed on the pool


def _briefly(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` on the pool's thread, the interpreter switched every POOL_SWITCH_INTERVAL meanwhile.

    The switch interval is the process's; the pool's one thread is the only one that changes it,
    and puts the previous value back as soon as it is done, so between big documents the process
    runs with its usual interval."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, POOL_SWITCH_INTERVAL))
    try:
        return function(*args)
    finally:
        sys.setswitchinterval(previous)


def big(query: str | None) -> bool:
    """Whether a text is parsed, pre-checked and validated on the pool rather than the event loop."""
    return query is not None and len(query) > INLINE_QUERY_CHARS


def _checked(schema: Any, document: DocumentNode, rules: Sequence[type[ASTValidationRule]]) -> list[GraphQLError]:
    """The pre-check, then the rules when it passes: one hop to the pool for a big document."""
    refused = check(document)
    return [refused] if refused is not None else validate_document(schema, document, tuple(rules))


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
        if not big(query):
            shape = measure(document, MAX_SELECTION_FIELDS, MAX_EXPANDED_FIELDS)
            refused = refusal(shape)
            if refused is not None:
                context.pre_execution_errors = [refused]
                yield
                return
            if small(shape):
                yield  # strawberry (or the document cache) validates it inline
                return
        values = _variables_key(context.variables)
        key = (query, rules, values)
        if values is not None and self.passed.get(key):
            context.pre_execution_errors = []  # it passed the pre-check and the rules with these variables
        else:
            schema = context.schema._schema
            loop = asyncio.get_running_loop()
            # The cost and page rules read the request's variables from a context variable.
            run = contextvars.copy_context().run
            errors = await loop.run_in_executor(_POOL, _briefly, run, _checked, schema, document, tuple(rules))
            if not errors and values is not None:
                self.passed.put(key, True)
            context.pre_execution_errors = errors
        yield


_NEWLINE = re.compile(r"\r\n|[\n\r]")  # graphql-core's line breaks (`graphql.language.source`)


class IndexedSource(Source):
    """A big document's source, its line breaks indexed once (on the pool, with the parse).

    graphql-core finds an error's line by scanning the body up to the error's position, on every
    error: 2-5 ms for a node after 256 KiB of padding, on the event loop when a resolver fails. This
    finds it by bisection, with graphql-core's answer (`Source.get_location`: the line breaks
    `\r\n`, `\n` and `\r` that start before the position)."""

    def __init__(self, body: str) -> None:
        super().__init__(body)
        starts, ends = array.array("q"), array.array("q")
        for match in _NEWLINE.finditer(body):
            starts.append(match.start())
            ends.append(match.end())
        self.starts, self.ends = starts, ends

    def get_location(self, position: int) -> SourceLocation:
        breaks = bisect.bisect_left(self.starts, position)
        line_start = self.ends[breaks - 1] if breaks else 0
        return SourceLocation(breaks + 1, position + 1 - line_start)


async def parse_document(context: ExecutionContext) -> None:
    """strawberry's parse step (`_parse_operation_document`), on the pool for a big text.

    A document already set (`compiled.CachedDocuments` found it) or a small text is parsed
    inline, as strawberry does; a big one on `_POOL`, with the same options (the token limit),
    so a syntax or token-limit error is the one strawberry would raise, reported the same way."""
    query = context.query
    if context.graphql_document is not None or query is None or not big(query):
        _parse_operation_document(context)
        return
    max_tokens = context.parse_options.get("max_tokens")
    loop = asyncio.get_running_loop()
    parse_big = functools.partial(_parse_big, query, max_tokens)
    context.graphql_document = await loop.run_in_executor(_POOL, _briefly, parse_big)


def _parse_big(query: str, max_tokens: int | None) -> DocumentNode:
    return parse(IndexedSource(query), max_tokens=max_tokens)


class BoundedSchema(strawberry.Schema):
    """A strawberry schema whose parse step does not run a big document on the event loop.

    strawberry 0.341 parses inside `_prepare_operation_async`, which `execute` (HTTP queries and
    mutations) and `stream` (multipart and graphql-transport-ws subscriptions) both call; no
    extension hook can replace the parse and still have its error reported as a parse error. This
    is that method with `_parse_operation_document(context)` replaced by `await parse_document(context)`
    (tests/test_validation_limits.py compares the two, so an upgrade that changes it is noticed)."""

    async def _prepare_operation_async(
        self, context: ExecutionContext, extensions_runner: SchemaExtensionsRunner
    ) -> PreExecutionError | None:
        """Parse, check the operation type, and validate before execution."""
        if not context.query and context.graphql_document is None:
            raise MissingQueryError

        async with extensions_runner.parsing():
            try:
                await parse_document(context)

            except GraphQLError as error:
                context.pre_execution_errors = [error]
                return PreExecutionError(data=None, errors=[error])

            except Exception as error:
                error = GraphQLError(str(error), original_error=error)
                context.pre_execution_errors = [error]
                return PreExecutionError(data=None, errors=[error])

        try:
            operation_type = context.operation_type
        except RuntimeError as error:
            raise CannotGetOperationTypeError(context.operation_name) from error

        if operation_type not in context.allowed_operations:
            raise InvalidOperationTypeError(operation_type)

        async with extensions_runner.validation():
            _run_validation(context)
            if context.pre_execution_errors:
                return PreExecutionError(
                    data=None,
                    errors=context.pre_execution_errors,
                )

        return None

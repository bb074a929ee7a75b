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
any rule runs. Small documents (at most `INLINE_QUERY_CHARS` of text, `INLINE_FIELDS` expanded fields and
`INLINE_NODES` written nodes: about a millisecond at most) are validated inline as before (the document
cache of `compiled.CachedDocuments` keeps their verdicts). A text of at most `INLINE_QUERY_CHARS` that is
not small in shape (an ordinary query of 33 fields or more) is validated on a thread of its own: its work is
bounded by its length (at most about 6 ms). A longer text is parsed and validated in the validation process
(`api.validation_process`), so the event loop only waits for the verdict. Passes are kept per query text and
variables; on the thread, a text that passed once is judged again only by the rules that read variables
(a client asks for one run after another with the same text). The token limit (`Limits.max_tokens`,
graphql-core's parser) is reported with the same code.

Parsing is bounded by the body limit (256 KiB) and the token limit, but a 256 KiB comment, string
or run of tokens still takes graphql-core's pure-Python lexer 50-150 ms. `BoundedSchema` (the
schema class `build_schema` makes) parses a text longer than `INLINE_QUERY_CHARS` in the validation
process too, in the same trip as its pre-check and validation, on every path (HTTP queries and
mutations, multipart and graphql-transport-ws subscriptions all go through strawberry's
`_prepare_operation_async`; the subscription fast path of `api.cohorts` leaves big texts to it).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import dataclasses
import functools
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
    ValidationContext,
    ValidationRule,
)
from strawberry.exceptions import MissingQueryError
from strawberry.extensions import SchemaExtension
from strawberry.extensions.runner import SchemaExtensionsRunner
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.schema.schema import _parse_operation_document, _run_validation, validate_document
from strawberry.types.execution import ExecutionContext, PreExecutionError

from threadloom.api.compiled import VARIABLE_RULE_MODULES, _variables_key
from threadloom.api.cost import CODE
from threadloom.api.validation_process import (
    IndexedSource as IndexedSource,  # read here by tests
)
from threadloom.api.validation_process import (
    ValidationProcess,
    document_of,
    errors_of,
    raise_syntax,
    source_of,
)
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

_TOKENS = "Document contains more than"


def big(query: str | None) -> bool:
    """Whether a text is parsed, pre-checked and validated in the validation process rather than inline."""
    return query is not None and len(query) > INLINE_QUERY_CHARS


def checked(schema: Any, document: DocumentNode, rules: Sequence[type[ASTValidationRule]]) -> list[GraphQLError]:
    """The pre-check, then the rules when it passes (what the validation process runs for a document)."""
    refused = check(document)
    return [refused] if refused is not None else validate_document(schema, document, tuple(rules))


# A text of at most INLINE_QUERY_CHARS that is not small in shape is validated on this thread: its work is
# bounded by its length (at most ~6 ms, bench/validation_worst.py), too little to be worth a trip to the
# validation process, which most ordinary queries of 33+ fields would otherwise start on every server. While
# the thread works the interpreter is handed over every POOL_SWITCH_INTERVAL seconds instead of every 5 ms.
_THREAD = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="threadloom-validate")
POOL_SWITCH_INTERVAL = 0.001


def _briefly(function: Callable[..., T], *args: Any) -> T:
    """`function(*args)` on the thread, the interpreter switched every POOL_SWITCH_INTERVAL meanwhile (the
    previous interval is put back as soon as it is done)."""
    previous = sys.getswitchinterval()
    sys.setswitchinterval(min(previous, POOL_SWITCH_INTERVAL))
    try:
        return function(*args)
    finally:
        sys.setswitchinterval(previous)


def _process(context: ExecutionContext) -> ValidationProcess:
    schema = context.schema
    assert isinstance(schema, BoundedSchema), "BoundedValidation needs the schema build_schema makes"
    return schema.validation


class BoundedValidation(SchemaExtension):
    """Pre-checks every document and has the big ones validated in the validation process (module docstring)."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def on_parse(self) -> Iterator[None]:
        yield
        for error in self.execution_context.pre_execution_errors or ():
            if isinstance(error, GraphQLSyntaxError) and _TOKENS in error.message:
                error.extensions = {"code": CODE, "limit": "tokens", "max": self.limits.max_tokens}

    async def on_validate(self) -> AsyncIterator[None]:
        context = self.execution_context
        document, query, rules = context.graphql_document, context.query, context.validation_rules
        if document is None or context.pre_execution_errors is not None or not rules or query is None:
            yield  # (a document without its text: strawberry validates it, the pre-check first)
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
        process = _process(context)
        values = _variables_key(context.variables)
        if values is not None and process.passed.get((query, values)):
            context.pre_execution_errors = []  # it passed the pre-check and the rules with these variables
        elif big(query):  # a big text whose document was given (parsed texts got their verdict in the parse step)
            verdict = await process.judge(
                query, context.variables, max_tokens=self.limits.max_tokens, operation=False, big=True
            )
            source = document.loc.source if document.loc is not None else Source(query)
            context.pre_execution_errors = errors_of(verdict, source)
            if not verdict.errors and values is not None:
                process.passed.put((query, values), True)
        else:
            # The cost and page rules read the request's variables from a context variable.
            run = contextvars.copy_context().run
            loop = asyncio.get_running_loop()
            schema = context.schema._schema
            key = (query, tuple(rules))
            if process.statics.get(key):
                # The rules that read no variables passed this text before: only the variable rules are left
                # (a client asking for one run after another sends one text with a new id each time).
                only = tuple(r for r in rules if r.__module__ in VARIABLE_RULE_MODULES)
                errors = await loop.run_in_executor(_THREAD, _briefly, run, validate_document, schema, document, only)
            else:
                errors = await loop.run_in_executor(_THREAD, _briefly, run, checked, schema, document, key[1])
                if not errors:  # every rule passed, those that read no variables among them
                    process.statics.put(key, True)
            if not errors and values is not None:
                process.passed.put((query, values), True)
            context.pre_execution_errors = errors
        yield


async def parse_document(context: ExecutionContext) -> None:
    """strawberry's parse step (`_parse_operation_document`), in the validation process for a big text.

    A document already set (`compiled.CachedDocuments` found it) or a small text is parsed inline, as
    strawberry does. A big one is parsed, pre-checked and validated in one trip to the validation
    process, with the same options (the token limit): a syntax or token-limit error is the one
    strawberry would raise, reported the same way; the verdict is the request's validation (set here,
    so the validation step has nothing left to do). The document that comes back is the part that runs
    (the chosen operation and its fragments), kept per text, operation and variables."""
    query = context.query
    if context.graphql_document is not None or query is None or not big(query):
        _parse_operation_document(context)
        return
    process = _process(context)
    values = _variables_key(context.variables)
    key = (query, context.operation_name, values)
    document = process.documents.get(key) if values is not None else None
    if document is not None:
        context.graphql_document, context.pre_execution_errors = document, []
        return
    verdict = await process.judge(
        query,
        context.variables,
        max_tokens=context.parse_options.get("max_tokens"),
        operation=context.operation_name,
        big=True,
    )
    source = source_of(query, verdict)
    raise_syntax(verdict, source)
    context.graphql_document = document_of(verdict, source)
    context.pre_execution_errors = errors_of(verdict, source)
    if verdict.document is not None and values is not None:
        process.documents.put(key, context.graphql_document)


class BoundedSchema(strawberry.Schema):
    """A strawberry schema whose parse step does not run a big document on the event loop.

    strawberry 0.341 parses inside `_prepare_operation_async`, which `execute` (HTTP queries and
    mutations) and `stream` (multipart and graphql-transport-ws subscriptions) both call; no
    extension hook can replace the parse and still have its error reported as a parse error. This
    is that method with `_parse_operation_document(context)` replaced by `await parse_document(context)`
    (tests/test_validation_limits.py compares the two, so an upgrade that changes it is noticed)."""

    def __init__(self, *args: Any, validation: ValidationProcess, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.validation = validation

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

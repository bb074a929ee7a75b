"""Big documents are parsed and validated in a process of their own, never on the event loop.

Parsing a 256 KiB text and running graphql-core's rules over thousands of nodes is pure Python: tens
to hundreds of milliseconds. On a thread it still competed for the interpreter the event loop needs:
with a 1 ms switch interval the loop was held 8-27 ms per document (allocation-triggered collections
and long C calls keep the GIL). In a child process it holds nothing of ours; the loop waits for the
verdict as it waits for the database.

What crosses back is small and quick to read:
- the errors as (message, positions, extensions), rebuilt here against the request's own source, so
  a location reads as graphql-core would have given it;
- for a text that passed and has no document here yet, its document, pickled with the lexer's token
  chain dropped (locations keep their start and end, all an error needs) and the source sent by
  reference (this side puts its own in);
- for a text that failed, an outline instead of the document: each operation's type and name, all
  strawberry reads before it reports the errors (the operation type check). A failed document is
  never executed, so its nodes need not cross;
- the text's line index (`IndexedSource`), so a location is found by bisection rather than a scan.

One process per schema (`ValidationProcess`). `threadloom serve` starts it before it serves, forked
while it runs no other thread (it shares the imported modules: ready in about 0.1 s), so the first big
document does not wait. A child started later (one replacing a child that died, or the first in a
process that never called `start`) is forked only while the process runs no other thread, else spawned
(about a second: it imports and builds the same schema, same limits, same dev flag). The request's
variables travel as JSON for the cost and page rules. One process is enough: the pre-check bounds each
document's work, and on a two-core machine a second would compete with the loop for the other core.
"""

from __future__ import annotations

import array
import asyncio
import bisect
import concurrent.futures
import contextlib
import ctypes
import dataclasses
import io
import multiprocessing
import os
import pickle
import re
import signal
import threading
from collections.abc import Iterator
from typing import Any

import orjson
from graphql import (
    ASTValidationRule,
    DocumentNode,
    FragmentDefinitionNode,
    FragmentSpreadNode,
    GraphQLError,
    GraphQLSchema,
    GraphQLSyntaxError,
    NameNode,
    Node,
    OperationDefinitionNode,
    OperationType,
    SelectionSetNode,
    Source,
    SourceLocation,
    parse,
)

from threadloom.api import cost
from threadloom.api.compiled import _Lru
from threadloom.config import Limits

_NEWLINE = re.compile(r"\r\n|[\n\r]")  # graphql-core's line breaks (`graphql.language.source`)
_PR_SET_PDEATHSIG = 1  # <linux/prctl.h>
_SOURCE = "source"  # the pickled document's reference to its source


class IndexedSource(Source):
    """A big document's source, its line breaks indexed once (in the validation process, with the parse).

    graphql-core finds an error's line by scanning the body up to the error's position, on every
    error: 2-5 ms for a node after 256 KiB of padding, on the event loop when a resolver fails. This
    finds it by bisection, with graphql-core's answer (`Source.get_location`: the line breaks
    `\\r\\n`, `\\n` and `\\r` that start before the position)."""

    def __init__(self, body: str, lines: tuple[array.array[int], array.array[int]] | None = None) -> None:
        super().__init__(body)
        if lines is None:
            starts, ends = array.array("q"), array.array("q")
            for match in _NEWLINE.finditer(body):
                starts.append(match.start())
                ends.append(match.end())
            lines = (starts, ends)
        self.starts, self.ends = lines

    def get_location(self, position: int) -> SourceLocation:
        breaks = bisect.bisect_left(self.starts, position)
        line_start = self.ends[breaks - 1] if breaks else 0
        return SourceLocation(breaks + 1, position + 1 - line_start)


@dataclasses.dataclass(frozen=True, slots=True)
class Failure:
    """An error as it crosses the process boundary."""

    message: str
    positions: tuple[int, ...]
    extensions: dict[str, Any] | None


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """What the validation process answers for one text.

    `syntax`: the parse failed with (position, description), or (None, message) for another parse
    error; `errors`: the pre-check's or the rules' errors (empty: the text passed); `document`: the
    pickled document (asked for, and passed); `outline`: (operation, name) of each operation (asked
    for, and failed); `lines`: the text's line index (asked for)."""

    syntax: tuple[int | None, str] | None = None
    errors: tuple[Failure, ...] = ()
    document: bytes | None = None
    outline: tuple[tuple[str, str | None], ...] = ()
    lines: tuple[array.array[int], array.array[int]] | None = None


# --- the child's side ---------------------------------------------------------------------------

_child: tuple[GraphQLSchema, tuple[type[ASTValidationRule], ...], Any] | None = None


def _start(
    limits: Limits, dev: bool, parent: int, close: tuple[int, ...] = (), built: GraphQLSchema | None = None
) -> None:
    """The child's initializer: it dies with the server, and validates with the same schema and rules as the
    server's. A forked child is given the server's own schema (`built`, its copy made by the fork); a spawned
    one builds it (imported here: it has not loaded the parent's modules yet). A forked child also closes the
    server's descriptors it was given (its listening socket) and drops the signal handlers and wake-up
    descriptor it inherited: a signal to it must not reach the server's loop."""
    global _child
    _die_with(parent)
    for fd in close:
        with contextlib.suppress(OSError):
            os.close(fd)
    signal.set_wakeup_fd(-1)
    for number in (signal.SIGINT, signal.SIGTERM):
        signal.signal(number, signal.SIG_DFL)
    from threadloom.api import bounds, schema, validation

    if built is None:
        built = schema.build_schema(limits, dev=dev)._schema
    _child = (built, validation.all_rules(limits), bounds.checked)


def _die_with(parent: int) -> None:
    """Ask the kernel to kill this process when the server dies (a kill -9 leaves no one to stop it:
    a pool's child waits on a pipe it holds both ends of)."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the server died before the request took effect
        os._exit(1)


def _ready() -> bool:
    """Nothing: sent once to have the child start and initialize (`ValidationProcess.start`)."""
    return _child is not None


def _judge(query: str, variables: bytes, max_tokens: int | None, operation: str | bool | None, big: bool) -> Verdict:
    """Parse, pre-check and validate one text (in the child). `operation`: the operation name to send the
    document back for (None: the document's only operation), or False for the verdict alone."""
    assert _child is not None, "the validation process was not started"
    schema, rules, checked = _child
    source = IndexedSource(query) if big else Source(query)
    lines = (source.starts, source.ends) if isinstance(source, IndexedSource) else None
    try:
        document = parse(source, max_tokens=max_tokens)
    except GraphQLSyntaxError as error:
        position = next(iter(error.positions or ()), None)
        return Verdict(syntax=(position, error.message.removeprefix("Syntax Error: ")), lines=lines)
    except Exception as error:  # strawberry reports any parse failure as an error with its text
        return Verdict(syntax=(None, str(error)), lines=lines)
    with cost.variables_bound(orjson.loads(variables)):
        errors = checked(schema, document, rules)
    failures = tuple(Failure(e.message, tuple(e.positions or ()), e.extensions or None) for e in errors)
    if operation is False:
        return Verdict(errors=failures, lines=lines)
    executed = None if failures else _executed(document, operation if isinstance(operation, str) else None)
    if executed is None:
        return Verdict(errors=failures, outline=_outline(document), lines=lines)
    return Verdict(document=_pickled(executed, source), lines=lines)


def _executed(document: DocumentNode, name: str | None) -> DocumentNode | None:
    """The part of `document` that runs: the operation `name` selects (as strawberry selects it: the first
    so named, or the first of all without a name) and the fragments it reaches. Reading back 620
    operations to run one held the loop 6 ms; one takes a fraction."""
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    chosen = [o for o in operations if name is None or (o.name is not None and o.name.value == name)][:1]
    if not chosen:
        return None  # strawberry refuses the operation choice: the outline tells it so
    fragments = {d.name.value: d for d in document.definitions if isinstance(d, FragmentDefinitionNode)}
    reached: dict[str, FragmentDefinitionNode] = {}
    pending: list[Node] = [chosen[0]]
    while pending:
        for node in _nodes(pending.pop()):
            if isinstance(node, FragmentSpreadNode) and node.name.value not in reached:
                fragment = fragments[node.name.value]  # validation passed: every spread is defined
                reached[node.name.value] = fragment
                pending.append(fragment)
    return DocumentNode(definitions=(chosen[0], *reached.values()), loc=document.loc)


def _outline(document: DocumentNode) -> tuple[tuple[str, str | None], ...]:
    return tuple(
        (d.operation.value, d.name.value if d.name else None)
        for d in document.definitions
        if isinstance(d, OperationDefinitionNode)
    )


def _nodes(root: Node) -> Iterator[Node]:
    stack = [root]
    while stack:
        node = stack.pop()
        yield node
        for key in node.keys:
            value = getattr(node, key, None)
            if isinstance(value, Node):
                stack.append(value)
            elif isinstance(value, tuple):
                stack.extend(item for item in value if isinstance(item, Node))


class _Pickler(pickle.Pickler):
    def __init__(self, file: io.BytesIO, source: Source) -> None:
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL)
        self.source = source

    def persistent_id(self, obj: Any) -> str | None:
        return _SOURCE if obj is self.source else None


class _Unpickler(pickle.Unpickler):
    def __init__(self, data: bytes, source: Source) -> None:
        super().__init__(io.BytesIO(data))
        self.source = source

    def persistent_load(self, pid: Any) -> Any:
        if pid != _SOURCE:
            raise pickle.UnpicklingError(f"unknown reference {pid!r}")
        return self.source


def _pickled(document: DocumentNode, source: Source) -> bytes:
    for node in _nodes(document):
        if node.loc is not None:
            # The token chain links every token of the text; a location needs only its start and end.
            node.loc.start_token = node.loc.end_token = None  # type: ignore[assignment]
    out = io.BytesIO()
    _Pickler(out, source).dump(document)
    return out.getvalue()


# --- the server's side --------------------------------------------------------------------------


class ValidationProcess:
    """The schema's validation process: started when first needed, started again if it dies."""

    def __init__(self, limits: Limits, dev: bool = False) -> None:
        self.limits, self.dev = limits, dev
        # The schema this process validates with (set once built): a forked child takes its copy instead of
        # building one (~0.1 s of CPU a server start).
        self.schema: GraphQLSchema | None = None
        self._executor: concurrent.futures.ProcessPoolExecutor | None = None
        self._lock = threading.Lock()
        self.passed = _Lru(256)  # (query, variables) whose validation passed: the same pass again
        # (query, rules) that passed every rule once: the rules that read no variables pass it again.
        self.statics = _Lru(256)
        # (query, operation, variables) -> the document that passed: a big text repeated is not sent again.
        self.documents = _Lru(32)

    def _pool(self, close: tuple[int, ...] = ()) -> concurrent.futures.ProcessPoolExecutor:
        with self._lock:
            if self._executor is None:
                # A fork shares the imported modules (the child is ready in ~0.1 s); a spawned child imports
                # and builds everything (~1 s of CPU). Only a process running no other thread is forked: a
                # fork copies a lock another thread holds as held.
                alone = threading.active_count() == 1
                self._executor = concurrent.futures.ProcessPoolExecutor(
                    max_workers=1,
                    mp_context=multiprocessing.get_context("fork" if alone else "spawn"),
                    initializer=_start,
                    initargs=(self.limits, self.dev, os.getpid(), *((close, self.schema) if alone else ())),
                )
            return self._executor

    def start(self, close: tuple[int, ...] = ()) -> bool:
        """Start the child now, while this process runs no other thread (`threadloom serve`, before it
        serves): forked, it costs little, and the first big document does not wait for a spawn. `close`:
        descriptors of the server the child must not keep (its listening socket). Returns whether it
        started; with other threads running it is left to start on first need, spawned."""
        if threading.active_count() != 1:
            return False
        self._pool(close).submit(_ready).result(timeout=60)
        return True

    def pids(self) -> list[int]:
        """The running child's pid, if any (for tests and the operator)."""
        executor = self._executor
        return [p.pid for p in (executor._processes or {}).values() if p.pid] if executor else []

    def close(self, within: float = 5.0) -> None:
        """Stop the child, and wait (up to `within` seconds) for the pool's manager thread to end. Left running,
        that thread closes its wake-up pipe while the interpreter's exit hook writes to it (CPython 3.11's
        `concurrent.futures.process._python_exit` takes no lock for that): `OSError: Bad file descriptor` as a
        process that had just closed its pool exited, seen in a benchmark's smoke run."""
        with self._lock:
            executor, self._executor = self._executor, None
        if executor is None:
            return
        manager: threading.Thread | None = getattr(executor, "_executor_manager_thread", None)
        executor.shutdown(wait=False, cancel_futures=True)
        if manager is not None:
            manager.join(within)

    async def judge(
        self, query: str, variables: Any, *, max_tokens: int | None, operation: str | bool | None, big: bool
    ) -> Verdict:
        """The child's verdict on `query` (with the document to run `operation`, unless it is False); a child
        that died is replaced and asked once more."""
        payload = orjson.dumps(variables if isinstance(variables, dict) else {}, default=lambda _: None)
        loop = asyncio.get_running_loop()
        for attempt in (1, 2):
            executor = self._pool()
            try:
                return await loop.run_in_executor(executor, _judge, query, payload, max_tokens, operation, big)
            except concurrent.futures.process.BrokenProcessPool:
                with self._lock:
                    if self._executor is executor:
                        self._executor = None
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")


def source_of(query: str, verdict: Verdict) -> Source:
    """The request's source, indexed with the child's line index when it sent one."""
    return IndexedSource(query, verdict.lines) if verdict.lines is not None else Source(query)


def errors_of(verdict: Verdict, source: Source) -> list[GraphQLError]:
    """The verdict's errors, located in this process's `source` as graphql-core would locate them."""
    return [
        GraphQLError(f.message, source=source, positions=list(f.positions) or None, extensions=f.extensions)
        for f in verdict.errors
    ]


def raise_syntax(verdict: Verdict, source: Source) -> None:
    """Raise the parse error the child met, as strawberry's parse would have raised it."""
    if verdict.syntax is None:
        return
    position, description = verdict.syntax
    if position is None:
        raise GraphQLError(description)
    raise GraphQLSyntaxError(source, position, description)


def document_of(verdict: Verdict, source: Source) -> DocumentNode:
    """The passed document, or the failed one's outline (its operations, no selections)."""
    if verdict.document is not None:
        document = _Unpickler(verdict.document, source).load()
        assert isinstance(document, DocumentNode)
        return document
    empty = SelectionSetNode(selections=())
    return DocumentNode(
        definitions=tuple(
            OperationDefinitionNode(
                operation=OperationType(operation),
                name=NameNode(value=name) if name is not None else None,
                variable_definitions=(),
                directives=(),
                selection_set=empty,
            )
            for operation, name in verdict.outline
        )
    )

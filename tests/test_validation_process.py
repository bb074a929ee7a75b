"""Big documents are parsed and validated in a process of their own (`api.validation_process`).

In-process tests compare each big document's answer with the same document written small (validated
inline, as strawberry does): the same data, messages, codes and locations (the big one's shifted by its
padding). Real servers show the child is forked before the server serves and dies with it; a killed
child is replaced, and a process running other threads spawns it instead.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
import strawberry.schema.schema as strawberry_schema

from tests.support.graphql import make_project
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from threadloom.api import bounds
from threadloom.api.schema import build_schema

LINES = 2000
PADDING = ("#" + "x" * 99 + "\n") * LINES  # 200 KiB of comment: over the inline threshold


@pytest.fixture(scope="module")
def schema() -> Iterator[Any]:
    built = build_schema()
    yield built
    built.validation.close()


def _answer(result: Any, shift: int = 0) -> tuple[Any, list[tuple[str, Any, list[tuple[int, int]]]]]:
    """(data, [(message, code, locations)]), the locations moved up by `shift` lines."""
    errors = [
        (e.message, (e.extensions or {}).get("code"), [(loc.line - shift, loc.column) for loc in e.locations or ()])
        for e in result.errors or ()
    ]
    return result.data, errors


async def _both(schema: Any, query: str, **kwargs: Any) -> tuple[Any, Any]:
    small = _answer(await schema.execute(query, **kwargs))
    big = _answer(await schema.execute(PADDING + query, **kwargs), shift=LINES)
    return small, big


async def test_big_documents_are_parsed_in_the_validation_process_and_small_ones_inline(
    schema: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    parsed: list[str] = []
    real = strawberry_schema.parse

    def recording(query: Any, **kwargs: Any) -> Any:
        parsed.append(str(query))
        return real(query, **kwargs)

    monkeypatch.setattr(strawberry_schema, "parse", recording)
    small = await schema.execute("{ __typename }")
    assert small.data == {"__typename": "Query"} and parsed == ["{ __typename }"]  # strawberry's parse, inline
    answered = await schema.execute(PADDING + "{ __typename }")
    assert answered.errors is None and answered.data == {"__typename": "Query"}
    [pid] = schema.validation.pids()
    assert pid != os.getpid() and psutil.Process(pid).ppid() == os.getpid()
    broken = await schema.execute(PADDING + "{ __typename")
    [error] = broken.errors or []
    assert [tuple(location) for location in error.locations or ()] == [(LINES + 1, 13)]
    assert parsed == ["{ __typename }"]  # neither big text was parsed here


async def test_a_big_document_answers_as_the_same_document_written_small(schema: Any) -> None:
    logging.disable(logging.ERROR)  # the resolvers that need a request log their failure
    try:
        cases = [
            "{ __typename }",
            "{ __typename",  # a syntax error
            "{ viewer { scope } }",  # a resolver error: located in the document that came back
            "{ nope }",  # a validation error
            "query A { __typename } fragment F on Query { __typename }",  # an unused fragment
            "{ viewer {" + " scope" * 400 + " } }",  # over the overlap limit: QUERY_TOO_COSTLY
            "query { ...F0 } " + " ".join(f"fragment F{i} on Query {{ ...F{i + 1} ...F{i + 1} }}" for i in range(20))
            + " fragment F20 on Query { __typename }",  # a fragment bomb
        ]
        for query in cases:
            small, big = await _both(schema, query)
            assert big == small, query
        located = _answer(await schema.execute(PADDING + "{ viewer { scope } }"))[1]
        assert located and located[0][2] == [(LINES + 1, 3)]  # where `viewer` is written in the big text
    finally:
        logging.disable(logging.NOTSET)


async def test_the_operation_named_runs_with_the_fragments_it_reaches(schema: Any) -> None:
    query = (
        "query A { ...T } query B { ...U } query C { __schema { queryType { name } } }"
        " fragment T on Query { __typename } fragment U on Query { ...T __schema { queryType { name } } }"
    )
    for name in ("A", "B", "C", None):
        small, big = await _both(schema, query, operation_name=name)
        assert big == small and small[1] == [], name
    assert _answer(await schema.execute(PADDING + query, operation_name="B"))[0] == {
        "__typename": "Query",
        "__schema": {"queryType": {"name": "Query"}},
    }
    with pytest.raises(Exception, match="nope"):  # strawberry's refusal of an unknown operation, as for a small one
        await schema.execute(PADDING + query, operation_name="nope")


async def test_variables_reach_the_page_rule_and_a_refusal_is_not_kept(schema: Any) -> None:
    # The page-size rule reads the request's variables: they travel to the child. A refused text is
    # not cached as a document, so the same text with a small page is judged again and passes.
    query = "query($n: Int) { projects(first: $n) { nodes { id } } }"
    refused_small, refused_big = await _both(schema, query, variable_values={"n": 100_000})
    assert refused_big == refused_small and refused_small[1], refused_small
    logging.disable(logging.ERROR)
    try:
        passed_small, passed_big = await _both(schema, query, variable_values={"n": 5})
    finally:
        logging.disable(logging.NOTSET)
    assert passed_big == passed_small
    assert all(code not in ("GRAPHQL_VALIDATION_FAILED", "QUERY_TOO_COSTLY") for _, code, _ in passed_small[1])


async def test_a_wide_text_is_judged_by_the_variable_free_rules_once_and_by_the_variable_rules_every_time(
    schema: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A short text of more than 32 fields is validated on a thread. Once it passed every rule, a request with
    other variables runs only the rules that read variables: a page too big is still refused, with the answer
    a schema seeing the text for the first time gives. Twin: a text failing a rule that reads no variables is
    judged in full every time."""
    full: list[str] = []
    real = bounds.checked

    def counted(schema_: Any, document: Any, rules: Any) -> Any:
        full.append(str(document.loc.source.body) if document.loc else "")
        return real(schema_, document, rules)

    monkeypatch.setattr(bounds, "checked", counted)
    wide = "query($n: Int) { projects(first: $n) { nodes {" + " id" * 40 + " } } }"
    logging.disable(logging.ERROR)  # no request: the resolver logs its failure
    try:
        for n in (5, 7, 9):
            answer = _answer(await schema.execute(wide, variable_values={"n": n}))
            assert all(code not in ("GRAPHQL_VALIDATION_FAILED", "QUERY_TOO_COSTLY") for _, code, _ in answer[1])
        refused = _answer(await schema.execute(wide, variable_values={"n": 100_000}))
        assert full.count(wide) == 1, full
        fresh = build_schema()
        try:
            assert refused == _answer(await fresh.execute(wide, variable_values={"n": 100_000}))
        finally:
            fresh.validation.close()
    finally:
        logging.disable(logging.NOTSET)
    assert refused == (None, [("first must be at most 100", "PAGE_SIZE_EXCEEDED", [(1, 18)])])

    failing = "query($n: Int) { projects(first: $n) { nodes {" + " id" * 40 + " nope } } }"
    for n in (5, 7):
        [(message, code, _)] = _answer(await schema.execute(failing, variable_values={"n": n}))[1]
        assert code == "GRAPHQL_VALIDATION_FAILED" and "nope" in message
    assert full.count(failing) == 2


async def test_a_killed_validation_process_is_replaced(schema: Any) -> None:
    assert (await schema.execute(PADDING + "{ __typename }")).data == {"__typename": "Query"}
    [first] = schema.validation.pids()
    os.kill(first, signal.SIGKILL)
    psutil.Process(first).wait(timeout=30)
    again = await schema.execute(PADDING + "{ again: __typename }")  # a new text: not answered from the cache
    assert again.errors is None and again.data == {"again": "Query"}
    [second] = schema.validation.pids()
    assert second != first


def _forked(child: psutil.Process, parent: psutil.Process) -> bool:
    return child.cmdline() == parent.cmdline()


def _spawned(child: psutil.Process) -> bool:
    return any("spawn_main" in part for part in child.cmdline())


def _validation_children(server: ServerProcess) -> list[psutil.Process]:
    """The server's validation process: a fork of it (the same command line), or one it spawned."""
    me = psutil.Process(server.proc.pid)
    return [child for child in me.children() if _forked(child, me) or _spawned(child)]


def test_a_server_forks_its_validation_process_before_it_serves(server: ServerProcess) -> None:
    """Ready, and no document sent yet: the child is there, a fork of the server (it shares the imported
    modules), so the first big document does not wait for a second of imports."""
    me = psutil.Process(server.proc.pid)
    [child] = _validation_children(server)
    assert _forked(child, me) and not _spawned(child)


async def test_a_process_running_other_threads_spawns_the_child_on_first_need() -> None:
    """The twin: `start` forks only a process that runs no other thread (a fork would copy a lock another
    thread holds as held); with a thread running it starts nothing, and the first big document spawns it."""
    built = build_schema()
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert built.validation.start() is False and built.validation.pids() == []
        assert (await built.execute(PADDING + "{ __typename }")).data == {"__typename": "Query"}
        [pid] = built.validation.pids()
        assert _spawned(psutil.Process(pid))
    finally:
        stop.set()
        other.join()
        built.validation.close()


def test_a_forked_child_takes_the_servers_schema_and_a_spawned_one_builds_its_own(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Building the schema again cost each forked child ~0.1 s of CPU (a test run starts ~400 servers): the
    fork already holds a copy of the server's. A spawned child has nothing to copy, so it is given none.
    (The pool starts its child on the first task: nothing is started here.)"""
    built = build_schema()
    try:
        monkeypatch.setattr(threading, "active_count", lambda: 1)  # as in `threadloom serve` before it serves
        forking = built.validation._pool(close=(99,))
        assert forking._mp_context.get_start_method() == "fork"
        assert forking._initargs[-2:] == ((99,), built._schema)
        built.validation.close()
        monkeypatch.setattr(threading, "active_count", lambda: 2)
        spawning = built.validation._pool(close=(99,))
        assert spawning._mp_context.get_start_method() == "spawn"
        assert built._schema not in spawning._initargs and (99,) not in spawning._initargs
    finally:
        built.validation.close()


async def test_the_validation_process_dies_with_its_server(server: ServerProcess, client: Client) -> None:
    await make_project(client, "big")
    assert (await client.gql(PADDING + "{ viewer { scope } }")) == {"viewer": {"scope": "ADMIN"}}
    [child] = _validation_children(server)
    assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE  # the twin: it lives while the server does
    server.kill()  # kill -9: the server stops nothing itself

    async def gone() -> bool | None:
        try:
            return True if child.status() == psutil.STATUS_ZOMBIE else None
        except psutil.NoSuchProcess:
            return True

    await until(gone, within=30)


async def test_close_returns_once_the_pools_manager_thread_has_ended() -> None:
    """A process that closes its pool and exits at once raced the pool's manager thread: the thread closed its
    wake-up pipe while the interpreter's exit hook wrote to it (`OSError: Bad file descriptor`, a benchmark's
    smoke run). `close` now waits for that thread, so nothing of the pool runs at exit."""
    built = build_schema()
    try:
        assert (await built.execute(PADDING + "{ __typename }")).data == {"__typename": "Query"}  # the pool runs
        manager = built.validation._executor._executor_manager_thread
        assert manager.is_alive()
    finally:
        built.validation.close()
    assert not manager.is_alive() and built.validation.pids() == []

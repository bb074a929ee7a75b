"""Documents built to stall validation are refused cheaply (QUERY_TOO_COSTLY) on every path, while
other tenants keep being answered; legitimate fragments and documents at the limits still pass.

The pre-check itself (`api.bounds`) is unit-tested at its boundaries; one real server answers
the refusals over HTTP (GET and POST), as multipart subscriptions and over graphql-transport-ws.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import random
import textwrap
from typing import Any

import httpx
import pytest
import strawberry
import websockets
from graphql import Source, parse, validate
from strawberry.types.execution import ParseOptions

from tests.support.cli import create_token
from tests.support.graphql import make_project, make_thread
from tests.support.multipart import MULTIPART
from tests.support.server import Client, ServerProcess
from tests.support.ws import WsClient
from threadloom.api import bounds
from threadloom.api.schema import build_schema
from threadloom.api.validation import all_rules
from threadloom.config import Limits

GRAPHQL_RESPONSE = {"accept": "application/graphql-response+json"}
SCHEMA = build_schema()._schema


def bomb(levels: int = 25) -> str:
    """The finding's document: 884 characters that expand to 2^24 `viewer { scope }`."""
    chain = " ".join(f"fragment F{i} on Query{{...F{i + 1} ...F{i + 1}}}" for i in range(levels - 1))
    return f"query{{...F0}} {chain} fragment F{levels - 1} on Query{{viewer{{scope}}}}"


DUPLICATES = "{ viewer {" + " scope" * 1240 + " } }"
SUBSCRIPTION_DUPLICATES = "subscription($t: ID!) { threadEvents(threadId: $t) {" + " sequence" * 1240 + " } }"
SUBSCRIPTION_BOMB = (
    "subscription($t: ID!) { threadEvents(threadId: $t) { ...E0 } } "
    + " ".join(f"fragment E{i} on ThreadEvent {{ ...E{i + 1} ...E{i + 1} }}" for i in range(24))
    + " fragment E24 on ThreadEvent { sequence }"
)


# Over `bounds.INLINE_QUERY_CHARS`, so parsed, pre-checked and validated on the pool: 2,000 lines of
# comment (200 KiB) before the operation, which starts on line 2,001.
PADDING = ("#" + "x" * 99 + "\n") * 2000


def limit_of(error: dict[str, Any]) -> str:
    assert error["extensions"]["code"] == "QUERY_TOO_COSTLY", error
    return str(error["extensions"]["limit"])


# ---- the pre-check and the memoized rules, without a server -------------------------------------


def test_the_bomb_is_measured_in_one_pass_and_refused() -> None:
    shape = bounds.measure(parse(bomb()))
    assert shape.fields == 2**25  # 2^24 viewers and their scopes, counted without expanding
    refused = bounds.check(parse(bomb()))
    assert refused is not None and refused.extensions is not None
    assert refused.extensions["code"] == "QUERY_TOO_COSTLY"
    # The rules that expand fragments now answer at once too (depth, aliases, cost).
    assert validate(SCHEMA, parse(bomb()), all_rules(Limits())) == []


def test_documents_that_take_long_to_validate_leave_the_event_loop_even_when_short() -> None:
    """Validation visits every written node, used or not: unused fragments and nested inline fragments take
    milliseconds though they expand to two fields (bench/validation_worst.py), so they go to the pool; the
    same documents at the written-node bound stay inline (the twin)."""

    def fragments(count: int) -> str:
        return "query { viewer { scope } }" + "".join(
            f" fragment U{i} on Query {{ viewer {{ scope }} }}" for i in range(count)
        )

    nested = "{" + " ... on Query {" * 40 + " viewer { scope }" + " }" * 41
    for text in (fragments(20), nested):
        assert len(text) <= bounds.INLINE_QUERY_CHARS and bounds.measure(parse(text)).fields == 2
        assert not bounds.inline(parse(text), text), text
    within = fragments((bounds.INLINE_NODES - 3) // 3)  # 3 written nodes for the operation and each fragment
    assert bounds.measure(parse(within)).written == bounds.INLINE_NODES - (bounds.INLINE_NODES % 3)
    assert bounds.inline(parse(within), within)
    # A text over INLINE_QUERY_CHARS is parsed on the pool whatever it holds.
    assert bounds.big("{ viewer { scope } }" + " " * bounds.INLINE_QUERY_CHARS)


def test_fragment_cycles_end_and_are_refused() -> None:
    cyclic = "query { ...A } fragment A on Query { viewer { scope } ...B } fragment B on Query { ...A }"
    assert bounds.measure(parse(cyclic)).fields == 2
    errors = validate(SCHEMA, parse(cyclic), all_rules(Limits()))
    assert any("Cannot spread fragment" in e.message for e in errors)


def test_selection_width_limit_at_its_boundary() -> None:
    at = "{ viewer {" + "".join(f" f{i}" for i in range(bounds.MAX_SELECTION_FIELDS)) + " } }"
    over = "{ viewer {" + "".join(f" f{i}" for i in range(bounds.MAX_SELECTION_FIELDS + 1)) + " } }"
    assert bounds.check(parse(at)) is None
    refused = bounds.check(parse(over))
    assert refused is not None and refused.extensions == {
        "code": "QUERY_TOO_COSTLY", "limit": "selectionFields", "max": 500, "count": 501
    }  # fmt: skip


def test_expanded_fields_limit_at_its_boundary() -> None:
    # F holds 100 distinct fields; n spreads of it, each under its own field, expand to n * 101.
    fragment = "fragment F on Viewer {" + "".join(f" f{i}" for i in range(100)) + " }"

    def spreads(n: int, extra: int) -> str:
        body = " ".join(f"v{i}: viewer {{ ...F }}" for i in range(n)) + "".join(f" x{i}" for i in range(extra))
        return f"{{ {body} }} {fragment}"

    at = parse(spreads(198, 20_000 - 198 * 101))
    assert bounds.measure(at).fields == 20_000 and bounds.check(at) is None
    over = bounds.check(parse(spreads(198, 20_000 - 198 * 101 + 1)))
    assert over is not None and over.extensions is not None and over.extensions["limit"] == "expandedFields"


def test_overlapping_fields_limit_at_its_boundary() -> None:
    most = int((2 * bounds.MAX_OVERLAP) ** 0.5)  # m copies of a leaf: m²/2 comparisons
    assert bounds.check(parse("{ viewer {" + " scope" * most + " } }")) is None
    over = bounds.check(parse("{ viewer {" + " scope" * (most + 1) + " } }"))
    assert over is not None and over.extensions is not None and over.extensions["limit"] == "overlappingFields"


def test_depth_and_alias_rules_keep_their_messages() -> None:
    rules = all_rules(Limits(max_depth=2, max_aliases=1))
    deep = validate(SCHEMA, parse("query Q { ...F } fragment F on Query { viewer { a: scope b: scope } }"), rules)
    assert [e.message for e in deep] == ["2 aliases found. Allowed: 1"]
    nested = "query Q { projects { nodes { threads(first: 1) { nodes { id } } } } }"
    assert [e.message for e in validate(SCHEMA, parse(nested), rules)] == ["'Q' exceeds maximum operation depth of 2"]


def _body(function: Any) -> str:
    """A method's statements without its docstring, as `ast.unparse` prints them."""
    [definition] = ast.parse(textwrap.dedent(inspect.getsource(function))).body
    assert isinstance(definition, ast.AsyncFunctionDef)
    statements = definition.body[1:] if ast.get_docstring(definition) else definition.body
    return "\n".join(ast.unparse(statement) for statement in statements)


def test_the_schema_parses_as_strawberry_does_but_off_the_loop() -> None:
    # BoundedSchema copies strawberry's `_prepare_operation_async` but for the parse call: an
    # upgrade of strawberry that changes the method fails here rather than silently diverging.
    theirs = _body(strawberry.Schema._prepare_operation_async)
    ours = _body(bounds.BoundedSchema._prepare_operation_async)
    assert theirs.count("_parse_operation_document(context)") == 1
    assert ours == theirs.replace("_parse_operation_document(context)", "await parse_document(context)")
    assert set(ParseOptions.__annotations__) == {"max_tokens"}  # the only option the pool's parse passes


def test_an_indexed_source_locates_as_graphql_core_does() -> None:
    rng = random.Random(7)
    for _ in range(200):
        body = "".join(rng.choice("ab\r\n") for _ in range(rng.randint(0, 30)))
        plain, indexed = Source(body), bounds.IndexedSource(body)
        assert [indexed.get_location(i) for i in range(len(body) + 1)] == [
            plain.get_location(i) for i in range(len(body) + 1)
        ]


# ---- a real server ------------------------------------------------------------------------------


async def test_refused_on_every_path_while_another_tenant_is_answered(
    server: ServerProcess, client: Client, database_url: str
) -> None:
    project = await make_project(client, "attacker")
    other = await make_project(client, "neighbour")
    thread = (await make_thread(client, project))["id"]
    read_token = create_token(database_url, "read", project)[1]
    neighbour = create_token(database_url, "read", other)[1]

    small = client.post("{ viewer { scope } }", token=neighbour)
    refusals = [client.post(q, token=read_token, headers=GRAPHQL_RESPONSE) for q in (bomb(), DUPLICATES)]
    answered, *refused = await asyncio.gather(small, *refusals)
    assert answered.json() == {"data": {"viewer": {"scope": "READ"}}}
    for response in refused:
        assert response.status_code == 400
        assert response.headers["content-type"].startswith("application/graphql-response+json")
        body = response.json()
        assert "data" not in body
        assert limit_of(body["errors"][0]) in ("expandedFields", "selectionFields")

    # GET is refused the same way.
    got = await client.http.get(
        "/graphql", params={"query": bomb()}, headers={**client.headers(read_token), **GRAPHQL_RESPONSE}
    )
    assert got.status_code == 400 and limit_of(got.json()["errors"][0]) in ("expandedFields", "selectionFields")

    # A multipart subscription over HTTP.
    for query in (SUBSCRIPTION_BOMB, SUBSCRIPTION_DUPLICATES):
        async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
            response = await http.post(
                "/graphql",
                json={"query": query, "variables": {"t": thread}},
                headers={"accept": MULTIPART, **client.headers(read_token)},
            )
        assert "QUERY_TOO_COSTLY" in response.text, response.text

    # graphql-transport-ws: an `error` message, and the socket still serves the neighbour's query.
    ws = await WsClient.connect(server.url, read_token)
    try:
        for query in (SUBSCRIPTION_BOMB, SUBSCRIPTION_DUPLICATES):
            op = await ws.subscribe(query, {"t": thread})
            message = await ws.receive()
            assert message["id"] == op and message["type"] == "error", message
            assert limit_of(message["payload"][0]) in ("expandedFields", "selectionFields")
    finally:
        await ws.close()
    assert (await client.gql("{ viewer { scope } }", token=neighbour)) == {"viewer": {"scope": "READ"}}


async def test_legitimate_fragments_pass_and_the_token_limit_refuses(client: Client) -> None:
    project = await make_project(client, "twin")
    await make_thread(client, project, "twin")
    twin = """query($p: ID!) { ...Page }
      fragment Page on Query { threads(projectId: $p, first: 5) { edges { node { ...Thread } } } }
      fragment Thread on Thread { id ...Title project { ...Project } }
      fragment Title on Thread { title }
      fragment Project on Project { id name threads(first: 2) { nodes { ...Title id } } }"""
    data = await client.gql(twin, {"p": project})
    [edge] = data["threads"]["edges"]
    assert edge["node"]["title"] == "twin"
    assert edge["node"]["project"]["threads"]["nodes"][0]["title"] == "twin"

    # A document under the inline threshold and one over it (validated on the pool) answer alike.
    wide = "{ viewer {" + " scope" * 100 + " } }"
    assert (await client.gql(wide)) == {"viewer": {"scope": "ADMIN"}}

    tokens = "{ viewer {" + " scope" * 5000 + " } }"
    response = await client.post(tokens, headers=GRAPHQL_RESPONSE)
    assert response.status_code == 400
    [error] = response.json()["errors"]
    assert error["extensions"] == {"code": "QUERY_TOO_COSTLY", "limit": "tokens", "max": 5000}


async def test_big_documents_are_answered_and_keep_their_error_codes(
    server: ServerProcess, client: Client, database_url: str
) -> None:
    """Documents over the inline threshold (200 KiB of comment, a 200 KiB string argument) take the
    pool's path on every transport and are answered as small ones are; a syntax error keeps its code."""
    project = await make_project(client, "big")
    thread = (await make_thread(client, project))["id"]
    token = create_token(database_url, "read", project)[1]
    long_name = "x" * (200 * 1024)

    data = await client.gql(PADDING + "query Big { viewer { scope } }", token=token)
    assert data == {"viewer": {"scope": "READ"}}
    data = await client.gql(f'{{ __type(name: "{long_name}") {{ name }} viewer {{ scope }} }}', token=token)
    assert data == {"__type": None, "viewer": {"scope": "READ"}}

    broken = await client.post(PADDING + "{ viewer { scope }", token=token, headers=GRAPHQL_RESPONSE)
    assert broken.status_code == 400
    [error] = broken.json()["errors"]
    assert error["extensions"] == {"code": "GRAPHQL_PARSE_FAILED"}
    assert error["locations"] == [{"line": 2001, "column": 19}]

    subscription = PADDING + "subscription($t: ID!) { threadEvents(threadId: $t, afterSequence: 0) { sequence type } }"
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        response = await http.post(
            "/graphql",
            json={"query": PADDING + "subscription { threadEvents(", "variables": {}},
            headers={"accept": MULTIPART, **client.headers(token)},
        )
    assert "GRAPHQL_PARSE_FAILED" in response.text, response.text

    ws = await WsClient.connect(server.url, token)
    try:
        op = await ws.subscribe(subscription, {"t": thread})
        first = await ws.receive()
        assert first["id"] == op and first["type"] == "next", first
        assert first["payload"]["data"]["threadEvents"]["type"] == "thread.created"
    finally:
        await ws.close()

    # A syntax error closes the socket (strawberry's graphql-transport-ws: 4400 and the error's message),
    # for a big document as for a small one.
    for query in ("subscription { threadEvents(", PADDING + "subscription { threadEvents("):
        ws = await WsClient.connect(server.url, token)
        try:
            await ws.subscribe(query, {})
            with pytest.raises(websockets.exceptions.ConnectionClosed) as closed:
                await ws.receive()
            assert closed.value.rcvd is not None
            assert (closed.value.rcvd.code, closed.value.rcvd.reason) == (
                4400,
                "Syntax Error: Expected Name, found <EOF>.",
            )
        finally:
            await ws.close()

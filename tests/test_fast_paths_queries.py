"""The query fast paths (`api/compiled.py`) change no byte of any response.

Two real servers share one database: one with the fast paths (the default), one started
with `THREADLOOM_FAST_PATHS=0`. Every document below — pages of many field kinds (enums,
datetimes, nulls, ids; an idle thread and one whose run waits; one project named by every
thread), aliases, `__typename`, fragments, nested connections, abstract `nodes`, field errors,
validation errors with and without variables — is sent to both, twice to the fast server (the
second time its caches answer), and the bodies, statuses and statement counts must be identical.
"""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
import strawberry

from tests.support.cli import create_token
from tests.support.graphql import THREADS_PAGE, make_project, make_thread, statements
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, serving
from tests.support.waiting import until
from threadloom.api.compiled import with_fast_paths
from threadloom.api.row_pages import compile_threads
from threadloom.api.schema import build_schema

PAGE = """query($p: ID!, $n: Int) { threads(projectId: $p, first: $n) { edges { cursor node {
  id title status latestSequence providerInstanceId model runtimeMode queueHeld archivedAt
  createdAt updatedAt project { id name } } } pageInfo { hasNextPage endCursor } } }"""

SHAPES = """
fragment Row on Thread { id t: title status __typename lineage { relationship __typename } }
query($p: ID!) {
  __typename
  a: threads(projectId: $p, first: 3, includeArchived: true) {
    __typename totalCount
    nodes { ...Row ... on Thread { archivedAt model m2: model } ... on Node { id } }
    edges { cursor c2: cursor node { ...Row runs(first: 2) { edges { node {
      id ordinal status statusReason requestedAt startedAt completedAt queuePosition __typename
      userMessage { id role text createdAt } } } pageInfo { hasNextPage startCursor } } } }
  }
  b: threads(projectId: $p, last: 2) { pageInfo { hasPreviousPage startCursor endCursor } edges { node { title } } }
  project(id: $p) { name workspaceRoot archivedAt threads(first: 1) { edges { node { title queueHeld } } } }
}"""

# Documents the compiled page (`api/row_pages.py`) answers, and some it hands back to graphql-core.
WINDOW = "edges { cursor node { title } } pageInfo { hasNextPage hasPreviousPage startCursor endCursor }"
UNKNOWN_PROJECT = "UHJvamVjdDowMDAwMDAwMC0wMDAwLTAwMDAtMDAwMC0wMDAwMDAwMDAwMDA"  # Project:<zero uuid>
COMPILED_PAGES: list[tuple[str, dict[str, Any]]] = [
    # Every field it reads from a row, aliases, __typename at every level, both lists, all of pageInfo.
    (
        """query($p: ID!) { __typename t: threads(projectId: $p, first: 20, includeArchived: true) {
          __typename n: nodes { id archivedAt workspacePath queueHoldReason model s: status }
          pageInfo { __typename endCursor startCursor hasPreviousPage hasNextPage e2: endCursor }
          edges { __typename c: cursor cursor node { __typename title id createdAt updatedAt latestSequence
            queueHeld runtimeMode providerInstanceId status project { __typename id name workspaceRoot
            createdAt updatedAt } p2: project { name } } } } }""",
        {},
    ),
    # Fragments (named, inline, on the interface), a field asked twice, two compiled roots at once.
    (
        """fragment R on Thread { id t: title ... on Node { id } }
        query($p: ID!) {
          a: threads(projectId: $p, first: 3) { edges { node { ...R status title ... on Thread { model } } } }
          b: threads(projectId: $p, last: 2) { pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
            nodes { ...R project { id } project { name } } } }""",
        {},
    ),
    # Pages after and before a cursor (CURSOR: the third thread's), an empty page.
    (f"query($p: ID!, $a: String) {{ threads(projectId: $p, first: 2, after: $a) {{ {WINDOW} }} }}", {"a": "CURSOR"}),
    (f"query($p: ID!, $b: String) {{ threads(projectId: $p, last: 2, before: $b) {{ {WINDOW} }} }}", {"b": "CURSOR"}),
    (f"query($p: ID!) {{ threads(projectId: $p, first: 0) {{ {WINDOW} nodes {{ id }} }} }}", {}),
    # Declined at run time: both first and last, a cursor from another connection, an unknown or
    # malformed project, a Thread id (THREAD) where a Project id is needed.
    ("query($p: ID!) { threads(projectId: $p, first: 1, last: 1) { edges { cursor } } }", {}),
    ("query($p: ID!, $a: String) { threads(projectId: $p, first: 1, after: $a) { edges { cursor } } }", {"a": "Yzox"}),
    (f'query {{ threads(projectId: "{UNKNOWN_PROJECT}") {{ edges {{ cursor }} }} }}', {}),
    ("query($q: ID!) { threads(projectId: $q, first: 1) { edges { cursor } } }", {"q": "THREAD"}),
    # Not compiled: totalCount, other thread fields, directives, a nested connection.
    ("query($p: ID!) { threads(projectId: $p, first: 3) { totalCount edges { node { id } } } }", {}),
    ("query($p: ID!) { threads(projectId: $p, first: 3) { edges { node { id activeRun { id status } } } } }", {}),
    (
        "query($p: ID!, $y: Boolean!) { threads(projectId: $p, first: 3) "
        "{ edges { node { id title @include(if: $y) } } } }",
        {"y": True},
    ),
    ("query($p: ID!, $y: Boolean!) { threads(projectId: $p, first: 3) @skip(if: $y) { nodes { id } } }", {"y": False}),
    ("query($p: ID!) { threads(projectId: $p, first: 3) { nodes { id runs(first: 1) { edges { cursor } } } } }", {}),
    (
        "query($p: ID!) { project(id: $p) { threads(first: 2) { edges { node { title } } } } "
        "threads(projectId: $p, first: 2) { nodes { title } } }",
        {},
    ),
]

NODES = """query($ids: [ID!]!) { nodes(ids: $ids) { __typename id
  ... on Thread { title status project { name } }
  ... on Project { name }
  ... on Run { ordinal status thread { title } } } }"""

# (document, variables) — failures included: the error bodies must match too.
CASES: list[tuple[str, dict[str, Any]]] = [
    ("query { viewer { scope project { id } } }", {}),
    ("{ __typename viewer { __typename scope } }", {}),
    ("query { thread(id: \"not-an-id\") { id } node(id: \"VGhyZWFkOng\") { id } }", {}),
    ("query { threads(projectId: \"x\", first: 5) { edges { node { id } } } }", {}),
    ("query { nope }", {}),
    ("query { viewer { scope ", {}),
    ("query($p: ID!) { threads(projectId: $p, first: 1000) { edges { cursor } } }", {}),
    ("query($p: ID!, $n: Int) { threads(projectId: $p, first: $n) { edges { cursor } } }", {"n": -1}),
    ("query($p: ID!, $a: String) { threads(projectId: $p, after: $a) { edges { cursor } } }", {"a": "bad"}),
]


@pytest.fixture
def plain_server(database_url: str, tmp_path: Path) -> Iterator[ServerProcess]:
    with serving(database_url, tmp_path / "data-plain", {"THREADLOOM_FAST_PATHS": "0"}) as proc:
        yield proc


async def exchange(client: Client, query: str, variables: dict[str, Any]) -> tuple[int, bytes, int]:
    response = await client.post(query, variables, headers={"accept": "application/graphql-response+json"})
    return response.status_code, response.content, statements(response.headers)


async def test_fast_paths_answer_byte_for_byte_like_graphql_core(
    client: Client, plain_server: ServerProcess, database_url: str
) -> None:
    plain = Client(plain_server.url, client.token)
    try:
        project = await make_project(client)
        threads = [(await make_thread(client, project, f"thread {i:02d}"))["id"] for i in range(12)]
        await make_thread(client, project, None)  # a null title
        archived = await client.gql(
            "mutation($t: ID!) { archiveThread(input: {threadId: $t}) { thread { archivedAt } } }", {"t": threads[1]}
        )
        assert archived["archiveThread"]["thread"]["archivedAt"] is not None
        sent = await send(client, threads[0], "hello")
        await finished(client, sent["run"]["id"])
        run_id = sent["run"]["id"]
        # A thread whose run waits for an approval: its status is read through the run loader
        # (a resolver of an enum whose value is awaited), and stays the same while we compare.
        await send(client, threads[2], "@approval echo ok > ok.txt\n@reply done")

        async def waiting() -> bool | None:
            found = await client.gql("query($t: ID!) { thread(id: $t) { status } }", {"t": threads[2]})
            return True if found["thread"]["status"] == "WAITING" else None

        await until(waiting)

        four = "query($p: ID!) { threads(projectId: $p, first: 4) { edges { cursor } } }"
        window = await client.gql(four, {"p": project})
        stand_ins = {"CURSOR": window["threads"]["edges"][2]["cursor"], "THREAD": threads[0]}
        compiled = [(q, {"p": project, **{k: stand_ins.get(v, v) for k, v in vs.items()}}) for q, vs in COMPILED_PAGES]
        cases = [
            *compiled,
            (PAGE, {"p": project, "n": 10}),
            (PAGE, {"p": project, "n": 100}),
            (PAGE, {"p": project, "n": 1000}),  # refused by a variable rule the same document passed above
            (THREADS_PAGE, {"projectId": project, "first": 5}),
            (SHAPES, {"p": project}),
            (NODES, {"ids": [threads[0], project, run_id, "bad", threads[1]]}),
            *[(q, {"p": project, **v}) if "$p" in q else (q, v) for q, v in CASES],
        ]
        for query, variables in cases:
            expected = await exchange(plain, query, variables)
            assert expected[0] in (200, 400)
            for _ in range(2):  # the second time, from the fast server's caches
                assert await exchange(client, query, variables) == expected, query
        # The page's statement count does not grow with its size (two threads: the waiting one is
        # the second unarchived, so both pages read its run).
        small = await exchange(client, PAGE, {"p": project, "n": 2})
        large = await exchange(client, PAGE, {"p": project, "n": 100})
        assert small[2] == large[2]

        # A token bound to another project sees a null page here and its own project's page; an
        # unknown token is refused before anything runs. Both servers answer alike.
        other = await make_project(client, "other")
        await make_thread(client, other, "other's")
        _, scoped = create_token(database_url, "read", other)
        for token, expect_null in ((scoped, True), ("tl_not_a_token", False)):
            fast_scoped, plain_scoped = Client(client.base_url, token), Client(plain_server.url, token)
            try:
                for variables in ({"p": project, "n": 10}, {"p": other, "n": 10}):
                    expected = await exchange(plain_scoped, PAGE, variables)
                    for _ in range(2):
                        assert await exchange(fast_scoped, PAGE, variables) == expected
                hidden = await exchange(fast_scoped, PAGE, {"p": project, "n": 10})
                assert (orjson.loads(hidden[1]).get("data") == {"threads": None}) is expect_null
            finally:
                await fast_scoped.aclose()
                await plain_scoped.aclose()
    finally:
        await plain.aclose()


def test_compiled_page_serves_plain_pages_and_declines_the_rest() -> None:
    """The compiled page is really used for the benchmark's page (not silently declined), and it
    declines selections it does not know before reading anything."""
    made: list[object] = []

    def spy(executor: Any, parent_type: Any, group: Any) -> Any:
        found = compile_threads(executor, parent_type, group)
        made.append(found)
        return found

    schema = with_fast_paths(build_schema(), {"threads": spy})

    async def compiled(query: str, variables: dict[str, Any]) -> list[object]:
        made.clear()
        await schema.execute(query, variable_values={"p": "x", "n": 3, **variables})
        return list(made)

    async def check() -> None:
        for query, variables in [(PAGE, {}), *COMPILED_PAGES[:2], COMPILED_PAGES[4], COMPILED_PAGES[-1]]:
            found = await compiled(query, variables)
            assert found and all(x is not None for x in found), query
        for query, variables in COMPILED_PAGES[-6:-1]:
            assert await compiled(query, variables) in ([None], []), query

    asyncio.run(check())


# ---------------------------------------------------------------- the compiled paths' edge cases
#
# Errors inside compiled objects and lists cannot be provoked through the service's own schema (its
# resolvers do not fail at execution), so a small real strawberry schema provides them: nulls in
# non-null fields and list items, exceptions, wrong object types, out-of-range ints and unknown
# enum values, awaitable items, shared objects, directives. The same documents run on the schema
# with and without `with_fast_paths` (twice with it: the second time its plans are shared).


@strawberry.enum
class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@strawberry.interface
class Named:
    name: str | None


@strawberry.type
class Leaf(Named):
    n: int
    color: Color
    flag: bool = False

    @strawberry.field
    def boom(self) -> str:
        raise ValueError(f"boom {self.name}")

    @strawberry.field
    def doubled(self) -> int:
        return self.n * 2


class NotALeaf:
    """Returned where a Leaf is expected: the type check refuses it."""


async def _later(leaf: Leaf | None) -> Leaf | None:
    return leaf


@strawberry.type
class Item:
    id: strawberry.ID
    label: str
    leaf: Leaf | None
    must: Leaf
    leaves: list[Leaf | None]
    strict: list[Leaf]
    odd: Leaf | None = None
    optional_list: list[Leaf] | None = None

    @strawberry.field
    def pending(self) -> Leaf | None:
        return _later(self.leaf)  # type: ignore[return-value]  # a coroutine from a sync resolver

    @strawberry.field
    def pending_items(self) -> list[Leaf | None]:
        return [_later(x) for x in self.leaves]  # type: ignore[misc]

    @strawberry.field
    async def later(self) -> Leaf | None:
        return self.leaf

    @strawberry.field
    def info_leaf(self, info: strawberry.Info) -> Leaf | None:
        return self.leaf if info.context is None else None


SHARED = Leaf(name="shared", n=1, color=Color.RED)
HUGE = Leaf(name="huge", n=2**40, color=Color.BLUE)
WRONG = Leaf(name="wrong", n=3, color="green")  # type: ignore[arg-type]


def _items() -> list[Item]:
    plain = [Leaf(name=f"leaf {i}", n=i, color=Color.BLUE, flag=i % 2 == 0) for i in range(3)]
    return [
        Item(
            id=strawberry.ID("1"), label="one", leaf=SHARED, must=SHARED, leaves=[SHARED, None, plain[0]], strict=plain
        ),
        Item(id=strawberry.ID("2"), label="two", leaf=None, must=plain[1], leaves=[], strict=[SHARED, SHARED]),
        Item(id=strawberry.ID("3"), label=None, leaf=plain[2], must=SHARED, leaves=[None], strict=plain),  # type: ignore[arg-type]
        Item(id=strawberry.ID("4"), label="four", leaf=HUGE, must=None, leaves=[HUGE], strict=[plain[0], None]),  # type: ignore[arg-type, list-item]
        Item(
            id=strawberry.ID("5"), label="five", leaf=WRONG, must=plain[0], leaves=[WRONG, SHARED], strict=[],
            odd=NotALeaf(), optional_list=[SHARED, None],  # type: ignore[arg-type, list-item]
        ),
    ]


@strawberry.type
class Box:
    items: list[Item]
    maybe_items: list[Item | None] | None
    first: Item | None


@strawberry.type
class EdgeQuery:
    @strawberry.field
    async def items(self) -> list[Item]:
        return _items()

    @strawberry.field
    async def box(self) -> Box:
        items = _items()
        return Box(items=items, maybe_items=[None, *items], first=items[0])


EDGE_DOCUMENTS: list[tuple[str, dict[str, Any]]] = [
    ("{ box { first { __typename id label leaf { __typename name n color flag doubled } } } }", {}),
    ("{ box { items { id a: label b: label leaf { name } } } }", {}),
    ("{ box { maybeItems { id label } } }", {}),
    ("{ box { maybeItems { id must { name } } } }", {}),
    ("{ box { maybeItems { id leaves { name n } } } }", {}),
    ("{ box { maybeItems { id strict { name } } } }", {}),
    ("{ box { maybeItems { id leaves { color } } } }", {}),
    ("{ box { maybeItems { id odd { name } optionalList { name } } } }", {}),
    ("{ box { maybeItems { id leaf { boom } } } }", {}),
    ("{ box { maybeItems { id pending { name n } pendingItems { name color } later { name } } } }", {}),
    ("{ box { maybeItems { id infoLeaf { name ... on Named { name } } } } }", {}),
    ("{ items { id leaf { name n } } }", {}),
    ("{ box { items { id must { name n doubled } } } }", {}),
    (
        "query($yes: Boolean!) { box { maybeItems { id leaf @include(if: $yes) { name } "
        "must { n @skip(if: $yes) name } } } }",
        {"yes": True},
    ),
    (
        "query($yes: Boolean!) { box { maybeItems { id leaf @include(if: $yes) { name } "
        "must { n @skip(if: $yes) name } } } }",
        {"yes": False},
    ),
    ("fragment F on Leaf { name color } { box { first { leaf { ...F ... on Leaf { n } } leaves { ...F } } } }", {}),
]


def _edge_schema() -> strawberry.Schema:
    return strawberry.Schema(query=EdgeQuery, types=[Leaf])


async def _run(schema: strawberry.Schema, query: str, variables: dict[str, Any]) -> bytes:
    result = await schema.execute(query, variable_values=variables)
    errors = [
        {"message": e.message, "path": e.path, "locations": [(loc.line, loc.column) for loc in e.locations or []]}
        for e in result.errors or []
    ]
    return orjson.dumps({"data": result.data, "errors": errors})


@pytest.mark.parametrize(("query", "variables"), EDGE_DOCUMENTS)
async def test_compiled_objects_fail_and_null_like_graphql_core(query: str, variables: dict[str, Any]) -> None:
    plain, fast = _edge_schema(), with_fast_paths(_edge_schema())
    expected = await _run(plain, query, variables)
    assert b'"data":' in expected
    for _ in range(2):  # the second time, from the shared plans
        assert await _run(fast, query, variables) == expected

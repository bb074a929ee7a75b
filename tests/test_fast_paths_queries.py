"""The query fast paths (`api/compiled.py`) change no byte of any response.

Two real servers share one database: one with the fast paths (the default), one started
with `THREADLOOM_FAST_PATHS=0`. Every document below — pages of many field kinds (enums,
datetimes, nulls, ids; an idle thread and one whose run waits; one project named by every
thread), aliases, `__typename`, fragments, nested connections, abstract `nodes`, field errors,
validation errors with and without variables — is sent to both, twice to the fast server (the
second time its caches answer), and the bodies, statuses and statement counts must be identical.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.graphql import THREADS_PAGE, make_project, make_thread, statements
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, serving
from tests.support.waiting import until

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
    client: Client, plain_server: ServerProcess
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

        cases = [
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
    finally:
        await plain.aclose()

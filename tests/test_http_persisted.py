"""Automatic persisted queries (Apollo's protocol) against a real server, as Apollo Client's link sends them.

The round trip: a hash the server does not know → PERSISTED_QUERY_NOT_FOUND; the hash with its query → data
(and the query is registered); the hash alone → data, over POST and over GET (a short URL a cache can key
on); a hash that is not the query's → refused, and it does not become a name for that query; a mutation
sent by hash over GET is still refused, and runs over POST.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.graphql import make_project, workspace
from tests.support.pg import PgServer
from tests.support.server import Client, ServerProcess, serving


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module; each test persists queries of its own (a unique comment in each)."""
    with serving(database_url, tmp_path_factory.mktemp("http-apq")) as proc:
        yield proc


def persisted(query: str) -> dict[str, Any]:
    return {"persistedQuery": {"version": 1, "sha256Hash": hashlib.sha256(query.encode()).hexdigest()}}


def code(response: httpx.Response) -> str:
    return str(response.json()["errors"][0]["extensions"]["code"])


async def post(client: Client, body: dict[str, Any]) -> httpx.Response:
    return await client.http.post("/graphql", json=body, headers=client.headers())


async def get(client: Client, params: dict[str, Any]) -> httpx.Response:
    encoded = {k: v if isinstance(v, str) else json.dumps(v) for k, v in params.items()}
    return await client.http.get("/graphql", params=encoded, headers=client.headers())


async def test_the_apq_round_trip_over_post_and_get(client: Client) -> None:
    project = await make_project(client, "APQ")
    query = "# round trip\nquery Named($p: ID!) { node(id: $p) { ... on Project { name } } }"
    ext = persisted(query)
    variables = {"p": project}
    expected = {"data": {"node": {"name": "APQ"}}}

    unknown = await post(client, {"extensions": ext, "variables": variables})
    assert unknown.status_code == 200  # as Apollo Server answers: the client library retries with the query
    assert unknown.json() == {
        "errors": [{"message": "PersistedQueryNotFound", "extensions": {"code": "PERSISTED_QUERY_NOT_FOUND"}}]
    }
    assert "no-cache" in unknown.headers["cache-control"]  # a cache must not keep the miss
    unknown_get = await get(client, {"extensions": ext, "variables": variables})
    assert unknown_get.status_code == 200 and code(unknown_get) == "PERSISTED_QUERY_NOT_FOUND"

    registered = await post(client, {"query": query, "extensions": ext, "variables": variables})
    assert registered.status_code == 200 and registered.json() == expected

    by_hash = await post(client, {"extensions": ext, "variables": variables})
    assert by_hash.json() == expected
    over_get = await get(client, {"extensions": ext, "variables": variables})
    assert over_get.status_code == 200 and over_get.json() == expected
    assert over_get.headers["vary"] == "Authorization"  # a cache keeps it per token
    assert "query=" not in str(over_get.request.url)  # the URL carries the hash only


async def test_a_hash_that_is_not_the_querys_is_refused_and_registers_nothing(client: Client) -> None:
    query = "# mismatch\n{ viewer { scope } }"
    other = "# another\n{ viewer { scope } }"
    wrong = persisted(other)
    refused = await post(client, {"query": query, "extensions": wrong})
    assert refused.status_code == 400 and code(refused) == "PERSISTED_QUERY_HASH_MISMATCH"
    assert list(refused.json()) == ["errors"]
    still_unknown = await post(client, {"extensions": wrong})
    assert code(still_unknown) == "PERSISTED_QUERY_NOT_FOUND"
    # Its twin: the right hash for the same text is accepted.
    assert (await post(client, {"query": query, "extensions": persisted(query)})).json() == {
        "data": {"viewer": {"scope": "ADMIN"}}
    }


@pytest.mark.parametrize(
    ("extension", "wanted"),
    [
        ({"persistedQuery": {"version": 2, "sha256Hash": "0" * 64}}, "PERSISTED_QUERY_VERSION_UNSUPPORTED"),
        ({"persistedQuery": {"version": 1, "sha256Hash": "not-a-hash"}}, "PERSISTED_QUERY_BAD_HASH"),
        ({"persistedQuery": "yes"}, "PERSISTED_QUERY_VERSION_UNSUPPORTED"),
    ],
)
async def test_a_malformed_persisted_query_extension_is_refused_with_a_code(
    client: Client, extension: dict[str, Any], wanted: str
) -> None:
    response = await post(client, {"extensions": extension})
    assert response.status_code == 400 and code(response) == wanted


async def test_a_persisted_mutation_runs_over_post_and_is_refused_over_get(client: Client, tmp_path: Path) -> None:
    mutation = (
        "# apq mutation\nmutation M($name: String!, $root: String!) { createProject(input: {name: $name, "
        "workspaceRoot: $root}) { project { name } userErrors { code } } }"
    )
    ext = persisted(mutation)
    first = {"name": "by hash 1", "root": workspace(tmp_path, "one")}
    made = await post(client, {"query": mutation, "extensions": ext, "variables": first})
    assert made.json()["data"]["createProject"] == {"project": {"name": "by hash 1"}, "userErrors": []}

    second = {"name": "by hash 2", "root": workspace(tmp_path, "two")}
    refused = await get(client, {"extensions": ext, "variables": second})
    assert refused.status_code == 405 and code(refused) == "MUTATION_OVER_GET"
    assert refused.headers["allow"] == "POST"
    again = await post(client, {"extensions": ext, "variables": second})
    assert again.json()["data"]["createProject"] == {"project": {"name": "by hash 2"}, "userErrors": []}
    names = await client.gql("{ projects(first: 50) { nodes { name } } }")
    assert [n["name"] for n in names["projects"]["nodes"] if n["name"].startswith("by hash")] == [
        "by hash 1",
        "by hash 2",
    ]

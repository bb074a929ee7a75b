"""Every refusal of /graphql is a JSON GraphQL error with a stable code and its HTTP status (GraphQL-over-HTTP).

A client library reads `errors[0].extensions.code` whatever went wrong; none of these requests may answer
plain text or HTML, and none runs anything (no `data` entry). Against a real server, over real HTTP.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from tests.support.server import Client, ServerProcess

SHARED_SERVER = True  # one server for the module: each request here is refused before it could change anything

JSON = {"content-type": "application/json"}
MUTATION = 'mutation { createProject(input: {name: "x", workspaceRoot: "/nowhere"}) { userErrors { code } } }'

# (what is wrong, method, extra request arguments, status, code, a header the answer must carry)
BAD_REQUESTS: list[tuple[str, str, dict[str, Any], int, str, tuple[str, str] | None]] = [
    ("body is not JSON", "POST", {"content": b"{not json", "headers": JSON}, 400, "INVALID_JSON", None),
    ("body cut short", "POST", {"content": b'{"query": "{ viewer', "headers": JSON}, 400, "INVALID_JSON", None),
    ("no content type", "POST", {"content": b'{"query": "{ viewer { scope } }"}'}, 415, "UNSUPPORTED_MEDIA_TYPE", None),
    (
        "text/plain content type",
        "POST",
        {"content": b'{"query": "{ viewer { scope } }"}', "headers": {"content-type": "text/plain"}},
        415,
        "UNSUPPORTED_MEDIA_TYPE",
        None,
    ),
    ("a mutation over GET", "GET", {"params": {"query": MUTATION}}, 405, "MUTATION_OVER_GET", ("allow", "POST")),
    ("PUT", "PUT", {"json": {"query": "{ viewer { scope } }"}}, 405, "METHOD_NOT_ALLOWED", ("allow", "GET, POST")),
    ("DELETE", "DELETE", {}, 405, "METHOD_NOT_ALLOWED", ("allow", "GET, POST")),
    ("no query", "POST", {"json": {}}, 400, "MISSING_QUERY", None),
    ("GET without a query", "GET", {"headers": {"accept": "application/json"}}, 400, "MISSING_QUERY", None),
    ("a JSON string, not an object", "POST", {"json": "{ viewer { scope } }"}, 400, "BAD_REQUEST", None),
    ("query is not a string", "POST", {"json": {"query": 5}}, 400, "BAD_REQUEST", None),
    (
        "variables are not an object",
        "POST",
        {"json": {"query": "{ viewer { scope } }", "variables": [1]}},
        400,
        "BAD_REQUEST",
        None,
    ),
    (
        "a batch (a list of operations)",
        "POST",
        {"json": [{"query": "{ viewer { scope } }"}]},
        400,
        "BATCHING_NOT_SUPPORTED",
        None,
    ),
    (
        "GET variables not JSON",
        "GET",
        {"params": {"query": "{ viewer { scope } }", "variables": "{x"}},
        400,
        "INVALID_JSON",
        None,
    ),
]


def assert_coded(response: httpx.Response, status: int, code: str) -> dict[str, Any]:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].split(";")[0] in ("application/json", "application/graphql-response+json")
    body: dict[str, Any] = response.json()
    assert list(body) == ["errors"], body  # nothing ran: no `data` entry
    (error,) = body["errors"]
    assert isinstance(error["message"], str) and error["message"], error
    assert error["extensions"]["code"] == code, error
    return dict(error)


@pytest.mark.parametrize(
    ("wrong", "method", "request_kw", "status", "code", "header"), BAD_REQUESTS, ids=[r[0] for r in BAD_REQUESTS]
)
async def test_each_bad_request_is_answered_json_with_its_code_and_status(
    client: Client,
    wrong: str,
    method: str,
    request_kw: dict[str, Any],
    status: int,
    code: str,
    header: tuple[str, str] | None,
) -> None:
    headers = {**client.headers(), **request_kw.pop("headers", {})}
    response = await client.http.request(method, "/graphql", headers=headers, **request_kw)
    assert_coded(response, status, code)
    if header is not None:
        assert response.headers[header[0]] == header[1]


async def test_the_media_type_asked_for_is_the_one_answered(client: Client) -> None:
    """graphql-response+json when the client accepts it, application/json otherwise: the error body is the same."""
    for accept, media in (
        ("application/graphql-response+json", "application/graphql-response+json"),
        ("application/json", "application/json"),
    ):
        response = await client.http.post(
            "/graphql", content=b"{nope", headers={**client.headers(), **JSON, "accept": accept}
        )
        assert_coded(response, 400, "INVALID_JSON")
        assert response.headers["content-type"].split(";")[0] == media


async def test_refusals_before_the_token_is_read_are_coded_too(server: ServerProcess, client: Client) -> None:
    """No token, a bad token and an oversized body are refused by the gate in front of GraphQL: same shape."""
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as http:
        for headers in ({}, {"authorization": "Bearer tl_nope"}):
            assert_coded(
                await http.post("/graphql", content=b"{nope", headers={**headers, **JSON}), 401, "UNAUTHENTICATED"
            )
        huge = b'{"query": "' + b" " * (300 * 1024) + b'{ viewer { scope } }"}'
        assert_coded(
            await http.post("/graphql", content=huge, headers={**client.headers(), **JSON}), 413, "PAYLOAD_TOO_LARGE"
        )


async def test_a_good_request_beside_them_still_runs(client: Client) -> None:
    """The twin of the table: the same server answers a well-formed query and a query over GET with data."""
    assert (await client.gql("{ viewer { scope } }"))["viewer"]["scope"] == "ADMIN"
    response = await client.http.get("/graphql", params={"query": "{ viewer { scope } }"}, headers=client.headers())
    assert response.status_code == 200 and response.json() == {"data": {"viewer": {"scope": "ADMIN"}}}


async def test_a_browser_page_load_is_refused_with_a_code_while_graphiql_is_off(client: Client) -> None:
    response = await client.http.get("/graphql", headers={**client.headers(), "accept": "text/html"})
    assert_coded(response, 404, "GRAPHIQL_OFF")
    assert (await client.http.get("/graphiql/start.js")).status_code == 404  # its files are not served either

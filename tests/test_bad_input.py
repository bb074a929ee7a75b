"""Bad input gets a clear, coded error, the documented HTTP status, and changes nothing."""

from __future__ import annotations

import base64

from tests.support.db import count
from tests.support.graphql import CREATE_THREAD, make_project, make_thread
from tests.support.server import Client, ServerProcess
from threadloom.store import tables as t
from threadloom.store.db import Database

SHARED_SERVER = True  # no test here starts agent work: the shared server writes nothing between requests

GRAPHQL_RESPONSE = {"accept": "application/graphql-response+json"}


async def _writes(database_url: str) -> tuple[int, int]:
    db = Database.from_url(database_url, pool_size=1)
    try:
        return await count(db, t.events), await count(db, t.command_receipts)
    finally:
        await db.dispose()


async def test_undecodable_and_wrong_type_ids(client: Client, database_url: str) -> None:
    project = await make_project(client)
    thread = await make_thread(client, project)
    before = await _writes(database_url)
    data = await client.gql(
        """query($bad: ID!, $p: ID!, $t: ID!) {
             node(id: $bad) { id } thread(id: $p) { id } run(id: $t) { id } project(id: $t) { id }
             nodes(ids: [$bad, $p, $t]) { id } threads(projectId: $t) { totalCount } }""",
        {"bad": "%%%not-an-id", "p": project, "t": thread["id"]},
    )
    assert data["node"] is None and data["thread"] is None and data["run"] is None and data["project"] is None
    assert data["nodes"] == [None, {"id": project}, {"id": thread["id"]}]
    assert data["threads"] is None
    wrong = await client.gql(CREATE_THREAD, {"projectId": thread["id"], "title": "x"})
    assert wrong["createThread"]["thread"] is None
    assert wrong["createThread"]["userErrors"] == [
        {"code": "INVALID_ID", "field": "projectId", "message": "projectId is a Thread id; a Project id is needed"}
    ]
    junk = base64.urlsafe_b64encode(b"Thread:not-a-uuid").decode()
    for bad in ("", "!!!", junk, "x" * 500):
        result = await client.gql(
            """mutation($id: ID!) { archiveThread(input: {threadId: $id}) { userErrors { code field } } }""",
            {"id": bad},
        )
        assert result["archiveThread"]["userErrors"] == [{"code": "INVALID_ID", "field": "threadId"}]
    assert await _writes(database_url) == before


async def test_invalid_title_root_or_provider_is_refused_and_writes_nothing(client: Client, database_url: str) -> None:
    project = await make_project(client)
    before = await _writes(database_url)
    blank = await client.gql(CREATE_THREAD, {"projectId": project, "title": "   "})
    assert blank["createThread"]["userErrors"][0]["code"] == "INVALID_INPUT"
    assert blank["createThread"]["userErrors"][0]["field"] == "title"
    relative = await client.gql(
        """mutation { createProject(input: {name: "x", workspaceRoot: "relative"}) { userErrors { code field } } }"""
    )
    assert relative["createProject"]["userErrors"] == [{"code": "INVALID_INPUT", "field": "workspaceRoot"}]
    provider = await client.gql(
        """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "nope"}) {
             userErrors { code field } } }""",
        {"p": project},
    )
    assert provider["createThread"]["userErrors"] == [
        {"code": "UNKNOWN_PROVIDER_INSTANCE", "field": "providerInstanceId"}
    ]
    assert await _writes(database_url) == before


async def test_page_size_and_cursor_limits(client: Client) -> None:
    project = await make_project(client)
    for first in (10_000, 101, -1):
        response = await client.post(
            "query($p: ID!, $n: Int) { threads(projectId: $p, first: $n) { totalCount } }", {"p": project, "n": first}
        )
        assert response.status_code == 200
        body = response.json()
        assert "data" not in body  # refused during validation, variables included: nothing executed
        code = body["errors"][0]["extensions"]["code"]
        assert code == ("INVALID_INPUT" if first < 0 else "PAGE_SIZE_EXCEEDED")
    bad_cursor = await client.post(
        'query($p: ID!) { threads(projectId: $p, after: "garbage") { totalCount } }', {"p": project}
    )
    assert bad_cursor.json()["errors"][0]["extensions"]["code"] == "INVALID_CURSOR"
    both = await client.post("{ projects(first: 1, last: 1) { totalCount } }")
    assert both.json()["errors"][0]["extensions"]["code"] == "INVALID_INPUT"


async def test_depth_alias_and_token_limits(client: Client) -> None:
    deep = (
        "{ projects { edges { node { threads { edges { node { project { threads { edges { node { project {"
        " threads { edges { node { id } } } } } } } } } } } } } } }"
    )
    response = await client.post(deep, headers=GRAPHQL_RESPONSE)
    assert response.status_code == 400
    assert response.headers["content-type"].startswith("application/graphql-response+json")
    body = response.json()
    assert "data" not in body or body["data"] is None
    assert "exceeds maximum operation depth" in body["errors"][0]["message"]
    assert body["errors"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"
    aliases = "{ " + " ".join(f"a{i}: viewer {{ scope }}" for i in range(40)) + " }"
    response = await client.post(aliases, headers=GRAPHQL_RESPONSE)
    assert response.status_code == 400
    assert "aliases" in response.json()["errors"][0]["message"]
    tokens = "{ " + " ".join("viewer { scope }" for _ in range(2000)) + " }"
    response = await client.post(tokens, headers=GRAPHQL_RESPONSE)
    assert response.status_code == 400
    assert "token" in response.json()["errors"][0]["message"].lower()
    # Older clients asking for application/json get 200 with the same errors.
    legacy = await client.post(aliases, headers={"accept": "application/json"})
    assert legacy.status_code == 200
    assert legacy.headers["content-type"] == "application/json"
    assert legacy.json()["errors"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"


async def test_unparseable_and_unknown_fields(client: Client) -> None:
    response = await client.post("{ viewer { scope ", headers=GRAPHQL_RESPONSE)
    assert response.status_code == 400
    assert response.json()["errors"][0]["extensions"]["code"] == "GRAPHQL_PARSE_FAILED"
    unknown = await client.post("{ viewer { scopes } }", headers=GRAPHQL_RESPONSE)
    assert unknown.status_code == 400
    assert "Did you mean" not in unknown.json()["errors"][0]["message"]  # no suggestions outside dev mode
    not_json = await client.http.post(
        "/graphql", content=b"{nope", headers={**client.headers(), "content-type": "application/json"}
    )
    assert not_json.status_code == 400


async def test_oversized_body_is_413(server: ServerProcess, client: Client, database_url: str) -> None:
    before = await _writes(database_url)
    big = 'mutation { createProject(input: {name: "' + "x" * 300_000 + '", workspaceRoot: "/w"}) { project { id } } }'
    response = await client.post(big)
    assert response.status_code == 413
    assert response.json()["errors"][0]["extensions"]["code"] == "PAYLOAD_TOO_LARGE"

    def chunks():  # type: ignore[no-untyped-def]
        yield b'{"query": "{ viewer { scope } }", "x": "'
        for _ in range(40):
            yield b"y" * 10_000
        yield b'"}'

    async def achunks():  # type: ignore[no-untyped-def]
        for chunk in chunks():
            yield chunk

    streamed = await client.http.post(
        "/graphql", content=achunks(), headers={**client.headers(), "content-type": "application/json"}
    )
    assert streamed.status_code == 413
    assert await _writes(database_url) == before


async def test_get_is_for_queries_only(client: Client) -> None:
    ok = await client.http.get("/graphql", params={"query": "{ viewer { scope } }"}, headers=client.headers())
    assert ok.status_code == 200 and ok.json()["data"]["viewer"]["scope"] == "ADMIN"
    mutation = await client.http.get(
        "/graphql",
        params={"query": 'mutation { createProject(input: {name: "x", workspaceRoot: "/w"}) { project { id } } }'},
        headers=client.headers(),
    )
    assert mutation.status_code == 405

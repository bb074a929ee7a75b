"""The auth matrix over a real server: no token, wrong project, read on a mutation, revoked."""

from __future__ import annotations

import uuid

import pytest
import websockets

from tests.support.cli import create_token, threadloom
from tests.support.graphql import CREATE_THREAD, make_project, make_thread
from tests.support.server import Client, ServerProcess
from tests.support.ws import WsClient
from threadloom.api import ids

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

RENAME = """mutation($id: ID!) { renameThread(input: {threadId: $id, title: "x"}) {
  thread { id title } userErrors { code field } } }"""


async def test_no_token_is_401(server: ServerProcess, client: Client) -> None:
    response = await client.post("{ viewer { scope } }", token="")
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert response.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    bad = await client.post("{ viewer { scope } }", token="tl_not-a-token")
    assert bad.status_code == 401
    assert bad.json()["errors"][0]["message"] == "invalid or revoked token"


async def test_token_never_sees_another_project(server: ServerProcess, client: Client, database_url: str) -> None:
    mine = await make_project(client, "mine")
    theirs = await make_project(client, "theirs")
    their_thread = await make_thread(client, theirs, "secret")
    my_thread = await make_thread(client, mine, "mine")
    _, token = create_token(database_url, "operate", mine)
    me = Client(server.url, token)
    try:
        data = await me.gql(
            """query($t: ID!, $p: ID!) { node(id: $t) { id } thread(id: $t) { id } project(id: $p) { id }
               threads(projectId: $p) { totalCount } nodes(ids: [$t]) { id }
               projects { totalCount edges { node { id } } } viewer { scope project { id } } }""",
            {"t": their_thread["id"], "p": theirs},
        )
        assert data["node"] is None and data["thread"] is None and data["project"] is None
        assert data["threads"] is None and data["nodes"] == [None]
        assert data["projects"]["totalCount"] == 1
        assert data["projects"]["edges"][0]["node"]["id"] == mine
        assert data["viewer"] == {"scope": "OPERATE", "project": {"id": mine}}
        # Mutations on invisible objects look exactly like unknown ones.
        renamed = await me.gql(RENAME, {"id": their_thread["id"]})
        assert renamed["renameThread"] == {"thread": None, "userErrors": [{"code": "NOT_FOUND", "field": "threadId"}]}
        created = await me.gql(CREATE_THREAD, {"projectId": theirs, "title": "x"})
        assert created["createThread"]["userErrors"][0]["code"] == "NOT_FOUND"
        # …while its own project works.
        ok = await me.gql(RENAME, {"id": my_thread["id"]})
        assert ok["renameThread"]["thread"]["title"] == "x"
        forbidden = await me.gql(
            """mutation { createProject(input: {name: "n", workspaceRoot: "/w"}) {
                 project { id } userErrors { code } } }"""
        )
        assert forbidden["createProject"] == {"project": None, "userErrors": [{"code": "FORBIDDEN"}]}
    finally:
        await me.aclose()
    check = await client.gql("query($t: ID!) { thread(id: $t) { title } }", {"t": their_thread["id"]})
    assert check["thread"]["title"] == "secret"


async def test_read_token_cannot_mutate(server: ServerProcess, client: Client, database_url: str) -> None:
    project = await make_project(client)
    thread = await make_thread(client, project, "before")
    _, token = create_token(database_url, "read", project)
    reader = Client(server.url, token)
    try:
        seen = await reader.gql("query($t: ID!) { thread(id: $t) { title } }", {"t": thread["id"]})
        assert seen["thread"]["title"] == "before"
        refused = await reader.gql(RENAME, {"id": thread["id"]})
        assert refused["renameThread"] == {"thread": None, "userErrors": [{"code": "FORBIDDEN", "field": None}]}
        created = await reader.gql(CREATE_THREAD, {"projectId": project, "title": "x"})
        assert created["createThread"]["userErrors"][0]["code"] == "FORBIDDEN"
    finally:
        await reader.aclose()
    after = await client.gql(
        "query($p: ID!) { threads(projectId: $p) { totalCount edges { node { title } } } }", {"p": project}
    )
    assert after["threads"]["totalCount"] == 1
    assert after["threads"]["edges"][0]["node"]["title"] == "before"


async def test_revoked_token_is_401(server: ServerProcess, client: Client, database_url: str) -> None:
    token_id, token = create_token(database_url, "admin")
    assert (await client.post("{ viewer { scope } }", token=token)).status_code == 200
    listed = threadloom(database_url, "token", "list")  # the API's global ids, as everywhere
    assert ids.encode("ApiToken", uuid.UUID(token_id)) in listed.stdout and token not in listed.stdout
    done = threadloom(database_url, "token", "revoke", token_id)
    assert done.returncode == 0, done.stderr
    response = await client.post("{ viewer { scope } }", token=token)
    assert response.status_code == 401
    assert "revoked" in threadloom(database_url, "token", "list").stdout
    again = threadloom(database_url, "token", "revoke", token_id)
    assert again.returncode == 2


@pytest.mark.own_server  # it stops the server to read its whole log
async def test_token_is_never_logged(server: ServerProcess, client: Client) -> None:
    await client.gql("query Probe { viewer { scope } }")
    assert client.token
    server.stop()
    assert any('"operation":"Probe"' in line for line in server.log)
    assert all(client.token not in line for line in server.log)


@pytest.mark.own_server  # it stops the server to read its whole log
async def test_a_refused_socket_is_logged_and_an_accepted_one_is_not(server: ServerProcess, client: Client) -> None:
    """A socket refused for its token leaves one line saying why (never the token); an accepted one leaves
    none: a crowd of reconnecting clients does not flood the log (open sockets are counted on /metrics)."""
    with pytest.raises(websockets.ConnectionClosed) as refused:
        await WsClient.connect(server.url, "tl_not-a-real-token")
    assert refused.value.rcvd is not None and refused.value.rcvd.code == 4403
    assert client.token
    accepted = await WsClient.connect(server.url, client.token)
    await accepted.close()
    await client.gql("query AfterTheSockets { viewer { scope } }")  # logged after both sockets' lines
    server.stop()
    log = "\n".join(server.log)
    assert '"operation":"AfterTheSockets"' in log
    refusals = [line for line in server.log if "websocket refused" in line]
    assert len(refusals) == 1 and "invalid or revoked token" in refusals[0], refusals
    assert "tl_not-a-real-token" not in log and client.token not in log
    assert "[accepted]" not in log and "connection open" not in log and "connection closed" not in log

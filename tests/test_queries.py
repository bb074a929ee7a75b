"""Browsing through the typed schema: pagination, nodes, and no N+1 statements."""

from __future__ import annotations

import asyncio

from tests.support.graphql import THREADS_PAGE, make_project, make_thread, statements
from tests.support.server import Client

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)


async def test_keyset_pages_walk_forward_and_back(client: Client) -> None:
    project = await make_project(client)
    made = [(await make_thread(client, project, f"t{i:02d}"))["id"] for i in range(25)]
    seen: list[str] = []
    after = None
    while True:
        data = await client.gql(THREADS_PAGE, {"projectId": project, "first": 10, "after": after})
        page = data["threads"]
        assert page["totalCount"] == 25
        seen += [e["node"]["id"] for e in page["edges"]]
        if not page["pageInfo"]["hasNextPage"]:
            break
        after = page["pageInfo"]["endCursor"]
    assert seen == made  # oldest first, nothing skipped or repeated
    back = await client.gql(
        """query($p: ID!, $b: String) { threads(projectId: $p, last: 5, before: $b) {
             pageInfo { hasPreviousPage hasNextPage } edges { node { title } } } }""",
        {"p": project, "b": None},
    )
    assert [e["node"]["title"] for e in back["threads"]["edges"]] == [f"t{i}" for i in range(20, 25)]
    assert back["threads"]["pageInfo"] == {"hasPreviousPage": True, "hasNextPage": False}


async def test_archived_threads_are_hidden_unless_asked(client: Client) -> None:
    project = await make_project(client)
    keep = await make_thread(client, project, "keep")
    gone = await make_thread(client, project, "gone")
    archived = await client.gql(
        "mutation($t: ID!) { archiveThread(input: {threadId: $t}) { thread { archivedAt } userErrors { code } } }",
        {"t": gone["id"]},
    )
    assert archived["archiveThread"]["thread"]["archivedAt"] is not None
    again = await client.gql(
        "mutation($t: ID!) { archiveThread(input: {threadId: $t}) { thread { id } userErrors { code } } }",
        {"t": gone["id"]},
    )
    assert again["archiveThread"]["userErrors"] == [{"code": "ALREADY_ARCHIVED"}]
    listing = """query($p: ID!, $all: Boolean!) { threads(projectId: $p, includeArchived: $all) {
                   totalCount edges { node { id } } } }"""
    visible = await client.gql(listing, {"p": project, "all": False})
    assert [e["node"]["id"] for e in visible["threads"]["edges"]] == [keep["id"]]
    everything = await client.gql(listing, {"p": project, "all": True})
    assert everything["threads"]["totalCount"] == 2
    back = await client.gql(
        "mutation($t: ID!) { unarchiveThread(input: {threadId: $t}) { thread { archivedAt latestSequence } } }",
        {"t": gone["id"]},
    )
    assert back["unarchiveThread"]["thread"] == {"archivedAt": None, "latestSequence": 3}


async def test_statement_count_does_not_grow_with_page_size(client: Client) -> None:
    project = await make_project(client)
    for i in range(0, 120, 20):
        await asyncio.gather(*(make_thread(client, project, f"t{j}") for j in range(i, i + 20)))
    counts = {}
    for first in (1, 10, 100):
        response = await client.post(THREADS_PAGE, {"projectId": project, "first": first})
        body = response.json()
        assert "errors" not in body, body
        assert len(body["data"]["threads"]["edges"]) == first
        counts[first] = statements(dict(response.headers))
    assert counts[1] == counts[10] == counts[100], counts


async def test_node_and_nodes_resolve_every_kind(client: Client) -> None:
    project = await make_project(client)
    thread = await make_thread(client, project, "x")
    data = await client.gql(
        """query($ids: [ID!]!) {
             nodes(ids: $ids) { __typename id ... on Thread { title } ... on Project { name } } }""",
        {"ids": [thread["id"], project, thread["id"]]},
    )
    assert data["nodes"] == [
        {"__typename": "Thread", "id": thread["id"], "title": "x"},
        {"__typename": "Project", "id": project, "name": "Demo"},
        {"__typename": "Thread", "id": thread["id"], "title": "x"},
    ]
    too_many = await client.post("query($ids: [ID!]!) { nodes(ids: $ids) { id } }", {"ids": ["x"] * 101})
    assert too_many.json()["errors"][0]["extensions"]["code"] == "PAGE_SIZE_EXCEEDED"


async def test_idempotent_create_thread_over_http(client: Client) -> None:
    project = await make_project(client)
    mutation = """mutation($p: ID!) { createThread(input: {projectId: $p, title: "once", clientMutationId: "abc"}) {
                    thread { id title latestSequence } userErrors { code } clientMutationId } }"""
    answers = await asyncio.gather(*(client.gql(mutation, {"p": project}) for _ in range(20)))
    assert all(a == answers[0] for a in answers)
    assert answers[0]["createThread"]["thread"]["title"] == "once"
    assert answers[0]["createThread"]["clientMutationId"] == "abc"
    listed = await client.gql("query($p: ID!) { threads(projectId: $p) { totalCount } }", {"p": project})
    assert listed["threads"]["totalCount"] == 1

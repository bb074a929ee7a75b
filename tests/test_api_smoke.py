"""The newcomer's tour over a real server: create a project and a thread, browse them."""

from __future__ import annotations

from tests.support.graphql import THREADS_PAGE, make_project, make_thread
from tests.support.server import Client


async def test_a_created_thread_is_listed_in_its_project_page(client: Client) -> None:
    project_id = await make_project(client)
    thread = await make_thread(client, project_id, "Hello")
    assert thread["title"] == "Hello"
    assert thread["status"] == "IDLE"
    assert thread["latestSequence"] == 1
    assert thread["providerInstanceId"] == "scripted"
    data = await client.gql(THREADS_PAGE, {"projectId": project_id, "first": 10})
    page = data["threads"]
    assert page["totalCount"] == 1
    node = page["edges"][0]["node"]
    assert node["id"] == thread["id"]
    assert node["project"]["id"] == project_id
    assert node["runs"]["totalCount"] == 0
    assert node["lineage"]["rootThread"]["id"] == thread["id"]
    assert node["lineage"]["parentThread"] is None

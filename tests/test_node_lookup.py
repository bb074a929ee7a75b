"""`node(id:)` and `nodes(ids:)` resolve every Node type, as a table: for each type, one object of a real
scene (tests/support/graph_scene.py) is asked for by an all-projects token, by a token of its own project
(the owner's twin: it succeeds) and by a token of another project (`null`, and the same for `nodes`).

A provider session belongs to no project (one runtime serves every project's threads on its instance), so
only an all-projects token sees it; both project tokens get `null` for it.
"""

from __future__ import annotations

from typing import Any

from tests.support import graph_scene
from tests.support.cli import create_token
from tests.support.graphql import make_project
from tests.support.server import Client, ServerProcess
from threadloom.api.types import NODE_TYPES

PROVIDERS = graph_scene.PROVIDERS

ONE_OF_EACH = """query($t: ID!) { thread(id: $t) {
  id project { id } budgets { id }
  messages(first: 1) { nodes { id } }
  activities(first: 1) { nodes { id } }
  checkpoints(first: 1) { nodes { id scope { id } } }
  contextTransfers(first: 1) { nodes { id } }
  providerThreads { id session { id } turns(first: 1) { nodes { id } } }
  last: runs(last: 1) { nodes { contextHandoff { id } } }
  runs(first: 1) { nodes { id attempts { id } rootNode { id } plans { id } runtimeRequests { id }
    usageRecords { id } } }
} }"""

SET_BUDGET = """mutation($t: ID!) { setBudget(input: {threadId: $t, maxTokens: 1000000000, window: TOTAL,
  action: STOP}) { userErrors { code } } }"""
NODE = """query($id: ID!) { node(id: $id) { __typename id } }"""
NODES = """query($ids: [ID!]!) { nodes(ids: $ids) { __typename id } }"""


def _one_of_each(thread: dict[str, Any]) -> dict[str, str]:
    """One global id per Node type, from the scene's source thread."""
    run = thread["runs"]["nodes"][0]
    pt = thread["providerThreads"][0]
    checkpoint = thread["checkpoints"]["nodes"][0]
    return {
        "Project": thread["project"]["id"],
        "Thread": thread["id"],
        "Run": run["id"],
        "RunAttempt": run["attempts"][0]["id"],
        "ExecutionNode": run["rootNode"]["id"],
        "ConversationMessage": thread["messages"]["nodes"][0]["id"],
        "ProviderSession": pt["session"]["id"],
        "ProviderThread": pt["id"],
        "ProviderTurn": pt["turns"]["nodes"][0]["id"],
        "ContextTransfer": thread["contextTransfers"]["nodes"][0]["id"],
        "ContextHandoff": thread["last"]["nodes"][0]["contextHandoff"]["id"],
        "CheckpointScope": checkpoint["scope"]["id"],
        "Checkpoint": checkpoint["id"],
        "RuntimeRequest": run["runtimeRequests"][0]["id"],
        "PlanArtifact": run["plans"][0]["id"],
        "Activity": thread["activities"]["nodes"][0]["id"],
        "UsageRecord": run["usageRecords"][0]["id"],
        "Budget": thread["budgets"][0]["id"],
    }


async def test_node_and_nodes_resolve_every_node_type_for_its_owner_and_null_for_another_project(
    client: Client, server: ServerProcess, database_url: str
) -> None:
    scene = await graph_scene.build(client, 1)
    budget = await client.gql(SET_BUDGET, {"t": scene.units[0].source})  # far above what the scene spends
    assert budget["setBudget"]["userErrors"] == []
    ids = _one_of_each((await client.gql(ONE_OF_EACH, {"t": scene.units[0].source}))["thread"])
    assert set(ids) == set(NODE_TYPES), set(NODE_TYPES) ^ set(ids)  # the table covers every Node type

    other = await make_project(client, "other")
    owner = Client(server.url, create_token(database_url, "read", scene.project)[1])
    stranger = Client(server.url, create_token(database_url, "read", other)[1])
    try:
        seen: dict[str, list[Any]] = {"admin": [], "owner": [], "stranger": []}
        for type_name, global_id in ids.items():
            mine = {"__typename": type_name, "id": global_id}
            expected = {"admin": mine, "owner": None if type_name == "ProviderSession" else mine, "stranger": None}
            for who, asker in (("admin", client), ("owner", owner), ("stranger", stranger)):
                found = (await asker.gql(NODE, {"id": global_id}))["node"]
                assert found == expected[who], f"node({type_name}) as {who}: {found}"
                seen[who].append(expected[who])
        for who, asker in (("admin", client), ("owner", owner), ("stranger", stranger)):
            listed = (await asker.gql(NODES, {"ids": list(ids.values())}))["nodes"]
            assert listed == seen[who], f"nodes(ids) as {who}"
        # Not an id, or an id of a type that does not exist: null for everyone, never an error.
        assert (await client.gql(NODES, {"ids": ["nope", "VHlwbzoxMjM"]}))["nodes"] == [None, None]
    finally:
        await owner.aclose()
        await stranger.aclose()

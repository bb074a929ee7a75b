"""GraphQL documents shared by several tests."""

import os
import re
import tempfile
from pathlib import Path
from typing import Any

CREATE_PROJECT = """
mutation($name: String!, $root: String!, $key: String) {
  createProject(input: {name: $name, workspaceRoot: $root, clientMutationId: $key}) {
    project { id name workspaceRoot }
    userErrors { code message field }
  }
}"""

CREATE_THREAD = """
mutation($projectId: ID!, $title: String, $key: String) {
  createThread(input: {projectId: $projectId, title: $title, clientMutationId: $key}) {
    thread { id title status latestSequence providerInstanceId queueHeld archivedAt }
    userErrors { code message field }
    clientMutationId
  }
}"""

THREADS_PAGE = """
query($projectId: ID!, $first: Int, $after: String) {
  threads(projectId: $projectId, first: $first, after: $after) {
    totalCount
    pageInfo { hasNextPage hasPreviousPage startCursor endCursor }
    edges { cursor node {
      id title status latestSequence queueHeld
      project { id name }
      activeRun { id status }
      runs(last: 3) { totalCount edges { node { id ordinal status attempts { id } } } }
      messages(first: 3) { edges { node { id text } } }
      queue { id }
      pendingRequests { id }
      lineage { relationship parentThread { id } rootThread { id } }
    } }
  }
}"""


def workspace(parent: Path | None = None, name: str = "ws") -> str:
    """An existing folder for a project's workspace (createProject refuses a missing one).

    Without a parent, a fresh temporary folder: workspace roots of projects may not overlap.
    """
    if parent is None:
        folder = tempfile.mkdtemp(prefix="threadloom-ws-")
        os.chmod(folder, 0o711)  # made 0700: within reach of the agent user (docs/deploy.md, "The agent user")
        return folder
    path = parent / name
    path.mkdir(parents=True, exist_ok=True)
    return str(path)


async def make_project(client, name: str = "Demo", root: str | None = None) -> str:  # type: ignore[no-untyped-def]
    data = await client.gql(CREATE_PROJECT, {"name": name, "root": root or workspace()})
    assert data["createProject"]["userErrors"] == []
    return data["createProject"]["project"]["id"]  # type: ignore[no-any-return]


async def make_thread(client, project_id: str, title: str | None = "T", key: str | None = None) -> dict:  # type: ignore[no-untyped-def,type-arg]
    data = await client.gql(CREATE_THREAD, {"projectId": project_id, "title": title, "key": key})
    assert data["createThread"]["userErrors"] == []
    return data["createThread"]["thread"]  # type: ignore[no-any-return]


def statements(headers: Any) -> int:
    """The SQL statements the server ran for a request (its `Server-Timing` header)."""
    match = re.search(r'desc="(\d+) statements"', headers["server-timing"])
    assert match, headers
    return int(match.group(1))


async def threads_sharing_a_runtime(client, root: Path, instance: str) -> list[str]:  # type: ignore[no-untyped-def]
    """Ids of two new threads ("a", "b") of one project in `root` on `instance`: they share its runtime."""
    data = await client.gql(CREATE_PROJECT, {"name": "shared", "root": str(root)})
    threads = []
    for title in ("a", "b"):
        made = await client.gql(
            """mutation($p: ID!, $i: String!, $title: String!) {
                 createThread(input: {projectId: $p, providerInstanceId: $i, title: $title}) {
                   thread { id } userErrors { code message } } }""",
            {"p": data["createProject"]["project"]["id"], "i": instance, "title": title},
        )
        assert made["createThread"]["userErrors"] == []
        threads.append(made["createThread"]["thread"]["id"])
    return threads

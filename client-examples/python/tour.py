"""A small Threadloom client: create a project and a thread, then page through threads.

Uses only httpx. Set THREADLOOM_URL (the server's base URL, default http://127.0.0.1:8000) and THREADLOOM_TOKEN.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Any

import httpx

URL = os.environ.get("THREADLOOM_URL", "http://127.0.0.1:8000").rstrip("/") + "/graphql"


def gql(client: httpx.Client, query: str, variables: dict[str, Any] | None = None) -> dict[str, Any]:
    response = client.post(URL, json={"query": query, "variables": variables or {}})
    response.raise_for_status()
    body = response.json()
    if body.get("errors"):
        raise RuntimeError(body["errors"])
    return body["data"]  # type: ignore[no-any-return]


def main() -> int:
    token = os.environ.get("THREADLOOM_TOKEN")
    if not token:
        print("set THREADLOOM_TOKEN to the token `threadloom serve` printed", file=sys.stderr)
        return 2
    with httpx.Client(headers={"authorization": f"Bearer {token}"}, timeout=30) as client:
        created = gql(
            client,
            """mutation($key: String!) { createProject(input: {name: "Example", workspaceRoot: "/tmp/example",
                 clientMutationId: $key}) { project { id } userErrors { code message } } }""",
            {"key": str(uuid.uuid4())},
        )["createProject"]
        if created["userErrors"]:
            print(created["userErrors"], file=sys.stderr)
            return 1
        project_id = created["project"]["id"]
        for n in range(3):
            key = str(uuid.uuid4())  # reuse the same key when retrying this request
            gql(
                client,
                """mutation($p: ID!, $t: String!, $key: String!) { createThread(input: {projectId: $p, title: $t,
                     clientMutationId: $key}) { thread { id } userErrors { code message } } }""",
                {"p": project_id, "t": f"thread {n}", "key": key},
            )
        after = None
        while True:
            page = gql(
                client,
                """query($p: ID!, $after: String) { threads(projectId: $p, first: 2, after: $after) {
                     pageInfo { hasNextPage endCursor } edges { node { id title status } } } }""",
                {"p": project_id, "after": after},
            )["threads"]
            for edge in page["edges"]:
                print(edge["node"]["title"], edge["node"]["status"])
            if not page["pageInfo"]["hasNextPage"]:
                return 0
            after = page["pageInfo"]["endCursor"]


if __name__ == "__main__":
    raise SystemExit(main())

"""A small Threadloom client: create a project and threads, page through them, then clean up.

Uses only httpx. Set THREADLOOM_URL (the server's base URL, default http://127.0.0.1:8000) and THREADLOOM_TOKEN.
The token must be an admin token for all projects: the tour creates its own project, in a fresh temporary
folder, and archives it at the end.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
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


def ok(payload: dict[str, Any]) -> dict[str, Any]:
    """A mutation's payload, or an error naming its userErrors (the server changed nothing)."""
    if payload["userErrors"]:
        raise RuntimeError(payload["userErrors"])
    return payload


def tour(client: httpx.Client, folder: str) -> None:
    # A fresh folder of its own: no two projects may share a workspace root (WORKSPACE_OVERLAPS).
    project_id = ok(
        gql(
            client,
            """mutation($root: String!, $key: String!) { createProject(input: {name: "Tour", workspaceRoot: $root,
                 clientMutationId: $key}) { project { id } userErrors { code message } } }""",
            {"root": folder, "key": str(uuid.uuid4())},
        )["createProject"]
    )["project"]["id"]
    print(f"created project {project_id} in {folder}")
    try:
        for n in range(3):
            key = str(uuid.uuid4())  # reuse the same key when retrying this request
            ok(
                gql(
                    client,
                    """mutation($p: ID!, $t: String!, $key: String!) { createThread(input: {projectId: $p,
                         title: $t, clientMutationId: $key}) { thread { id } userErrors { code message } } }""",
                    {"p": project_id, "t": f"thread {n}", "key": key},
                )["createThread"]
            )
        after = None
        seen = 0
        while True:
            page = gql(
                client,
                """query($p: ID!, $after: String) { threads(projectId: $p, first: 2, after: $after) {
                     pageInfo { hasNextPage endCursor } edges { node { id title status } } } }""",
                {"p": project_id, "after": after},
            )["threads"]
            for edge in page["edges"]:
                print(edge["node"]["title"], edge["node"]["status"])
                seen += 1
            if not page["pageInfo"]["hasNextPage"]:
                break
            after = page["pageInfo"]["endCursor"]
        if seen != 3:
            raise RuntimeError(f"paged through {seen} threads, not 3")
    finally:
        # Clean up: the project leaves `projects` and takes no more runs (its threads stay readable).
        ok(
            gql(
                client,
                """mutation($p: ID!) { archiveProject(input: {projectId: $p}) {
                     project { archivedAt } userErrors { code message } } }""",
                {"p": project_id},
            )["archiveProject"]
        )
        print(f"archived project {project_id}")


def main() -> int:
    token = os.environ.get("THREADLOOM_TOKEN")
    if not token:
        print("set THREADLOOM_TOKEN to the token `threadloom serve` printed", file=sys.stderr)
        return 2
    folder = tempfile.mkdtemp(prefix="threadloom-tour-")
    try:
        with httpx.Client(headers={"authorization": f"Bearer {token}"}, timeout=30) as client:
            tour(client, folder)
    except Exception as error:  # a failed step is the tour's answer
        print(f"FAILED: {error!r}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    print("the tour worked")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

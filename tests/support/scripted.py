"""A thread on a scripted-agent instance, driven through the real API (shared by the fork and rollback tests)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.server import Client

CREATE_THREAD = """mutation($p: ID!, $i: String!) { createThread(input: {projectId: $p, providerInstanceId: $i}) {
  thread { id } userErrors { code } } }"""
SEND_ON = """mutation($t: ID!, $text: String!, $i: String) {
  sendMessage(input: {threadId: $t, text: $text, providerInstanceId: $i}) { run { id } userErrors { code } } }"""
REPLIES = """query($t: ID!) { thread(id: $t) {
  messages(first: 100) { edges { node { role text run { id } } } } } }"""


class ScriptedThread:
    def __init__(self, client: Client, thread_id: str, workspace: Path) -> None:
        self.client = client
        self.id = thread_id
        self.workspace = workspace

    @classmethod
    async def create(cls, client: Client, workspace: Path, instance: str = "scripted") -> Any:
        """A new project over `workspace` (it must exist) with one thread on `instance`."""
        name = f"p-{workspace.name}-{instance}"
        project = await client.gql(CREATE_PROJECT, {"name": name, "root": str(workspace)})
        assert project["createProject"]["userErrors"] == [], project
        created = await client.gql(CREATE_THREAD, {"p": project["createProject"]["project"]["id"], "i": instance})
        assert created["createThread"]["userErrors"] == [], created
        return cls(client, created["createThread"]["thread"]["id"], workspace)

    async def run_on(self, instance: str, text: str) -> dict[str, Any]:
        """Send `text` to `instance` (switching the thread to it) and wait for its run to complete."""
        sent = (await self.client.gql(SEND_ON, {"t": self.id, "text": text, "i": instance}))["sendMessage"]
        assert sent["userErrors"] == [], sent
        done = await finished(self.client, sent["run"]["id"])
        assert done["status"] == "COMPLETED", done
        return done

    async def run(self, text: str) -> dict[str, Any]:
        """Send `text` and wait for its run to complete."""
        sent = await send(self.client, self.id, text)
        assert sent["userErrors"] == [], sent
        done = await finished(self.client, sent["run"]["id"])
        assert done["status"] == "COMPLETED", done
        return done

    async def recall(self) -> list[str]:
        """What the agent's conversation holds (`@recall`), minus the `@recall` asking for it."""
        done = await self.run("@recall")
        data = await self.client.gql(REPLIES, {"t": self.id})
        texts = [
            e["node"]["text"]
            for e in data["thread"]["messages"]["edges"]
            if e["node"]["role"] == "ASSISTANT" and e["node"]["run"]["id"] == done["id"]
        ]
        lines = "".join(texts).split("\n")
        assert lines[-1] == "user: @recall", lines
        return lines[:-1]

"""A merge-back's delta reaches the real Codex and Claude Code CLIs as context of its own (fake model server).

A thread on one CLI, a fork from run 1 that does work of its own, `mergeBack`; the source's next message is
sent to the model with the fork's delta as a part of its own in front of the user's words: exactly the text
the API records on the transfer's handoff (DELIVERED, with that run), while the conversation shows the user's
message unchanged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import cli_api
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.handoffs import MODEL_PATH, first_request, turn_parts, user_message
from tests.support.runs import finished
from tests.support.server import Client

THREAD = """mutation($p: ID!, $i: String!) {
  createThread(input: {projectId: $p, providerInstanceId: $i, runtimeMode: "workspace_write", title: "t"}) {
    thread { id } userErrors { code message } } }"""
SEND = """mutation($t: ID!, $text: String!) { sendMessage(input: {threadId: $t, text: $text}) {
  run { id } userErrors { code message field } } }"""
FORK = """mutation($r: ID!) { forkThread(input: {source: {run: $r}}) { thread { id } userErrors { code message } } }"""
MERGE = """mutation($f: ID!) { mergeBack(input: {forkThreadId: $f}) { transfer { id status } userErrors { code } } }"""
TRANSFER = """query($id: ID!) { node(id: $id) { ... on ContextTransfer {
  status targetRun { id } handoff { text status targetRun { id } } } } }"""


@pytest.fixture
async def api(database_url: str, tmp_path: Path, fake: FakeModel) -> AsyncIterator[Client]:
    async with cli_api(database_url, tmp_path, fake) as client:
        yield client


async def _done(client: Client, thread: str, text: str) -> dict[str, Any]:
    sent = (await client.gql(SEND, {"t": thread, "text": text}))["sendMessage"]
    assert sent["userErrors"] == [], sent
    done = await finished(client, sent["run"]["id"], within=90)
    assert done["status"] == "COMPLETED", done
    return done


@pytest.mark.parametrize("provider", ["codex", "claude"])
async def test_a_merge_back_delta_reaches_the_cli_as_context_of_its_own(
    api: Client, fake: FakeModel, workspace: Path, provider: str
) -> None:
    project = (await api.gql(CREATE_PROJECT, {"name": provider, "root": str(workspace)}))["createProject"]
    thread = (await api.gql(THREAD, {"p": project["project"]["id"], "i": provider}))["createThread"]["thread"]["id"]
    first = await _done(api, thread, "alpha-one words")
    fork = (await api.gql(FORK, {"r": first["id"]}))["forkThread"]
    assert fork["userErrors"] == [], fork
    await _done(api, fork["thread"]["id"], "golf-fork words")
    merged = (await api.gql(MERGE, {"f": fork["thread"]["id"]}))["mergeBack"]
    assert merged["userErrors"] == [] and merged["transfer"]["status"] == "PENDING", merged

    seen = len(fake.bodies(MODEL_PATH[provider]))
    back = await _done(api, thread, "hotel-back words")
    request = first_request(provider, fake.bodies(MODEL_PATH[provider])[seen:], "hotel-back words")
    parts = turn_parts(provider, request, "hotel-back words")

    transfer = (await api.gql(TRANSFER, {"id": merged["transfer"]["id"]}))["node"]
    assert transfer["status"] == "CONSUMED" and transfer["targetRun"]["id"] == back["id"], transfer
    handoff = transfer["handoff"]
    assert handoff["status"] == "DELIVERED" and handoff["targetRun"]["id"] == back["id"], handoff
    assert parts == [handoff["text"], "hotel-back words"], parts  # its own part, exactly as recorded
    assert "golf-fork words" in handoff["text"]  # the fork's work
    assert await user_message(api, back["id"]) == "hotel-back words"

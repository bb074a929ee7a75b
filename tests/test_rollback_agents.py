"""rollbackToRun with the real Codex and Claude Code CLIs against the fake model server.

After two runs, a rollback to run 1: the model's next request no longer carries run 2, and the files are run 1's.
Codex rolls its thread back natively; Claude Code forks its session at run 1's last message.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.agents import MODEL_PATH, cli_api
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.server import Client

THREAD = """mutation($p: ID!, $i: String!) {
  createThread(input: {projectId: $p, providerInstanceId: $i, runtimeMode: "workspace_write", title: "t"}) {
    thread { id } userErrors { code message } } }"""
ROLLBACK = """mutation($t: ID!) { rollbackToRun(input: {threadId: $t, runOrdinal: 1}) {
  rolledBackRuns { ordinal status } userErrors { code message } } }"""


@pytest.fixture
async def api(database_url: str, tmp_path: Path, fake: FakeModel) -> AsyncIterator[Client]:
    async with cli_api(database_url, tmp_path, fake) as client:
        yield client


async def _done(client: Client, thread: str, text: str) -> None:
    sent = await send(client, thread, text)
    assert sent["userErrors"] == [], sent
    assert (await finished(client, sent["run"]["id"], within=90))["status"] == "COMPLETED"


@pytest.mark.parametrize("provider", ["codex", "claude"])
async def test_rollback_to_run_one_forgets_run_two(api: Client, fake: FakeModel, tmp_path: Path, provider: str) -> None:
    workspace = tmp_path / f"ws-{provider}"
    workspace.mkdir()
    project = (await api.gql(CREATE_PROJECT, {"name": provider, "root": str(workspace)}))["createProject"]
    made = (await api.gql(THREAD, {"p": project["project"]["id"], "i": provider}))["createThread"]
    thread = made["thread"]["id"]
    await _done(api, thread, "WRITE: one.txt alpha-file")
    await _done(api, thread, "WRITE: two.txt zulu-marker")
    assert (workspace / "two.txt").exists()

    answer = (await api.gql(ROLLBACK, {"t": thread}))["rollbackToRun"]
    assert answer["userErrors"] == [], answer
    assert answer["rolledBackRuns"] == [{"ordinal": 2, "status": "ROLLED_BACK"}]
    assert (workspace / "one.txt").exists() and not (workspace / "two.txt").exists()

    seen = len(fake.bodies(MODEL_PATH[provider]))
    await _done(api, thread, "third words")
    later = fake.bodies(MODEL_PATH[provider])[seen:]
    assert later, "the third run reached the model"
    assert "alpha-file" in str(later[0])  # run 1 is still in the conversation
    assert not any("zulu-marker" in str(body) for body in later)  # run 2 is not

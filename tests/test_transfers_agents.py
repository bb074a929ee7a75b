"""Forks and provider switches with the real Codex and Claude Code CLIs against the fake model server.

After two runs, a fork from run 1: the model's first request on the fork carries run 1 and not run 2
(a native fork, the provider's own thread cut after run 1's turn). A fork whose first message picks the
other CLI resolves portably: that request carries the handoff built from run 1 and not run 2. A thread
that goes Codex → Claude → Codex gives Claude a full summary and Codex, back on its own thread, only the
delta of Claude's run.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import MODEL_PATH, cli_api
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished
from tests.support.server import Client

THREAD = """mutation($p: ID!, $i: String!) {
  createThread(input: {projectId: $p, providerInstanceId: $i, runtimeMode: "workspace_write", title: "t"}) {
    thread { id } userErrors { code message } } }"""
FORK = """mutation($r: ID!) { forkThread(input: {source: {run: $r}, workspace: SHARED}) {
  thread { id } transfer { id } userErrors { code message } } }"""
SEND_ON = """mutation($t: ID!, $text: String!, $i: String) {
  sendMessage(input: {threadId: $t, text: $text, providerInstanceId: $i}) {
    run { id } userErrors { code message field } } }"""
TRANSFER = """query($id: ID!) { node(id: $id) { ... on ContextTransfer {
  status targetRun { providerThread { providerInstanceId } } handoff { text } } } }"""


@pytest.fixture
async def api(database_url: str, tmp_path: Path, fake: FakeModel) -> AsyncIterator[Client]:
    async with cli_api(database_url, tmp_path, fake) as client:
        yield client


async def _done(client: Client, thread: str, text: str, provider: str | None = None) -> dict[str, Any]:
    sent = (await client.gql(SEND_ON, {"t": thread, "text": text, "i": provider}))["sendMessage"]
    assert sent["userErrors"] == [], sent
    done = await finished(client, sent["run"]["id"], within=90)
    assert done["status"] == "COMPLETED", done
    return done


async def _thread_with_two_runs(api: Client, workspace: Path, provider: str) -> tuple[str, dict[str, Any]]:
    project = (await api.gql(CREATE_PROJECT, {"name": provider, "root": str(workspace)}))["createProject"]
    made = (await api.gql(THREAD, {"p": project["project"]["id"], "i": provider}))["createThread"]
    thread = made["thread"]["id"]
    first = await _done(api, thread, "alpha-words for run one")
    await _done(api, thread, "zulu-marker for run two")
    return thread, first


@pytest.mark.parametrize("provider", ["codex", "claude"])
async def test_a_native_fork_carries_the_history_up_to_its_point(
    api: Client, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    (tmp_path / f"ws-{provider}").mkdir()
    _, first = await _thread_with_two_runs(api, tmp_path / f"ws-{provider}", provider)
    fork = (await api.gql(FORK, {"r": first["id"]}))["forkThread"]
    assert fork["userErrors"] == [], fork

    seen = len(fake.bodies(MODEL_PATH[provider]))
    await _done(api, fork["thread"]["id"], "on the fork")
    later = fake.bodies(MODEL_PATH[provider])[seen:]
    assert later, "the fork's run reached the model"
    assert "alpha-words" in str(later[0]) and "on the fork" in str(later[0])
    assert not any("zulu-marker" in str(body) for body in later)
    transfer = (await api.gql(TRANSFER, {"id": fork["transfer"]["id"]}))["node"]
    assert transfer["status"] == "RESOLVED_NATIVE" and transfer["handoff"] is None


async def test_a_fork_onto_the_other_cli_resolves_portably(api: Client, fake: FakeModel, tmp_path: Path) -> None:
    (tmp_path / "ws").mkdir()
    _, first = await _thread_with_two_runs(api, tmp_path / "ws", "codex")
    fork = (await api.gql(FORK, {"r": first["id"]}))["forkThread"]
    assert fork["userErrors"] == [], fork

    seen = len(fake.bodies(MODEL_PATH["claude"]))
    await _done(api, fork["thread"]["id"], "on the claude fork", provider="claude")
    later = [b for b in fake.bodies(MODEL_PATH["claude"])[seen:] if b.get("tools")]
    assert later, "the fork's run reached Claude's model"
    assert "alpha-words" in str(later[0]) and "on the claude fork" in str(later[0])
    assert not any("zulu-marker" in str(body) for body in later)
    transfer = (await api.gql(TRANSFER, {"id": fork["transfer"]["id"]}))["node"]
    assert transfer["status"] == "RESOLVED_PORTABLE"
    assert transfer["targetRun"]["providerThread"]["providerInstanceId"] == "claude"
    assert transfer["handoff"]["text"].splitlines()[0] in str(later[0])


async def test_codex_then_claude_then_codex_hands_off_full_then_delta(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    (tmp_path / "ws").mkdir()
    thread, _ = await _thread_with_two_runs(api, tmp_path / "ws", "codex")

    seen = len(fake.bodies(MODEL_PATH["claude"]))
    await _done(api, thread, "claude-turn words", provider="claude")
    on_claude = [b for b in fake.bodies(MODEL_PATH["claude"])[seen:] if b.get("tools")]
    assert on_claude and "full_thread_summary" in str(on_claude[0])
    assert "alpha-words" in str(on_claude[0]) and "zulu-marker" in str(on_claude[0])  # both Codex runs

    seen = len(fake.bodies(MODEL_PATH["codex"]))
    await _done(api, thread, "back on codex", provider="codex")
    on_codex = fake.bodies(MODEL_PATH["codex"])[seen:]
    assert on_codex, "the run reached Codex's model"
    first = str(on_codex[0])
    assert "delta_since_target_last_seen" in first and "claude-turn words" in first  # only Claude's run
    assert "alpha-words" in first and "zulu-marker" in first  # Codex's own thread still holds its runs
    texts = [c.get("text", "") for item in on_codex[0]["input"] for c in item.get("content") or []]
    [delta] = [text for text in texts if "delta_since_target_last_seen" in text]
    runs = [line for line in delta.splitlines() if line.startswith("## Run ")]  # its sections, one per run
    assert len(runs) == 1 and runs[0].startswith("## Run 3 ") and "claude-turn words" in delta

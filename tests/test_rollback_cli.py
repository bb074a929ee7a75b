"""rollbackToRun after a provider switch, and undoRollback, with the real Codex and Claude Code CLIs against the
fake model server: a rollback that neither CLI can carry out natively works, by a restart from context.

Runs 1-2 on one CLI, run 3 on the other, `switchProvider` back, `rollbackToRun(1)`. The provider thread that
ran run 3 holds nothing from before run 1's end that it may keep (its first turn carried a summary of runs
1-2), so it is replaced by a new one whose first turn carries the conversation up to run 1; the first CLI's
provider thread ran the undone run 2, so it is retired. Both CLIs then get run 1 as a handoff: an input of its
own in front of the user's words, in the model request exactly as the API records it, and never run 2 or 3.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import cli_api
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.handoffs import (
    ACTIVITIES,
    HANDOFF,
    MODEL_PATH,
    delivered_with,
    first_request,
    turn_parts,
    user_message,
)
from tests.support.runs import finished
from tests.support.server import Client
from threadloom.api import ids

THREAD = """mutation($p: ID!, $i: String!) {
  createThread(input: {projectId: $p, providerInstanceId: $i, runtimeMode: "workspace_write", title: "t"}) {
    thread { id } userErrors { code message } } }"""
SEND_ON = """mutation($t: ID!, $text: String!, $i: String) {
  sendMessage(input: {threadId: $t, text: $text, providerInstanceId: $i}) {
    run { id } userErrors { code message field } } }"""
SWITCH = """mutation($t: ID!, $i: String!) {
  switchProvider(input: {threadId: $t, providerInstanceId: $i}) { userErrors { code message } } }"""
ROLLBACK = """mutation($t: ID!) { rollbackToRun(input: {threadId: $t, runOrdinal: 1}) {
  rolledBackRuns { ordinal status } userErrors { code message } } }"""
UNDO = """mutation($t: ID!) { undoRollback(input: {threadId: $t}) { userErrors { code message } } }"""
OTHER = {"codex": "claude", "claude": "codex"}
UNDONE = ("bravo-two", "charlie-three")


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


async def _switched_then_rolled_back(api: Client, workspace: Path, first: str) -> str:
    """Runs 1-2 on `first`, run 3 on the other CLI, a switch back to `first`, then `rollbackToRun(1)`."""
    project = (await api.gql(CREATE_PROJECT, {"name": first, "root": str(workspace)}))["createProject"]
    made = (await api.gql(THREAD, {"p": project["project"]["id"], "i": first}))["createThread"]
    thread = str(made["thread"]["id"])
    await _done(api, thread, "alpha-one words", first)
    await _done(api, thread, "bravo-two words", first)
    await _done(api, thread, "charlie-three words", OTHER[first])
    assert (await api.gql(SWITCH, {"t": thread, "i": first}))["switchProvider"]["userErrors"] == []

    answer = (await api.gql(ROLLBACK, {"t": thread}))["rollbackToRun"]
    assert answer["userErrors"] == [], answer
    assert answer["rolledBackRuns"] == [
        {"ordinal": 2, "status": "ROLLED_BACK"},
        {"ordinal": 3, "status": "ROLLED_BACK"},
    ]
    return thread


async def _handed(
    api: Client, fake: FakeModel, thread: str, provider: str, text: str, seen: int
) -> tuple[list[str], list[dict[str, Any]], list[dict[str, Any]]]:
    """Send `text` on `provider`: the parts of its user message in the first model request of the turn, the
    handoffs the API says went with it, and every request of the turn."""
    done = await _done(api, thread, text, provider)
    bodies = fake.bodies(MODEL_PATH[provider])[seen:]
    parts = turn_parts(provider, first_request(provider, bodies, text), text)
    handoffs = await delivered_with(api, thread, done["id"])
    assert await user_message(api, done["id"]) == text  # the conversation shows the user's own words
    for handoff in handoffs:
        assert handoff["status"] == "DELIVERED" and handoff["targetRun"]["id"] == done["id"], handoff
    # The handoff went as a part of its own in front of the message, exactly as recorded.
    assert parts == ["\n".join(h["text"] for h in handoffs), text], parts
    return parts, handoffs, bodies


@pytest.mark.parametrize("first", ["codex", "claude"])
async def test_a_rollback_after_a_switch_restarts_both_clis_from_run_one(
    api: Client, fake: FakeModel, workspace: Path, first: str
) -> None:
    thread = await _switched_then_rolled_back(api, workspace, first)

    # Back on the first CLI: its provider thread that ran run 2 is retired, a new one is told of run 1.
    seen = len(fake.bodies(MODEL_PATH[first]))
    parts, handoffs, bodies = await _handed(api, fake, thread, first, "delta-four words", seen)
    assert "alpha-one words" in parts[0], parts
    assert [h["coveredRunOrdinals"] for h in handoffs] == [[1]], handoffs
    assert not any(word in str(body) for body in bodies for word in UNDONE), bodies

    # On the other CLI, the replacement of the provider thread that ran run 3 gets the restart from context
    # (the conversation up to run 1), with the run it missed since.
    other = OTHER[first]
    seen = len(fake.bodies(MODEL_PATH[other]))
    parts, handoffs, bodies = await _handed(api, fake, thread, other, "echo-five words", seen)
    assert "alpha-one words" in parts[0] and "delta-four words" in parts[0], parts
    assert sorted(o for h in handoffs for o in h["coveredRunOrdinals"]) == [1, 4], handoffs
    assert not any(word in str(body) for body in bodies for word in UNDONE), bodies


@pytest.mark.parametrize("first", ["codex", "claude"])
async def test_undo_rollback_after_a_restart_from_context_brings_the_undone_runs_back(
    api: Client, fake: FakeModel, workspace: Path, first: str
) -> None:
    thread = await _switched_then_rolled_back(api, workspace, first)
    [step] = (await _rollback_record(api, thread))["providerThreads"]
    assert step["handoffId"] is not None  # the replacement's restart from context, pending until its next turn
    restart = step["handoffId"]  # a global id, as every id in a payload
    assert (ids.decode(restart) or ("",))[0] == "ContextHandoff"
    undone = (await api.gql(UNDO, {"t": thread}))["undoRollback"]
    assert undone["userErrors"] == [], undone

    seen = len(fake.bodies(MODEL_PATH[first]))
    parts, _, bodies = await _handed(api, fake, thread, first, "foxtrot-four words", seen)
    for word in ("alpha-one", *UNDONE):  # runs 2 and 3 are part of the conversation again
        assert word in str(bodies[0]), (word, parts)
    # The replacement the undo closed never took its turn: its restart from context was never sent.
    assert (await api.gql(HANDOFF, {"id": restart}))["node"]["status"] == "PENDING"


async def _rollback_record(api: Client, thread: str) -> dict[str, Any]:
    data = await api.gql(ACTIVITIES, {"t": thread})
    nodes = [e["node"] for e in data["thread"]["activities"]["edges"]]
    [record] = [n["payload"] for n in nodes if n["kind"] == "rollback.completed"]
    return record  # type: ignore[no-any-return]

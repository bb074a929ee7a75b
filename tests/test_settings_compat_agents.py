"""Model and runtime mode changes with the real Codex and Claude Code CLIs against the fake model server.

Both drivers change the model on a live provider thread (Codex: `turn/start`'s `model`; Claude Code: its
process restarted with `--resume` on the same session and the new `--model`), so after `switchProvider` to the
same instance with another model the next run stays on the same provider thread: the model endpoint sees the
new model name in that run's request together with the earlier run's history, and no handoff is made.
Neither changes the runtime mode in place: after `setRuntimeMode` the next run is on a new provider thread whose
first model request carries the full summary that the run's transfer records.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import MODEL_PATH, cli_providers_env
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished
from tests.support.server import Client

THREAD = """mutation($p: ID!, $i: String!) {
  createThread(input: {projectId: $p, providerInstanceId: $i, runtimeMode: "workspace_write", title: "t"}) {
    thread { id } userErrors { code message } } }"""
SEND = """mutation($t: ID!, $text: String!, $m: String) {
  sendMessage(input: {threadId: $t, text: $text, model: $m}) { run { id } userErrors { code message field } } }"""
SWITCH = """mutation($t: ID!, $i: String!, $m: String) {
  switchProvider(input: {threadId: $t, providerInstanceId: $i, model: $m}) {
    thread { model } userErrors { code message field } } }"""
RUN = """query($r: ID!) { run(id: $r) { id model
  providerThread { id status model runtimeMode } contextTransfers { id } } }"""
ACTIVITIES = """query($t: ID!, $r: ID) { thread(id: $t) { activities(runId: $r, first: 100) { nodes { kind } } } }"""
NEW_MODEL = "fake-model-two"


SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)


@pytest.fixture(scope="module")
def fake(module_fake: FakeModel) -> FakeModel:
    """conftest's module_fake, the model of the module's server; each test reads only the requests made after
    it began (`seen`) that carry its own run's words."""
    return module_fake


@pytest.fixture(scope="module")
def module_server_env(fake: FakeModel, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return cli_providers_env(tmp_path_factory.mktemp("providers"), fake)


async def _done(client: Client, thread: str, text: str, model: str | None = None) -> dict[str, Any]:
    sent = (await client.gql(SEND, {"t": thread, "text": text, "m": model}))["sendMessage"]
    assert sent["userErrors"] == [], sent
    done = await finished(client, sent["run"]["id"], within=90)
    assert done["status"] == "COMPLETED", done
    return (await client.gql(RUN, {"r": done["id"]}))["run"]  # type: ignore[no-any-return]


def turn_requests(fake: FakeModel, provider: str, since: int, marker: str) -> list[dict[str, Any]]:
    """The model requests of one turn: those after `since` that carry the turn's message (Claude Code also
    makes auxiliary requests, e.g. for a title, which do not)."""
    return [
        body
        for body in fake.bodies(MODEL_PATH[provider])[since:]
        if marker in str(body.get("input") or body.get("messages"))
    ]


def folder(path: Path) -> Path:
    path.mkdir()
    return path


async def _thread(api: Client, workspace: Path, provider: str) -> str:
    project = (await api.gql(CREATE_PROJECT, {"name": provider, "root": str(workspace)}))["createProject"]
    made = (await api.gql(THREAD, {"p": project["project"]["id"], "i": provider}))["createThread"]
    assert made["userErrors"] == [], made
    return str(made["thread"]["id"])


@pytest.mark.parametrize("provider", ["codex", "claude"])
async def test_a_model_change_is_applied_in_place_on_the_same_provider_thread(
    api: Client, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    thread = await _thread(api, folder(tmp_path / f"ws-{provider}"), provider)
    seen = len(fake.bodies(MODEL_PATH[provider]))
    first = await _done(api, thread, "alpha-words for run one")
    [before] = turn_requests(fake, provider, seen, "alpha-words")[:1]
    assert before["model"] != NEW_MODEL

    moved = (await api.gql(SWITCH, {"t": thread, "i": provider, "m": NEW_MODEL}))["switchProvider"]
    assert moved["userErrors"] == [] and moved["thread"]["model"] == NEW_MODEL
    seen = len(fake.bodies(MODEL_PATH[provider]))
    second = await _done(api, thread, "zulu-marker for run two")

    later = turn_requests(fake, provider, seen, "zulu-marker")
    assert later, "the second run reached the model"
    assert {body["model"] for body in later} == {NEW_MODEL}  # the new model, from the first request on
    assert "alpha-words" in str(later[0])  # run 1 is in the provider's own history, not in a handoff
    assert "full_thread_summary" not in str(later[0])
    assert second["providerThread"]["id"] == first["providerThread"]["id"]
    assert (second["providerThread"]["model"], second["providerThread"]["runtimeMode"]) == (
        NEW_MODEL,
        "workspace_write",
    )
    assert first["providerThread"]["model"] is None  # it ran with the instance's default before
    assert second["contextTransfers"] == []
    kinds = {
        a["kind"]
        for a in (await api.gql(ACTIVITIES, {"t": thread, "r": second["id"]}))["thread"]["activities"]["nodes"]
    }
    assert "lineage.provider_thread_replaced" not in kinds and "run.completed" in kinds


async def test_a_per_run_model_on_codex_reaches_the_model_and_the_next_run_returns_to_the_threads(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    """sendMessage's `model` holds for its run only: that run's request names it, the next run's names the
    thread's model again, all on one provider thread."""
    thread = await _thread(api, folder(tmp_path / "ws"), "codex")
    seen = len(fake.bodies(MODEL_PATH["codex"]))
    first = await _done(api, thread, "alpha-words for run one")
    [default] = turn_requests(fake, "codex", seen, "alpha-words")
    seen = len(fake.bodies(MODEL_PATH["codex"]))
    second = await _done(api, thread, "zulu-marker for run two", NEW_MODEL)
    [asked] = turn_requests(fake, "codex", seen, "zulu-marker")
    seen = len(fake.bodies(MODEL_PATH["codex"]))
    third = await _done(api, thread, "yankee-marker for run three")
    [back] = turn_requests(fake, "codex", seen, "yankee-marker")
    assert asked["model"] == NEW_MODEL and back["model"] == default["model"] != NEW_MODEL
    assert "zulu-marker" in str(back["input"])
    ids = {r["providerThread"]["id"] for r in (first, second, third)}
    assert len(ids) == 1 and second["contextTransfers"] == [] and third["contextTransfers"] == []


SET_MODE = """mutation($t: ID!, $mode: String!) { setRuntimeMode(input: {threadId: $t, runtimeMode: $mode}) {
  userErrors { code } } }"""
TRANSFERS = (
    """query($r: ID!) { run(id: $r) { contextTransfers { sourcePoint handoff { text coveredRunOrdinals } } } }"""
)


@pytest.mark.parametrize("provider", ["codex", "claude"])
async def test_a_runtime_mode_change_starts_a_new_provider_thread_given_the_conversation(
    api: Client, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    """Neither CLI changes the sandbox of a live thread: the next run is on a new provider thread, and its first
    model request carries the summary of run 1 (which that native thread never ran)."""
    thread = await _thread(api, folder(tmp_path / f"ws-{provider}"), provider)
    first = await _done(api, thread, "alpha-words for run one")
    assert (await api.gql(SET_MODE, {"t": thread, "mode": "read_only"}))["setRuntimeMode"]["userErrors"] == []
    seen = len(fake.bodies(MODEL_PATH[provider]))
    second = await _done(api, thread, "zulu-marker for run two")

    assert second["providerThread"]["id"] != first["providerThread"]["id"]
    assert second["providerThread"]["runtimeMode"] == "read_only"
    [transfer] = (await api.gql(TRANSFERS, {"r": second["id"]}))["run"]["contextTransfers"]
    assert transfer["sourcePoint"]["reason"] == "settings_changed" and transfer["handoff"]["coveredRunOrdinals"] == [1]
    [request] = turn_requests(fake, provider, seen, "zulu-marker")[:1]
    assert "full_thread_summary" in str(request) and "alpha-words" in str(request)
    assert transfer["handoff"]["text"].splitlines()[0] in str(request)  # what was recorded is what was sent

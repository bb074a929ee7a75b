"""Settings changed incompatibly, against a real server and the scripted agent.

The scripted driver changes nothing on a live provider thread (docs/providers.md, "Changing the model or
runtime mode"): a run asking for another model than its provider thread ran with starts a new provider thread
that gets a full summary (`sourcePoint.reason: settings_changed`), the old one is closed, and an activity on
the run says why. What a user sees is asserted: each run's provider thread and the settings it records, the
transfers and their handoff, the activities, and what the agent remembers (`@recall`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.runs import finished
from tests.support.scripted import ScriptedThread
from tests.support.server import Client

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

SEND = """mutation($t: ID!, $text: String!, $m: String) {
  sendMessage(input: {threadId: $t, text: $text, model: $m}) { run { id } userErrors { code message field } } }"""
SWITCH = """mutation($t: ID!, $i: String!, $m: String) {
  switchProvider(input: {threadId: $t, providerInstanceId: $i, model: $m}) {
    thread { id model } userErrors { code message field } } }"""
RUN = """query($r: ID!) { run(id: $r) { id ordinal model
  providerThread { id status model runtimeMode providerInstanceId }
  contextTransfers { type status sourcePoint handoff { text status strategy coveredRunOrdinals } } } }"""
THREAD = """query($t: ID!, $r: ID) { thread(id: $t) {
  providerThreads { id status model runtimeMode }
  activities(runId: $r, first: 100) { nodes { kind summary runId payload } }
  messages(first: 100) { edges { node { role text run { id } } } } } }"""
REPLACED = "lineage.provider_thread_replaced"


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


async def on(api: Client, thread: ScriptedThread, text: str, model: str | None = None) -> dict[str, Any]:
    """Send `text` (asking for `model`, if given), wait for the run to complete; the run as `RUN` reads it."""
    sent = (await api.gql(SEND, {"t": thread.id, "text": text, "m": model}))["sendMessage"]
    assert sent["userErrors"] == [], sent
    assert (await finished(api, sent["run"]["id"]))["status"] == "COMPLETED"
    return (await api.gql(RUN, {"r": sent["run"]["id"]}))["run"]  # type: ignore[no-any-return]


async def recall(api: Client, thread: ScriptedThread, model: str | None = None) -> tuple[list[str], dict[str, Any]]:
    """What the run's agent remembers (`@recall`, minus the `@recall` itself), and the run."""
    run = await on(api, thread, "@recall", model)
    data = (await api.gql(THREAD, {"t": thread.id}))["thread"]
    texts = [
        e["node"]["text"]
        for e in data["messages"]["edges"]
        if e["node"]["role"] == "ASSISTANT" and e["node"]["run"]["id"] == run["id"]
    ]
    lines = "".join(texts).split("\n")
    assert lines[-1] == "user: @recall", lines
    return lines[:-1], run


def shown(handoff: str) -> str:
    """A handoff as `@recall` shows it (one line, escaped)."""
    return "handoff: " + handoff.replace("\\", "\\\\").replace("\n", "\\n")


async def activities(api: Client, thread: ScriptedThread, run_id: str) -> list[dict[str, Any]]:
    data = (await api.gql(THREAD, {"t": thread.id, "r": run_id}))["thread"]
    return data["activities"]["nodes"]  # type: ignore[no-any-return]


async def test_a_model_change_the_scripted_driver_cannot_apply_starts_a_new_provider_thread_with_a_summary(
    api: Client, home: Path
) -> None:
    thread = await ScriptedThread.create(api, home)
    first = await on(api, thread, "@reply one")
    second = await on(api, thread, "@reply two")
    old = first["providerThread"]
    assert second["providerThread"]["id"] == old["id"]
    assert (old["model"], old["runtimeMode"]) == (None, "workspace_write")  # the settings it ran with

    moved = (await api.gql(SWITCH, {"t": thread.id, "i": "scripted", "m": "m2"}))["switchProvider"]
    assert moved["userErrors"] == [] and moved["thread"]["model"] == "m2"
    memory, third = await recall(api, thread)

    new = third["providerThread"]
    assert new["id"] != old["id"]
    assert (new["model"], new["runtimeMode"], new["status"]) == ("m2", "workspace_write", "IDLE")
    [transfer] = third["contextTransfers"]
    handoff = transfer["handoff"]
    assert (transfer["type"], transfer["status"]) == ("PROVIDER_HANDOFF", "CONSUMED")
    assert transfer["sourcePoint"]["reason"] == "settings_changed"
    assert handoff["strategy"] == "FULL_THREAD_SUMMARY" and handoff["coveredRunOrdinals"] == [1, 2]
    assert handoff["status"] == "DELIVERED"
    assert "@reply one" in handoff["text"] and "@reply two" in handoff["text"]
    assert memory == [shown(handoff["text"])]  # the new agent thread knows runs 1-2 only from the summary

    pts = {p["id"]: p for p in (await api.gql(THREAD, {"t": thread.id}))["thread"]["providerThreads"]}
    assert pts[old["id"]]["status"] == "CLOSED"  # superseded: no later run resumes it
    said = [a for a in await activities(api, thread, third["id"]) if a["kind"] == REPLACED]
    assert [a["summary"] for a in said] == [
        "model the default → m2: scripted cannot change this on a live provider thread, so the run starts a new "
        "one with a summary of the conversation"
    ]
    assert said[0]["payload"]["changed"] == ["model"] and said[0]["payload"]["toModel"] == "m2"

    # The same settings again: the new provider thread goes on, with nothing handed off.
    fourth = await on(api, thread, "@reply four")
    assert fourth["providerThread"]["id"] == new["id"] and fourth["contextTransfers"] == []
    assert [a for a in await activities(api, thread, fourth["id"]) if a["kind"] == REPLACED] == []


async def test_unchanged_settings_keep_the_provider_thread_and_its_memory(api: Client, home: Path) -> None:
    """The twin: the same model named again (the thread's own) is no change; the agent remembers natively."""
    thread = await ScriptedThread.create(api, home)
    moved = (await api.gql(SWITCH, {"t": thread.id, "i": "scripted", "m": "m1"}))["switchProvider"]
    assert moved["userErrors"] == []
    first = await on(api, thread, "@reply one")
    memory, second = await recall(api, thread, "m1")  # sendMessage naming the model the thread has
    assert second["providerThread"]["id"] == first["providerThread"]["id"]
    assert second["providerThread"]["model"] == "m1" and second["contextTransfers"] == []
    assert memory == ["user: @reply one"]
    assert [a for a in await activities(api, thread, second["id"]) if a["kind"] == REPLACED] == []


async def test_a_per_run_model_moves_the_thread_to_a_provider_thread_for_that_model_and_back(
    api: Client, home: Path
) -> None:
    """sendMessage's `model` is the run's: each change is one the scripted driver cannot apply, so each new
    setting gets a new provider thread with the whole conversation; runs with the same setting stay together."""
    thread = await ScriptedThread.create(api, home)
    first = await on(api, thread, "@reply one")
    second = await on(api, thread, "@reply two", "m2")
    third = await on(api, thread, "@reply three", "m2")
    memory, fourth = await recall(api, thread)  # back to the thread's model (the default)

    ids = [r["providerThread"]["id"] for r in (first, second, third, fourth)]
    assert ids[1] != ids[0] and ids[2] == ids[1] and ids[3] not in (ids[0], ids[1])
    assert [r["providerThread"]["model"] for r in (first, second, third, fourth)] == [None, "m2", "m2", None]
    assert [t["sourcePoint"]["reason"] for t in second["contextTransfers"]] == ["settings_changed"]
    assert third["contextTransfers"] == []
    [back] = fourth["contextTransfers"]
    assert back["sourcePoint"]["reason"] == "settings_changed"
    assert back["handoff"]["coveredRunOrdinals"] == [1, 2, 3]
    assert memory == [shown(back["handoff"]["text"])]
    pts = {p["id"]: p["status"] for p in (await api.gql(THREAD, {"t": thread.id}))["thread"]["providerThreads"]}
    assert (pts[ids[0]], pts[ids[1]], pts[ids[3]]) == ("CLOSED", "CLOSED", "IDLE")


SET_MODE = """mutation($t: ID!, $mode: String!) { setRuntimeMode(input: {threadId: $t, runtimeMode: $mode}) {
  thread { id runtimeMode } userErrors { code field } } }"""


async def test_a_runtime_mode_change_starts_a_new_provider_thread_that_runs_in_the_new_mode(
    api: Client, home: Path
) -> None:
    thread = await ScriptedThread.create(api, home)
    first = await on(api, thread, "@write one.txt first")
    assert (home / "one.txt").read_text() == "first"  # workspace_write: the write happens

    changed = (await api.gql(SET_MODE, {"t": thread.id, "mode": "read_only"}))["setRuntimeMode"]
    assert changed["userErrors"] == [] and changed["thread"]["runtimeMode"] == "read_only"
    memory, second = await recall(api, thread)
    new = second["providerThread"]
    assert new["id"] != first["providerThread"]["id"]
    assert (new["model"], new["runtimeMode"]) == (None, "read_only")
    [transfer] = second["contextTransfers"]
    assert transfer["sourcePoint"]["reason"] == "settings_changed"
    assert transfer["handoff"]["coveredRunOrdinals"] == [1] and "@write one.txt first" in transfer["handoff"]["text"]
    assert memory == [shown(transfer["handoff"]["text"])]
    said = [a for a in await activities(api, thread, second["id"]) if a["kind"] == REPLACED]
    assert [a["summary"].split(":")[0] for a in said] == ["runtime mode workspace_write → read_only"]

    # The twin of run 1's write, on the new provider thread: refused, as read_only says.
    third = await on(api, thread, "@write two.txt second")
    assert third["providerThread"]["id"] == new["id"] and third["contextTransfers"] == []
    assert not (home / "two.txt").exists()


@pytest.mark.parametrize(("mode", "code"), [("full_access", "RUNTIME_MODE_NOT_ALLOWED"), ("yolo", "INVALID_INPUT")])
async def test_setruntimemode_refuses_what_createthread_refuses_and_changes_nothing(
    api: Client, home: Path, mode: str, code: str
) -> None:
    thread = await ScriptedThread.create(api, home)  # the default scripted instance does not allow full_access
    refused = (await api.gql(SET_MODE, {"t": thread.id, "mode": mode}))["setRuntimeMode"]
    assert [(e["code"], e["field"]) for e in refused["userErrors"]] == [(code, "runtimeMode")]
    after = await api.gql("query($t: ID!) { thread(id: $t) { runtimeMode } }", {"t": thread.id})
    assert after["thread"]["runtimeMode"] == "workspace_write"

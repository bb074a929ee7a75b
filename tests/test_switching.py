"""Provider switching against a real server and two scripted-agent instances (`a` and `b`).

What a user sees is asserted: which provider thread each run used, the PROVIDER_HANDOFF transfers and their
handoff text, and what each agent remembers (`@recall` lists every user message and handoff it received).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

PROVIDERS = """
[instances.a]
driver = "scripted"

[instances.b]
driver = "scripted"

[instances.c]
driver = "scripted"
handoff_max_runs_behind = 1
"""

SEND_ON = """mutation($t: ID!, $text: String!, $i: String, $fresh: Boolean! = false, $d: DispatchInput) {
  sendMessage(input: {threadId: $t, text: $text, providerInstanceId: $i, freshContext: $fresh, dispatch: $d}) {
    run { id status } userErrors { code message field } } }"""
SWITCH = """mutation($t: ID!, $i: String!) { switchProvider(input: {threadId: $t, providerInstanceId: $i}) {
  thread { id providerInstanceId } userErrors { code message field } } }"""
RUN = """query($r: ID!) { run(id: $r) { id ordinal providerThread { id providerInstanceId }
  contextTransfers { type status resolutionStrategy sourcePoint
                     handoff { text status strategy coveredRunOrdinals } } } }"""
TRANSFERS = """query($t: ID!) { thread(id: $t) { transfers(type: PROVIDER_HANDOFF) { id } providerThreads { id } } }"""
REPLIES = """query($t: ID!) { thread(id: $t) { messages(first: 100) { edges { node { role text run { id } } } } } }"""


@pytest.fixture
def home(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    return folder


async def on(api: Client, thread: ScriptedThread, text: str, instance: str | None, **kw: Any) -> dict[str, Any]:
    """Send `text` (to `instance`, if given) and wait for the run to complete; the run as `RUN` reads it."""
    sent = (await api.gql(SEND_ON, {"t": thread.id, "text": text, "i": instance, **kw}))["sendMessage"]
    assert sent["userErrors"] == [], sent
    assert (await finished(api, sent["run"]["id"]))["status"] == "COMPLETED"
    return (await api.gql(RUN, {"r": sent["run"]["id"]}))["run"]  # type: ignore[no-any-return]


async def recall_on(api: Client, thread: ScriptedThread, instance: str | None, **kw: Any) -> tuple[list[str], Any]:
    """What the agent of the run remembers (`@recall`), and that run."""
    run = await on(api, thread, "@recall", instance, **kw)
    data = await api.gql(REPLIES, {"t": thread.id})
    texts = [
        e["node"]["text"]
        for e in data["thread"]["messages"]["edges"]
        if e["node"]["role"] == "ASSISTANT" and e["node"]["run"]["id"] == run["id"]
    ]
    lines = "".join(texts).split("\n")
    assert lines[-1] == "user: @recall", lines
    return lines[:-1], run


def shown(handoff: str) -> str:
    """A handoff as `@recall` shows it (one line, escaped)."""
    return "handoff: " + handoff.replace("\\", "\\\\").replace("\n", "\\n")


async def test_the_spec_example_full_then_delta_then_fresh(api: Client, home: Path) -> None:
    thread = await ScriptedThread.create(api, home, "a")
    first = await on(api, thread, "@reply one", None)
    await on(api, thread, "@reply two", None)

    # To b for the first time: a new provider thread and a full summary of runs 1-2.
    memory, third = await recall_on(api, thread, "b")
    [transfer] = third["contextTransfers"]
    handoff = transfer["handoff"]
    assert (transfer["type"], transfer["status"]) == ("PROVIDER_HANDOFF", "CONSUMED")
    assert transfer["resolutionStrategy"] == "full_thread_summary" and transfer["sourcePoint"]["reason"] == "first_time"
    assert handoff["strategy"] == "FULL_THREAD_SUMMARY" and handoff["coveredRunOrdinals"] == [1, 2]
    assert handoff["status"] == "DELIVERED" and memory == [shown(handoff["text"])]
    assert "@reply one" in handoff["text"] and "@reply two" in handoff["text"]
    assert third["providerThread"]["providerInstanceId"] == "b"
    await on(api, thread, "@reply four", None)  # the thread stays on b

    # Back to a: its own provider thread resumes, with only runs 3-4 as a delta.
    memory, fifth = await recall_on(api, thread, "a")
    assert fifth["providerThread"]["id"] == first["providerThread"]["id"]
    [transfer] = fifth["contextTransfers"]
    delta = transfer["handoff"]
    assert delta["strategy"] == "DELTA_SINCE_TARGET_LAST_SEEN" and delta["coveredRunOrdinals"] == [3, 4]
    assert "@reply four" in delta["text"] and "runs 3\u20134" in delta["text"].splitlines()[0]
    assert memory == ["user: @reply one", "user: @reply two", shown(delta["text"])]

    # freshContext: a new provider thread on a, told everything so far.
    memory, sixth = await recall_on(api, thread, None, fresh=True)
    assert sixth["providerThread"]["id"] != first["providerThread"]["id"]
    [transfer] = sixth["contextTransfers"]
    assert transfer["sourcePoint"]["reason"] == "fresh_context"
    assert transfer["handoff"]["coveredRunOrdinals"] == [1, 2, 3, 4, 5]
    assert memory == [shown(transfer["handoff"]["text"])]
    view = (await api.gql(TRANSFERS, {"t": thread.id}))["thread"]
    assert len(view["transfers"]) == 3 and len(view["providerThreads"]) == 3


async def test_a_run_that_stays_gets_no_handoff(api: Client, home: Path) -> None:
    thread = await ScriptedThread.create(api, home, "a")
    await on(api, thread, "@reply one", None)
    same = await on(api, thread, "@reply two", "a")  # naming the thread's own provider is no switch
    assert same["contextTransfers"] == []
    assert (await api.gql(TRANSFERS, {"t": thread.id}))["thread"]["transfers"] == []


async def test_switchprovider_moves_later_runs_and_refuses_unknown_instances(api: Client, home: Path) -> None:
    thread = await ScriptedThread.create(api, home, "a")
    await on(api, thread, "@reply one", None)
    moved = (await api.gql(SWITCH, {"t": thread.id, "i": "b"}))["switchProvider"]
    assert moved["userErrors"] == [] and moved["thread"]["providerInstanceId"] == "b"
    memory, run = await recall_on(api, thread, None)
    assert run["providerThread"]["providerInstanceId"] == "b" and len(memory) == 1 and "@reply one" in memory[0]

    unknown = (await api.gql(SWITCH, {"t": thread.id, "i": "nope"}))["switchProvider"]
    assert [(e["code"], e["field"]) for e in unknown["userErrors"]] == [
        ("UNKNOWN_PROVIDER_INSTANCE", "providerInstanceId")
    ]
    sent = (await api.gql(SEND_ON, {"t": thread.id, "text": "x", "i": "nope"}))["sendMessage"]
    assert [e["code"] for e in sent["userErrors"]] == ["UNKNOWN_PROVIDER_INSTANCE"] and sent["run"] is None


async def test_a_switch_while_a_run_is_active_queues_and_never_steers(api: Client, home: Path) -> None:
    thread = await ScriptedThread.create(api, home, "a")
    waiting = await send(api, thread.id, "@approval echo hi")

    async def is_waiting() -> bool:
        data = await api.gql("query($r: ID!) { run(id: $r) { status } }", {"r": waiting["run"]["id"]})
        return bool(data["run"]["status"] == "WAITING")

    await until(is_waiting)
    steer = {"steerActive": {"targetRunId": waiting["run"]["id"]}}
    refused = (await api.gql(SEND_ON, {"t": thread.id, "text": "x", "i": "b", "d": steer}))["sendMessage"]
    assert [e["code"] for e in refused["userErrors"]] == ["PROVIDER_SWITCH_UNAVAILABLE"]
    queued = (await api.gql(SEND_ON, {"t": thread.id, "text": "@reply on b", "i": "b"}))["sendMessage"]
    assert queued["userErrors"] == [] and queued["run"]["status"] == "QUEUED"


async def test_a_provider_thread_that_cannot_resume_is_replaced_with_the_conversation(
    api: Client, home: Path, data_dir: Path
) -> None:
    thread = await ScriptedThread.create(api, home, "a")
    first = await on(api, thread, "@reply one", None)
    crashed = await send(api, thread.id, "@crash")  # its process exits; the next run must resume
    assert (await finished(api, crashed["run"]["id"]))["status"] == "FAILED"
    records = list((data_dir / "agents" / "a").glob("*/threads/*.json"))
    assert records
    for record in records:
        record.unlink()  # and the agent's stored conversation is gone

    memory, run = await recall_on(api, thread, None)
    assert run["providerThread"]["id"] != first["providerThread"]["id"]
    [transfer] = run["contextTransfers"]
    assert transfer["sourcePoint"]["reason"] == "cannot_resume"
    assert memory == [shown(transfer["handoff"]["text"])] and "@reply one" in memory[0]


async def test_switching_a_thread_of_another_project_is_not_found(
    server: ServerProcess, api: Client, home: Path, tmp_path: Path, database_url: str
) -> None:
    thread = await ScriptedThread.create(api, home, "a")
    other_home = tmp_path / "other"
    other_home.mkdir()
    other = await ScriptedThread.create(api, other_home, "a")
    project = (await api.gql("query($t: ID!) { thread(id: $t) { project { id } } }", {"t": other.id}))["thread"]
    _, token = create_token(database_url, "operate", project["project"]["id"])
    stranger = Client(server.url, token)
    try:
        refused = (await stranger.gql(SWITCH, {"t": thread.id, "i": "b"}))["switchProvider"]
        assert [(e["code"], e["field"]) for e in refused["userErrors"]] == [("NOT_FOUND", "threadId")]
    finally:
        await stranger.aclose()


async def test_a_provider_thread_too_far_behind_starts_fresh(api: Client, home: Path) -> None:
    thread = await ScriptedThread.create(api, home, "c")
    first = await on(api, thread, "@reply one", None)
    await on(api, thread, "@reply two", "b")
    await on(api, thread, "@reply three", None)
    memory, back = await recall_on(api, thread, "c")  # c missed runs 2-3: more than its limit of 1
    assert back["providerThread"]["id"] != first["providerThread"]["id"]
    [transfer] = back["contextTransfers"]
    assert transfer["sourcePoint"]["reason"] == "too_stale"
    assert transfer["handoff"]["coveredRunOrdinals"] == [1, 2, 3] and memory == [shown(transfer["handoff"]["text"])]

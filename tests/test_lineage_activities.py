"""Lineage activities (domain/lineage.py) against a real server and the scripted agent: forks, merge-backs,
provider switches, handoff deliveries, rollbacks and retries each leave one line in `Thread.activities`, with
its run and node, and a refused operation (a typed userError) leaves none.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.runs import finished, run, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client
from tests.support.waiting import until
from tests.support.ws import WsClient

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

PROVIDERS = """
[instances.a]
driver = "scripted"

[instances.b]
driver = "scripted"

[instances.plain]
driver = "scripted"
supports_native_fork = false
supports_native_rollback = false

[instances.retrying]
driver = "scripted"
crash_retries = 1
crash_retry_backoff_s = 0.05
"""

ACTIVITIES = """query($t: ID!) { thread(id: $t) { title activities(first: 100) {
  edges { node { id kind summary runId nodeId payload } } } } }"""
FORK = """mutation($run: ID!, $title: String) { forkThread(input: {source: {run: $run}, title: $title}) {
  thread { id } userErrors { code } } }"""
MERGE = """mutation($f: ID!) { mergeBack(input: {forkThreadId: $f}) { transfer { id } userErrors { code } } }"""
SWITCH = """mutation($t: ID!, $i: String!, $key: String) {
  switchProvider(input: {threadId: $t, providerInstanceId: $i, clientMutationId: $key}) { userErrors { code } } }"""
SEND_ON = """mutation($t: ID!, $text: String!, $i: String) {
  sendMessage(input: {threadId: $t, text: $text, providerInstanceId: $i}) { run { id } userErrors { code } } }"""
ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n, restoreFiles: false}) {
  userErrors { code } } }"""
UNDO = """mutation($t: ID!) { undoRollback(input: {threadId: $t}) { userErrors { code } } }"""
TRANSFER_HANDOFF = """query($id: ID!) { node(id: $id) { ... on ContextTransfer { handoff { id } } } }"""
EVENTS = """subscription($t: ID!) { threadEvents(threadId: $t, afterSequence: 0) {
  sequence type entity { __typename ... on Activity { kind } } } }"""
LINEAGE = ("lineage.", "rollback.", "run.retried")


async def activities(api: Client, thread_id: str) -> list[dict[str, Any]]:
    data = await api.gql(ACTIVITIES, {"t": thread_id})
    return [e["node"] for e in data["thread"]["activities"]["edges"]]


async def lineage(api: Client, thread_id: str) -> list[dict[str, Any]]:
    """The thread's lineage lines (forks, merges, switches, handoffs, rollbacks, retries), oldest first."""
    return [a for a in await activities(api, thread_id) if a["kind"].startswith(LINEAGE)]


async def delivered(api: Client, thread_id: str, run_id: str) -> dict[str, Any]:
    """The `lineage.handoff_delivered` line of `run_id`, once written (it follows the turn's start)."""

    async def found() -> dict[str, Any] | None:
        lines = [a for a in await lineage(api, thread_id) if a["kind"] == "lineage.handoff_delivered"]
        return next((a for a in lines if a["runId"] == run_id), None)

    return await until(found, within=30.0)


async def title(api: Client, thread_id: str) -> str:
    return str((await api.gql(ACTIVITIES, {"t": thread_id}))["thread"]["title"])


async def completed(api: Client, thread: ScriptedThread, text: str, instance: str | None = None) -> dict[str, Any]:
    sent = (await api.gql(SEND_ON, {"t": thread.id, "text": text, "i": instance}))["sendMessage"]
    assert sent["userErrors"] == [], sent
    done = await finished(api, sent["run"]["id"])
    assert done["status"] == "COMPLETED", done
    return done


def _home(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    return folder


async def test_fork_merge_back_and_their_handoffs_each_write_one_line(api: Client, tmp_path: Path) -> None:
    source = await ScriptedThread.create(api, _home(tmp_path, "ws"), "plain")  # no native fork: a handoff
    first = await completed(api, source, "@reply alpha")
    await completed(api, source, "@reply beta")
    before = await activities(api, source.id)

    made = (await api.gql(FORK, {"run": first["id"], "title": "explore"}))["forkThread"]
    assert made["userErrors"] == [], made
    fork = ScriptedThread(api, made["thread"]["id"], source.workspace)
    [forked] = await lineage(api, fork.id)
    assert forked["kind"] == "lineage.forked" and forked["runId"] == first["id"]
    assert forked["summary"] == f'forked from "{await title(api, source.id)}" at run 1'
    assert forked["payload"]["sourceThreadId"] == source.id and forked["payload"]["runOrdinal"] == 1
    assert await activities(api, source.id) == before  # the source's history is untouched by the fork

    fork_run = await completed(api, fork, "@reply gamma")
    handed = await delivered(api, fork.id, fork_run["id"])
    assert handed["nodeId"] == (await run(api, fork_run["id"]))["rootNode"]["id"]
    assert handed["summary"] == "run 1 was given the conversation it was forked from (run 1)"
    assert handed["payload"]["coveredRunOrdinals"] == [1]

    merged = (await api.gql(MERGE, {"f": fork.id}))["mergeBack"]
    assert merged["userErrors"] == [], merged
    [merge_line] = [a for a in await lineage(api, source.id) if a["kind"] == "lineage.merged_back"]
    assert merge_line["runId"] == fork_run["id"]
    assert merge_line["summary"] == 'merge-back from fork "explore": run 1, for the next run'
    assert merge_line["payload"]["transferId"] == merged["transfer"]["id"]

    after = await completed(api, source, "@reply with the fork's idea")
    handed = await delivered(api, source.id, after["id"])
    assert handed["summary"] == "run 3 was given a fork's merge-back (the fork's run 1)"
    assert handed["payload"]["transferId"] == merged["transfer"]["id"]
    handoff = (await api.gql(TRANSFER_HANDOFF, {"id": merged["transfer"]["id"]}))["node"]["handoff"]
    assert handed["payload"]["handoffId"] == handoff["id"]


async def test_refused_fork_and_merge_back_write_nothing(api: Client, tmp_path: Path) -> None:
    source = await ScriptedThread.create(api, _home(tmp_path, "ws"), "a")
    await completed(api, source, "@reply alpha")
    waiting = await send(api, source.id, "@approval echo hi")  # an unstable point: a run waiting for approval

    async def is_waiting() -> bool:
        return bool((await run(api, waiting["run"]["id"]))["status"] == "WAITING")

    await until(is_waiting)
    before = await activities(api, source.id)
    refused = (await api.gql(FORK, {"run": waiting["run"]["id"]}))["forkThread"]
    assert [e["code"] for e in refused["userErrors"]] == ["UNSTABLE_FORK_POINT"] and refused["thread"] is None
    not_a_fork = (await api.gql(MERGE, {"f": source.id}))["mergeBack"]
    assert [e["code"] for e in not_a_fork["userErrors"]] == ["NOT_A_FORK"]
    assert await activities(api, source.id) == before


async def test_a_refused_merge_back_of_nothing_new_writes_nothing(api: Client, tmp_path: Path) -> None:
    source = await ScriptedThread.create(api, _home(tmp_path, "ws"), "a")
    first = await completed(api, source, "@reply alpha")
    fork_id = (await api.gql(FORK, {"run": first["id"]}))["forkThread"]["thread"]["id"]
    before_source, before_fork = await activities(api, source.id), await activities(api, fork_id)
    refused = (await api.gql(MERGE, {"f": fork_id}))["mergeBack"]
    assert [e["code"] for e in refused["userErrors"]] == ["NOTHING_TO_MERGE"] and refused["transfer"] is None
    assert await activities(api, source.id) == before_source
    assert await activities(api, fork_id) == before_fork


async def test_switches_and_their_handoffs_say_from_what_to_what(api: Client, tmp_path: Path) -> None:
    thread = await ScriptedThread.create(api, _home(tmp_path, "ws"), "a")
    await completed(api, thread, "@reply one")

    assert (await api.gql(SWITCH, {"t": thread.id, "i": "b", "key": "to-b"}))["switchProvider"]["userErrors"] == []
    [switched] = await lineage(api, thread.id)
    assert switched["kind"] == "lineage.provider_switched" and switched["runId"] is None
    assert switched["summary"] == "provider switched from a to b"
    assert (switched["payload"]["fromProviderInstanceId"], switched["payload"]["toProviderInstanceId"]) == ("a", "b")
    # A replayed key, a switch to where the thread already is, and a refused switch write nothing.
    assert (await api.gql(SWITCH, {"t": thread.id, "i": "b", "key": "to-b"}))["switchProvider"]["userErrors"] == []
    assert (await api.gql(SWITCH, {"t": thread.id, "i": "b"}))["switchProvider"]["userErrors"] == []
    refused = (await api.gql(SWITCH, {"t": thread.id, "i": "nowhere"}))["switchProvider"]
    assert [e["code"] for e in refused["userErrors"]] == ["UNKNOWN_PROVIDER_INSTANCE"]
    assert await lineage(api, thread.id) == [switched]

    second = await completed(api, thread, "@reply two")
    handed = await delivered(api, thread.id, second["id"])
    assert handed["summary"] == "run 2 was given a summary of the conversation (run 1)"
    assert handed["nodeId"] == second["rootNode"]["id"] and handed["payload"]["strategy"] == "full_thread_summary"

    # Back to a by a message naming it: the switch, then a's own thread gets only what it missed.
    third = await completed(api, thread, "@reply three", instance="a")
    kinds = [(a["kind"], a["summary"]) for a in await lineage(api, thread.id)]
    assert ("lineage.provider_switched", "provider switched from b to a") in kinds
    handed = await delivered(api, thread.id, third["id"])
    assert handed["summary"] == "run 3 was given the runs its provider had not seen (run 2)"


async def test_rollback_and_its_undo_name_the_run_rolled_back_to(api: Client, tmp_path: Path) -> None:
    thread = await ScriptedThread.create(api, _home(tmp_path, "ws"), "a")
    first = await completed(api, thread, "@reply one")
    await completed(api, thread, "@reply two")

    assert (await api.gql(ROLLBACK, {"t": thread.id, "n": 1}))["rollbackToRun"]["userErrors"] == []
    lines = {a["kind"]: a for a in await lineage(api, thread.id)}
    assert sorted(lines) == ["rollback.completed", "rollback.started"]
    started, rolled = lines["rollback.started"], lines["rollback.completed"]
    assert (started["kind"], started["summary"]) == ("rollback.started", "rolling back to run 1 (1 run to undo)")
    assert started["payload"]["status"] == "completed" and started["runId"] == first["id"]
    assert (rolled["kind"], rolled["summary"]) == ("rollback.completed", "rolled back to run 1 (1 run undone)")
    assert rolled["runId"] == first["id"] and rolled["nodeId"] == first["rootNode"]["id"]
    assert rolled["payload"]["targetRunId"] == first["id"]

    assert (await api.gql(UNDO, {"t": thread.id}))["undoRollback"]["userErrors"] == []
    [undone] = [a for a in await lineage(api, thread.id) if a["kind"] == "rollback.undone"]
    assert (undone["kind"], undone["summary"]) == ("rollback.undone", "undid the rollback to run 1")
    assert undone["runId"] == first["id"] and undone["nodeId"] == first["rootNode"]["id"]

    before = await activities(api, thread.id)
    refused = (await api.gql(UNDO, {"t": thread.id}))["undoRollback"]
    assert [e["code"] for e in refused["userErrors"]] == ["ROLLBACK_NOT_UNDOABLE"]
    refused = (await api.gql(ROLLBACK, {"t": thread.id, "n": 9}))["rollbackToRun"]
    assert refused["userErrors"] != []
    assert await activities(api, thread.id) == before


async def test_the_run_after_a_replacing_rollback_is_told_the_conversation(api: Client, tmp_path: Path) -> None:
    thread = await ScriptedThread.create(api, _home(tmp_path, "ws"), "plain")  # nothing native: a new thread
    await completed(api, thread, "@reply one")
    await completed(api, thread, "@reply two")
    assert (await api.gql(ROLLBACK, {"t": thread.id, "n": 1}))["rollbackToRun"]["userErrors"] == []
    after = await completed(api, thread, "@reply three")
    handed = await delivered(api, thread.id, after["id"])
    assert handed["summary"] == "run 3 was given the conversation up to a rollback (run 1)"
    assert handed["nodeId"] == after["rootNode"]["id"] and handed["payload"]["transferId"] is None


async def test_a_retry_names_its_run_and_the_new_attempts_node(api: Client, tmp_path: Path) -> None:
    thread = await ScriptedThread.create(api, _home(tmp_path, "ws"), "retrying")
    done = await completed(api, thread, "@crash once\n@reply survived")
    [retried] = await lineage(api, thread.id)
    assert retried["kind"] == "run.retried" and retried["runId"] == done["id"]
    assert retried["nodeId"] == done["attempts"][1]["rootNode"]["id"] == done["rootNode"]["id"]
    assert retried["summary"].startswith("run 1 retried (1 of 1): ")


async def test_a_switch_and_its_activity_replay_from_the_log_together(api: Client, tmp_path: Path) -> None:
    thread = await ScriptedThread.create(api, _home(tmp_path, "ws"), "a")
    assert (await api.gql(SWITCH, {"t": thread.id, "i": "b"}))["switchProvider"]["userErrors"] == []
    ws = await WsClient.connect(api.base_url, api.token)
    try:
        op = await ws.subscribe(EVENTS, {"t": thread.id})
        replayed: list[dict[str, Any]] = []
        while True:
            message = await ws.receive()
            assert message["id"] == op and message["type"] == "next", message
            event = message["payload"]["data"]["threadEvents"]
            if event["type"] == "synchronized":
                break
            replayed.append(event)
    finally:
        await ws.close()
    said = [i for i, e in enumerate(replayed) if (e["entity"] or {}).get("kind") == "lineage.provider_switched"]
    assert len(said) == 1, replayed
    # Written by the switch's own command: the thread's new provider, then the line saying so.
    assert [e["type"] for e in replayed[said[0] - 1 : said[0] + 1]] == ["thread.updated", "activity.recorded"]

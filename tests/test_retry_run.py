"""retryRun against a real server and the scripted agent: a failed run gets a new attempt (reason RETRY) that
completes it, and every refusal carries its code. `@crash once` kills the agent process for real the first time
(the default `scripted` instance does not retry a crash), so the run fails and its retry goes past the crash."""

from __future__ import annotations

import base64
import uuid
from pathlib import Path
from typing import Any

from tests.support.cli import create_token
from tests.support.graphql import make_project
from tests.support.runs import finished, run, running, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client
from tests.support.waiting import until

RETRY = """mutation($r: ID!, $key: String) { retryRun(input: {runId: $r, clientMutationId: $key}) {
  run { id status attempts { attemptOrdinal reason status } }
  userErrors { code message field } clientMutationId } }"""
RUN_STATE = """query($r: ID!) { run(id: $r) {
  id status statusReason failure { code }
  attempts { id attemptOrdinal reason status statusReason rootNode { id } } } }"""
THREAD_STATE = """query($t: ID!) { thread(id: $t) {
  queueHeld
  messages(first: 50) { nodes { role text run { id } } }
  activities(first: 100) { nodes { kind runId nodeId payload } } } }"""
RESUME = """mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { userErrors { code } } }"""


async def _failed_by_a_crash(api: Client, workspace: Path, text: str) -> tuple[ScriptedThread, str]:
    thread = await ScriptedThread.create(api, workspace)
    sent = await send(api, thread.id, text)
    assert sent["userErrors"] == [], sent
    failed = await finished(api, sent["run"]["id"])
    assert (failed["status"], failed["statusReason"]) == ("FAILED", "provider_crashed"), failed
    return thread, str(sent["run"]["id"])


async def _retry(api: Client, run_id: str, key: str | None = None, **kw: Any) -> dict[str, Any]:
    return (await api.gql(RETRY, {"r": run_id, "key": key}, **kw))["retryRun"]  # type: ignore[no-any-return]


def _random_run_id() -> str:
    return base64.b64encode(f"Run:{uuid.uuid4()}".encode()).decode()


async def test_retry_run_completes_a_failed_run_on_a_retry_attempt(api: Client, workspace: Path) -> None:
    thread, run_id = await _failed_by_a_crash(api, workspace, "@crash once\n@reply second time lucky")

    retried = await _retry(api, run_id, key="retry-1")
    assert retried["userErrors"] == [] and retried["clientMutationId"] == "retry-1", retried
    assert [(a["attemptOrdinal"], a["reason"]) for a in retried["run"]["attempts"]] == [(1, "INITIAL"), (2, "RETRY")]
    await finished(api, run_id)
    done = (await api.gql(RUN_STATE, {"r": run_id}))["run"]
    assert (done["status"], done["statusReason"], done["failure"]) == ("COMPLETED", None, None), done
    attempts = [(a["attemptOrdinal"], a["reason"], a["status"], a["statusReason"]) for a in done["attempts"]]
    assert attempts == [(1, "INITIAL", "FAILED", "provider_crashed"), (2, "RETRY", "COMPLETED", None)]

    state = (await api.gql(THREAD_STATE, {"t": thread.id}))["thread"]
    replies = [m["text"] for m in state["messages"]["nodes"] if m["role"] == "ASSISTANT"]
    assert replies == ["second time lucky"]
    [activity] = [a for a in state["activities"]["nodes"] if a["kind"] == "run.retried"]
    assert activity["runId"] == run_id and activity["nodeId"] == done["attempts"][1]["rootNode"]["id"]
    assert activity["payload"]["reason"] == "RETRY" and activity["payload"]["failedWith"] == "provider_crashed"
    assert state["queueHeld"]  # the failure held the queue; the retry leaves that to resumeQueue

    again = await _retry(api, run_id, key="retry-1")  # the same key: the stored answer, no third attempt
    assert again["userErrors"] == [] and again["clientMutationId"] == "retry-1"
    assert len((await run(api, run_id))["attempts"]) == 2
    refused = await _retry(api, run_id, key="retry-2")  # a new key: the run completed, so it stays as it is
    assert [e["code"] for e in refused["userErrors"]] == ["RUN_NOT_RETRYABLE"] and refused["run"] is None


async def test_another_projects_run_is_not_found_and_its_owner_retries_it(
    api: Client, workspace: Path, database_url: str
) -> None:
    thread, run_id = await _failed_by_a_crash(api, workspace, "@crash once\n@reply done")
    own = (await api.gql("query($t: ID!) { thread(id: $t) { project { id } } }", {"t": thread.id}))["thread"]
    _, owner_token = create_token(database_url, "operate", own["project"]["id"])
    other = await make_project(api, "other")
    _, stranger = create_token(database_url, "operate", other)

    theirs = await api.post(RETRY, {"r": run_id}, token=stranger)
    unknown = await api.post(RETRY, {"r": _random_run_id()}, token=stranger)
    assert theirs.json() == unknown.json()  # nothing tells another project's run from an unknown one
    assert theirs.json()["data"]["retryRun"]["userErrors"] == [
        {"code": "NOT_FOUND", "message": "not found", "field": "runId"}
    ]
    assert (await run(api, run_id))["status"] == "FAILED"  # the stranger changed nothing

    owner = await _retry(api, run_id, token=owner_token)  # the twin: the same call, a token of the run's project
    assert owner["userErrors"] == [] and owner["run"]["status"] in ("PREPARING", "STARTING", "RUNNING", "COMPLETED")
    assert (await finished(api, run_id))["status"] == "COMPLETED"


async def test_a_busy_thread_and_a_run_behind_a_newer_one_are_refused(api: Client, workspace: Path) -> None:
    thread, failed = await _failed_by_a_crash(api, workspace, "@crash once\n@reply never")
    gate = workspace / "gate"
    sent = await send(api, thread.id, "@await gate\n@reply newer", d={"queueAfterActive": True})
    assert sent["userErrors"] == [], sent
    if sent["run"]["status"] == "QUEUED":  # the failure held the queue
        assert (await api.gql(RESUME, {"t": thread.id}))["resumeQueue"]["userErrors"] == []
    newer = sent["run"]["id"]

    async def running() -> bool:
        return (await run(api, newer))["status"] == "RUNNING"

    await until(running)
    busy = await _retry(api, failed)
    assert [e["code"] for e in busy["userErrors"]] == ["THREAD_BUSY"]
    gate.touch()
    assert (await finished(api, newer))["status"] == "COMPLETED"
    behind = await _retry(api, failed)
    assert [(e["code"], e["field"]) for e in behind["userErrors"]] == [("RUN_NOT_LATEST", "runId")]
    assert [a["reason"] for a in (await run(api, failed))["attempts"]] == ["INITIAL"]  # refusals changed nothing


async def _replies(api: Client, thread_id: str) -> list[str]:
    state = (await api.gql(THREAD_STATE, {"t": thread_id}))["thread"]
    return [m["text"] for m in state["messages"]["nodes"] if m["role"] == "ASSISTANT"]


async def test_a_retry_keeps_what_was_steered_into_the_failed_run(api: Client, workspace: Path) -> None:
    thread = await ScriptedThread.create(api, workspace)
    sent = await send(api, thread.id, "@await-steer\n@crash once\n@reply base")
    run_id = sent["run"]["id"]
    await running(api, run_id)
    steer = await send(api, thread.id, "@reply steered")  # into the live turn, which then crashes
    assert (steer["appliedDispatch"], steer["run"]["id"]) == ("STEER_ACTIVE", run_id), steer
    failed = await finished(api, run_id)
    assert (failed["status"], failed["statusReason"]) == ("FAILED", "provider_crashed"), failed
    before = await _replies(api, thread.id)

    assert (await _retry(api, run_id))["userErrors"] == []
    await running(api, run_id)
    # The retried turn is asked the whole run again, so it too waits for a steer first.
    again = await send(api, thread.id, "@reply again")
    assert (again["appliedDispatch"], again["run"]["id"]) == ("STEER_ACTIVE", run_id), again
    done = await finished(api, run_id)
    assert done["status"] == "COMPLETED", done
    # What the retried turn answered: the new steer, then the run's message, then the steer sent before the failure.
    assert (await _replies(api, thread.id))[len(before) :] == ["again", "base", "steered"]

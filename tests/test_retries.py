"""Retrying a run whose agent process died mid-turn (domain/retries.py) against a real server and the scripted
agent: `@crash` kills the agent process for real; `@crash once` does so only the first time."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.runs import finished, run, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client

PROVIDERS = """
[instances.retrying]
driver = "scripted"
crash_retries = 2
crash_retry_backoff_s = 0.05

[instances.plain]
driver = "scripted"
"""
ACTIVITIES = """query($t: ID!) { thread(id: $t) { activities(first: 100) { edges { node { kind payload } } } } }"""
REPLIES = """query($t: ID!) { thread(id: $t) { messages(first: 50) { edges { node { role text } } } } }"""


async def _thread(api: Client, tmp_path: Path, instance: str) -> ScriptedThread:
    home = tmp_path / f"ws-{instance}"
    home.mkdir(exist_ok=True)
    return await ScriptedThread.create(api, home, instance)  # type: ignore[no-any-return]


async def _ran(api: Client, thread: ScriptedThread, text: str) -> dict[str, Any]:
    sent = await send(api, thread.id, text)
    assert sent["userErrors"] == [], sent
    await finished(api, sent["run"]["id"])
    return await run(api, sent["run"]["id"])


async def test_a_crash_before_anything_ran_is_retried_on_a_new_attempt(api: Client, tmp_path: Path) -> None:
    thread = await _thread(api, tmp_path, "retrying")
    done = await _ran(api, thread, "@crash once\n@reply survived the crash")
    assert done["status"] == "COMPLETED", done
    attempts = [(a["attemptOrdinal"], a["reason"], a["status"]) for a in done["attempts"]]
    assert attempts == [(1, "INITIAL", "FAILED"), (2, "PROVIDER_RECOVERY", "COMPLETED")]
    assert done["activeAttempt"]["id"] == done["attempts"][1]["id"]
    replies = (await api.gql(REPLIES, {"t": thread.id}))["thread"]["messages"]["edges"]
    assert [e["node"]["text"] for e in replies if e["node"]["role"] == "ASSISTANT"] == ["survived the crash"]
    kinds = [e["node"] for e in (await api.gql(ACTIVITIES, {"t": thread.id}))["thread"]["activities"]["edges"]]
    [retried] = [k for k in kinds if k["kind"] == "run.retried"]
    assert retried["payload"]["retry"] == 1 and retried["payload"]["attempt"] == 2


async def test_a_crash_after_a_write_fails_the_run_and_nothing_runs_twice(api: Client, tmp_path: Path) -> None:
    thread = await _thread(api, tmp_path, "retrying")
    done = await _ran(api, thread, "@write note.txt once\n@crash once\n@reply never")
    assert done["status"] == "FAILED" and done["statusReason"] == "provider_crashed"
    assert [a["reason"] for a in done["attempts"]] == ["INITIAL"]
    assert (tmp_path / "ws-retrying" / "note.txt").read_text() == "once"


async def test_provider_recovery_retries_are_bounded_then_the_run_fails(api: Client, tmp_path: Path) -> None:
    thread = await _thread(api, tmp_path, "retrying")
    done = await _ran(api, thread, "@crash")
    assert done["status"] == "FAILED"
    assert [a["reason"] for a in done["attempts"]] == ["INITIAL", "PROVIDER_RECOVERY", "PROVIDER_RECOVERY"]
    assert all(a["status"] == "FAILED" for a in done["attempts"])
    again = await _ran(api, thread, "@reply the thread goes on")  # the queue was held by the failure
    assert again["status"] in ("COMPLETED", "QUEUED"), again


async def test_without_a_policy_a_crash_fails_the_run(api: Client, tmp_path: Path) -> None:
    thread = await _thread(api, tmp_path, "plain")
    done = await _ran(api, thread, "@crash once\n@reply never")
    assert done["status"] == "FAILED" and [a["reason"] for a in done["attempts"]] == ["INITIAL"]

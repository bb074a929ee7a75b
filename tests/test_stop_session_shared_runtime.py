"""Stopping one thread's run ends only that run's turn on a runtime shared with other threads.

The other thread's turn waits for an approval (an event, not a delay), so it is certainly live
on the shared runtime when the first thread's run is interrupted; it must still be answerable
afterwards and complete.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.graphql import threads_sharing_a_runtime
from tests.support.runs import finished, run, send
from tests.support.server import Client
from tests.support.waiting import until

PROVIDERS = """
[instances.stopper]
driver = "scripted"
supports_active_steering = false
supports_interrupt = false
interrupt_unsupported = "stop_session"
"""
INTERRUPT = """mutation($r: ID!) { interruptRun(input: {runId: $r, holdQueue: false}) {
  run { status } userErrors { code } } }"""
PENDING = "query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"
APPROVE = """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) {
  userErrors { code } } }"""


async def test_stop_session_leaves_a_waiting_turn_on_the_same_runtime_answerable(
    client: Client, tmp_path: Path
) -> None:
    root = tmp_path / "shared"
    root.mkdir()
    threads = await threads_sharing_a_runtime(client, root, "stopper")
    waiting = await send(client, threads[1], "@approval echo b\n@reply b done")

    async def asked() -> list[dict[str, Any]]:
        return list((await client.gql(PENDING, {"t": threads[1]}))["thread"]["pendingRequests"])

    request = (await until(asked))[0]["id"]
    interrupted = await send(client, threads[0], "@delay 20000\n@reply never")

    async def running() -> bool:
        return bool((await run(client, interrupted["run"]["id"]))["status"] == "RUNNING")

    await until(running)
    stopped = (await client.gql(INTERRUPT, {"r": interrupted["run"]["id"]}))["interruptRun"]
    assert stopped == {"run": {"status": "INTERRUPTED"}, "userErrors": []}
    assert (await run(client, waiting["run"]["id"]))["status"] == "WAITING"  # still waiting for its approval
    assert (await client.gql(APPROVE, {"r": request}))["respondToApproval"]["userErrors"] == []
    other = await finished(client, waiting["run"]["id"])
    assert (other["status"], other["statusReason"]) == ("COMPLETED", None)

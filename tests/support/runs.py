"""Helpers for run scenarios over the real API."""

from __future__ import annotations

import asyncio
from typing import Any

import websockets

from tests.support.server import Client
from tests.support.waiting import until
from tests.support.ws import WsClient

SEND = """
mutation($t: ID!, $text: String!, $d: DispatchInput, $key: String) {
  sendMessage(input: {threadId: $t, text: $text, dispatch: $d, clientMessageId: $key}) {
    run { id ordinal status queuePosition }
    message { id role text }
    appliedDispatch
    userErrors { code message field }
  }
}"""

RUN = """
query($id: ID!) {
  run(id: $id) {
    id ordinal status statusReason queuePosition requestedAt startedAt completedAt
    userMessage { text }
    rootNode { id kind status countsForRun children { id kind status title detail } }
    attempts { id attemptOrdinal reason status rootNode { id }
               providerTurns { id ordinal status nativeTurnRef providerThread { id nativeThreadRef } } }
    activeAttempt { id }
    providerThread { id nativeThreadRef status }
    executionGraph { nodes { id kind status parent { id } } edges { parent { id } child { id } } }
    plans { kind status items }
  }
}"""

TERMINAL = {"COMPLETED", "FAILED", "INTERRUPTED", "CANCELLED", "ROLLED_BACK"}


async def send(client: Client, thread_id: str, text: str, **kw: Any) -> dict[str, Any]:
    data = await client.gql(SEND, {"t": thread_id, "text": text, **kw})
    payload: dict[str, Any] = data["sendMessage"]
    return payload


async def run(client: Client, run_id: str) -> dict[str, Any]:
    return (await client.gql(RUN, {"id": run_id}))["run"]  # type: ignore[no-any-return]


HEAD = "query($id: ID!) { run(id: $id) { status thread { id } } }"
STATUS = "subscription($t: ID!, $r: ID) { runStatus(threadId: $t, runId: $r) { status } }"


async def finished(client: Client, run_id: str, within: float = 30.0) -> dict[str, Any]:
    """The run (as `run` reads it) once it has ended.

    It waits on the `runStatus` subscription, which starts with the run's current status: the suite waits for
    a run ~1,100 times, and reading the whole run every 50 ms until it ended (~6,000 reads, ~10 ms of server CPU
    each) was about a sixth of the servers' CPU. Where no socket can be opened or it breaks (a test restarting
    servers), it polls the status."""
    head = (await client.gql(HEAD, {"id": run_id}))["run"]
    if head["status"] not in TERMINAL:
        try:
            async with asyncio.timeout(within):
                try:
                    await _ended_on_socket(client, head["thread"]["id"], run_id)
                except TimeoutError:  # an OSError too: not a broken socket
                    raise
                except (OSError, ConnectionError, websockets.WebSocketException, TooSlow):
                    await _polled_until_ended(client, run_id, within)
        except TimeoutError:
            last = (await client.gql(HEAD, {"id": run_id}))["run"]["status"]
            raise TimeoutError(f"run {run_id} has not ended in {within}s; its status: {last}") from None
    return await run(client, run_id)


async def _ended_on_socket(client: Client, thread_id: str, run_id: str) -> None:
    ws = await WsClient.connect(client.base_url, client.token)
    try:
        await ws.subscribe(STATUS, {"t": thread_id, "r": run_id})
        while True:
            message = await ws.receive(within=3600)  # the caller's timeout ends the wait
            if message["type"] != "next":
                raise ConnectionError(f"runStatus ended: {message}")
            errors = message["payload"].get("errors") or [{}]
            if errors[0].get("extensions", {}).get("code") == "SUBSCRIBER_TOO_SLOW":  # a server told a tiny queue
                raise TooSlow(errors[0]["message"])
            assert "errors" not in message["payload"], message
            if message["payload"]["data"]["runStatus"]["status"] in TERMINAL:
                return
    finally:
        await ws.close()


async def running(client: Client, run_id: str) -> dict[str, Any]:
    """The run (as `run` reads it) once its turn is RUNNING."""

    async def check() -> dict[str, Any] | None:
        found = await run(client, run_id)
        return found if found["status"] == "RUNNING" else None

    return await until(check)


class TooSlow(Exception):
    """The server cut the wait's subscription (`SUBSCRIBER_TOO_SLOW`)."""


async def finished_polled(client: Client, run_id: str, within: float = 30.0) -> dict[str, Any]:
    """`finished` by polling the run's status: for a test that counts the server's subscriptions, sockets or
    cut subscribers, where the wait's own subscription would be counted with the test's."""
    await _polled_until_ended(client, run_id, within)
    return await run(client, run_id)


async def _polled_until_ended(client: Client, run_id: str, within: float) -> None:
    async def ended() -> str | None:
        status: str = (await client.gql(HEAD, {"id": run_id}))["run"]["status"]
        return status if status in TERMINAL else None

    await until(ended, within=within)

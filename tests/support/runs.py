"""Helpers for run scenarios over the real API."""

from __future__ import annotations

from typing import Any

from tests.support.server import Client
from tests.support.waiting import until

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


async def finished(client: Client, run_id: str, within: float = 30.0) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        found = await run(client, run_id)
        return found if found["status"] in TERMINAL else None

    return await until(check, within=within)

"""What a handoff looked like on its way to an agent: in the model request the fake server received, and in
the GraphQL API (the `ContextHandoff`s delivered with a run, its user message).

A handoff is sent as an input of its own ahead of the user's words (docs/providers.md): a text part of the
same user message for Codex (`input_text`) and Claude Code (a text content block). `turn_parts` reads that
message back out of a request body, so a test can compare it with what the API says was sent.
"""

from __future__ import annotations

from typing import Any

from tests.support.server import Client
from tests.support.waiting import until

MODEL_PATH = {"codex": "/v1/responses", "claude": "/v1/messages"}

ACTIVITIES = """query($t: ID!) { thread(id: $t) { activities(first: 100) {
  edges { node { kind runId payload } } } } }"""
HANDOFF = """query($id: ID!) { node(id: $id) { ... on ContextHandoff {
  id text status strategy coveredRunOrdinals targetRun { id } } } }"""
USER_MESSAGE = """query($id: ID!) { run(id: $id) { userMessage { text } } }"""


def _texts(content: Any, kinds: tuple[str, ...]) -> list[str]:
    if isinstance(content, str):
        return [content]
    return [str(part.get("text", "")) for part in content or [] if isinstance(part, dict) and part.get("type") in kinds]


def user_messages(provider: str, body: dict[str, Any]) -> list[list[str]]:
    """The text parts of every user message of one model request, in order (Codex: `input`, Claude: `messages`)."""
    if provider == "codex":
        items = body.get("input") or []
        users = [i for i in items if i.get("type", "message") == "message" and i.get("role") == "user"]
        return [_texts(item.get("content"), ("input_text",)) for item in users]
    messages = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    return [_texts(message.get("content"), ("text",)) for message in messages]


def turn_parts(provider: str, body: dict[str, Any], user_text: str) -> list[str]:
    """The parts of the user message whose last part is `user_text`, minus what the CLI itself adds to a
    message (Claude Code's `<system-reminder>` blocks): the handoff parts, then the user's words."""
    found = [parts for parts in user_messages(provider, body) if parts and parts[-1] == user_text]
    assert found, f"no user message ending with {user_text!r} in {user_messages(provider, body)!r}"
    return [part for part in found[-1] if not part.lstrip().startswith("<system-reminder>")]


def first_request(provider: str, bodies: list[dict[str, Any]], user_text: str) -> dict[str, Any]:
    """The first main-loop request of the turn that sent `user_text` (Claude Code's side requests offer no tools)."""
    for body in bodies:
        if provider == "claude" and not body.get("tools"):
            continue
        if any(parts and parts[-1] == user_text for parts in user_messages(provider, body)):
            return body
    raise AssertionError(f"no {provider} request carried {user_text!r}")


async def delivered_with(client: Client, thread_id: str, run_id: str) -> list[dict[str, Any]]:
    """The handoffs the API says went out with the run's first turn (its `lineage.handoff_delivered` lines,
    written once the turn started), oldest first, each as the `ContextHandoff` node."""

    async def lines() -> list[dict[str, Any]] | None:
        data = await client.gql(ACTIVITIES, {"t": thread_id})
        nodes = [e["node"] for e in data["thread"]["activities"]["edges"]]
        mine = [n for n in nodes if n["kind"] == "lineage.handoff_delivered" and n["runId"] == run_id]
        return mine or None

    found = await until(lines, within=30.0)
    return [(await client.gql(HANDOFF, {"id": line["payload"]["handoffId"]}))["node"] for line in found]


async def user_message(client: Client, run_id: str) -> str:
    """The run's message as the conversation shows it."""
    return str((await client.gql(USER_MESSAGE, {"id": run_id}))["run"]["userMessage"]["text"])

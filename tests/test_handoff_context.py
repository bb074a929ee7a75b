"""A handoff reaches the scripted agent as a `context` item whether tracing is on or off (real server).

With tracing on, every provider call goes through the tracing wrapper (providers/traced.py); the handoff must
pass through it as the same context item, never pasted into the user's message. A thread moves from instance
`a` to `b`; on `b`, `@recall` shows what the agent was given with that turn: the handoff as a `handoff:` entry
of its own, exactly the text the API records (DELIVERED, with that run), then the user's message alone. The
twin runs the same with tracing off. The tracing-on case also checks that the wrapper was in use (a
`provider start_turn` span was exported), so it cannot pass with tracing silently off.
"""

from __future__ import annotations

import queue
import time
from pathlib import Path

import pytest

from tests.support.handoffs import delivered_with, user_message
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess, providers_env, serving
from threadloom.agent.recall import escape

PROVIDERS = """
[instances.a]
driver = "scripted"

[instances.b]
driver = "scripted"
"""
TRACING = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "threadloom-test"}
SWITCH = """mutation($t: ID!, $i: String!) {
  switchProvider(input: {threadId: $t, providerInstanceId: $i}) { userErrors { code message } } }"""
LAST_RUN = """query($t: ID!) { thread(id: $t) { runs(last: 1) { edges { node { id ordinal } } } } }"""


def _span_exported(server: ServerProcess, name: str, within: float) -> bool:
    """Whether the server's console exporter printed a span called `name` within `within` seconds (it flushes
    every 50 ms); the server's output read so far is consumed."""
    deadline = time.monotonic() + within
    wanted = f'"name": "{name}"'
    while True:
        try:
            if wanted in server.lines.get(timeout=0.05):
                return True
        except queue.Empty:
            if time.monotonic() > deadline:
                return False


@pytest.mark.parametrize("tracing", [True, False], ids=["tracing-on", "tracing-off"])
async def test_a_handoff_reaches_the_scripted_agent_as_its_context_item(
    database_url: str, tmp_path: Path, workspace: Path, tracing: bool
) -> None:
    env = providers_env(tmp_path, PROVIDERS, **(TRACING if tracing else {}))
    with serving(database_url, tmp_path / "data", env) as server:
        client = Client(server.url, server.admin_token)
        try:
            thread = await ScriptedThread.create(client, workspace, "a")
            await thread.run("@reply alpha one")
            switched = (await client.gql(SWITCH, {"t": thread.id, "i": "b"}))["switchProvider"]
            assert switched["userErrors"] == [], switched

            recalled = await thread.recall()  # run 2, on b: its first turn carries a summary of run 1
            [edge] = (await client.gql(LAST_RUN, {"t": thread.id}))["thread"]["runs"]["edges"]
            run = edge["node"]
            assert run["ordinal"] == 2, run
            [handoff] = await delivered_with(client, thread.id, run["id"])
            assert handoff["status"] == "DELIVERED" and handoff["targetRun"]["id"] == run["id"], handoff
            assert "@reply alpha one" in handoff["text"], handoff
            assert recalled == [f"handoff: {escape(handoff['text'])}"], recalled  # then "user: @recall" alone
            assert await user_message(client, run["id"]) == "@recall"
            # The wrapper was in use: its start_turn span went out (a server without tracing prints none).
            assert _span_exported(server, "provider start_turn", 30.0 if tracing else 0.5) == tracing
        finally:
            await client.aclose()

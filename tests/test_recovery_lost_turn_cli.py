"""A recovery attempt does not show the agent the lost turn's message twice (real Codex CLI, fake model).

The model holds the turn's reply (`HOLD`), the server gets `kill -9` (its Codex app-server dies with it) and a new
server recovers the run with a PROVIDER_RECOVERY attempt on the resumed native thread. Codex had recorded the lost
turn (the user's message) in its own history, so resuming it alone would send the message twice; the lost turn is
rolled back natively (`thread/revert`, then read back) before the new attempt's turn starts, and its provider turn
reads ROLLED_BACK.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.fake_model import FakeModel
from tests.support.runs import finished, send
from tests.support.waiting import until
from tests.test_codex_collab_nodes import _thread
from tests.test_restart_recovery_agents import Restartable

WAIT_S = 90.0
MESSAGE = "HOLD\nthe one message"
RUN = """query($r: ID!) { run(id: $r) { status attempts { reason status
  providerTurns { status nativeTurnRef providerThread { nativeThreadRef } } } } }"""


def _times_sent(body: dict[str, Any]) -> int:
    """How often the user's message is in a request's conversation."""
    return sum(
        1
        for item in body["input"]
        if item.get("role") == "user"
        for part in item.get("content") or []
        if part.get("type") == "input_text" and part.get("text") == MESSAGE
    )


async def test_the_recovery_attempt_sends_the_lost_turns_message_once(
    database_url: str, fake: FakeModel, tmp_path: Path
) -> None:
    restartable = Restartable(database_url, tmp_path, fake)
    client = restartable.client()
    try:
        thread = await _thread(client, tmp_path / "ws")
        sent = await send(client, thread, MESSAGE)
        run_id = sent["run"]["id"]

        async def held() -> bool:
            bodies = fake.bodies("/v1/responses")
            return bool(bodies) and (await client.gql(RUN, {"r": run_id}))["run"]["status"] == "RUNNING"

        await until(held, within=WAIT_S)
        assert _times_sent(fake.bodies("/v1/responses")[0]) == 1
        before = len(fake.bodies("/v1/responses"))
        restartable.crash_and_restart()
        await client.aclose()
        client = restartable.client()

        async def asked_again() -> dict[str, Any] | None:
            bodies = fake.bodies("/v1/responses")
            return bodies[-1] if len(bodies) > before else None

        again = await until(asked_again, within=WAIT_S)
        fake.release()
        done = await finished(client, run_id, within=WAIT_S)
        assert done["status"] == "COMPLETED", done
        assert _times_sent(again) == 1, again["input"]
        attempts = (await client.gql(RUN, {"r": run_id}))["run"]["attempts"]
        assert [(a["reason"], [t["status"] for t in a["providerTurns"]]) for a in attempts] == [
            ("INITIAL", ["ROLLED_BACK"]),
            ("PROVIDER_RECOVERY", ["COMPLETED"]),
        ]
        natives = {t["providerThread"]["nativeThreadRef"] for a in attempts for t in a["providerTurns"]}
        assert len(natives) == 1  # the same native thread, resumed
    finally:
        await client.aclose()
        restartable.server.stop()
        for proc in [*restartable.dead, restartable.server]:
            print(proc.report(40))

"""A server killed (-9) in the middle of a run that already reported usage: after the restart the lost
attempt keeps exactly what it recorded, the recovery attempt records its own calls, and nothing is counted
twice (docs/usage.md, "Restarts").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess, providers_env
from tests.support.waiting import until

INSTANCES = """
[instances.scripted]
driver = "scripted"
"""
USAGE = "usage { calls inputTokens outputTokens costUsd costSource }"
RUN = (
    "query($r: ID!) { run(id: $r) { status "
    + USAGE
    + " attempts { attemptOrdinal reason status "
    + USAGE
    + " } usageRecords { callRef attempt { attemptOrdinal } } } }"
)


async def _run(client: Client, run_id: str) -> dict[str, Any]:
    return (await client.gql(RUN, {"r": run_id}))["run"]  # type: ignore[no-any-return]


async def test_a_restart_mid_run_keeps_each_call_once(database_url: str, tmp_path: Path) -> None:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    env = providers_env(tmp_path, INSTANCES)
    first = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
    servers = [first]
    token = first.admin_token
    assert token is not None
    client = Client(first.url, token)
    try:
        thread = await ScriptedThread.create(client, workspace)
        sent = await send(client, thread.id, "@usage 5 5 0.05\n@await gate\n@reply back")
        run_id = sent["run"]["id"]

        async def recorded() -> bool:  # the call is in the ledger, the turn waits at the gate
            found = await _run(client, run_id)
            return found["status"] == "RUNNING" and found["usage"]["calls"] == 1

        await until(recorded)
        first.kill()
        await client.aclose()
        second = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
        servers.append(second)
        client = Client(second.url, token)

        async def recovering() -> dict[str, Any] | None:
            found = await _run(client, run_id)
            attempts = found["attempts"]
            ready = len(attempts) == 2 and attempts[1]["status"] == "RUNNING" and attempts[1]["usage"]["calls"]
            return found if ready else None

        during = await until(recovering, within=45)
        assert [a["reason"] for a in during["attempts"]] == ["INITIAL", "PROVIDER_RECOVERY"]
        assert during["attempts"][0]["usage"] == {
            "calls": 1,
            "inputTokens": 5,
            "outputTokens": 5,
            "costUsd": 0.05,
            "costSource": "REPORTED",
        }
        (workspace / "gate").touch()
        assert (await finished(client, run_id))["status"] == "COMPLETED"
        done = await _run(client, run_id)
        # attempt 2 made its own call again (the turn ran anew); attempt 1's is still one record
        assert [a["usage"]["calls"] for a in done["attempts"]] == [1, 1]
        assert done["usage"] == {
            "calls": 2,
            "inputTokens": 10,
            "outputTokens": 10,
            "costUsd": 0.1,
            "costSource": "REPORTED",
        }
        refs = [r["callRef"] for r in done["usageRecords"]]
        assert len(refs) == len(set(refs)) == 2
    finally:
        await client.aclose()
        for server in servers:
            if server is not first:
                server.stop()
            print(server.report(40))

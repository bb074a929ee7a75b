"""mergeBack while the fork's own step is half written: the interleaving that once ended in a deadlock.

A mergeBack locks the source thread and inserts a transfer that names the fork, so PostgreSQL's foreign-key
check takes `FOR KEY SHARE` on the fork's row. A step of the fork's own run (a turn's request after its
provider thread's record, a run's end after its turn's last events) writes the fork's row twice in one
transaction, and PostgreSQL checks the second write's `parent_thread_id` again, with `FOR KEY SHARE` on the
source's row. While a command's thread lock was `FOR UPDATE`, each waited for the other's lock: a deadlock, and
the mergeBack answered INTERNAL_SERVER_ERROR (found by tests/test_thread_races.py). The lock is
`FOR NO KEY UPDATE` now, which no foreign-key check waits for (docs/architecture.md, "Lock order").

The hold point `step-before-written` (`THREADLOOM_TEST_HOLD_AT`) stops the fork's turn request with the fork's
row locked and written once; the mergeBack goes out then, and the gate opens only once the mergeBack has
answered or is seen waiting for a lock, so the two transactions meet in that order every time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.support import server_log
from tests.support.db import assert_log_replays
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess, providers_env
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(120)

PROVIDERS = """
[instances.scripted]
driver = "scripted"
"""
FORK = """mutation($r: ID!) { forkThread(input: {source: {run: $r}, ownWorkspace: true}) {
  thread { id } userErrors { code message field } } }"""
MERGE = """mutation($f: ID!) { mergeBack(input: {forkThreadId: $f}) {
  thread { id } transfer { id type status sourcePoint sourceThread { id } targetThread { id } }
  userErrors { code message field } } }"""
# Backends of the test's database waiting for a heavyweight lock (a row's, a transaction's, an advisory one).
LOCK_WAITS = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'"


async def _exists(path: Path) -> bool:
    return await asyncio.to_thread(path.exists)


async def test_merge_back_answers_while_the_forks_step_holds_its_half_written_row(pg: PgServer, tmp_path: Path) -> None:
    gate, held = tmp_path / "gate", tmp_path / "gate.held"
    gate.touch()  # open: everything before the race passes the hold point
    url = await pg.fresh()
    env = providers_env(tmp_path, PROVIDERS, THREADLOOM_TEST_HOLD_AT=f"step-before-written:{gate}")
    workspace = tmp_path / "ws"
    workspace.mkdir()
    server = ServerProcess(url, tmp_path / "data", env=env)
    try:
        await asyncio.to_thread(server.wait_ready)
        client = Client(server.url, server.admin_token)
        watcher = await pg.connect(url)
        try:
            source = await ScriptedThread.create(client, workspace)
            first = await source.run("@reply alpha from the source")
            made = (await client.gql(FORK, {"r": first["id"]}))["forkThread"]
            assert made["userErrors"] == [], made
            fork = ScriptedThread(client, made["thread"]["id"], workspace)
            await fork.run("@reply idea one from the fork")

            # Shut the gate; the fork's next turn request stops with its row locked and written once.
            await asyncio.to_thread(gate.unlink)
            await asyncio.to_thread(held.unlink, missing_ok=True)
            second = await send(client, fork.id, "@reply idea two from the fork")
            assert second["userErrors"] == [], second
            await until(lambda: _exists(held), within=60)

            merging = asyncio.ensure_future(client.gql(MERGE, {"f": fork.id}))

            async def answered_or_waiting() -> bool:
                return merging.done() or await watcher.fetchval(LOCK_WAITS) > 0

            await until(answered_or_waiting, within=60)
            answered_while_held = merging.done()
            await asyncio.to_thread(gate.touch)
            merged: dict[str, Any] = (await asyncio.wait_for(merging, 60))["mergeBack"]
            assert merged["userErrors"] == [], merged
            transfer = merged["transfer"]
            assert (transfer["type"], transfer["status"]) == ("MERGE_BACK", "PENDING")
            assert transfer["sourceThread"] == {"id": fork.id} and transfer["targetThread"] == {"id": source.id}
            assert transfer["sourcePoint"]["runOrdinal"] == 1  # the fork's second run was not stable yet
            assert answered_while_held  # a mergeBack never waits for the fork's own transaction

            assert (await finished(client, second["run"]["id"]))["status"] == "COMPLETED"
            again = (await client.gql(MERGE, {"f": fork.id}))["mergeBack"]
            assert again["userErrors"] == [] and again["transfer"]["sourcePoint"]["runOrdinal"] == 2, again

            # The source's next run gets both merges, oldest first, as the context of its turn.
            handoffs = [line for line in await source.recall() if line.startswith("handoff: ")]
            assert len(handoffs) == 1, handoffs
            one, two = handoffs[0].index("idea one from the fork"), handoffs[0].index("idea two from the fork")
            assert one < two and handoffs[0].count("merge_back_delta") == 2, handoffs
        finally:
            await watcher.close()
            await client.aclose()
    finally:
        server.stop()
        print(server.report(40))  # shown when the test failed
    assert server_log.errors(server.log) == [], "\n".join(server.log[-40:])
    await assert_log_replays(url)

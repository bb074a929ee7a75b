"""A replica killed while holding leases: the lease lives in the database, so the surviving replica enforces it.

Two `threadloom serve` processes on one database. The laptop takes the leases of two threads through replica A;
A gets `kill -9`. Through replica B the phone's writes are still WRITER_LEASE_HELD naming the laptop, an observer
still reads the holder, and the laptop, now talking to B, goes on driving (renews, sends) without acquiring again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.graphql import make_project, make_thread, workspace
from tests.support.pg import PgServer
from tests.support.runs import SEND, finished
from tests.support.server import Client, ServerProcess

ACQUIRE = """mutation($t: ID!) { acquireThreadLease(input: {threadId: $t, ttlSeconds: 600}) {
  thread { lease { deviceId } } userErrors { code message } } }"""
RENEW = """mutation($t: ID!) { renewThreadLease(input: {threadId: $t, ttlSeconds: 600}) { userErrors { code } } }"""
LEASE = """query($t: ID!) { thread(id: $t) { lease { deviceId tokenName } } }"""
TOKEN = """mutation($p: ID!, $name: String!) {
  createToken(input: {projectId: $p, name: $name, scope: OPERATE}) { secret userErrors { code } } }"""


async def _as(client: Client, token: str, device: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
    return await client.gql(query, variables, token=token, headers={"Threadloom-Device": device})


async def test_a_killed_replicas_leases_are_enforced_by_the_replica_that_survives(pg: PgServer, tmp_path: Path) -> None:
    database_url = await pg.fresh()
    first = ServerProcess(database_url, tmp_path / "a").wait_ready()
    second = ServerProcess(database_url, tmp_path / "b").wait_ready()
    a, b = Client(first.url, first.admin_token), Client(second.url, first.admin_token)
    try:
        project = await make_project(a, "replicas", workspace(tmp_path))
        threads = [str((await make_thread(a, project, f"t{i}"))["id"]) for i in range(2)]
        laptop, phone = [
            (await a.gql(TOKEN, {"p": project, "name": name}))["createToken"]["secret"]
            for name in ("laptop-token", "phone-token")
        ]
        for thread in threads:
            taken = (await _as(a, laptop, "laptop", ACQUIRE, {"t": thread}))["acquireThreadLease"]
            assert taken["userErrors"] == [] and taken["thread"]["lease"]["deviceId"] == "laptop", taken
        first.kill()  # kill -9: whatever A held in memory is gone

        for thread in threads:
            refused = (await _as(b, phone, "phone", SEND, {"t": thread, "text": "@reply mine now"}))["sendMessage"]
            assert [e["code"] for e in refused["userErrors"]] == ["WRITER_LEASE_HELD"], refused
            assert "'laptop'" in refused["userErrors"][0]["message"]
            seen = (await b.gql(LEASE, {"t": thread}))["thread"]["lease"]
            assert seen == {"deviceId": "laptop", "tokenName": "laptop-token"}
        # The holder carries on through the survivor: its lease is the same one, not a new acquisition.
        assert (await _as(b, laptop, "laptop", RENEW, {"t": threads[0]}))["renewThreadLease"]["userErrors"] == []
        sent = (await _as(b, laptop, "laptop", SEND, {"t": threads[1], "text": "@reply still driving"}))["sendMessage"]
        assert sent["userErrors"] == [], sent
        assert (await finished(b, sent["run"]["id"]))["status"] == "COMPLETED"
    finally:
        await a.aclose()
        await b.aclose()
        first.kill()
        second.stop()

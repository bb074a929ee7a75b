"""Webhook deliveries survive a `kill -9` of their server: written with their events, sent after the restart.

A thread's first `run.completed` is held by the receiver (no answer: the delivery is in flight, `SENDING`), its
next two wait behind it (`PENDING`: in order per thread), and another thread waits on an approval. The server
gets SIGKILL. The next server on the same database sends each of the three again or for the first time, with the
`webhook-id`s the API showed before the crash, in the thread's order, and pages `request.expired` for the
approval its recovery expired. Nothing is lost, and the only repeat is the delivery that was in flight.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.graphql import make_project, make_thread, workspace
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.webhooks import HOLD, Receiver, verify

ENV = {
    "THREADLOOM_WEBHOOK_ALLOW_LOOPBACK": "1",
    "THREADLOOM_WEBHOOK_RETRY_SCHEDULE": ",".join(["0.2"] * 10),
}  # the default 10 s timeout: the held request is still in flight when the server is killed
CREATE = """mutation($p: ID!, $url: String!) {
  createWebhookEndpoint(input: {projectId: $p, url: $url,
                                events: [RUN_COMPLETED, APPROVAL_REQUESTED, REQUEST_EXPIRED]}) {
    endpoint { id } secret userErrors { code } } }"""
DELIVERIES = """query($e: ID!) { webhookDeliveries(endpointId: $e) {
  webhookId event status sequence thread { id } attempts { number statusCode } } }"""
PENDING = "query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"


class Servers:
    def __init__(self, database_url: str, folder: Path) -> None:
        self.database_url = database_url
        self.data_dir = folder / "data"
        self.all: list[ServerProcess] = []
        first = self.start()
        assert first.admin_token is not None
        self.token: str = first.admin_token

    def start(self) -> ServerProcess:
        server = ServerProcess(self.database_url, self.data_dir, env=ENV).wait_ready()
        self.all.append(server)
        return server


@pytest.fixture
def servers(database_url: str, tmp_path: Path) -> Iterator[Servers]:
    s = Servers(database_url, tmp_path)
    yield s
    for server in s.all:
        server.stop()
        print(server.report(40))  # shown when the test failed


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = await Receiver(plan=[HOLD]).start()
    yield r
    await r.close()


async def _deliveries(client: Client, endpoint: str) -> list[dict[str, Any]]:
    return (await client.gql(DELIVERIES, {"e": endpoint}))["webhookDeliveries"]  # type: ignore[no-any-return]


async def test_deliveries_pending_at_a_kill_9_are_each_delivered_after_the_restart_with_their_ids(
    servers: Servers, receiver: Receiver, tmp_path: Path
) -> None:
    first = servers.all[0]
    client = Client(first.url, servers.token)
    project = await make_project(client, "crash", workspace(tmp_path, "crash"))
    runs, asking = (await make_thread(client, project))["id"], (await make_thread(client, project))["id"]
    made = (await client.gql(CREATE, {"p": project, "url": receiver.url}))["createWebhookEndpoint"]
    assert made["userErrors"] == []
    endpoint, secret = made["endpoint"]["id"], made["secret"]

    await finished(client, (await send(client, runs, "@reply one"))["run"]["id"])
    await receiver.until(lambda r: len(r) == 1)  # run 1's delivery is in flight, held by the receiver
    for text in ("@reply two", "@reply three"):
        await finished(client, (await send(client, runs, text))["run"]["id"])
    await send(client, asking, "@approval echo never")
    await until(lambda: _pending(client, asking))
    await receiver.until(lambda r: any(x.json["type"] == "approval.requested" for x in r))  # another thread: not held

    async def all_four() -> list[dict[str, Any]] | None:
        found = await _deliveries(client, endpoint)
        delivered = [d for d in found if d["event"] == "APPROVAL_REQUESTED" and d["status"] == "DELIVERED"]
        return found if len(found) == 4 and delivered else None

    before = {d["webhookId"]: d for d in await until(all_four)}
    in_order = sorted((d for d in before.values() if d["event"] == "RUN_COMPLETED"), key=lambda d: d["sequence"])
    assert [d["status"] for d in in_order] == ["SENDING", "PENDING", "PENDING"]
    ids = [d["webhookId"] for d in in_order]
    assert receiver.received[0].webhook_id == ids[0]
    await client.aclose()

    first.kill()  # SIGKILL: nothing of its shutdown runs
    second = servers.start()
    client = Client(second.url, servers.token)
    try:
        got = await receiver.until(
            lambda r: (
                {x.webhook_id for x in r if x.answer == 200} >= set(ids)
                and any(x.json["type"] == "request.expired" for x in r if x.answer == 200)
            )
        )
        completed = [x.webhook_id for x in got if x.answer == 200 and x.json["type"] == "run.completed"]
        assert completed == ids  # each once, in the thread's order, with the ids shown before the crash
        assert [x.webhook_id for x in got].count(ids[0]) == 2  # the one in flight, sent again
        assert all(verify(secret, x.headers, x.body) for x in got)
        expired = next(x for x in got if x.json["type"] == "request.expired").json["data"]
        assert expired["threadId"] == asking and expired["request"]["status"] == "EXPIRED"

        async def settled() -> list[dict[str, Any]] | None:
            found = await _deliveries(client, endpoint)
            mine = [d for d in found if d["webhookId"] in ids]
            return mine if all(d["status"] == "DELIVERED" for d in mine) else None

        after = await until(settled)
        assert {d["webhookId"] for d in after} == set(ids)  # no delivery made twice
    finally:
        await client.aclose()


async def _pending(client: Client, thread: str) -> list[dict[str, Any]] | None:
    found = (await client.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"]
    return found or None

"""/metrics on a real server: who may scrape it, that it parses as Prometheus text, that its counters move."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import orjson
from prometheus_client.parser import text_string_to_metric_families

from tests.support.cli import create_token
from tests.support.graphql import make_project, make_thread, workspace
from tests.support.runs import finished_polled, send
from tests.support.server import Client, ServerProcess, free_port, serving
from tests.support.waiting import until
from tests.support.ws import WsClient, slow_socket
from tests.test_streams_limits import BIG

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]

EVENTS = """subscription($t: ID!) {
  threadEvents(threadId: $t, afterSequence: 0) { sequence type entity { __typename ... on Run { status } } }
}"""


def parse(text: str) -> Samples:
    """Every sample by (name, sorted labels); the official parser refuses anything malformed."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


async def scrape(client: Client) -> Samples:
    response = await client.http.get("/metrics", headers=client.headers())
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith("text/plain; version=0.0.4")
    return parse(response.text)


async def test_metrics_need_an_admin_token_for_all_projects(
    server: ServerProcess, client: Client, database_url: str
) -> None:
    anonymous = await client.http.get("/metrics")
    assert anonymous.status_code == 401
    assert anonymous.json()["errors"][0]["extensions"]["code"] == "UNAUTHENTICATED"
    project = await make_project(client, "scoped")
    _, project_admin = create_token(database_url, "admin", project)
    scoped = await client.http.get("/metrics", headers={"authorization": f"Bearer {project_admin}"})
    assert scoped.status_code == 403
    assert scoped.json()["errors"][0]["extensions"]["code"] == "FORBIDDEN"
    assert "threadloom_" not in scoped.text


async def test_counters_move_as_the_api_is_used(server: ServerProcess, client: Client) -> None:
    before = await scrape(client)
    project = await make_project(client, "metrics")
    thread = await make_thread(client, project, "counted")

    await client.gql("query Projects { projects { totalCount } }")
    bad = await client.post("query Broken { projects { noSuchField } }")
    assert bad.json()["errors"][0]["extensions"]["code"] == "GRAPHQL_VALIDATION_FAILED"

    ws = await WsClient.connect(server.url, client.token)
    try:
        await ws.subscribe(EVENTS, {"t": thread["id"]})
        sent = await send(client, thread["id"], "hello")
        done = await finished_polled(client, sent["run"]["id"])
        assert done["status"] == "COMPLETED"
        async for message in ws.items():  # the run's events reach the subscription, up to its completion
            assert message["type"] == "next", message
            if (message["payload"]["data"]["threadEvents"]["entity"] or {}).get("status") == "COMPLETED":
                break
        live = await scrape(client)
        assert value(live, "threadloom_websockets_open") == 1
        assert value(live, "threadloom_subscriptions_open", path="fast") == 1
    finally:
        await ws.close()

    after = await scrape(client)

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("threadloom_requests_total", operation="Projects", status="200") == 1
    assert moved("threadloom_request_duration_seconds_count", operation="Projects") == 1
    assert moved("threadloom_requests_total", operation="", status="200") >= 4  # unnamed: create, send, polls
    assert moved("threadloom_errors_total", code="GRAPHQL_VALIDATION_FAILED") == 1
    assert moved("threadloom_operations_total", operation="Projects", type="query") == 1
    assert moved("threadloom_operations_total", operation="Broken", type="query") == 0  # refused, not executed
    assert moved("threadloom_operations_total", operation="", type="subscription") == 1  # over the WebSocket
    assert moved("threadloom_operations_total", operation="", type="mutation") >= 3  # project, thread, send
    assert moved("threadloom_effects_total", kind="provider-turn.start", outcome="done") == 1
    assert moved("threadloom_subscription_events_total", outcome="delivered", path="fast") >= 3
    assert value(after, "threadloom_runs", status="completed") == 1
    assert value(after, "threadloom_queue_depth") == 0
    assert value(after, "threadloom_outbox_effects", status="pending") == 0
    assert value(after, "threadloom_agent_processes", instance="scripted") == 1
    assert value(after, "threadloom_db_pool_size") > 0
    assert value(after, "threadloom_db_pool_connections", state="checked_out") >= 1  # the scrape's own
    await until(lambda: _closed(client))  # the server saw the socket go


async def _closed(client: Client) -> bool | None:
    samples = await scrape(client)
    return True if value(samples, "threadloom_websockets_open") == 0 else None


async def test_a_localhost_port_serves_metrics_without_a_token(database_url: str, data_dir: Path) -> None:
    port = free_port()
    with serving(database_url, data_dir, {"THREADLOOM_METRICS_PORT": str(port)}):
        async with httpx.AsyncClient() as http:
            response = await http.get(f"http://127.0.0.1:{port}/metrics")
            assert response.status_code == 200
            samples = parse(response.text)
            assert ("threadloom_queue_depth", ()) in samples
            assert (await http.get(f"http://127.0.0.1:{port}/other")).status_code == 404


async def test_slow_consumers_dropped_events_and_replays_are_counted(
    database_url: str, data_dir: Path
) -> None:
    with serving(database_url, data_dir, {"THREADLOOM_SUBSCRIBER_QUEUE": "20"}) as server:
        client = Client(server.url, server.admin_token)
        try:
            root = workspace()
            thread = (await make_thread(client, await make_project(client, "slow", root), "slow"))["id"]
            before = await scrape(client)
            ws = await slow_socket(server.url)  # reads as little as the kernel allows
            await ws.send(orjson.dumps({"type": "connection_init", "payload": {"token": client.token}}).decode())
            assert orjson.loads(await ws.recv())["type"] == "connection_ack"
            payload = {"query": BIG, "variables": {"t": thread, "after": 0}}
            await ws.send(orjson.dumps({"id": "slow", "type": "subscribe", "payload": payload}).decode())
            await send(client, thread, "@await go\n@reply done")  # held: the next messages stay queued
            for _ in range(40):  # ~6 MB: more than the socket buffers and the queue of 20 hold
                last = await send(client, thread, "x" * 150_000, d={"queueAfterActive": True})
            (Path(root) / "go").touch()  # the queued runs now run one after another, and their events pile up
            while True:  # what the server managed to send, then its verdict
                message = orjson.loads(await asyncio.wait_for(ws.recv(), 30))
                if message["type"] == "next" and message["payload"].get("errors"):
                    assert message["payload"]["errors"][0]["extensions"]["code"] == "SUBSCRIBER_TOO_SLOW"
                    break
            # Its `complete` read too: a socket closed with a frame unread waits out websockets' 10 s close
            # timeout (it stops reading while its queue of one frame is full).
            assert orjson.loads(await asyncio.wait_for(ws.recv(), 30)) == {"id": "slow", "type": "complete"}
            await ws.close()
            # The replay below starts once the queued runs are over: live events arriving during a replay
            # are held for at most the queue's 20 frames, and a starved reader would be cut a second time.
            await finished_polled(client, last["run"]["id"])
            again = await WsClient.connect(server.url, client.token)  # a replay of the whole thread
            await again.subscribe(BIG, {"t": thread, "after": 0})
            while (await again.receive())["payload"]["data"]["threadEvents"]["type"] != "synchronized":
                pass
            await again.close()
            after = await scrape(client)
        finally:
            await client.aclose()

    def moved(name: str, **labels: str) -> float:
        return value(after, name, **labels) - value(before, name, **labels)

    assert moved("threadloom_slow_consumers_total") == 1
    assert moved("threadloom_errors_total", code="SUBSCRIBER_TOO_SLOW") == 1
    assert moved("threadloom_subscription_events_total", outcome="dropped", path="fast") >= 1
    latest = value(after, "threadloom_replayed_events_total") - value(before, "threadloom_replayed_events_total")
    assert latest >= 40  # the second subscription read the thread's log from its start

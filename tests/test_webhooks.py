"""Webhooks through a real server and a real receiver (tests/support/webhooks.py) on loopback.

The server runs with `THREADLOOM_WEBHOOK_ALLOW_LOOPBACK=1` (the receiver is http://127.0.0.1), a short retry
schedule (three retries 0.2 s apart: four attempts a delivery), a 5 s attempt timeout (long enough that a
loaded machine does not time out an answered attempt), and endpoints disabled after two deliveries in a row
used up their schedule. Every delivery the receiver gets is checked with the
Standard Webhooks reference algorithm, written apart from the server's code; a forged one must fail it. Waits
are for what the receiver got or what the API shows, never for a time. One server for the module; each test
makes its own project, endpoint and receiver.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.cli import create_token
from tests.support.graphql import make_project, make_thread, workspace
from tests.support.runs import finished, send
from tests.support.server import Client
from tests.support.waiting import until
from tests.support.webhooks import HOLD, Receiver, verify

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)
SERVER_ENV = {
    "THREADLOOM_WEBHOOK_ALLOW_LOOPBACK": "1",
    "THREADLOOM_WEBHOOK_RETRY_SCHEDULE": "0.2,0.2,0.2",
    "THREADLOOM_WEBHOOK_TIMEOUT_SECONDS": "5",
    "THREADLOOM_WEBHOOK_DISABLE_AFTER": "2",
}

ENDPOINT_FIELDS = "id url events description includeSubagents status previousSecretExpiresAt project { id }"
CREATE = f"""mutation($p: ID!, $url: String!, $events: [WebhookEvent!]!, $sub: Boolean! = false) {{
  createWebhookEndpoint(input: {{projectId: $p, url: $url, events: $events, description: "ops",
                                 includeSubagents: $sub}}) {{
    endpoint {{ {ENDPOINT_FIELDS} }} secret userErrors {{ code field }} }} }}"""
UPDATE = f"""mutation($e: ID!, $url: String, $enabled: Boolean, $events: [WebhookEvent!]) {{
  updateWebhookEndpoint(input: {{endpointId: $e, url: $url, enabled: $enabled, events: $events}}) {{
    endpoint {{ {ENDPOINT_FIELDS} }} userErrors {{ code field }} }} }}"""
DELETE = """mutation($e: ID!) { deleteWebhookEndpoint(input: {endpointId: $e}) {
  deletedEndpointId userErrors { code field } } }"""
ROTATE = f"""mutation($e: ID!, $grace: Int) {{ rotateWebhookSecret(input: {{endpointId: $e, graceSeconds: $grace}}) {{
  endpoint {{ {ENDPOINT_FIELDS} }} secret userErrors {{ code field }} }} }}"""
REDELIVER = """mutation($d: ID!) { redeliverWebhook(input: {deliveryId: $d}) {
  delivery { id webhookId status } userErrors { code field } } }"""
ENDPOINTS = "query($p: ID!) { webhookEndpoints(projectId: $p) { id url status } }"
DELIVERIES = """query($e: ID!, $s: WebhookDeliveryStatus) { webhookDeliveries(endpointId: $e, status: $s) {
  id webhookId event status sequence body thread { id }
  attempts { number statusCode latencyMs error message } } }"""
APPROVE = """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) {
  userErrors { code } } }"""
PENDING = "query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"
ACTIVITIES = "query($t: ID!) { thread(id: $t) { activities(last: 50) { nodes { kind summary payload } } } }"
DELEGATE = """mutation($t: ID!, $text: String!) { delegateTask(input: {threadId: $t, text: $text}) {
  thread { id } userErrors { code } } }"""


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    r = await Receiver().start()
    yield r
    await r.close()


async def _endpoint(
    client: Client, project: str, url: str, events: list[str], token: str | None = None, sub: bool = False
) -> dict[str, Any]:
    made = (await client.gql(CREATE, {"p": project, "url": url, "events": events, "sub": sub}, token=token))[
        "createWebhookEndpoint"
    ]
    assert made["userErrors"] == [], made
    assert made["secret"].startswith("whsec_") and len(base64.b64decode(made["secret"][6:])) == 32
    return made  # type: ignore[no-any-return]


async def _deliveries(client: Client, endpoint: str, status: str | None = None) -> list[dict[str, Any]]:
    return (await client.gql(DELIVERIES, {"e": endpoint, "s": status}))["webhookDeliveries"]  # type: ignore[no-any-return]


async def _settled(client: Client, endpoint: str, count: int) -> list[dict[str, Any]]:
    """The endpoint's deliveries once `count` of them are DELIVERED or FAILED (the server recorded the answer)."""

    async def check() -> list[dict[str, Any]] | None:
        found = await _deliveries(client, endpoint)
        done = [d for d in found if d["status"] in ("DELIVERED", "FAILED")]
        return found if len(done) >= count else None

    return await until(check, within=45)


async def _thread(client: Client, tmp_path: Path, name: str) -> tuple[str, str]:
    project = await make_project(client, name, workspace(tmp_path, name))
    return project, (await make_thread(client, project))["id"]


def _forged(secret: str, received: Any) -> None:
    """The reference check refuses what the server did not sign: another body, another secret, another id."""
    assert not verify(secret, received.headers, received.body + b" ")
    other = "whsec_" + base64.b64encode(uuid.uuid4().bytes * 2).decode()
    assert not verify(other, received.headers, received.body)
    assert not verify(secret, {**received.headers, "webhook-id": "msg_forged"}, received.body)


async def test_a_completed_run_is_delivered_signed_after_two_failures_and_a_timeout_with_one_webhook_id(
    client: Client, receiver: Receiver, tmp_path: Path
) -> None:
    project, thread = await _thread(client, tmp_path, "retries")
    made = await _endpoint(client, project, receiver.url, ["RUN_COMPLETED"])
    endpoint, secret = made["endpoint"], made["secret"]
    assert endpoint["status"] == "ACTIVE" and endpoint["events"] == ["RUN_COMPLETED"]
    receiver.plan = [503, 500, HOLD]  # then 200

    sent = await send(client, thread, "@reply hi")
    done = await finished(client, sent["run"]["id"])
    got = await receiver.until(lambda r: any(x.answer == 200 for x in r))
    assert len(got) == 4 and len({r.webhook_id for r in got}) == 1 and got[0].webhook_id.startswith("msg_")
    for request in got:
        assert verify(secret, request.headers, request.body), request.headers
        assert (request.method, request.path) == ("POST", "/hooks")
        assert request.headers["content-type"] == "application/json"
    assert len({r.body for r in got}) == 1  # the same bytes every attempt
    _forged(secret, got[-1])
    body = got[-1].json
    assert body["type"] == "run.completed"
    assert body["data"]["projectId"] == project and body["data"]["threadId"] == thread
    assert body["data"]["run"] == {
        "id": done["id"],
        "ordinal": 1,
        "status": "COMPLETED",
        "statusReason": done["statusReason"],
        "failureCode": None,
    }

    [delivery] = await _settled(client, endpoint["id"], 1)
    assert delivery["status"] == "DELIVERED" and delivery["webhookId"] == got[0].webhook_id
    assert delivery["event"] == "RUN_COMPLETED" and delivery["thread"] == {"id": thread}
    assert delivery["body"] == got[0].body.decode()
    shown = [(a["number"], a["statusCode"], a["error"]) for a in delivery["attempts"]]
    assert shown == [(1, 503, "HTTP_STATUS"), (2, 500, "HTTP_STATUS"), (3, None, "TIMEOUT"), (4, 200, None)]
    assert all(a["latencyMs"] >= 0 for a in delivery["attempts"])
    assert delivery["attempts"][2]["latencyMs"] >= 5000  # the timeout, as set for the test


async def test_an_approval_pages_with_its_prompt_and_the_runs_end_waits_for_it_in_order(
    client: Client, receiver: Receiver, tmp_path: Path
) -> None:
    project, thread = await _thread(client, tmp_path, "approval")
    made = await _endpoint(client, project, receiver.url, ["APPROVAL_REQUESTED", "RUN_COMPLETED", "QUESTION_ASKED"])
    receiver.plan = [503, 503]  # the approval's first two attempts fail

    sent = await send(client, thread, "@approval echo yes > ok.txt\n@reply done")
    request = (await until(lambda: _pending(client, thread)))[0]
    answered = (await client.gql(APPROVE, {"r": request["id"]}))["respondToApproval"]
    assert answered["userErrors"] == []
    await finished(client, sent["run"]["id"])
    got = await receiver.until(lambda r: len([x for x in r if x.answer == 200]) == 2)

    # In order per thread: the run's end is sent only after the approval was delivered.
    assert [(r.json["type"], r.answer) for r in got] == [
        ("approval.requested", 503),
        ("approval.requested", 503),
        ("approval.requested", 200),
        ("run.completed", 200),
    ]
    asked = got[-2].json["data"]
    assert asked["request"]["id"] == request["id"] and asked["request"]["kind"] == "COMMAND_APPROVAL"
    assert asked["request"]["status"] == "PENDING" and asked["request"]["prompt"]["command"] == "echo yes > ok.txt"
    assert asked["run"]["status"] == "WAITING" and asked["threadId"] == thread
    assert all(verify(made["secret"], r.headers, r.body) for r in got)
    deliveries = await _settled(client, made["endpoint"]["id"], 2)
    assert [d["event"] for d in deliveries] == ["RUN_COMPLETED", "APPROVAL_REQUESTED"]  # newest first
    assert deliveries[0]["sequence"] > deliveries[1]["sequence"]


async def _pending(client: Client, thread: str) -> list[dict[str, Any]] | None:
    found = (await client.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"]
    return found or None


async def test_another_projects_admin_sees_no_endpoint_and_changes_none_while_the_owner_can(
    client: Client, database_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    a, _ = await _thread(client, tmp_path, "a")
    b, _ = await _thread(client, tmp_path, "b")
    a_admin = create_token(database_url, "admin", a)[1]
    a_operate = create_token(database_url, "operate", a)[1]
    b_admin = create_token(database_url, "admin", b)[1]
    made = await _endpoint(client, a, receiver.url, ["RUN_COMPLETED"], token=a_admin)
    endpoint = made["endpoint"]["id"]
    twin_b = await _endpoint(client, b, receiver.url, ["RUN_COMPLETED"], token=b_admin)  # B's own: fine

    assert (await client.gql(ENDPOINTS, {"p": a}, token=b_admin))["webhookEndpoints"] is None
    assert (await client.gql(DELIVERIES, {"e": endpoint}, token=b_admin))["webhookDeliveries"] is None
    not_found = [{"code": "NOT_FOUND", "field": "endpointId"}]
    refused_update = await client.gql(UPDATE, {"e": endpoint, "enabled": False}, token=b_admin)
    assert refused_update["updateWebhookEndpoint"] == {"endpoint": None, "userErrors": not_found}
    refused_rotate = (await client.gql(ROTATE, {"e": endpoint}, token=b_admin))["rotateWebhookSecret"]
    assert refused_rotate == {"endpoint": None, "secret": None, "userErrors": not_found}
    refused_delete = (await client.gql(DELETE, {"e": endpoint}, token=b_admin))["deleteWebhookEndpoint"]
    assert refused_delete == {"deletedEndpointId": None, "userErrors": not_found}
    into_a = await client.gql(CREATE, {"p": a, "url": receiver.url, "events": ["RUN_FAILED"]}, token=b_admin)
    assert into_a["createWebhookEndpoint"]["userErrors"] == [{"code": "NOT_FOUND", "field": "projectId"}]
    under = (await client.gql(UPDATE, {"e": endpoint, "enabled": False}, token=a_operate))["updateWebhookEndpoint"]
    assert [e["code"] for e in under["userErrors"]] == ["FORBIDDEN"]
    listed = await client.post(ENDPOINTS, {"p": a}, token=a_operate)
    assert listed.json()["errors"][0]["extensions"]["code"] == "FORBIDDEN"

    # The twins: A's admin sees and changes its endpoint; B's admin its own.
    assert (await client.gql(ENDPOINTS, {"p": a}, token=a_admin))["webhookEndpoints"] == [
        {"id": endpoint, "url": receiver.url, "status": "ACTIVE"}
    ]
    assert (await client.gql(DELIVERIES, {"e": endpoint}, token=a_admin))["webhookDeliveries"] == []
    off = (await client.gql(UPDATE, {"e": endpoint, "enabled": False}, token=a_admin))["updateWebhookEndpoint"]
    assert off["userErrors"] == [] and off["endpoint"]["status"] == "DISABLED"
    assert [e["id"] for e in (await client.gql(ENDPOINTS, {"p": b}, token=b_admin))["webhookEndpoints"]] == [
        twin_b["endpoint"]["id"]
    ]
    gone = (await client.gql(DELETE, {"e": endpoint}, token=a_admin))["deleteWebhookEndpoint"]
    assert gone == {"deletedEndpointId": endpoint, "userErrors": []}
    assert (await client.gql(ENDPOINTS, {"p": a}, token=a_admin))["webhookEndpoints"] == []


async def test_redelivery_sends_the_same_webhook_id_and_body_again(
    client: Client, database_url: str, receiver: Receiver, tmp_path: Path
) -> None:
    project, thread = await _thread(client, tmp_path, "redeliver")
    made = await _endpoint(client, project, receiver.url, ["RUN_COMPLETED"])
    await finished(client, (await send(client, thread, "@reply once"))["run"]["id"])
    [delivery] = await _settled(client, made["endpoint"]["id"], 1)
    other_admin = create_token(database_url, "admin", (await _thread(client, tmp_path, "other"))[0])[1]
    refused = (await client.gql(REDELIVER, {"d": delivery["id"]}, token=other_admin))["redeliverWebhook"]
    assert refused == {"delivery": None, "userErrors": [{"code": "NOT_FOUND", "field": "deliveryId"}]}

    again = (await client.gql(REDELIVER, {"d": delivery["id"]}))["redeliverWebhook"]
    assert again["userErrors"] == [] and again["delivery"]["webhookId"] == delivery["webhookId"]
    got = await receiver.until(lambda r: len(r) == 2)
    assert got[0].webhook_id == got[1].webhook_id == delivery["webhookId"] and got[0].body == got[1].body
    assert verify(made["secret"], got[1].headers, got[1].body)

    async def two_attempts() -> list[dict[str, Any]] | None:
        [d] = await _deliveries(client, made["endpoint"]["id"])
        return d["attempts"] if d["status"] == "DELIVERED" and len(d["attempts"]) == 2 else None

    attempts = await until(two_attempts)
    assert [(a["number"], a["statusCode"]) for a in attempts] == [(1, 200), (2, 200)]


async def test_a_rotated_secret_signs_beside_the_old_one_during_its_grace_and_alone_after(
    client: Client, receiver: Receiver, tmp_path: Path
) -> None:
    project, thread = await _thread(client, tmp_path, "rotation")
    made = await _endpoint(client, project, receiver.url, ["RUN_COMPLETED"])
    first = made["secret"]
    rotated = (await client.gql(ROTATE, {"e": made["endpoint"]["id"], "grace": 3600}))["rotateWebhookSecret"]
    second = rotated["secret"]
    assert rotated["userErrors"] == [] and second != first and rotated["endpoint"]["previousSecretExpiresAt"]

    await finished(client, (await send(client, thread, "@reply during grace"))["run"]["id"])
    [during] = await receiver.until(lambda r: len(r) == 1)
    assert len(during.signatures) == 2  # both secrets sign: a receiver with either verifies
    assert verify(first, during.headers, during.body) and verify(second, during.headers, during.body)

    now = (await client.gql(ROTATE, {"e": made["endpoint"]["id"], "grace": 0}))["rotateWebhookSecret"]
    third = now["secret"]
    assert now["endpoint"]["previousSecretExpiresAt"] is None
    await finished(client, (await send(client, thread, "@reply after"))["run"]["id"])
    after = (await receiver.until(lambda r: len(r) == 2))[1]
    assert len(after.signatures) == 1 and verify(third, after.headers, after.body)
    assert not verify(second, after.headers, after.body) and not verify(first, after.headers, after.body)
    bad_grace = (await client.gql(ROTATE, {"e": made["endpoint"]["id"], "grace": -1}))["rotateWebhookSecret"]
    assert bad_grace["userErrors"] == [{"code": "INVALID_INPUT", "field": "graceSeconds"}]


async def test_egress_refusals_have_stable_codes_and_change_nothing(
    client: Client, receiver: Receiver, tmp_path: Path
) -> None:
    project, _ = await _thread(client, tmp_path, "egress")
    cases = {
        "ftp://example.com/hook": "WEBHOOK_URL_NOT_ALLOWED",
        "http://example.com/hook": "WEBHOOK_URL_NOT_ALLOWED",  # http only to loopback
        "http://10.0.0.7/hook": "WEBHOOK_URL_NOT_ALLOWED",
        "https://user:pw@example.com/hook": "WEBHOOK_URL_NOT_ALLOWED",
        "not a url": "WEBHOOK_URL_NOT_ALLOWED",
        "https://10.0.0.7/hook": "WEBHOOK_TARGET_NOT_ALLOWED",
        "https://192.168.1.2/hook": "WEBHOOK_TARGET_NOT_ALLOWED",
        "https://169.254.169.254/latest/meta-data": "WEBHOOK_TARGET_NOT_ALLOWED",
        "https://[::ffff:10.0.0.7]/hook": "WEBHOOK_TARGET_NOT_ALLOWED",
        "https://[fd00::1]/hook": "WEBHOOK_TARGET_NOT_ALLOWED",
        "https://0.0.0.0/hook": "WEBHOOK_TARGET_NOT_ALLOWED",
    }
    for url, code in cases.items():
        refused = await client.gql(CREATE, {"p": project, "url": url, "events": ["RUN_COMPLETED"]})
        assert refused["createWebhookEndpoint"] == {
            "endpoint": None,
            "secret": None,
            "userErrors": [{"code": code, "field": "url"}],
        }, url
    no_events = await client.gql(CREATE, {"p": project, "url": receiver.url, "events": []})
    assert no_events["createWebhookEndpoint"]["userErrors"] == [{"code": "INVALID_INPUT", "field": "events"}]
    assert (await client.gql(ENDPOINTS, {"p": project}))["webhookEndpoints"] == []  # nothing was made

    made = await _endpoint(client, project, receiver.url, ["RUN_COMPLETED"])  # the loopback twin (allowed here)
    moved = await client.gql(UPDATE, {"e": made["endpoint"]["id"], "url": "https://10.1.2.3/x"})
    assert moved["updateWebhookEndpoint"]["userErrors"] == [{"code": "WEBHOOK_TARGET_NOT_ALLOWED", "field": "url"}]
    listed = (await client.gql(ENDPOINTS, {"p": project}))["webhookEndpoints"]
    assert listed == [{"id": made["endpoint"]["id"], "url": receiver.url, "status": "ACTIVE"}]


async def test_a_redirect_is_not_followed_and_an_endpoint_that_keeps_failing_is_disabled_with_an_activity(
    client: Client, receiver: Receiver, tmp_path: Path
) -> None:
    project, thread = await _thread(client, tmp_path, "failing")
    made = await _endpoint(client, project, receiver.url, ["RUN_COMPLETED"])
    endpoint = made["endpoint"]["id"]
    receiver.default = 307  # every answer a redirect to /elsewhere

    await finished(client, (await send(client, thread, "@reply one"))["run"]["id"])
    [first] = await _settled(client, endpoint, 1)
    assert first["status"] == "FAILED" and [a["statusCode"] for a in first["attempts"]] == [307] * 4
    assert "redirects are not followed" in first["attempts"][0]["message"]
    assert (await client.gql(ENDPOINTS, {"p": project}))["webhookEndpoints"][0]["status"] == "FAILING"

    await finished(client, (await send(client, thread, "@reply two"))["run"]["id"])
    await _settled(client, endpoint, 2)

    async def disabled() -> list[dict[str, Any]] | None:
        found = (await client.gql(ACTIVITIES, {"t": thread}))["thread"]["activities"]["nodes"]
        return [a for a in found if a["kind"] == "webhook.endpoint_disabled"] or None

    [activity] = await until(disabled)
    assert activity["payload"]["endpointId"] == endpoint and activity["payload"]["url"] == receiver.url
    assert "2 deliveries in a row" in activity["summary"]
    assert (await client.gql(ENDPOINTS, {"p": project}))["webhookEndpoints"][0]["status"] == "DISABLED"
    assert {r.path for r in receiver.received} == {"/hooks"} and len(receiver.received) == 8  # never /elsewhere
    metrics = (await client.http.get("/metrics", headers=client.headers())).text
    assert _metric(metrics, "threadloom_webhook_endpoints_disabled_total") >= 1
    assert _metric(metrics, 'threadloom_webhook_attempts_total{outcome="http_status"}') >= 8

    # Disabled: a new run's event gets no delivery; enabled again, the next one does.
    await finished(client, (await send(client, thread, "@reply three"))["run"]["id"])
    assert len(await _deliveries(client, endpoint)) == 2
    on = (await client.gql(UPDATE, {"e": endpoint, "enabled": True}))["updateWebhookEndpoint"]
    assert on["endpoint"]["status"] == "ACTIVE"
    receiver.default = 200
    await finished(client, (await send(client, thread, "@reply four"))["run"]["id"])
    delivered = await _settled(client, endpoint, 3)
    assert [d["status"] for d in delivered] == ["DELIVERED", "FAILED", "FAILED"]


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


async def test_a_subagents_run_pages_only_an_endpoint_that_includes_subagents(client: Client, tmp_path: Path) -> None:
    project, thread = await _thread(client, tmp_path, "subagents")
    plain_receiver, sub_receiver = await Receiver().start(), await Receiver().start()
    try:
        plain = await _endpoint(client, project, plain_receiver.url, ["RUN_COMPLETED"])
        with_sub = await _endpoint(client, project, sub_receiver.url, ["RUN_COMPLETED"], sub=True)
        assert with_sub["endpoint"]["includeSubagents"] is True and plain["endpoint"]["includeSubagents"] is False
        delegated = (await client.gql(DELEGATE, {"t": thread, "text": "@reply from the child"}))["delegateTask"]
        assert delegated["userErrors"] == []
        child = delegated["thread"]["id"]
        got = await sub_receiver.until(lambda r: any(x.json["data"]["threadId"] == child for x in r))
        assert got[0].json["type"] == "run.completed"
        # The delivery rows of one event are written together: the plain endpoint's list has none for it.
        assert [d["thread"]["id"] for d in await _deliveries(client, plain["endpoint"]["id"])] == []
        await finished(client, (await send(client, thread, "@reply parent"))["run"]["id"])
        parent = await plain_receiver.until(lambda r: len(r) == 1)
        assert parent[0].json["data"]["threadId"] == thread
    finally:
        await plain_receiver.close()
        await sub_receiver.close()


SET_BUDGET = """mutation($t: ID!) { setBudget(input: {threadId: $t, maxTokens: 100, window: TOTAL, action: STOP}) {
  budget { id } userErrors { code } } }"""


async def test_a_budget_passed_pages_with_its_limit_and_what_was_spent(
    client: Client, receiver: Receiver, tmp_path: Path
) -> None:
    project, thread = await _thread(client, tmp_path, "budget")
    made = await _endpoint(client, project, receiver.url, ["BUDGET_EXCEEDED"])
    budget = (await client.gql(SET_BUDGET, {"t": thread}))["setBudget"]
    assert budget["userErrors"] == []

    sent = await send(client, thread, "@usage 150 30\n@reply over the limit")
    await finished(client, sent["run"]["id"])
    [paged] = await receiver.until(lambda r: len(r) == 1)
    assert verify(made["secret"], paged.headers, paged.body)
    assert paged.json["type"] == "budget.exceeded"
    data = paged.json["data"]
    assert data["threadId"] == thread and data["run"]["id"] == sent["run"]["id"]
    assert data["budget"] == {
        "id": budget["budget"]["id"], "window": "TOTAL", "action": "STOP", "maxCostUsd": None, "maxTokens": 100,
        "spentCostUsd": 0.0, "spentTokens": 180,
    }  # fmt: skip
    assert data["requestId"] is None

"""The pure webhook rules (domain/webhooks.py, webhook_signing.py, webhook_egress.py), without a server.

Signatures are checked against the reference check in tests/support/webhooks.py, written from the Standard
Webhooks text apart from the server's code. The egress table covers what the live test cannot set on its shared
server: loopback refused without the operator's flag, private networks allowed with theirs.
"""

from __future__ import annotations

import base64
import random
import re
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest
from graphql import parse as parse_graphql
from graphql import validate

from tests.support.webhooks import verify
from threadloom.api.schema import build_schema
from threadloom.domain import webhook_signing as signing
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change
from threadloom.domain.entities import RuntimeRequest
from threadloom.domain.errors import DomainError
from threadloom.domain.ids import new_id
from threadloom.domain.interruption import STOP_HOLD_REASON
from threadloom.domain.statuses import ResponseCapability, RuntimeRequestKind, RuntimeRequestStatus
from threadloom.domain.webhook_egress import parse, refused_address
from threadloom.domain.webhooks import (
    DEFAULT_SCHEDULE,
    MAX_BODY_BYTES,
    EndpointStatus,
    Health,
    WebhookEvent,
    WebhookPolicy,
    after_attempt,
    hooks_of,
    retry_delay,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
OPEN = WebhookPolicy(allow_loopback=True, allow_private=True)


def test_signatures_verify_with_the_reference_check_and_only_with_their_own_secret() -> None:
    rng = random.Random(7)
    for _ in range(50):
        secret, other = signing.new_secret(), signing.new_secret()
        body = orjson.dumps({"type": "run.completed", "data": {"x": rng.random(), "text": "é ✓"}})
        msg_id, ts = f"msg_{uuid.uuid4().hex}", int(time.time())
        header = signing.signature_header([secret], msg_id, ts, body)
        headers = {"webhook-id": msg_id, "webhook-timestamp": str(ts), "webhook-signature": header}
        assert header.startswith("v1,") and verify(secret, headers, body)
        assert not verify(other, headers, body) and not verify(secret, headers, body[:-1])
        assert not verify(secret, {**headers, "webhook-timestamp": str(ts + 1)}, body)
        both = signing.signature_header([other, secret], msg_id, ts, body)
        assert verify(secret, {**headers, "webhook-signature": both}, body)  # either key of a rotation verifies
    assert len(base64.b64decode(signing.new_secret().removeprefix("whsec_"))) == 32
    with pytest.raises(ValueError):
        signing.key_of("sk_live_123")


def test_an_old_timestamp_fails_the_reference_check() -> None:
    secret, body = signing.new_secret(), b"{}"
    old = int(time.time()) - 600
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(old)}
    headers["webhook-signature"] = signing.sign(secret, "msg_1", old, body)
    assert not verify(secret, headers, body) and verify(secret, headers, body, now=old + 10)


def test_the_default_schedule_spans_about_three_days_and_each_delay_is_jittered_within_ten_percent() -> None:
    policy = WebhookPolicy()
    assert 3 * 86400 < sum(DEFAULT_SCHEDULE) < 3.2 * 86400 and len(DEFAULT_SCHEDULE) == 9
    for attempts, base in enumerate(DEFAULT_SCHEDULE, start=1):
        low, high = retry_delay(policy, attempts, 0.0), retry_delay(policy, attempts, 0.999999)
        assert low is not None and high is not None
        assert low == pytest.approx(base * 0.9) and high == pytest.approx(base * 1.1, rel=1e-5)
    assert retry_delay(policy, len(DEFAULT_SCHEDULE) + 1, 0.5) is None


def test_settings_come_from_the_environment_and_a_bad_value_names_its_variable() -> None:
    policy = WebhookPolicy.from_env(
        {
            "THREADLOOM_WEBHOOK_RETRY_SCHEDULE": "1, 2.5,60",
            "THREADLOOM_WEBHOOK_TIMEOUT_SECONDS": "0.5",
            "THREADLOOM_WEBHOOK_ALLOW_LOOPBACK": "1",
            "THREADLOOM_WEBHOOK_DISABLE_AFTER": "3",
        }
    )
    assert policy == WebhookPolicy((1.0, 2.5, 60.0), 0.5, True, False, 3)
    assert WebhookPolicy.from_env({}) == WebhookPolicy()
    for name, value in (
        ("THREADLOOM_WEBHOOK_RETRY_SCHEDULE", "5,soon"),
        ("THREADLOOM_WEBHOOK_RETRY_SCHEDULE", "-1"),
        ("THREADLOOM_WEBHOOK_TIMEOUT_SECONDS", "0"),
        ("THREADLOOM_WEBHOOK_DISABLE_AFTER", "0"),
    ):
        with pytest.raises(ValueError, match=name):
            WebhookPolicy.from_env({name: value})


@pytest.mark.parametrize(
    ("url", "policy", "code"),
    [
        ("https://hooks.example.com/a?b=1", WebhookPolicy(), None),
        ("http://127.0.0.1:9/x", WebhookPolicy(), "WEBHOOK_URL_NOT_ALLOWED"),  # loopback needs the flag
        ("http://localhost:9/x", WebhookPolicy(), "WEBHOOK_URL_NOT_ALLOWED"),
        ("https://127.0.0.1/x", WebhookPolicy(), "WEBHOOK_TARGET_NOT_ALLOWED"),
        ("https://localhost/x", WebhookPolicy(), "WEBHOOK_TARGET_NOT_ALLOWED"),
        ("http://127.0.0.1:9/x", OPEN, None),
        ("http://[::1]:9/x", OPEN, None),
        ("http://10.0.0.1/x", OPEN, "WEBHOOK_URL_NOT_ALLOWED"),  # http only to loopback, whatever else is allowed
        ("https://10.0.0.1/x", WebhookPolicy(), "WEBHOOK_TARGET_NOT_ALLOWED"),
        ("https://10.0.0.1/x", OPEN, None),
        ("https://100.64.0.1/x", WebhookPolicy(), "WEBHOOK_TARGET_NOT_ALLOWED"),
        ("https://169.254.169.254/x", OPEN, "WEBHOOK_TARGET_NOT_ALLOWED"),  # link-local: never
        ("https://[ff02::1]/x", OPEN, "WEBHOOK_TARGET_NOT_ALLOWED"),
        ("https://0.0.0.0/x", OPEN, "WEBHOOK_TARGET_NOT_ALLOWED"),
        ("https://a:b@example.com/x", OPEN, "WEBHOOK_URL_NOT_ALLOWED"),
        ("https://example.com/x#frag", OPEN, "WEBHOOK_URL_NOT_ALLOWED"),
        ("https://example.com:99999/x", OPEN, "WEBHOOK_URL_NOT_ALLOWED"),
        ("file:///etc/passwd", OPEN, "WEBHOOK_URL_NOT_ALLOWED"),
        ("https://example.com/" + "a" * 2100, OPEN, "WEBHOOK_URL_NOT_ALLOWED"),
    ],
)
def test_a_url_is_refused_by_its_form_scheme_or_literal_address(
    url: str, policy: WebhookPolicy, code: str | None
) -> None:
    if code is None:
        parse(url, policy)
        return
    with pytest.raises(DomainError) as refused:
        parse(url, policy)
    assert (refused.value.code, refused.value.field) == (code, "url")


def test_a_parsed_target_names_the_host_port_and_path_the_request_uses() -> None:
    target = parse("https://Hooks.Example.com/in?x=1", WebhookPolicy())
    assert (target.host, target.port, target.path, target.host_header, target.tls) == (
        "hooks.example.com",
        443,
        "/in?x=1",
        "hooks.example.com",
        True,
    )
    local = parse("http://[::1]:8080", OPEN)
    assert (local.host, local.port, local.path, local.host_header, local.tls) == ("::1", 8080, "/", "[::1]:8080", False)


def test_every_resolved_address_is_checked_by_the_same_rules() -> None:
    strict = WebhookPolicy()
    assert refused_address("93.184.216.34", "https", strict) is None
    assert refused_address("2606:2800:220:1:248:1893:25c8:1946", "https", strict) is None
    assert refused_address("10.1.2.3", "https", strict) and refused_address("::ffff:192.168.0.1", "https", strict)
    assert refused_address("127.0.0.1", "https", strict) and refused_address("127.0.0.1", "http", OPEN) is None
    assert refused_address("fe80::1%eth0", "https", OPEN)  # link-local, even where private is allowed
    assert refused_address("93.184.216.34", "http", OPEN)  # plain http never leaves loopback


def test_an_endpoint_fails_after_a_used_up_schedule_and_is_disabled_after_more_or_a_410() -> None:
    policy = WebhookPolicy(disable_after=3)
    active = Health(EndpointStatus.ACTIVE, 0)
    assert after_attempt(active, policy, delivered=False, exhausted=False, status_code=500) == active
    failing = after_attempt(active, policy, delivered=False, exhausted=True, status_code=500)
    assert failing == Health(EndpointStatus.FAILING, 1)
    twice = after_attempt(failing, policy, delivered=False, exhausted=True, status_code=None)
    assert twice == Health(EndpointStatus.FAILING, 2)
    assert after_attempt(twice, policy, delivered=True, exhausted=False, status_code=200) == active
    off = after_attempt(twice, policy, delivered=False, exhausted=True, status_code=500)
    assert off == Health(EndpointStatus.DISABLED, 3)
    assert after_attempt(off, policy, delivered=True, exhausted=False, status_code=200) == off  # only a person
    gone = after_attempt(active, policy, delivered=False, exhausted=False, status_code=410)
    assert gone.status == EndpointStatus.DISABLED


def _request(thread: uuid.UUID, status: RuntimeRequestStatus, prompt: str = "rm -rf build") -> RuntimeRequest:
    return RuntimeRequest(
        id=new_id(),
        thread_id=thread,
        run_id=new_id(),
        node_id=new_id(),
        kind=RuntimeRequestKind.COMMAND_APPROVAL,
        status=status,
        response_capability=ResponseCapability.LIVE,
        payload={"command": prompt, "secretish": "not copied"},
        created_at=NOW,
    )


def test_only_the_listed_happenings_become_webhook_events_each_at_its_changes_offset() -> None:
    thread = new_id()
    changes = [
        activity(thread, ActivityKind.RUN_STARTED, "started", NOW, new_id),
        activity(thread, ActivityKind.QUEUE_HELD, STOP_HOLD_REASON, NOW, new_id),
        activity(thread, ActivityKind.QUEUE_HELD, "held by a failed run", NOW, new_id),
        Change.updated(_request(thread, RuntimeRequestStatus.EXPIRED)),
        Change.updated(_request(thread, RuntimeRequestStatus.RESOLVED)),
        activity(thread, ActivityKind.ROLLBACK_COMPLETED, "rolled back", NOW, new_id),
        activity(thread, ActivityKind.LINEAGE_FORKED, "forked", NOW, new_id, payload={"sourceThreadId": str(thread)}),
    ]
    hooks = hooks_of(changes, new_id(), NOW, new_id)
    assert [(h.offset, h.event) for h in hooks] == [
        (2, WebhookEvent.THREAD_STOPPED),
        (4, WebhookEvent.REQUEST_EXPIRED),
        (6, WebhookEvent.ROLLBACK_COMPLETED),
        (7, WebhookEvent.FORK_CREATED),
    ]
    assert len({h.message_id for h in hooks}) == 4 and all(h.message_id.startswith("msg_") for h in hooks)
    body = orjson.loads(hooks[1].body)
    assert body["type"] == "request.expired" and body["timestamp"] == NOW.isoformat()
    assert body["data"]["request"]["prompt"] == {"command": "rm -rf build"}  # what a person needs, nothing else
    assert hooks[0].body == orjson.dumps(orjson.loads(hooks[0].body)).decode()  # compact JSON, as signed
    assert hooks[0].row()["run_event"] is False
    assert hooks_of([], None, NOW, new_id) == []


def test_a_body_over_the_cap_leaves_the_prompt_out_and_says_so() -> None:
    thread = new_id()
    huge = Change.updated(_request(thread, RuntimeRequestStatus.EXPIRED, prompt="x" * (MAX_BODY_BYTES + 10)))
    [hook] = hooks_of([huge], new_id(), NOW, new_id)
    body = orjson.loads(hook.body)
    assert len(hook.body) < MAX_BODY_BYTES and body["data"]["truncated"] is True
    assert body["data"]["request"]["prompt"] is None and body["data"]["request"]["status"] == "EXPIRED"


DOC = Path(__file__).resolve().parents[1] / "docs" / "webhooks.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", DOC.read_text(), re.S | re.M)


def test_the_docs_operations_are_valid_against_the_schema() -> None:
    schema = build_schema()._schema
    blocks = _blocks("graphql")
    assert len(blocks) == 5
    for block in blocks:
        assert validate(schema, parse_graphql(block)) == [], block


def test_the_docs_verify_function_accepts_a_real_signature_and_refuses_a_forged_one() -> None:
    [code] = _blocks("python")
    scope: dict[str, object] = {}
    exec(code, scope)  # the reader's copy, as written
    doc_verify = scope["verify"]
    assert callable(doc_verify)
    secret, body, ts = signing.new_secret(), b'{"type":"run.completed"}', int(time.time())
    headers = {"webhook-id": "msg_1", "webhook-timestamp": str(ts)}
    headers["webhook-signature"] = signing.signature_header([signing.new_secret(), secret], "msg_1", ts, body)
    assert doc_verify(secret, headers, body) and not doc_verify(secret, headers, body + b"\n")

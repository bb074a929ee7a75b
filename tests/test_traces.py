"""OpenTelemetry on a real server, through the standard environment and the SDK's console exporter:
one `sendMessage` is one trace holding the operation, its SQL, and the effect that started the turn."""

from __future__ import annotations

import json
import queue
import time
from pathlib import Path
from typing import Any

from tests.support.graphql import make_project, make_thread
from tests.support.runs import finished
from tests.support.server import Client, ServerProcess, serving
from threadloom import tracing

SEND = """mutation SendHello($t: ID!) {
  sendMessage(input: {threadId: $t, text: "hello"}) { run { id } userErrors { code } }
}"""

TRACING = {"OTEL_TRACES_EXPORTER": "console", "OTEL_BSP_SCHEDULE_DELAY": "50", "OTEL_SERVICE_NAME": "threadloom-test"}


class Spans:
    """The spans the server's console exporter printed (pretty JSON objects, one after another)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.buffer = ""
        self.all: list[dict[str, Any]] = []

    def read(self) -> None:
        while True:
            try:
                self.buffer += self.server.lines.get_nowait() + "\n"
            except queue.Empty:
                break
        decoder = json.JSONDecoder()
        while (start := self.buffer.find("{")) >= 0:
            try:
                span, end = decoder.raw_decode(self.buffer, start)
            except json.JSONDecodeError:
                return  # the rest of this span is still on its way
            self.all.append(span)
            self.buffer = self.buffer[end:]

    def until(self, found: Any, within: float = 30.0) -> Any:
        """Read spans until `found(spans)` is not None (the exporter flushes every 50 ms)."""
        deadline = time.monotonic() + within
        while True:
            self.read()
            result = found(self.all)
            if result is not None or time.monotonic() > deadline:
                assert result is not None, [s["name"] for s in self.all]
                return result
            time.sleep(0.05)


def _trace_of(spans: list[dict[str, Any]], trace_id: str) -> list[dict[str, Any]]:
    return [s for s in spans if s["context"]["trace_id"] == trace_id]


def _under(span: dict[str, Any], ancestor: dict[str, Any], spans: list[dict[str, Any]]) -> bool:
    by_id = {s["context"]["span_id"]: s for s in spans}
    parent = span.get("parent_id")
    while parent is not None:
        if parent == ancestor["context"]["span_id"]:
            return True
        parent = by_id[parent].get("parent_id") if parent in by_id else None
    return False


async def test_one_send_message_is_one_trace(database_url: str, data_dir: Path) -> None:
    with serving(database_url, data_dir, TRACING) as server:
        client = Client(server.url, server.admin_token)
        try:
            project = await make_project(client, "traced")
            thread = await make_thread(client, project, "traced")
            sent = await client.gql(SEND, {"t": thread["id"]})
            await finished(client, sent["sendMessage"]["run"]["id"])
        finally:
            await client.aclose()
        spans = Spans(server)

        def operation(all: list[dict[str, Any]]) -> dict[str, Any] | None:
            return next((s for s in all if s["name"] == "mutation SendHello"), None)

        mutation = spans.until(operation)
        assert mutation["attributes"]["graphql.operation.name"] == "SendHello"
        assert mutation["resource"]["attributes"]["service.name"] == "threadloom-test"
        trace_id = mutation["context"]["trace_id"]

        def effect_and_call(all: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Any]] | None:
            mine = _trace_of(all, trace_id)
            effect = next((s for s in mine if s["name"] == "effect provider-turn.start"), None)
            call = next((s for s in mine if s["name"] == "provider start_turn"), None)
            return (effect, call) if effect is not None and call is not None else None

        effect, call = spans.until(effect_and_call)
        trace = _trace_of(spans.all, trace_id)
        # The HTTP request is the root; the operation, its SQL, the effect it enqueued and the provider
        # call that effect made all hang below it.
        (root,) = [s for s in trace if s.get("parent_id") is None]
        assert root["name"].startswith("POST") and root["kind"] == "SpanKind.SERVER"
        assert _under(mutation, root, trace)
        sql = [s for s in trace if s["attributes"].get("db.system") == "postgresql" and _under(s, mutation, trace)]
        texts = [s["attributes"]["db.statement"].upper() for s in sql]
        # Its reads, and its writes (the events and projections go in one statement, a WITH of INSERTs).
        assert any(text.startswith("SELECT") for text in texts), texts
        assert any("INSERT INTO EVENTS" in text for text in texts), texts
        assert _under(effect, mutation, trace)
        assert _under(call, effect, trace)
        assert any(s["attributes"].get("db.system") == "postgresql" and _under(s, effect, trace) for s in trace)
        # No span per field: the operation's children are SQL statements (and nothing named by a field).
        assert not [s for s in trace if "sendMessage" in s["name"] or s["name"].startswith("resolve")]


def test_traces_are_off_unless_the_environment_names_an_exporter() -> None:
    assert not tracing.wanted({})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "none"})
    assert not tracing.wanted({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "true"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "console", "OTEL_SDK_DISABLED": "false"})
    assert tracing.wanted({"OTEL_TRACES_EXPORTER": "otlp,console"})
    assert not tracing.ENABLED  # this test process set nothing: every hook is a no-op

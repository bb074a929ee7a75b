"""The process's Prometheus counters (docs/operations.md lists every metric).

A leaf module every layer may import: the hot paths only increment a counter here (a lock and an
add, ~0.3 µs), once per batch where there is a batch. Gauges that need the database or the live
objects of the API (runs by status, outbox backlog, open sockets …) are not kept up to date here:
`api/metrics.py` reads them when /metrics is scraped.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from prometheus_client import Counter, Histogram

# Operation names come from clients: past this many distinct names, new ones count as "other",
# so a client naming every request differently cannot grow the scrape without bound.
MAX_OPERATION_LABELS = 200
_operations: set[str] = set()

REQUESTS = Counter(
    "threadloom_requests", "GraphQL HTTP requests, by operation name and HTTP status.", ["operation", "status"]
)
REQUEST_SECONDS = Histogram(
    "threadloom_request_duration_seconds",
    "Time from a GraphQL HTTP request's arrival to its response's end, by operation name.",
    ["operation"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0),
)
OPERATIONS = Counter(
    "threadloom_operations",
    "GraphQL operations executed over any transport (HTTP, WebSocket), by operation name and type; "
    "operations refused before execution (parse, validation, auth) are not counted.",
    ["operation", "type"],
)
ERRORS = Counter("threadloom_errors", "Top-level errors sent to clients, by extensions.code.", ["code"])
EVENTS = Counter(
    "threadloom_subscription_events",
    "Log events handed to subscriptions (delivered) or thrown away for a slow consumer (dropped), "
    "by subscription path (fast: cohorts; general: per-subscription mailboxes).",
    ["outcome", "path"],
)
DELIVERED_FAST = EVENTS.labels("delivered", "fast")
DELIVERED_GENERAL = EVENTS.labels("delivered", "general")
DROPPED_FAST = EVENTS.labels("dropped", "fast")
DROPPED_GENERAL = EVENTS.labels("dropped", "general")
SLOW_CONSUMERS = Counter(
    "threadloom_slow_consumers", "Subscriptions ended with SUBSCRIBER_TOO_SLOW (their queue overflowed)."
)
REPLAYED = Counter(
    "threadloom_replayed_events", "Log events read to replay a subscription's history after its cursor."
)
EFFECTS = Counter("threadloom_effects", "Outbox effects run, by kind and outcome.", ["kind", "outcome"])
IO_IN_TRANSACTION = Counter(
    "threadloom_io_in_transaction",
    "git or agent calls made while a database write transaction was open (threadloom.io_guard), by kind.",
    ["kind"],
)

# Usage the agents reported (docs/usage.md), counted after each commit that records it.
USAGE_TOKENS = Counter(
    "threadloom_usage_tokens",
    "Tokens of the model calls agents reported, by project, provider instance and kind: input (every input "
    "token), cached_input and cache_write (parts of input), output (every output token), reasoning (part of "
    "output).",
    ["project", "instance", "kind"],
)
USAGE_COST = Counter(
    "threadloom_usage_cost_usd",
    "USD of the recorded model calls whose cost is known (REPORTED or PRICED), by project and provider instance.",
    ["project", "instance"],
)
USAGE_RECORDS = Counter(
    "threadloom_usage_records",
    "Usage records written (a call, or a query's reported cost), by project, provider instance and cost source.",
    ["project", "instance", "cost_source"],
)
_KINDS = (
    ("input", "input_tokens"),
    ("cached_input", "cached_input_tokens"),
    ("cache_write", "cache_write_tokens"),
    ("output", "output_tokens"),
    ("reasoning", "reasoning_tokens"),
)


def usage(project: str, records: Iterable[Any]) -> None:
    """Count usage records (`domain.entities.UsageRecord`) of a project, once each, after their commit."""
    for record in records:
        instance = record.provider_instance_id
        for kind, field in _KINDS:
            value = getattr(record, field)
            if value:
                USAGE_TOKENS.labels(project, instance, kind).inc(value)
        if record.cost_nano_usd is not None:
            USAGE_COST.labels(project, instance).inc(record.cost_nano_usd / 1e9)
        USAGE_RECORDS.labels(project, instance, str(record.cost_source)).inc()


def operation_label(name: object) -> str:
    """The label for an operation name: "" for none, "other" past `MAX_OPERATION_LABELS` names."""
    if not isinstance(name, str):
        return ""
    name = name[:100]
    if name in _operations:
        return name
    if len(_operations) >= MAX_OPERATION_LABELS:
        return "other"
    _operations.add(name)
    return name


def error(code: str, count: int = 1) -> None:
    ERRORS.labels(code).inc(count)

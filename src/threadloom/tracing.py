"""OpenTelemetry traces, off unless the standard `OTEL_*` environment asks for them (docs/operations.md).

`configure()` (called once by `create_app`) turns tracing on when `OTEL_TRACES_EXPORTER` names an
exporter (and `OTEL_SDK_DISABLED` is not true); only then is the SDK imported. Every hook below is
a no-op behind one attribute read while tracing is off, so an untraced server pays nothing.

Spans: the HTTP request (ASGI instrumentation), the GraphQL operation named by its operation name
(never one per field: a page of a list would cost ~10 times as much), each SQL statement (SQLAlchemy
instrumentation), each effect the outbox worker runs, and each call into a provider runtime. An
effect is enqueued with the trace context of the command that wrote it (`carrier()`), so the turn a
`sendMessage` starts shows in the same trace as the mutation, even when another process runs it.

A leaf module: it imports nothing of Threadloom, so every layer may use it.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from typing import Any

log = logging.getLogger("threadloom.tracing")

ENABLED = False
_tracer: Any = None
_NULL: contextlib.nullcontext[None] = contextlib.nullcontext()
CARRIER_KEY = "traceContext"  # where an effect's payload keeps its command's trace context


def wanted(env: Mapping[str, str] | None = None) -> bool:
    """True when the environment names a trace exporter and does not disable the SDK."""
    env = os.environ if env is None else env
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [e.strip() for e in env.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    return bool(exporters) and exporters != ["none"]


def configure() -> bool:
    """Set up the SDK from the environment if tracing is wanted (once per process); whether it is on."""
    global ENABLED, _tracer
    if ENABLED or not wanted():
        return ENABLED
    try:
        from opentelemetry import trace
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.util._importlib_metadata import entry_points
    except ImportError:
        log.warning("OTEL_TRACES_EXPORTER is set but OpenTelemetry is not installed (pip install threadloom[otel])")
        return False
    attributes = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": "threadloom"}
    provider = TracerProvider(resource=Resource.create(attributes))  # reads OTEL_RESOURCE_ATTRIBUTES, sampler
    exporting = False
    for name in (e.strip() for e in os.environ["OTEL_TRACES_EXPORTER"].split(",")):
        if not name or name == "none":
            continue
        found = list(entry_points(group="opentelemetry_traces_exporter", name=name))
        if not found:
            log.warning("no OpenTelemetry trace exporter named %r is installed", name)
            continue
        provider.add_span_processor(BatchSpanProcessor(found[0].load()()))  # OTEL_BSP_* apply
        exporting = True
    if not exporting:  # spans nobody receives would only cost
        return False
    trace.set_tracer_provider(provider)
    _tracer = trace.get_tracer("threadloom")
    ENABLED = True
    return True


def span(name: str, attributes: Mapping[str, Any] | None = None, parent: Mapping[str, str] | None = None) -> Any:
    """A context manager: a new current span (its value), or nothing at all while tracing is off.

    `parent`: a carrier from `carrier()`, to continue the trace of the code that wrote it."""
    if not ENABLED:
        return _NULL
    context = None
    if parent:
        from opentelemetry import propagate

        context = propagate.extract(dict(parent))
    return _tracer.start_as_current_span(name, context=context, attributes=dict(attributes or {}))


def carrier() -> dict[str, str]:
    """The current trace context as strings (W3C `traceparent` …), empty while tracing is off or outside a span."""
    if not ENABLED:
        return {}
    from opentelemetry import propagate

    out: dict[str, str] = {}
    propagate.inject(out)
    return out


def instrument_engine(engine: Any) -> None:
    """A span per SQL statement run through `engine` (an AsyncEngine), while tracing is on."""
    if not ENABLED:
        return
    from opentelemetry import metrics
    from opentelemetry.instrumentation.sqlalchemy.engine import EngineTracer

    usage = metrics.get_meter("threadloom").create_up_down_counter("db.client.connections.usage")
    EngineTracer(_tracer, engine.sync_engine, usage)  # type: ignore[no-untyped-call]


def middleware() -> list[Any]:
    """The app's middleware: the ASGI instrumentation (a server span per HTTP request or WebSocket, the
    client's `traceparent` continued) if `configure()` turns tracing on, else none at all."""
    if not configure():
        return []
    from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
    from starlette.middleware import Middleware

    # No span per ASGI message: a subscription's socket would make one per event.
    return [Middleware(OpenTelemetryMiddleware, exclude_spans=["receive", "send"])]



@contextlib.contextmanager
def detached() -> Iterator[None]:
    """Tasks created inside belong to no trace: a long-lived task (a feed, an agent's event reader)
    started by a request would otherwise put its statements in that request's trace for ever."""
    if not ENABLED:
        yield
        return
    from opentelemetry import context

    token = context.attach(context.Context())
    try:
        yield
    finally:
        context.detach(token)

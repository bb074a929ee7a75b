"""Assembly: settings + database → services → Starlette app with /graphql, /healthz, /readyz."""

from __future__ import annotations

import contextlib
import gc
import signal
from collections.abc import AsyncIterator

import sqlalchemy as sa
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute

from threadloom import tracing
from threadloom.api import graphiql
from threadloom.api.gate import Gate
from threadloom.api.http import GraphQLView
from threadloom.api.metrics import Metrics
from threadloom.api.schema import build_schema
from threadloom.config import Settings
from threadloom.dashboard import routes as dashboard_routes
from threadloom.engine.clock import Clock, SystemClock
from threadloom.engine.services import Services
from threadloom.providers.registry import load_instances
from threadloom.store import migrate
from threadloom.store.db import Database
from threadloom.streams.live import Live, StreamLimits


async def open_services(settings: Settings, database_url: str, clock: Clock | None = None) -> Services:
    """Connect and refuse an unmigrated database with a message naming the fix."""
    db = Database.from_url(database_url)
    try:
        await migrate.require_migrated(db.engine)
    except BaseException:
        await db.dispose()
        raise
    return Services.build(settings, db, clock or SystemClock(), load_instances(settings.providers_file))


def settle_garbage_collector() -> None:
    """Move everything alive after startup out of the collector's sight and collect young objects less often.

    A request allocates many short-lived objects; with the default thresholds the full collections that
    follow walk the whole (large, long-lived) import-time heap and showed up as ~150 ms pauses at p95.
    """
    gc.collect()
    gc.freeze()
    gc.set_threshold(50_000, 50, 1_000)


WORKER_LOST_EXIT = 75  # EX_TEMPFAIL: stopped on purpose, to be restarted


def _stop_self(app: Starlette) -> None:
    """This process is no longer a live worker (its lock's connection broke): stop gracefully, as on
    SIGTERM, and exit with WORKER_LOST_EXIT so a supervisor starts it again as a new worker."""
    app.state.exit_code = WORKER_LOST_EXIT
    signal.raise_signal(signal.SIGTERM)


def create_app(settings: Settings, database_url: str, clock: Clock | None = None) -> Starlette:
    """The ASGI app. Its schema is built here, before it serves: `threadloom serve` starts the schema's
    validation process (`app.state.schema.validation.start`) while it runs no other thread."""
    holder: dict[str, Services] = {}
    schema = build_schema(settings.limits, dev=settings.dev)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        services = await open_services(settings, database_url, clock)
        limits = settings.limits
        stream_limits = StreamLimits(
            limits.max_replay, limits.subscriber_queue, limits.subscriber_queue_bytes, limits.token_queue_bytes
        )
        live = Live(services.db, settings.broadcast_url, stream_limits)
        await live.start()
        services.pipeline.listeners.append(live.on_commit)
        await services.start(on_worker_lost=lambda: _stop_self(app))
        holder["services"] = services
        view = GraphQLView(services, schema, live)
        settle_garbage_collector()
        endpoint = Gate(view, services)
        app.router.routes += [Route("/graphql", endpoint), WebSocketRoute("/graphql", endpoint)]
        metrics = Metrics(services, view)  # /metrics for an admin token; without one on a localhost port
        app.router.routes.append(Route("/metrics", metrics))
        await metrics.serve_local(settings.metrics_port)

        async def going_away(within: float) -> None:
            """SIGTERM, before the server closes connections: refuse new requests, end subscriptions."""
            endpoint.draining = True
            await view.going_away(within)

        app.state.going_away = going_away
        try:
            yield
        finally:
            await metrics.stop()
            schema.validation.close()  # its child, if started
            await services.stop()
            await live.stop()
            await services.db.dispose()

    async def healthz(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> JSONResponse:
        services = holder.get("services")
        if services is None:
            return JSONResponse({"status": "starting"}, status_code=503)
        try:
            async with services.db.read() as db:
                await db.execute(sa.text("SELECT 1"))
            migrated = await migrate.is_migrated(services.db.engine)
        except (OSError, sa.exc.SQLAlchemyError) as error:
            return JSONResponse({"status": "database unreachable", "error": type(error).__name__}, status_code=503)
        if not migrated:
            return JSONResponse({"status": "database not migrated"}, status_code=503)
        return JSONResponse({"status": "ready"})

    routes = [Route("/healthz", healthz), Route("/readyz", readyz), *dashboard_routes(), *graphiql.routes(settings.ide)]
    app = Starlette(routes=routes, lifespan=lifespan, middleware=tracing.middleware())  # [] unless OTEL_* asks
    app.state.schema = schema
    return app

"""/metrics: Prometheus text for an admin token on the main port, and optionally without a token on a
port bound to localhost (`THREADLOOM_METRICS_PORT`) for a scraper on the same host (docs/operations.md).

Counters are kept by the code that counts them (`threadloom.metrics`); what is a state rather than a
count — open sockets and subscriptions, agent processes, the database pool, runs by status, queue
depth, the outbox's backlog and age — is read here when a scrape asks, so keeping it costs nothing
between scrapes. The database's figures take two statements (`store.gauges`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from prometheus_client import REGISTRY, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4  # what every Prometheus version reads
from starlette.types import Receive, Scope, Send

from threadloom.api.gate import _header, _reply, bearer
from threadloom.api.http import GraphQLView
from threadloom.domain.statuses import RunStatus, TokenScope
from threadloom.engine.services import Services
from threadloom.store import gauges, tokens

log = logging.getLogger("threadloom.metrics")

SOCKETS = Gauge("threadloom_websockets_open", "Open GraphQL WebSockets (graphql-transport-ws).")
HTTP_STREAMS = Gauge("threadloom_http_streams_open", "Open multipart subscriptions over HTTP.")
SUBSCRIPTIONS = Gauge(
    "threadloom_subscriptions_open",
    "Running subscriptions, by path (fast: served by cohorts; general: one stream each).",
    ["path"],
)
QUEUED_BYTES = Gauge(
    "threadloom_subscriber_queued_bytes",
    "Bytes of frames queued in this process for subscribers that have not taken them yet (fast-path socket "
    "queues and general-path mailboxes), bounded per subscriber by THREADLOOM_SUBSCRIBER_QUEUE_BYTES and per "
    "token by THREADLOOM_TOKEN_QUEUE_BYTES.",
)
AGENT_PROCESSES = Gauge(
    "threadloom_agent_processes", "Live provider runtimes (agent processes) of this server, by instance.", ["instance"]
)
WAKEUPS_DEGRADED = Gauge(
    "threadloom_wakeups_degraded",
    "1 while this process's wake-up channel (BROADCAST_URL) is down and its feeds poll the log instead; else 0.",
)
POOL = Gauge(
    "threadloom_db_pool_connections",
    "Database pool connections, by state (checked_out: in use; idle: in the pool; overflow: beyond its size).",
    ["state"],
)
POOL_SIZE = Gauge("threadloom_db_pool_size", "The database pool's configured size (overflow may add as many).")
RUNS = Gauge("threadloom_runs", "Runs in the database, by status.", ["status"])
QUEUE = Gauge("threadloom_queue_depth", "Queued runs waiting for their thread, over all threads.")
OUTBOX = Gauge("threadloom_outbox_effects", "Unfinished outbox effects, by status (pending, running).", ["status"])
OUTBOX_AGE = Gauge(
    "threadloom_outbox_oldest_pending_seconds", "Age of the oldest pending outbox effect (0 when none is pending)."
)


class Metrics:
    """The scrape: live figures of this process and the database's, then every metric as text."""

    def __init__(self, services: Services, view: GraphQLView) -> None:
        self.services = services
        self.view = view
        self._server: asyncio.Server | None = None

    async def render(self) -> bytes:
        self._live()
        async with self.services.db.statements() as db:
            found = await gauges.read(db)
        for status in RunStatus:
            RUNS.labels(status.value).set(found.runs_by_status.get(status.value, 0))
        QUEUE.set(found.runs_by_status.get(RunStatus.QUEUED.value, 0))
        OUTBOX.labels("pending").set(found.outbox_pending)
        OUTBOX.labels("running").set(found.outbox_running)
        OUTBOX_AGE.set(found.outbox_oldest_seconds)
        return generate_latest(REGISTRY)

    def _live(self) -> None:
        """This process's figures, read from its live objects (before the scrape takes a connection)."""
        sockets, streams = self.view.token_guard.open_counts()
        SOCKETS.set(sockets)
        HTTP_STREAMS.set(streams)
        cohorts = self.view.token_guard.cohorts.cohorts.values()
        SUBSCRIPTIONS.labels("fast").set(sum(len(cohort.members) for cohort in cohorts))
        hub = self.view.live.hub if self.view.live is not None else None
        feeds = [*hub.threads.values(), *hub.projects.values()] if hub is not None else []
        SUBSCRIPTIONS.labels("general").set(sum(len(feed.mailboxes) for feed in feeds))
        QUEUED_BYTES.set(hub.budget.total if hub is not None else 0)
        WAKEUPS_DEGRADED.set(1 if hub is not None and hub.degraded else 0)
        processes: dict[str, int] = dict.fromkeys(self.services.instances, 0)
        for session in self.services.sessions.live.values():
            if session.runtime.alive:
                processes[session.instance_id] = processes.get(session.instance_id, 0) + 1
        for instance, count in processes.items():
            AGENT_PROCESSES.labels(instance).set(count)
        pool: Any = self.services.db.engine.pool
        POOL_SIZE.set(pool.size())
        POOL.labels("checked_out").set(pool.checkedout())
        POOL.labels("idle").set(pool.checkedin())
        POOL.labels("overflow").set(max(0, pool.overflow()))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The main port's /metrics: an admin token for all projects, refused as /graphql refuses."""
        token = bearer(_header(scope, b"authorization"))
        principal = None
        if token is not None:
            async with self.services.db.statements() as db:
                principal = await tokens.authenticate(db, token)
        if principal is None:
            reason = "missing bearer token" if token is None else "invalid or revoked token"
            await _reply(send, 401, "UNAUTHENTICATED", reason, [(b"www-authenticate", b'Bearer realm="threadloom"')])
            return
        if principal.scope != TokenScope.ADMIN or principal.project_id is not None:
            await _reply(send, 403, "FORBIDDEN", "/metrics needs an admin token for all projects", [])
            return
        body = await self.render()
        headers = [(b"content-type", CONTENT_TYPE_PLAIN_0_0_4.encode()), (b"content-length", str(len(body)).encode())]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    async def serve_local(self, port: int | None) -> None:
        """Also answer GET /metrics without a token on 127.0.0.1:`port` (HTTP/1.0, one request a connection)."""
        if port is None:
            return
        self._server = await asyncio.start_server(self._answer_local, "127.0.0.1", port)

    async def _answer_local(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, path, *_ = [*head.split(b"\r\n", 1)[0].split(b" "), b"", b""]
            if method not in (b"GET", b"HEAD") or path.split(b"?")[0] != b"/metrics":
                status, body, kind = b"404 Not Found", b"not found\n", b"text/plain"
            else:
                status, body, kind = b"200 OK", await self.render(), CONTENT_TYPE_PLAIN_0_0_4.encode()
            writer.write(
                b"HTTP/1.0 " + status + b"\r\ncontent-type: " + kind + b"\r\ncontent-length: "
                + str(len(body)).encode() + b"\r\nconnection: close\r\n\r\n" + (b"" if method == b"HEAD" else body)
            )
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            pass
        except Exception:
            log.exception("metrics scrape failed")
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None

"""ASGI gate in front of /graphql: body size limit, bearer auth, per-request log line.

Done before Strawberry so an unauthenticated or oversized request costs no parsing.
The log line carries operation name, status, duration and SQL statement count — never
the token. `Server-Timing` tells clients the same figures, and /metrics's request counters are
counted at the same place.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any
from urllib.parse import parse_qsl

import orjson
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from threadloom import metrics
from threadloom.api import graphiql
from threadloom.domain.access import Principal
from threadloom.domain.errors import DomainError
from threadloom.domain.leases import clean_device_id
from threadloom.engine.services import Services
from threadloom.store import tokens
from threadloom.store.db import StatementCounter

log = logging.getLogger("threadloom.request")


def _header(scope: Scope, name: bytes) -> str:
    for key, value in scope.get("headers", []):
        if key == name:
            return str(value.decode("latin-1"))
    return ""


DEVICE_HEADER = b"threadloom-device"  # names the device a request comes from (domain/leases.py)


def with_device(principal: Principal, raw: str | None, field: str) -> Principal:
    """The principal with the device its request names (checked); unchanged when it names none."""
    device = clean_device_id(raw, field)
    return principal if device is None else dataclasses.replace(principal, device_id=device)


def bearer(authorization: str) -> str | None:
    scheme, _, token = authorization.partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


async def _reply(send: Send, status: int, code: str, message: str, headers: list[tuple[bytes, bytes]]) -> None:
    metrics.error(code)
    body = orjson.dumps({"errors": [{"message": message, "extensions": {"code": code}}]})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *headers],
        }
    )
    await send({"type": "http.response.body", "body": body})


class Gate:
    def __init__(self, app: ASGIApp, services: Services) -> None:
        self.app = app
        self.services = services
        self.draining = False  # shutting down: new requests go to another replica

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":
            if self.draining:  # a new socket while shutting down: refused before its handshake
                await send({"type": "websocket.close", "code": 1013, "reason": "server going away"})
                return
            scope.setdefault("state", {})
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        counter = StatementCounter()
        state = scope.setdefault("state", {})
        state["counter"] = counter
        status = 500

        async def send_wrapped(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
                ms = (time.perf_counter() - started) * 1000
                timing = f'app;dur={ms:.1f}, sql;desc="{counter.statements} statements"'.encode()
                message["headers"] = [*message.get("headers", []), (b"server-timing", timing)]
            await send(message)

        try:
            await self._handle(scope, receive, send_wrapped, state, counter)
        finally:
            seconds = time.perf_counter() - started
            label = metrics.operation_label(state.get("operation"))
            metrics.REQUESTS.labels(label, str(status)).inc()
            metrics.REQUEST_SECONDS.labels(label).observe(seconds)
            log.info(
                "request",
                extra={
                    "fields": {
                        "method": scope.get("method"),
                        "path": scope.get("path"),
                        "operation": state.get("operation"),
                        "status": status,
                        "ms": round(seconds * 1000, 2),
                        "sql": counter.statements,
                    }
                },
            )

    async def _handle(
        self, scope: Scope, receive: Receive, send: Send, state: dict[str, Any], counter: StatementCounter
    ) -> None:
        if self.draining:
            await _reply(send, 503, "SERVER_GOING_AWAY", "the server is shutting down; retry", [(b"retry-after", b"1")])
            return
        limit = self.services.settings.limits.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared.isdigit() and int(declared) > limit:
            await _reply(send, 413, "PAYLOAD_TOO_LARGE", f"request body is larger than {limit} bytes", [])
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                await _reply(send, 413, "PAYLOAD_TOO_LARGE", f"request body is larger than {limit} bytes", [])
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)

        params = dict(parse_qsl(scope.get("query_string", b"").decode("latin-1")))
        wants_ide = graphiql.wanted(scope.get("method", ""), _header(scope, b"accept"), params)
        token = bearer(_header(scope, b"authorization"))
        principal = None
        if token is not None:
            async with self.services.db.statements(counter) as db:
                principal = await tokens.authenticate(db, token)
        if principal is None and not (wants_ide and self.services.settings.ide):
            reason = "missing bearer token" if token is None else "invalid or revoked token"
            await _reply(send, 401, "UNAUTHENTICATED", reason, [(b"www-authenticate", b'Bearer realm="threadloom"')])
            return
        if principal is not None:
            try:
                principal = with_device(principal, _header(scope, DEVICE_HEADER) or None, "Threadloom-Device")
            except DomainError as error:
                await _reply(send, 400, error.code.value, error.message, [])
                return
        state["principal"] = principal
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

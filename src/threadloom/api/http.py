"""The GraphQL HTTP/WebSocket endpoint (GraphQL-over-HTTP, orjson encoding).

With `Accept: application/graphql-response+json` a request that fails before execution
(unparseable, invalid, bad variables) gets HTTP 400, as the GraphQL-over-HTTP spec says;
with `application/json` it gets 200, for older clients. A request refused before it is parsed (not JSON,
an unsupported content type or method, a mutation over GET, no query) gets a JSON body
`{"errors": [{"message", "extensions": {"code"}}]}` with its status (`REFUSALS`), never plain text.
A subscription whose request accepts `multipart/mixed;subscriptionSpec=1.0` is streamed as multipart parts,
one that accepts `text/event-stream` as server-sent events (the graphql-sse protocol, distinct connections
mode: `next` events, then `complete`), both guarded by `HTTPStream`; any other subscription sent over HTTP
is HTTP 400 `SUBSCRIPTION_OVER_HTTP`; a request refused by its token's rate limit is HTTP 429
`RATE_LIMITED` with `Retry-After`. `extensions.persistedQuery` is Apollo's automatic persisted queries
(`persisted.PersistedQueries`). A browser's GET (Accept: text/html) gets GraphiQL when it is on (`graphiql`).
WebSockets go through `token_guard.GuardedTransportWSHandler` (revocation, per-token caps).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import json
import logging
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import timedelta
from typing import Any, cast

import orjson
from cross_web import HTTPException
from graphql import GraphQLError, get_operation_ast, parse
from graphql import OperationType as GraphQLOperationType
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError, MissingQueryError
from strawberry.http import GraphQLHTTPResponse, GraphQLRequestData
from strawberry.http.streaming import HTTPStreamTransport, MultipartSubscriptionTransport
from strawberry.schema.exceptions import CannotGetOperationTypeError, InvalidOperationTypeError
from strawberry.subscriptions import (
    GRAPHQL_SSE_PROTOCOL,
    GRAPHQL_TRANSPORT_WS_PROTOCOL,
    MULTIPART_SUBSCRIPTION_PROTOCOL,
)
from strawberry.types.execution import ExecutionResult
from strawberry.types.graphql import OperationType
from strawberry.types.unset import UNSET, UnsetType

from threadloom.api import graphiql
from threadloom.api.compiled import with_fast_paths
from threadloom.api.context import NOBODY, Context
from threadloom.api.gate import bearer, with_device
from threadloom.api.persisted import PersistedQueries, PersistedQueryError
from threadloom.api.row_pages import compile_threads
from threadloom.api.token_guard import STATE_KEY, GuardedTransportWSHandler, TokenGuard
from threadloom.domain.errors import DomainError
from threadloom.engine.services import Services
from threadloom.streams.live import Live

log = logging.getLogger("threadloom.api.sockets")

GRAPHQL_RESPONSE = "application/graphql-response+json"
JSON = "application/json"
_media: contextvars.ContextVar[str] = contextvars.ContextVar("media", default=JSON)


def negotiate(accept: str) -> str:
    """The response media type for an Accept header (graphql-response+json preferred when asked)."""
    return GRAPHQL_RESPONSE if GRAPHQL_RESPONSE in accept else JSON


class CodedHTTPError(Exception):
    """A request refused before execution with a status and a stable code (a JSON error body)."""

    def __init__(self, status: int, code: str, message: str, headers: Mapping[str, str] | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.headers = dict(headers or {})


# Strawberry's own refusals (its HTTPException reasons) → status, stable code, message. Matched by reason
# because strawberry raises one exception type for all of them; a reason not listed keeps its status and
# gets the code of `BY_STATUS` (tests/test_http_errors.py sends each of these).
REFUSALS: dict[str, tuple[int, str, str]] = {
    "Unable to parse request body as JSON": (
        400,
        "INVALID_JSON",
        "the request body, or a `variables` or `extensions` parameter, is not valid JSON",
    ),
    "Unsupported content type": (415, "UNSUPPORTED_MEDIA_TYPE", "a POST needs `Content-Type: application/json`"),
    "GraphQL only supports GET and POST requests.": (
        405,
        "METHOD_NOT_ALLOWED",
        "/graphql answers GET (queries) and POST",
    ),
    "No GraphQL query found in the request": (
        400,
        "MISSING_QUERY",
        "no GraphQL query in the request (`query`, or a known `extensions.persistedQuery`)",
    ),
    "Not Found": (
        404,
        "GRAPHIQL_OFF",
        "GraphiQL is off on this server (THREADLOOM_GRAPHIQL=1 or THREADLOOM_DEV=1 turn it on)",
    ),
    "Batching is not enabled": (400, "BATCHING_NOT_SUPPORTED", "send one operation per request, not a list"),
}
BY_STATUS = {400: "BAD_REQUEST", 404: "NOT_FOUND", 405: "METHOD_NOT_ALLOWED", 415: "UNSUPPORTED_MEDIA_TYPE"}
ALLOW = {"allow": "GET, POST"}


def refusal(error: HTTPException) -> CodedHTTPError:
    """Strawberry's plain-text refusal as a coded JSON one."""
    status, code, message = REFUSALS.get(
        error.reason, (error.status_code, BY_STATUS.get(error.status_code, "BAD_REQUEST"), error.reason)
    )
    return CodedHTTPError(status, code, message, ALLOW if status == 405 else None)


def _is_mutation(data: GraphQLRequestData) -> bool:
    """Whether the operation the request names is a mutation (an unparseable one is left to execution)."""
    try:
        operation = get_operation_ast(parse(data.query or ""), data.operation_name)
    except GraphQLError:
        return False
    return operation is not None and operation.operation is GraphQLOperationType.MUTATION


class HTTPStream:
    """One subscription over HTTP (multipart or SSE): counted against its token, ended when it is revoked.

    It holds one of the token's `max_subscriptions_per_token` operations while it streams (the
    WebSocket operations share the count) and is registered with the token guard's watcher,
    which calls `close_revoked` within about a second of a revocation or expiry; the stream then
    sends one last item carrying `errors: [UNAUTHENTICATED]` and ends the way its protocol ends:
    a multipart part `{"payload": null, "errors": [...]}` (a transport error in the multipart
    subscription protocol) and the closing boundary, or an SSE `next` event `{"errors": [...]}` and `complete`.
    """

    def __init__(self, guard: TokenGuard, token_id: uuid.UUID, transport: HTTPStreamTransport) -> None:
        self.guard = guard
        self.token_id = token_id
        self.transport = transport
        self.revoked = asyncio.Event()

    async def close_revoked(self) -> None:
        self.revoked.set()

    def wrap(self, source: Callable[[], AsyncIterator[str]], encode: Callable[[object], str]) -> AsyncIterator[str]:
        async def parts() -> AsyncIterator[str]:
            self.guard.count(self.token_id, 1)
            self.guard.watch_stream(self.token_id, self)
            chunks = source()
            revoked = asyncio.ensure_future(self.revoked.wait())
            try:
                while True:
                    following = asyncio.ensure_future(anext(chunks))
                    await asyncio.wait((following, revoked), return_when=asyncio.FIRST_COMPLETED)
                    if revoked.done():
                        following.cancel()
                        with contextlib.suppress(asyncio.CancelledError, StopAsyncIteration):
                            await following
                        error = {"message": "token revoked or expired", "extensions": {"code": "UNAUTHENTICATED"}}
                        if isinstance(self.transport, MultipartSubscriptionTransport):
                            yield self.transport.encode_multipart_data({"payload": None, "errors": [error]}, encode)
                        else:
                            yield self.transport.encode_next({"errors": [error]}, encode)
                        yield self.transport.encode_complete()
                        return
                    try:
                        yield following.result()
                    except StopAsyncIteration:
                        return
            finally:
                revoked.cancel()
                self.guard.release_stream(self.token_id, self)
                self.guard.count(self.token_id, -1)
                with contextlib.suppress(Exception):
                    await chunks.aclose()  # type: ignore[attr-defined]

        return parts()


class GraphQLView(GraphQL[Context, None]):
    graphql_transport_ws_handler_class = GuardedTransportWSHandler

    def __init__(self, services: Services, schema: Any, live: Live | None = None) -> None:
        settings = services.settings
        super().__init__(
            with_fast_paths(schema, {"threads": compile_threads}) if settings.fast_paths else schema,
            graphql_ide="graphiql" if settings.ide else None,  # our own page (`render_graphql_ide`), no CDN
            allow_queries_via_get=True,
            subscription_protocols=(
                GRAPHQL_TRANSPORT_WS_PROTOCOL,
                MULTIPART_SUBSCRIPTION_PROTOCOL,
                GRAPHQL_SSE_PROTOCOL,
            ),
            allowed_origins=settings.allowed_origins,
            max_subscriptions_per_connection=settings.limits.max_subscriptions_per_connection,
            connection_init_wait_timeout=timedelta(seconds=10),
        )
        self.services = services
        self.live = live
        self.token_guard = TokenGuard(services.db, settings.limits)
        self.persisted = PersistedQueries()

    async def going_away(self, within: float) -> None:
        """Shutdown: end every subscription with SERVER_GOING_AWAY and its cursor, and wait (at most
        `within` seconds) until those last items are written, before the server closes the sockets."""
        self.token_guard.going_away()
        if self.live is not None:
            self.live.hub.going_away()
        deadline = time.monotonic() + within
        # Polled: many writers and streams finish on their own, with no one event to wait for.
        while not self.token_guard.drained() and time.monotonic() < deadline:  # noqa: ASYNC110
            await asyncio.sleep(0.02)

    def encode_json(self, data: object) -> str:
        # A str, not bytes: WebSocket messages must go out as text frames (browser clients
        # parse `event.data` as a string); for HTTP bodies the decode is nearly free.
        return orjson.dumps(data).decode()

    def decode_json(self, data: str | bytes) -> object:
        try:
            return orjson.loads(data)
        except orjson.JSONDecodeError as error:
            # orjson refuses a lone surrogate escape ("\ud800"), which is valid JSON: read it with the
            # standard library so validation (`input_text`) refuses the string with its field instead.
            if "surrogate" not in str(error):
                raise
            try:
                return json.loads(data)
            except (ValueError, RecursionError):  # not JSON after all, or nested past what it reads
                raise error from None

    async def get_context(self, request: Request | WebSocket, response: Response | WebSocket) -> Context:
        state = request.scope.setdefault("state", {})
        _media.set(negotiate(request.headers.get("accept", "")))
        state["sub_response"] = response
        state[STATE_KEY] = self.token_guard
        principal = state.get("principal") or NOBODY
        return Context.create(principal, self.services, request, response, state.get("counter"), self.live)

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """The token travels in connection_init: `{"authorization": "Bearer tl_…"}` (or `{"token": …}`)."""
        params = context.connection_params or {}
        raw = params.get("authorization") or params.get("Authorization") or ""
        token = bearer(str(raw)) if raw else (str(params["token"]) if params.get("token") else None)
        principal = None if token is None else await self.token_guard.authenticate_socket(token, context.counter)
        if principal is None:
            reason = "missing bearer token" if token is None else "invalid or revoked token"
            client = context.request.client
            log.info("websocket refused", extra={"fields": {"reason": reason, "client": client and client.host}})
            raise ConnectionRejectionError()
        device = params.get("deviceId") or context.request.headers.get("threadloom-device")
        try:
            principal = with_device(principal, None if device is None else str(device), "deviceId")
        except DomainError:
            log.info("websocket refused", extra={"fields": {"reason": "invalid deviceId"}})
            raise ConnectionRejectionError() from None
        self.token_guard.admit(context, principal)  # TooManyConnections → close 4429
        context.principal = principal
        return cast(UnsetType, UNSET)

    async def run(self, request: Any, context: Any = UNSET, root_value: Any = UNSET) -> Any:
        try:
            try:
                return await super().run(request, context, root_value)
            except HTTPException as error:
                raise refusal(error) from None
        except CodedHTTPError as error:
            body = {"errors": [{"message": error.message, "extensions": {"code": error.code}}]}
            return Response(
                self.encode_json(body), status_code=error.status, media_type=_media.get(), headers=error.headers
            )

    def should_render_graphql_ide(self, request: Any) -> bool:
        """A browser's page load: a GET asking for HTML with no operation in its URL (curl's `*/*` is not one)."""
        return graphiql.wanted(request.method, request.headers.get("accept", ""), request.query_params)

    async def render_graphql_ide(self, request: Request) -> Response:
        return graphiql.page()

    def parse_json(self, data: str | bytes) -> Any:
        value = super().parse_json(data)
        if not isinstance(value, (dict, list)):
            raise CodedHTTPError(400, "BAD_REQUEST", "the request must be a JSON object")
        return value

    async def parse_http_body(self, request: Any) -> GraphQLRequestData | list[GraphQLRequestData]:
        """The request, with a persisted query's text filled in from its hash (or registered under it)."""
        data = await super().parse_http_body(request)
        try:
            if isinstance(data, list):
                return [self.persisted.resolve(item) for item in data]
            resolved = self.persisted.resolve(data)
        except PersistedQueryError as error:
            # Not found is 200 (as Apollo Server answers), never cached: the client's next request registers it.
            headers = {"cache-control": "private, no-cache, must-revalidate"} if error.status == 200 else None
            raise CodedHTTPError(error.status, error.code, error.message, headers) from None
        if request.method == "GET" and resolved.protocol != "http" and _is_mutation(resolved):
            # A stream (SSE, multipart) would answer a mutation over GET with an error event and status 200;
            # refused like a plain request instead, before any response starts.
            raise CodedHTTPError(405, "MUTATION_OVER_GET", "mutations need POST", {"allow": "POST"})
        return resolved

    async def create_streaming_response(
        self,
        request: Request | WebSocket,
        stream: Callable[[], AsyncIterator[str]],
        sub_response: Response,
        headers: Mapping[str, str],
    ) -> Response:
        """A multipart or SSE subscription: refused over the token's operation cap, else guarded (`HTTPStream`)."""
        transport = self._get_stream_transport_from_headers(request.headers)
        principal = request.scope.get("state", {}).get("principal")
        if transport is None or principal is None:
            return await super().create_streaming_response(request, stream, sub_response, headers)
        limit = self.token_guard.limits.max_subscriptions_per_token
        if self.token_guard.operations(principal.token_id) >= limit:
            raise CodedHTTPError(429, "TOO_MANY_SUBSCRIPTIONS", f"at most {limit} operations per token")
        guarded = HTTPStream(self.token_guard, principal.token_id, transport)
        wrapped = guarded.wrap(stream, self.encode_json_string)
        return await super().create_streaming_response(request, lambda: wrapped, sub_response, headers)

    async def execute_single(
        self,
        request: Any,
        request_adapter: Any,
        sub_response: Any,
        context: Context,
        root_value: None,
        request_data: Any,
    ) -> ExecutionResult:
        """A plain HTTP request runs queries and mutations only (GraphQL-over-HTTP).

        A mutation sent with GET is 405; a subscription is HTTP 400 SUBSCRIPTION_OVER_HTTP, refused
        before anything runs. Only a plain request reaches here: one accepting
        `multipart/mixed;subscriptionSpec=1.0` is routed by strawberry to `schema.stream` instead.
        """
        method = request_adapter.method
        allowed = OperationType.from_http(method) - {OperationType.SUBSCRIPTION}
        try:
            return await self.schema.execute(
                request_data.query,
                root_value=root_value,
                variable_values=request_data.variables,
                context_value=context,
                operation_name=request_data.operation_name,
                allowed_operation_types=allowed,
                operation_extensions=request_data.extensions,
            )
        except CannotGetOperationTypeError as error:
            raise HTTPException(400, error.as_http_error_reason()) from error
        except InvalidOperationTypeError as error:
            if error.operation_type is OperationType.SUBSCRIPTION:
                raise CodedHTTPError(
                    400,
                    "SUBSCRIPTION_OVER_HTTP",
                    "subscriptions need a WebSocket (graphql-transport-ws) on this URL, or an HTTP request "
                    "that accepts multipart/mixed;subscriptionSpec=1.0 or text/event-stream",
                ) from None
            raise CodedHTTPError(405, "MUTATION_OVER_GET", "mutations need POST", {"allow": "POST"}) from None
        except MissingQueryError as error:
            raise HTTPException(400, "No GraphQL query found in the request") from error

    async def process_result(self, request: Request, result: ExecutionResult) -> GraphQLHTTPResponse:
        processed = await super().process_result(request, result)
        if request.method == "GET":  # a cache may keep a GET (a persisted query's short URL): per token, never shared
            request.scope["state"]["sub_response"].headers["vary"] = "Authorization"
        failed_before_execution = (
            result.data is None
            and bool(result.errors)
            and all(e.path is None and (e.extensions or {}).get("code") != "QUERY_TIMEOUT" for e in result.errors or [])
        )
        if failed_before_execution:
            # Nothing was executed: no `data` entry at all (the GraphQL spec, for either media type).
            processed.pop("data", None)
            if _media.get() == GRAPHQL_RESPONSE:
                request.scope["state"]["sub_response"].status_code = 400
        limited = next((e for e in result.errors or [] if (e.extensions or {}).get("code") == "RATE_LIMITED"), None)
        if limited is not None and result.data is None:
            sub_response = request.scope["state"]["sub_response"]
            sub_response.status_code = 429
            sub_response.headers["retry-after"] = str(math.ceil((limited.extensions or {}).get("retryAfter", 1)))
        return processed

    def create_response(self, response_data: Any, sub_response: Response) -> Response:
        response = Response(
            self.encode_json(response_data),
            status_code=sub_response.status_code or 200,
            media_type=_media.get(),
        )
        for name, value in sub_response.headers.items():
            if name.lower() not in ("content-type", "content-length"):
                response.headers[name] = value
        return response

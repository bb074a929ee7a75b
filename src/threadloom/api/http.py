"""The GraphQL HTTP/WebSocket endpoint (GraphQL-over-HTTP, orjson encoding).

With `Accept: application/graphql-response+json` a request that fails before execution
(unparseable, invalid, bad variables) gets HTTP 400, as the GraphQL-over-HTTP spec says;
with `application/json` it gets 200, for older clients.
"""

from __future__ import annotations

import contextvars
from datetime import timedelta
from typing import Any, cast

import orjson
from cross_web import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.websockets import WebSocket
from strawberry.asgi import GraphQL
from strawberry.exceptions import ConnectionRejectionError
from strawberry.http import GraphQLHTTPResponse
from strawberry.subscriptions import GRAPHQL_TRANSPORT_WS_PROTOCOL
from strawberry.types.execution import ExecutionResult
from strawberry.types.unset import UNSET, UnsetType

from threadloom.api.context import NOBODY, Context
from threadloom.api.gate import bearer
from threadloom.engine.services import Services
from threadloom.store import tokens
from threadloom.streams.live import Live

GRAPHQL_RESPONSE = "application/graphql-response+json"
JSON = "application/json"
_media: contextvars.ContextVar[str] = contextvars.ContextVar("media", default=JSON)


def negotiate(accept: str) -> str:
    """The response media type for an Accept header (graphql-response+json preferred when asked)."""
    return GRAPHQL_RESPONSE if GRAPHQL_RESPONSE in accept else JSON


class GraphQLView(GraphQL[Context, None]):
    def __init__(self, services: Services, schema: Any, live: Live | None = None) -> None:
        settings = services.settings
        super().__init__(
            schema,
            graphql_ide="graphiql" if settings.dev else None,
            allow_queries_via_get=True,
            subscription_protocols=(GRAPHQL_TRANSPORT_WS_PROTOCOL,),
            allowed_origins=settings.allowed_origins,
            max_subscriptions_per_connection=settings.limits.max_subscriptions_per_connection,
            connection_init_wait_timeout=timedelta(seconds=10),
        )
        self.services = services
        self.live = live

    def encode_json(self, data: object) -> str:
        # A str, not bytes: WebSocket messages must go out as text frames (browser clients
        # parse `event.data` as a string); for HTTP bodies the decode is nearly free.
        return orjson.dumps(data).decode()

    def decode_json(self, data: str | bytes) -> object:
        return orjson.loads(data)

    async def get_context(self, request: Request | WebSocket, response: Response | WebSocket) -> Context:
        state = request.scope.setdefault("state", {})
        _media.set(negotiate(request.headers.get("accept", "")))
        state["sub_response"] = response
        principal = state.get("principal") or NOBODY
        return Context.create(principal, self.services, request, response, state.get("counter"), self.live)

    async def on_ws_connect(self, context: Context) -> UnsetType | dict[str, object] | None:
        """The token travels in connection_init: `{"authorization": "Bearer tl_…"}` (or `{"token": …}`)."""
        params = context.connection_params or {}
        raw = params.get("authorization") or params.get("Authorization") or ""
        token = bearer(str(raw)) if raw else (str(params["token"]) if params.get("token") else None)
        principal = None
        if token is not None:
            async with self.services.db.read(context.counter) as db:
                principal = await tokens.authenticate(db, token)
        if principal is None:
            raise ConnectionRejectionError()
        context.principal = principal
        return cast(UnsetType, UNSET)

    async def execute_single(self, *args: Any, **kwargs: Any) -> Any:
        """GraphQL-over-HTTP: a mutation sent with GET is 405, not 400."""
        try:
            return await super().execute_single(*args, **kwargs)
        except HTTPException as error:
            if error.reason.startswith("mutations are not allowed when using GET"):
                raise HTTPException(405, "mutations need POST") from error
            raise

    async def process_result(self, request: Request, result: ExecutionResult) -> GraphQLHTTPResponse:
        processed = await super().process_result(request, result)
        failed_before_execution = (
            result.data is None and bool(result.errors) and all(e.path is None for e in result.errors or [])
        )
        if failed_before_execution and _media.get() == GRAPHQL_RESPONSE:
            request.scope["state"]["sub_response"].status_code = 400
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

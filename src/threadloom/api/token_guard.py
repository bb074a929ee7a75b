"""Per-token guards of one server process: open sockets, revocation, caps and rate limits.

- **Revocation and expiry on open WebSockets.** A socket's token is checked again before every
  operation it sends, and a watcher asks the database once a second — one statement for the tokens
  of every open socket — which of them still authenticate. A subscription the fast path serves
  (read-only) reuses a verdict younger than that second instead of asking again: a client opening
  thousands of subscriptions costs no statement each, and a revoked token's subscriptions end
  within the same second either way. Queries and mutations always ask. A socket whose token was revoked or has
  expired has its operations ended and is closed with code 4403, so a revocation takes effect on
  open sockets within about a second (the CLI that revokes runs in another process, so a periodic
  check is what reaches every server process without a shared channel). A multipart subscription
  over HTTP (api/http.py) is watched the same way and ended with a final error part.
- **Caps.** At most `max_connections_per_token` open sockets (a further `connection_init` is
  closed with 4429) and `max_subscriptions_per_token` running operations over all of a token's
  sockets and multipart HTTP subscriptions (a further `subscribe` gets an `error` message with code
  TOO_MANY_SUBSCRIPTIONS, a further multipart request HTTP 429 with that code).
- **Rate limits.** Token buckets per token for mutations and for run starts (`RateLimits`).

All of it is counted in this process's memory: with several processes each one enforces the
limits on the sockets and requests it serves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from graphql import (
    DocumentNode,
    FieldNode,
    FragmentSpreadNode,
    GraphQLError,
    InlineFragmentNode,
    OperationDefinitionNode,
    SelectionSetNode,
)
from graphql import ExecutionResult as GraphQLExecutionResult
from strawberry.extensions import SchemaExtension
from strawberry.subscriptions.protocols.graphql_transport_ws.handlers import BaseGraphQLTransportWSHandler
from strawberry.subscriptions.protocols.graphql_transport_ws.types import ConnectionInitMessage, SubscribeMessage
from strawberry.types.graphql import OperationType

from threadloom import tracing
from threadloom.api.cohorts import Cohorts, Member, Outbox
from threadloom.config import Limits
from threadloom.domain.access import Principal
from threadloom.domain.rate_limits import Bucket, Rate, take_all
from threadloom.store import tokens
from threadloom.store.db import Database, StatementCounter

if TYPE_CHECKING:
    from threadloom.api.context import Context

log = logging.getLogger("threadloom.api.tokens")

CLOSE_REVOKED = 4403
CLOSE_TOO_MANY_CONNECTIONS = 4429
RECHECK_SECONDS = 1.0
STATE_KEY = "token_guard"

# Mutations that start agent work: each also takes one token from the run-start bucket.
RUN_STARTING_FIELDS = frozenset({"sendMessage", "delegateTask", "implementPlan", "resumeQueue", "retryRun"})


class TooManyConnections(Exception):
    """Raised by the view's connection check; the socket handler closes with 4429."""


class Revocable(Protocol):
    """Something the watcher ends when its token stops authenticating (a socket, an HTTP stream)."""

    async def close_revoked(self) -> None: ...


class TokenGuard:
    def __init__(self, db: Database, limits: Limits) -> None:
        self.db = db
        self.limits = limits
        # token id → {socket context → its handler (None until the connection is acknowledged)}
        self._sockets: dict[uuid.UUID, dict[int, GuardedTransportWSHandler | None]] = {}
        # token id → {stream key → its closer}: multipart subscriptions over HTTP (no connection slot)
        self._streams: dict[uuid.UUID, dict[int, Revocable]] = {}
        self._watcher: asyncio.Task[None] | None = None
        self._mutations = Rate(limits.mutations_per_minute, limits.mutation_burst)
        self._run_starts = Rate(limits.run_starts_per_minute, limits.run_start_burst)
        self._buckets: dict[uuid.UUID, tuple[Bucket, Bucket]] = {}
        self.cohorts = Cohorts(limits)  # the subscription fast path of this process's sockets
        self._verified: dict[uuid.UUID, float] = {}  # token id → when it last authenticated
        self._principals: dict[str, Principal] = {}  # token hash → its principal, while it has a verdict
        self._operations: dict[uuid.UUID, int] = {}  # token id → operations over its sockets

    # -- sockets ----------------------------------------------------------------------------

    def admit(self, context: Context, principal: Principal) -> None:
        """Count a new socket of this token, or raise TooManyConnections (check and add: no await between)."""
        sockets = self._sockets.setdefault(principal.token_id, {})
        if len(sockets) >= self.limits.max_connections_per_token:
            raise TooManyConnections(f"at most {self.limits.max_connections_per_token} connections per token")
        sockets[id(context)] = None
        self._start_watcher()

    def _start_watcher(self) -> None:
        if self._watcher is None or self._watcher.done():
            with tracing.detached():  # outlives the socket that started it
                self._watcher = asyncio.create_task(self._watch(), name="token-guard")

    def watch_stream(self, token_id: uuid.UUID, stream: Revocable) -> None:
        """Have the watcher end this HTTP stream when its token is revoked or expires (no connection cap)."""
        self._streams.setdefault(token_id, {})[id(stream)] = stream
        self._start_watcher()

    def release_stream(self, token_id: uuid.UUID, stream: Revocable) -> None:
        self._drop(self._streams, token_id, id(stream))

    def _drop(self, registry: dict[uuid.UUID, dict[int, Any]], token_id: uuid.UUID, key: int) -> None:
        """Forget one socket or stream of a token; its verdict goes with its last socket and stream."""
        held = registry.get(token_id)
        if held is not None:
            held.pop(key, None)
            if not held:
                del registry[token_id]
                if token_id not in self._sockets and token_id not in self._streams:
                    self._forget(token_id)

    def attach(self, token_id: uuid.UUID, context: Context, handler: GuardedTransportWSHandler) -> None:
        sockets = self._sockets.get(token_id)
        if sockets is not None and id(context) in sockets:
            sockets[id(context)] = handler

    def release(self, token_id: uuid.UUID, context: Context) -> None:
        self._drop(self._sockets, token_id, id(context))

    def going_away(self) -> None:
        """Shutdown: the fast path's subscriptions end with SERVER_GOING_AWAY (the hub ends the others)."""
        self.cohorts.going_away()

    def drained(self) -> bool:
        """No operation runs over a socket or an HTTP stream, and every socket's queued frames went out."""
        if self._operations or self._streams:
            return False
        outboxes = (getattr(h, "_outbox", None) for sockets in self._sockets.values() for h in sockets.values())
        return all(outbox is None or not outbox.queue for outbox in outboxes)

    def open_counts(self) -> tuple[int, int]:
        """Open sockets and multipart HTTP streams of this process, over all tokens (for /metrics)."""
        return sum(map(len, self._sockets.values())), sum(map(len, self._streams.values()))

    def operations(self, token_id: uuid.UUID) -> int:
        """Running operations (subscriptions, and queries or mutations in flight) over the token's sockets."""
        return self._operations.get(token_id, 0)

    def count(self, token_id: uuid.UUID, change: int) -> None:
        total = self._operations.get(token_id, 0) + change
        if total > 0:
            self._operations[token_id] = total
        else:
            self._operations.pop(token_id, None)

    async def authenticate_socket(self, token: str, counter: StatementCounter) -> Principal | None:
        """A socket's token at `connection_init`. A verdict younger than `RECHECK_SECONDS` for the same token
        serves without a statement, as it does for fast-path subscriptions: a reconnecting crowd of one
        token's clients costs one lookup a second, and a revoked token's sockets close within that second."""
        digest = tokens.hash_token(token)
        known = self._principals.get(digest)
        if known is not None and self.recently_usable(known.token_id):
            return known
        async with self.db.statements(counter) as db:
            principal = await tokens.authenticate_hash(db, digest)
        if principal is not None:
            self._principals[digest] = principal
            self._verify({principal.token_id}, {principal.token_id})
        return principal

    async def usable(self, token_id: uuid.UUID) -> bool:
        async with self.db.statements() as db:
            usable = bool(await tokens.still_usable(db, [token_id]))
        self._verify({token_id} if usable else set(), {token_id})
        return usable

    def recently_usable(self, token_id: uuid.UUID) -> bool:
        """The token authenticated less than `RECHECK_SECONDS` ago (by `usable` or the watcher)."""
        verified = self._verified.get(token_id)
        return verified is not None and time.monotonic() - verified < RECHECK_SECONDS

    def verified(self, token_id: uuid.UUID) -> None:
        """The token just authenticated (a socket's `connection_init`): its verdict is fresh."""
        self._verify({token_id}, {token_id})

    def _verify(self, usable: set[uuid.UUID], asked: set[uuid.UUID]) -> None:
        now = time.monotonic()
        for token_id in asked:
            if token_id in usable:
                self._verified[token_id] = now
            else:
                self._forget(token_id)

    def _forget(self, token_id: uuid.UUID) -> None:
        if self._verified.pop(token_id, None) is not None:
            for digest in [d for d, p in self._principals.items() if p.token_id == token_id]:
                del self._principals[digest]

    async def _watch(self) -> None:
        """Once a second, one statement: close the sockets and streams whose token no longer authenticates."""
        while self._sockets or self._streams:
            await asyncio.sleep(RECHECK_SECONDS)
            ids = set(self._sockets) | set(self._streams)
            if not ids:
                break
            try:
                async with self.db.read() as db:
                    usable = await tokens.still_usable(db, ids)
            except Exception:  # the database being away must not end the watcher
                log.warning("token re-check failed", exc_info=True)
                continue
            self._verify(usable, ids)
            for token_id in ids - usable:
                for handler in list(self._sockets.get(token_id, {}).values()):
                    if handler is not None:
                        await handler.close_revoked()
                for stream in list(self._streams.get(token_id, {}).values()):
                    await stream.close_revoked()

    # -- rate limits ------------------------------------------------------------------------

    def charge(self, token_id: uuid.UUID, mutations: int, run_starts: int) -> int:
        """0 when the token may run these now (and they are counted), else whole seconds to wait."""
        now = time.monotonic()
        buckets = self._buckets.get(token_id)
        if buckets is None:
            buckets = self._buckets[token_id] = (
                Bucket.full(self._mutations, now),
                Bucket.full(self._run_starts, now),
            )
        return take_all([(buckets[0], self._mutations, mutations), (buckets[1], self._run_starts, run_starts)], now)


class CountedOperations(dict[str, Any]):
    """A socket's operations by id, keeping its token's total in the guard (no sum over sockets per subscribe)."""

    def __init__(self, guard: TokenGuard, token_id: uuid.UUID) -> None:
        super().__init__()
        self.guard = guard
        self.token_id = token_id

    def __setitem__(self, key: str, value: Any) -> None:
        if key not in self:
            self.guard.count(self.token_id, 1)
        super().__setitem__(key, value)

    def __delitem__(self, key: str) -> None:
        super().__delitem__(key)
        self.guard.count(self.token_id, -1)

    def pop(self, key: str, *default: Any) -> Any:
        if key in self:
            self.guard.count(self.token_id, -1)
        return super().pop(key, *default)


class GuardedTransportWSHandler(BaseGraphQLTransportWSHandler["Context", None]):
    """graphql-transport-ws with the per-token guards: re-check per operation, caps, revocation close."""

    @property
    def guard(self) -> TokenGuard:
        guard: TokenGuard = self.view.token_guard  # type: ignore[attr-defined]
        return guard

    async def handle_connection_init(self, message: ConnectionInitMessage) -> None:
        try:
            await super().handle_connection_init(message)
        except TooManyConnections as error:
            await self.websocket.close(code=CLOSE_TOO_MANY_CONNECTIONS, reason=str(error))
            return
        if self.connection_acknowledged:
            token_id = self.context.principal.token_id
            self.guard.attach(token_id, self.context, self)
            self.guard.verified(token_id)
            self.operations = CountedOperations(self.guard, token_id)

    async def handle_subscribe(self, message: SubscribeMessage) -> None:
        if self.connection_acknowledged:
            token_id = self.context.principal.token_id
            cached = self.guard.recently_usable(token_id) and self.guard.cohorts.serves(self, message)
            if not cached and not await self.guard.usable(token_id):
                await self.close_revoked()
                return
            limits = self.guard.limits
            if (
                len(self.operations) >= limits.max_subscriptions_per_connection
                or self.guard.operations(token_id) >= limits.max_subscriptions_per_token
            ):
                error = GraphQLError(
                    f"at most {limits.max_subscriptions_per_connection} operations per connection and "
                    f"{limits.max_subscriptions_per_token} per token",
                    extensions={"code": "TOO_MANY_SUBSCRIPTIONS"},
                )
                await self.send_message({"id": message["id"], "type": "error", "payload": [error.formatted]})
                return
            if message["id"] not in self.operations and await self.guard.cohorts.subscribe(self, message):
                return
        await super().handle_subscribe(message)

    def outbox(self, limit: int) -> Outbox:
        """The socket's queue for fast-path frames (api.cohorts), made on first use."""
        outbox: Outbox | None = getattr(self, "_outbox", None)
        if outbox is None:
            outbox = self._outbox = Outbox(self, limit)
        return outbox

    async def cleanup_operation(self, operation_id: str) -> None:
        operation = self.operations.get(operation_id)
        if isinstance(operation, Member):
            del self.operations[operation_id]
            operation.close()
            return
        await super().cleanup_operation(operation_id)

    async def close_revoked(self) -> None:
        """End every operation of this socket and close it with 4403."""
        for operation_id in list(self.operations):
            await self.cleanup_operation(operation_id)
        with contextlib.suppress(Exception):  # already closed by the client
            await self.websocket.close(code=CLOSE_REVOKED, reason="token revoked or expired")

    async def shutdown(self) -> None:
        try:
            await super().shutdown()
        finally:
            outbox: Outbox | None = getattr(self, "_outbox", None)
            if outbox is not None:
                outbox.stop()
            if self.connection_init_received:
                self.guard.release(self.context.principal.token_id, self.context)


def _root_fields(document: DocumentNode, operation: OperationDefinitionNode) -> Iterator[str]:
    fragments = {d.name.value: d for d in document.definitions if hasattr(d, "type_condition") and hasattr(d, "name")}

    def walk(selection_set: SelectionSetNode, seen: frozenset[str]) -> Iterator[str]:
        for selection in selection_set.selections:
            if isinstance(selection, FieldNode):
                yield selection.name.value
            elif isinstance(selection, InlineFragmentNode):
                yield from walk(selection.selection_set, seen)
            elif isinstance(selection, FragmentSpreadNode) and selection.name.value not in seen:
                fragment: Any = fragments.get(selection.name.value)
                if fragment is not None:
                    yield from walk(fragment.selection_set, seen | {selection.name.value})

    yield from walk(operation.selection_set, frozenset())


def _operation(document: DocumentNode, name: str | None) -> OperationDefinitionNode | None:
    operations = [d for d in document.definitions if isinstance(d, OperationDefinitionNode)]
    if name is None:
        return operations[0] if len(operations) == 1 else None
    return next((o for o in operations if o.name is not None and o.name.value == name), None)


class RateLimits(SchemaExtension):
    """Refuses a mutation request over its token's rate before anything executes.

    Hooked as a schema extension, after validation and before execution, so it sees the whole
    operation once, on HTTP and WebSocket alike, and a refusal changes nothing: every root
    mutation field costs one token from the token's mutation bucket, and each field that starts
    agent work (`RUN_STARTING_FIELDS`) one more from its run-start bucket; either bucket short
    refuses the whole operation with a top-level error RATE_LIMITED whose `extensions.retryAfter`
    is the whole seconds to wait (over HTTP also status 429 and a `Retry-After` header).
    The buckets live in the process's `TokenGuard` (found in the request's scope state).
    """

    def on_execute(self) -> Iterator[None]:
        ctx = self.execution_context
        refused = self._refusal()
        if refused is not None:
            ctx.result = GraphQLExecutionResult(data=None, errors=[refused])
        yield

    def _refusal(self) -> GraphQLError | None:
        ctx = self.execution_context
        if ctx.operation_type is not OperationType.MUTATION or ctx.graphql_document is None:
            return None
        request = getattr(ctx.context, "request", None)
        guard = getattr(request, "scope", {}).get("state", {}).get(STATE_KEY)
        principal: Principal | None = getattr(ctx.context, "principal", None)
        if guard is None or principal is None:
            return None
        operation = _operation(ctx.graphql_document, ctx.operation_name)
        if operation is None:
            return None
        fields = [name for name in _root_fields(ctx.graphql_document, operation) if name != "__typename"]
        starts = sum(1 for name in fields if name in RUN_STARTING_FIELDS)
        wait = guard.charge(principal.token_id, len(fields), starts)
        if wait == 0:
            return None
        return GraphQLError(
            f"this token's mutation rate is exceeded; retry in {wait} s",
            extensions={"code": "RATE_LIMITED", "retryAfter": wait},
        )

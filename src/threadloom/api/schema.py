"""Assembles the Strawberry schema with its limits.

Depth, alias and cost rules come from `api.validation` (built once per set of limits).
A query operation that runs longer than `Limits.query_timeout` is cancelled (QUERY_TIMEOUT).
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from typing import Any

from graphql import ExecutionResult, GraphQLError, OperationType
from strawberry.extensions import AddValidationRules, MaxTokensLimiter
from strawberry.schema.config import StrawberryConfig
from strawberry.schema.schema import StrawberryGraphQLCoreExecutionContext

from threadloom.api.bounds import BoundedSchema, BoundedValidation
from threadloom.api.context import Context, fresh_context
from threadloom.api.cost import CostVariables
from threadloom.api.descriptions import describe
from threadloom.api.errors import CodedErrors, RecordOperation
from threadloom.api.mutations import Mutation
from threadloom.api.query import Query
from threadloom.api.subscriptions import Subscription
from threadloom.api.token_guard import RateLimits
from threadloom.api.types import NODE_TYPES
from threadloom.api.usage import BIG_INT, BigInt
from threadloom.api.validation import limited_rules
from threadloom.api.validation_process import ValidationProcess
from threadloom.config import Limits
from threadloom.store.db import Snapshot


class FreshMemoExecutionContext(StrawberryGraphQLCoreExecutionContext):
    """Gives every subscription event a fresh field memo.

    graphql-core 3.3.2's per-event executor is a shallow copy that shares the parent's
    `_relevant_sub_fields` memo; each event adds an entry keyed by a fresh id that never
    hits again, so a long subscription grows by ~2.4 KB per event. A fresh memo per
    event keeps memory flat (and is cheaper).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # A WebSocket shares one context between its operations: each gets its own loaders.
        self.context_value = fresh_context(self.context_value)

    def build_per_event_executor(self, payload: Any) -> Any:
        executor = super().build_per_event_executor(payload)
        executor._relevant_sub_fields = {}
        executor._stream_usages = type(self._stream_usages)()
        # Each event resolves its nested fields against the database as it is now.
        executor.context_value = fresh_context(self.context_value)
        return executor


class BoundedListsExecutionContext(FreshMemoExecutionContext):
    """Counts the list items an operation returns and stops at the cost budget (QUERY_TOO_COSTLY).

    The static cost rule prices a plain list (a run's children, its execution graph) at one
    default page, but those lists return whatever the run holds; an operator can make runs
    with thousands of nodes. Counting at execution, before a list's items are completed,
    bounds every response by the same budget the static rule uses (per subscription event).
    """

    max_items: int = 20_000

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._items = 0

    def build_per_event_executor(self, payload: Any) -> Any:
        executor = super().build_per_event_executor(payload)
        executor._items = 0
        return executor

    def complete_list_value(
        self, return_type: Any, field_details: Any, info: Any, path: Any, result: Any, *rest: Any
    ) -> Any:
        if isinstance(result, list | tuple):
            self.count_list_items(result)
        return super().complete_list_value(return_type, field_details, info, path, result, *rest)

    def list_items_left(self) -> int:
        """How many more list items the budget allows (`row_pages` declines a page that would pass it)."""
        return self.max_items - self._items

    def count_list_items(self, items: list[Any] | tuple[Any, ...]) -> None:
        """Counts a list about to be completed (also called by `compiled.CompiledObjects`' inline lists)."""
        self._items += len(items)
        if self._items > self.max_items:
            raise GraphQLError(
                f"the response would hold more than {self.max_items} list items",
                extensions={"code": "QUERY_TOO_COSTLY", "cost": self._items, "maxCost": self.max_items},
            )


class TimedExecutionContext(BoundedListsExecutionContext):
    """Cancels a query operation that runs longer than `timeout` seconds (QUERY_TIMEOUT).

    The cancellation lands at the next await (a loader's SQL, a resolver): pure CPU work
    inside graphql-core does not yield, which is why the static cost rule refuses big
    queries before they start. Mutations are not cut mid-command: their work is one
    transaction and the payload they select is bounded by the cost rule.
    """

    timeout: float = 10.0

    def execute_operation(self, serially: bool | None = None) -> Any:
        query = self.operation.operation == OperationType.QUERY
        context = self.context_value
        # A query's reads share one snapshot, so what it returns agrees with itself; mutations read
        # their payload after their command commits, subscription events as each is resolved.
        snapshot = context.loaders.snapshot() if query and isinstance(context, Context) else None
        result = super().execute_operation(serially)
        if not query or not inspect.isawaitable(result):
            return result  # nothing awaited: no read was made, the snapshot never opened
        return self._within(result, self.timeout, snapshot)

    @staticmethod
    async def _within(result: Any, seconds: float, snapshot: Snapshot | None) -> Any:
        try:
            async with asyncio.timeout(seconds):
                return await result
        except TimeoutError:
            error = GraphQLError(
                f"the query ran longer than {seconds:g} s and was cancelled",
                extensions={"code": "QUERY_TIMEOUT", "timeoutSeconds": seconds},
            )
            return ExecutionResult(None, [error])
        finally:
            if snapshot is not None:
                await snapshot.close()


@functools.cache
def _execution_context(timeout: float, max_items: int) -> type[TimedExecutionContext]:
    return type("TimedExecutionContext", (TimedExecutionContext,), {"timeout": timeout, "max_items": max_items})


_prebuilt: dict[tuple[Limits, bool], BoundedSchema] = {}


def prebuild_schema(limits: Limits | None = None, *, dev: bool = False) -> BoundedSchema:
    """Build now the schema that the next `build_schema` with the same arguments, in this process or a fork of
    it, takes instead of building one: a process that forks servers (the test suite's forkserver) pays the
    build (~0.1 s of CPU) once rather than once per server."""
    limits = limits or Limits()
    built = _prebuilt[(limits, dev)] = _build(limits, dev)
    return built


def build_schema(limits: Limits | None = None, *, dev: bool = False) -> BoundedSchema:
    """The API's schema with `limits` (a prebuilt one when `prebuild_schema` made it, each taken once)."""
    limits = limits or Limits()
    return _prebuilt.pop((limits, dev), None) or _build(limits, dev)


def _build(limits: Limits, dev: bool) -> BoundedSchema:
    # BoundedSchema: strawberry's, with big documents parsed off the event loop (api.bounds).
    schema = BoundedSchema(
        query=Query,
        mutation=Mutation,
        subscription=Subscription,
        execution_context_class=_execution_context(limits.query_timeout, limits.max_query_cost),
        types=list(NODE_TYPES.values()),
        extensions=[
            functools.partial(
                AddValidationRules,
                limited_rules(limits),
            ),
            CostVariables,
            functools.partial(BoundedValidation, limits),  # after CostVariables: it may validate
            functools.partial(MaxTokensLimiter, max_token_count=limits.max_tokens),
            CodedErrors,
            RecordOperation,
            RateLimits,  # per-token mutation and run-start buckets
        ],
        config=StrawberryConfig(sort_schema=True, disable_field_suggestions=not dev, scalar_map={BigInt: BIG_INT}),
        validation=ValidationProcess(limits, dev),
    )
    describe(schema._schema)  # what the definitions leave undescribed (api.descriptions)
    schema.validation.schema = schema._schema
    return schema


def export_sdl() -> str:
    return build_schema().as_str() + "\n"

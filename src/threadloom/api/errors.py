"""Error shapes: `userErrors` for expected failures, coded top-level errors otherwise.

Every top-level error carries `extensions.code`. Unexpected exceptions are logged with
their traceback and reach the client only as INTERNAL_SERVER_ERROR.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import strawberry
from graphql import GraphQLError
from strawberry.extensions import MaskErrors, SchemaExtension

from threadloom import metrics, tracing
from threadloom.domain.errors import DomainError

log = logging.getLogger("threadloom.api")


@strawberry.type(description="An expected failure: nothing was changed.")
class UserError:
    code: str = strawberry.field(description="Stable machine-readable code, e.g. NOT_FOUND, INVALID_ID.")
    message: str
    field: str | None = strawberry.field(description="The input field at fault, when there is one.")

    @classmethod
    def of(cls, error: DomainError) -> UserError:
        return cls(code=error.code.value, message=error.message, field=error.field)


class ApiError(GraphQLError):
    """A coded error raised by a query resolver (bad page size, bad cursor …)."""

    def __init__(self, error: DomainError) -> None:
        super().__init__(error.message, extensions={"code": error.code.value, "field": error.field})


def _is_unexpected(error: GraphQLError) -> bool:
    original = error.original_error
    return original is not None and not isinstance(original, (GraphQLError, DomainError))


class CodedErrors(MaskErrors):
    """Masks unexpected errors and gives every error a code."""

    def __init__(self) -> None:
        super().__init__(should_mask_error=_is_unexpected, error_message="Internal server error")

    def _process_result(self, result: object) -> None:
        # The library checks a runtime Protocol on every streamed result; an attribute
        # read is enough and far cheaper on the subscription hot path.
        errors = getattr(result, "errors", None)
        if errors:
            result.errors = self._process_errors(errors)  # type: ignore[attr-defined]

    def anonymise_error(self, error: GraphQLError) -> GraphQLError:
        log.error("unexpected error at %s", error.path, exc_info=error.original_error)
        return GraphQLError(
            self.error_message,
            nodes=error.nodes,
            path=error.path,
            extensions={"code": "INTERNAL_SERVER_ERROR"},
        )

    def _process_errors(self, errors: list[GraphQLError]) -> list[GraphQLError]:
        out = super()._process_errors(errors)
        for error in out:
            if not error.extensions or "code" not in error.extensions:
                original = error.original_error
                if isinstance(original, DomainError):
                    code = original.code.value
                elif error.path is None:
                    syntax = error.message.startswith("Syntax Error")
                    code = "GRAPHQL_PARSE_FAILED" if syntax else "GRAPHQL_VALIDATION_FAILED"
                else:
                    code = "BAD_REQUEST"
                error.extensions = {**(error.extensions or {}), "code": code}
            metrics.error(str(error.extensions["code"]))
        return out


class RecordOperation(SchemaExtension):
    """Puts the operation name where the request log line can read it, counts the operation, and with
    tracing on makes its span (named by the operation, its SQL and effects inside it; none per field)."""

    def on_execute(self) -> Iterator[None]:
        context = self.execution_context
        request = getattr(context.context, "request", None)
        if request is not None:
            request.scope.setdefault("state", {})["operation"] = context.operation_name
        kind = context.operation_type.value
        metrics.OPERATIONS.labels(metrics.operation_label(context.operation_name), kind).inc()
        if not tracing.ENABLED:
            yield
            return
        if kind == "subscription":  # lives as long as its socket: the ASGI span covers it
            yield
            return
        name = context.operation_name or ""
        attributes = {"graphql.operation.type": kind, "graphql.operation.name": name}
        with tracing.span(f"{kind} {name}".strip(), attributes):
            yield

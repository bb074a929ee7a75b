"""Relay connections over keyset pages (`first`/`after`, `last`/`before`, ≤ 100 a page).

Page arguments written in the document are checked during validation (`pagination_rule`),
so a bad page is refused like any other malformed request, before anything runs; values
passed through variables are only known at execution and get the same coded errors there.
"""

from __future__ import annotations

import base64
import binascii
import inspect
import typing
import uuid
from collections.abc import Callable, Hashable, Mapping
from typing import Annotated, Any, Generic, TypeVar

import strawberry
from graphql import (
    FieldNode,
    GraphQLError,
    IntValueNode,
    ListValueNode,
    StringValueNode,
    ValidationRule,
    ValueNode,
    VariableNode,
    get_named_type,
)

from threadloom.api.context import Info
from threadloom.api.cost import request_variables
from threadloom.api.errors import ApiError
from threadloom.api.loaders import PAGED, Filters
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.store.reads import PageArgs

T = TypeVar("T")
DEFAULT_PAGE = 20


@strawberry.type
class PageInfo:
    has_next_page: bool
    has_previous_page: bool
    start_cursor: str | None
    end_cursor: str | None


@strawberry.type
class Edge(Generic[T]):
    cursor: str
    node: T


@strawberry.type
class Connection(Generic[T]):
    edges: list[Edge[T]]
    page_info: PageInfo
    _relation: strawberry.Private[str]
    _count_key: strawberry.Private[tuple[Hashable, Filters]]

    @strawberry.field(description="All items matching the filters, across pages.")
    async def total_count(self, info: Info) -> int:
        return await info.context.loaders.count(self._relation).load(self._count_key)

    @strawberry.field(description="The nodes of this page, for clients that do not need cursors.")
    def nodes(self) -> list[T]:
        return [e.node for e in self.edges]


def encode_cursor(value: Any) -> str:
    return base64.urlsafe_b64encode(f"c:{value}".encode()).decode().rstrip("=")


def decode_cursor(cursor: str, key_type: type) -> Any:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
        if not raw.startswith("c:"):
            raise ValueError(raw)
        return uuid.UUID(raw[2:]) if key_type is uuid.UUID else int(raw[2:])
    except (binascii.Error, UnicodeDecodeError, ValueError, OverflowError):
        raise ApiError(DomainError(ErrorCode.INVALID_CURSOR, "the cursor is not one this connection issued")) from None


def page_args(
    first: int | None, after: str | None, last: int | None, before: str | None, key_type: type, max_size: int
) -> PageArgs:
    def bad(code: ErrorCode, message: str, field: str) -> ApiError:
        return ApiError(DomainError(code, message, field))

    if first is not None and last is not None:
        raise bad(ErrorCode.INVALID_INPUT, "pass first or last, not both", "last")
    for name, size in (("first", first), ("last", last)):
        if size is not None and size < 0:
            raise bad(ErrorCode.INVALID_INPUT, f"{name} must not be negative", name)
        if size is not None and size > max_size:
            raise bad(ErrorCode.PAGE_SIZE_EXCEEDED, f"{name} must be at most {max_size}", name)
    if first is None and last is None:
        first = DEFAULT_PAGE
    return PageArgs(
        first=first,
        after=None if after is None else decode_cursor(after, key_type),
        last=last,
        before=None if before is None else decode_cursor(before, key_type),
    )


async def connect(
    info: Info,
    relation: str,
    parent: Hashable,
    build: Callable[[Any], T],
    *,
    first: int | None,
    after: str | None,
    last: int | None = None,
    before: str | None = None,
    filters: Mapping[str, Any] | None = None,
) -> Connection[T]:
    rel = PAGED[relation]
    args = page_args(first, after, last, before, rel.key_type, info.context.services.settings.limits.max_page_size)
    frozen: Filters = tuple(sorted((filters or {}).items()))
    page = await info.context.loaders.page(relation).load((parent, args, frozen))
    edges = [Edge(cursor=encode_cursor(r[rel.key]), node=build(r)) for r in page.rows]
    return Connection(
        edges=edges,
        page_info=PageInfo(
            has_next_page=page.has_next,
            has_previous_page=page.has_previous,
            start_cursor=edges[0].cursor if edges else None,
            end_cursor=edges[-1].cursor if edges else None,
        ),
        _relation=relation,
        _count_key=(parent, frozen),
    )


_PAGE_PARAMS = [
    inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=kind)
    for name, kind in (("first", int | None), ("after", str | None), ("last", int | None), ("before", str | None))
]


def paged(
    relation: str,
    node: str,
    *,
    parent: Callable[[Any], Hashable] = lambda obj: obj.rec.id,
    description: str | None = None,
) -> Callable[[Callable[..., Mapping[str, Any]]], Any]:
    """A connection field over `relation` whose nodes are the type named `node` (in the caller's module).

    The decorated function takes `(self, info, <its own arguments>)` and returns the relation's
    filters; the field's arguments are the page arguments plus its own, so every connection
    pages, counts and validates the same way.
    """

    def wrap(filters_of: Callable[..., Mapping[str, Any]]) -> Any:
        namespace = filters_of.__globals__
        hints = typing.get_type_hints(filters_of)
        own = list(inspect.signature(filters_of).parameters.values())[2:]  # after (self, info)

        async def resolve(self: Any, info: Info, **args: Any) -> Any:
            page = {name: args.pop(name, None) for name in ("first", "after", "last", "before")}
            filters = filters_of(self, info, **args)
            return await connect(info, relation, parent(self), namespace[node].from_row, **page, filters=filters)

        # Strawberry reads the field's arguments and type from the resolver's signature.
        resolve.__signature__ = inspect.Signature(  # type: ignore[attr-defined]
            [
                inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD),
                inspect.Parameter("info", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=Info),
                *_PAGE_PARAMS,
                *(p.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=hints[p.name]) for p in own),
            ],
            return_annotation=Connection[Annotated[node, strawberry.lazy(filters_of.__module__)]],  # type: ignore[valid-type]
        )
        resolve.__name__ = resolve.__qualname__ = filters_of.__name__
        resolve.__module__ = filters_of.__module__
        return strawberry.field(resolver=resolve, description=description)

    return wrap


# The connection types of the schema and the type of their cursor's key.
_CONNECTION_KEYS: dict[str, type] = {
    f"{node}Connection": PAGED[relation].key_type
    for node, relation in (
        ("Project", "projects"),
        ("Thread", "project.threads"),
        ("Run", "thread.runs"),
        ("ConversationMessage", "thread.messages"),
        ("Activity", "thread.activities"),
        ("ProviderTurn", "providerThread.turns"),
        ("ContextTransfer", "thread.transfers"),
    )
}


def _variable(value: ValueNode | None) -> Any:
    """The request's value of a variable argument (None when absent)."""
    return request_variables().get(value.name.value) if isinstance(value, VariableNode) else None


def _int(value: ValueNode | None) -> int | None:
    """An integer written in the document or given through a variable; None otherwise."""
    if isinstance(value, IntValueNode):
        return int(value.value)
    given = _variable(value)
    return given if isinstance(given, int) and not isinstance(given, bool) else None


def _str(value: ValueNode | None) -> str | None:
    if isinstance(value, StringValueNode):
        return value.value
    given = _variable(value)
    return given if isinstance(given, str) else None


def pagination_rule(max_size: int) -> type[ValidationRule]:
    """A validation rule refusing page arguments that can never work, with the runtime's codes.

    Negative or oversized `first`/`last`, both at once, a cursor this connection never
    issued, and more than `max_size` ids for `nodes` are refused before execution, so the
    response is a request error (HTTP 400 with graphql-response+json), never `data: null`.
    Arguments given through variables are checked with the request's values (`CostVariables`
    hands them to validation), so they are refused the same way.
    """

    class PaginationRule(ValidationRule):
        def enter_field(self, node: FieldNode, *_args: Any) -> None:
            field = self.context.get_field_def()
            if field is None or not node.arguments:
                return
            args = {a.name.value: a.value for a in node.arguments}
            parent = self.context.get_parent_type()
            if parent is not None and parent.name == "Query" and node.name.value == "nodes":
                ids = args.get("ids")
                if isinstance(ids, ListValueNode) and len(ids.values) > max_size:
                    message = f"at most {max_size} ids at once"
                    self._refuse(node, ApiError(DomainError(ErrorCode.PAGE_SIZE_EXCEEDED, message, "ids")))
                return
            key_type = _CONNECTION_KEYS.get(get_named_type(field.type).name)
            if key_type is None:
                return
            try:
                page_args(
                    _int(args.get("first")),
                    _str(args.get("after")),
                    _int(args.get("last")),
                    _str(args.get("before")),
                    key_type,
                    max_size,
                )
            except ApiError as error:
                self._refuse(node, error)

        def _refuse(self, node: FieldNode, error: ApiError) -> None:
            self.report_error(GraphQLError(error.message, node, extensions=error.extensions))

    return PaginationRule

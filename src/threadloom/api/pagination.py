"""Relay connections over keyset pages (`first`/`after`, `last`/`before`, ≤ 100 a page)."""

from __future__ import annotations

import base64
import binascii
import uuid
from collections.abc import Callable, Hashable, Mapping
from typing import Any, Generic, TypeVar

import strawberry

from threadloom.api.context import Info
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

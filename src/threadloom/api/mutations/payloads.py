"""What every mutation shares: one `input`, one engine command, a payload with `userErrors`.

A mutation is written as its engine command, `command(ctx, input)`, under `@mutation(shape)`:
the decorator makes the GraphQL field (argument `input`, the shape's payload type), runs the
command, turns a refusal (`DomainError`: the command's transaction rolled back, nothing
changed) into `userErrors`, and builds the payload from what the command returned, loaded
again under the caller's token.
"""

from __future__ import annotations

import dataclasses
import typing
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, Generic, TypeVar

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context, Info
from threadloom.api.errors import UserError
from threadloom.api.types import Run, Thread
from threadloom.domain.errors import DomainError, ErrorCode

R = TypeVar("R")
P = TypeVar("P")
MAX_KEY = 200


@dataclasses.dataclass(frozen=True, slots=True)
class Shape(Generic[R, P]):
    """A payload type and how to build it from (the command's result or None, userErrors, the client's key)."""

    payload: type[P]
    build: Callable[[Info, R | None, list[UserError], str | None], Awaitable[P]]


def mutation(
    shape: Shape[R, P], *, key_field: str = "client_mutation_id"
) -> Callable[[Callable[[Context, Any], Awaitable[R]]], Any]:
    """The mutation field running `command(ctx, input)`; its docstring is the field's description.

    `key_field` names the input's idempotency key, echoed in the payload.
    """

    def wrap(command: Callable[[Context, Any], Awaitable[R]]) -> Any:
        async def resolve(self: Any, info: Info, input: Any) -> P:
            client_key: str | None = getattr(input, key_field)
            try:
                result: R | None = await command(info.context, input)
                errors: list[UserError] = []
            except DomainError as error:
                result, errors = None, [UserError.of(error)]
            return await shape.build(info, result, errors, client_key)

        # Strawberry reads the argument and payload types from the resolver's annotations.
        input_type = typing.get_type_hints(command)["input"]
        resolve.__annotations__ = {"info": Info, "input": input_type, "return": shape.payload}
        resolve.__name__ = resolve.__qualname__ = command.__name__
        resolve.__module__ = command.__module__
        description = " ".join(command.__doc__.split()) if command.__doc__ else None
        return strawberry.mutation(resolver=resolve, description=description)

    return wrap


def key(value: str | None) -> str | None:
    """An idempotency key, checked (1..200 characters)."""
    if value is not None and (not value or len(value) > MAX_KEY):
        raise DomainError(
            ErrorCode.INVALID_INPUT, f"clientMutationId must be 1..{MAX_KEY} characters", "clientMutationId"
        )
    return value


@strawberry.input
class KeyedInput:
    """The base of every mutation input with an idempotency key (not in the schema itself)."""

    client_mutation_id: str | None = None

    def key(self) -> str | None:
        """The key, checked. Commands call it after decoding their ids, so a request with both
        faults reports the id, as it always did."""
        return key(self.client_mutation_id)


async def load(info: Info, cls: Any, entity_id: uuid.UUID | None) -> Any:
    """The object a command named, if the caller may see it."""
    row = await info.context.load_visible(cls.table(), entity_id)
    return None if row is None else cls.from_row(row)


def returning(payload: type[P], field: str, entity: Any) -> Shape[uuid.UUID, P]:
    """The shape of a payload naming one object (`field`) by the id the command returns."""

    async def build(info: Info, entity_id: uuid.UUID | None, errors: list[UserError], client_key: str | None) -> P:
        found = await load(info, entity, entity_id)
        return payload(**{field: found, "user_errors": errors, "client_mutation_id": client_key})

    return Shape(payload, build)


def thread_id(value: str) -> uuid.UUID:
    return gid.decode_as(value, "Thread", "threadId")


def run_id(value: str) -> uuid.UUID:
    return gid.decode_as(value, "Run", "runId")


@strawberry.type
class ThreadPayload:
    thread: Thread | None
    user_errors: list[UserError]
    client_mutation_id: str | None


@strawberry.type
class RunPayload:
    run: Run | None
    user_errors: list[UserError]
    client_mutation_id: str | None


THREAD = returning(ThreadPayload, "thread", Thread)
RUN = returning(RunPayload, "run", Run)

"""Descriptions for schema types and fields that their Python definitions do not carry.

Most object types are generated from domain entities (`types._entity`), whose fields have no place for a
description; connection, edge, input and payload types follow patterns. A description written where a field is
declared (`strawberry.field(description=…)`) always wins: `describe` fills in only what is missing, from the
tables in `descriptions_table` and from the patterns below. `tests/test_schema_descriptions.py` fails on a type
or field left without one, and on a table entry naming nothing in the schema.
"""

from __future__ import annotations

import re

from graphql import (
    GraphQLInputObjectType,
    GraphQLInterfaceType,
    GraphQLNamedType,
    GraphQLObjectType,
    GraphQLSchema,
    get_named_type,
)

from threadloom.api.descriptions_table import FIELDS, TYPES

BUILT_IN = frozenset({"String", "Int", "Float", "Boolean", "ID"})

# A field of this name means the same on every type that has it (`{type}` is the type's name).
COMMON_FIELDS = {
    "id": "The global id: `node(id:)` reads the object back with it.",
    "createdAt": "When it was created.",
    "updatedAt": "When it last changed.",
    "clientMutationId": "Any string of the client's, given back unchanged in the payload (Relay).",
    "userErrors": "Why nothing changed, each with a stable `code` and the input `field` it is about; empty on success.",
    "thread": "The thread it belongs to.",
    "threadId": "The thread's global id.",
    "run": "The run it belongs to.",
    "runId": "The run's global id.",
    "nodeId": "The execution node's global id.",
    "projectId": "The project's global id.",
    "requestId": "The runtime request's global id.",
    "project": "The project it belongs to.",
}
CONNECTION_FIELDS = {
    "edges": "The items of this page, each with its cursor.",
    "nodes": "The items of this page (the same as `edges { node }`).",
    "pageInfo": "Where this page sits: cursors to page on with `after` / `before`.",
    "totalCount": "How many items there are in all pages together.",
}
EDGE_FIELDS = {
    "cursor": "An opaque position: pass it as `after` or `before` to page from here.",
    "node": "The item.",
}


def _words(name: str) -> str:
    """`ConversationMessage` → "conversation message"."""
    return re.sub(r"(?<!^)(?=[A-Z])", " ", name).lower()


def _mutations_of(schema: GraphQLSchema) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Which mutations take each input type and answer with each payload type."""
    inputs: dict[str, list[str]] = {}
    payloads: dict[str, list[str]] = {}
    if schema.mutation_type is None:
        return inputs, payloads
    for name, field in schema.mutation_type.fields.items():
        payloads.setdefault(get_named_type(field.type).name, []).append(name)
        for arg in field.args.values():
            inputs.setdefault(get_named_type(arg.type).name, []).append(name)
    return inputs, payloads


def _quoted(names: list[str]) -> str:
    return ", ".join(f"`{n}`" for n in sorted(names))


def _pattern_type(t: GraphQLNamedType, inputs: dict[str, list[str]], payloads: dict[str, list[str]]) -> str | None:
    name = t.name
    if name.endswith("Connection"):
        items = _words(name.removesuffix("Connection"))
        return f"A page of {items}s (a Relay connection: `first`/`after`, `last`/`before`)."
    if name.endswith("Edge"):
        return f"One {_words(name.removesuffix('Edge'))} in a page, with its cursor."
    if name in inputs:
        return f"The input of {_quoted(inputs[name])}."
    if name in payloads:
        return f"What {_quoted(payloads[name])} answers: the object as it is after the change, or `userErrors`."
    return None


def _pattern_field(t: GraphQLNamedType, field: str) -> str | None:
    if t.name.endswith("Connection") and field in CONNECTION_FIELDS:
        return CONNECTION_FIELDS[field]
    if t.name.endswith("Edge") and field in EDGE_FIELDS:
        return EDGE_FIELDS[field]
    if t.name.endswith("Payload") and field not in COMMON_FIELDS:
        return f"The {_words(field)} as it is after the change; null when `userErrors` says why nothing changed."
    return COMMON_FIELDS.get(field)


def _described_types(schema: GraphQLSchema) -> list[GraphQLNamedType]:
    return [t for name, t in sorted(schema.type_map.items()) if not name.startswith("__") and name not in BUILT_IN]


def _fields(t: GraphQLNamedType) -> dict[str, object]:
    if isinstance(t, GraphQLObjectType | GraphQLInputObjectType | GraphQLInterfaceType):
        return dict(t.fields)
    return {}


def describe(schema: GraphQLSchema) -> None:
    """Give every type and field without a description one: the table's, else its pattern's."""
    inputs, payloads = _mutations_of(schema)
    for t in _described_types(schema):
        if not t.description:
            t.description = TYPES.get(t.name) or _pattern_type(t, inputs, payloads)
        for name, field in _fields(t).items():
            if not getattr(field, "description", None):
                text = FIELDS.get(f"{t.name}.{name}") or _pattern_field(t, name)
                if text:
                    field.description = text  # type: ignore[attr-defined]


def missing(schema: GraphQLSchema) -> list[str]:
    """Types (`Run`) and fields (`Run.status`) still without a description."""
    found = []
    for t in _described_types(schema):
        if not t.description:
            found.append(t.name)
        found += [f"{t.name}.{n}" for n, f in _fields(t).items() if not getattr(f, "description", None)]
    return found


def stale(schema: GraphQLSchema) -> list[str]:
    """Table entries that name no type or field of the schema (renamed or removed since)."""
    types = schema.type_map
    gone = [name for name in TYPES if name not in types]
    for key in FIELDS:
        type_name, _, field = key.partition(".")
        if type_name not in types or field not in _fields(types[type_name]):
            gone.append(key)
    return gone


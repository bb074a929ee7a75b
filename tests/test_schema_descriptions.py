"""Every type and field of the public schema says what it is, to a client reading it by introspection.

A newcomer learns the API from GraphiQL's docs pane and from `schema/schema.graphql`; a bare field name
(`advancesRunCount`, `resolutionFidelity`) teaches nothing. Descriptions written where a field is declared
win; `api.descriptions_table` fills in the rest (entity fields, enums), and patterns cover connections, edges,
inputs and payloads.
"""

from __future__ import annotations

from typing import Any

from graphql import GraphQLSchema, graphql_sync

from threadloom.api.descriptions import missing, stale
from threadloom.api.schema import build_schema, export_sdl

INTROSPECT = """{ __schema { types { name kind description
  fields(includeDeprecated: true) { name description } inputFields { name description } } } }"""
BUILT_IN = {"String", "Int", "Float", "Boolean", "ID"}


def _core() -> GraphQLSchema:
    return build_schema()._schema


def test_every_type_and_field_has_a_description_as_introspection_shows_it() -> None:
    result = graphql_sync(_core(), INTROSPECT)
    assert result.errors is None, result.errors
    assert result.data is not None
    bare: list[str] = []
    types: list[dict[str, Any]] = result.data["__schema"]["types"]
    for t in types:
        if t["name"].startswith("__") or t["name"] in BUILT_IN:
            continue
        if not (t["description"] or "").strip():
            bare.append(t["name"])
        for field in (t["fields"] or []) + (t["inputFields"] or []):
            if not (field["description"] or "").strip():
                bare.append(f"{t['name']}.{field['name']}")
    assert bare == [], f"{len(bare)} without a description (add them in src/threadloom/api/): {bare}"
    assert len(types) > 100  # the walk saw the whole schema, not an empty one


def test_the_description_table_names_only_what_the_schema_has() -> None:
    assert stale(_core()) == []


def test_a_description_written_on_the_field_wins_over_the_table() -> None:
    # `Thread.status` is described where it is declared; the table's patterns must not replace that.
    status = _core().type_map["Thread"].fields["status"]  # type: ignore[union-attr]
    assert status.description and "ROLLING_BACK" in status.description
    assert missing(_core()) == []


def test_the_exported_sdl_carries_the_descriptions() -> None:
    sdl = export_sdl()
    assert '"""The global id: `node(id:)` reads the object back with it."""' in sdl
    assert "One try of a run on the agent." in sdl

"""The schema as a contract: what a client built against the last release keeps working, or is told why.

`schema/released.graphql` is the SDL of the previous release (checked in, so the check runs on a clean
clone with no tags or network). The current SDL (`threadloom export-schema`) is compared with it by
graphql-core's breaking-change finder. Every breaking change must be listed in the `## Unreleased` section of
CHANGELOG.md: one line naming its schema coordinate in backticks (`Type.field`, `Type.field(arg:)`,
`Enum.VALUE`, `Type`, `@directive`) and saying what replaces it (`replaced by …`, or `no replacement`). A
field, argument or enum value may only be removed once the released schema marked it `@deprecated`. Cutting
a release copies schema/schema.graphql to schema/released.graphql and renames `## Unreleased` to the
version (docs/graph.md, "The schema as a contract").

The denial twins run the same check over temporary copies: a field removed is caught, and passes only when
it was deprecated in the released copy and listed in a temporary CHANGELOG.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from graphql import (
    BreakingChangeType,
    DocumentNode,
    GraphQLEnumType,
    GraphQLInputObjectType,
    GraphQLInterfaceType,
    GraphQLObjectType,
    GraphQLSchema,
    ObjectTypeDefinitionNode,
    build_schema,
    find_breaking_changes,
    parse,
    print_ast,
    print_schema,
)

from threadloom.api.schema import export_sdl

ROOT = Path(__file__).resolve().parents[1]
RELEASED = ROOT / "schema" / "released.graphql"
CHANGELOG = ROOT / "CHANGELOG.md"

# What a coordinate looks like in graphql-core's descriptions: `@dir` or `@dir(arg:)`, `Type.member` or
# `Type.field(arg:)`, else the description's first name (`Type was removed.`, `Member was removed from union`).
_DIRECTIVE = re.compile(r"@[_A-Za-z]\w*(?:\([_A-Za-z]\w*:\))?")
_MEMBER = re.compile(r"\b[_A-Za-z]\w*\.[_A-Za-z]\w*(?:\([_A-Za-z]\w*:\))?")
_NAME = re.compile(r"(?:Standard scalar )?([_A-Za-z]\w*)")
_REMOVALS = {
    BreakingChangeType.FIELD_REMOVED,
    BreakingChangeType.ARG_REMOVED,
    BreakingChangeType.VALUE_REMOVED_FROM_ENUM,
}
_SAYS_REPLACEMENT = re.compile(r"replaced by|no replacement", re.IGNORECASE)
_ENTRY = re.compile(r"- `([^`]+)`")  # a `### Breaking` entry: a bullet that starts with its coordinate


@dataclasses.dataclass(frozen=True)
class Breaking:
    kind: BreakingChangeType
    coordinate: str
    description: str


def coordinate(description: str) -> str:
    """The schema coordinate a breaking change is about, read from graphql-core's description of it."""
    for pattern in (_DIRECTIVE, _MEMBER):
        found = pattern.search(description)
        if found:
            return found.group(0)
    named = _NAME.match(description)
    assert named, description
    return named.group(1)


def breaking(released: GraphQLSchema, current: GraphQLSchema) -> list[Breaking]:
    return [
        Breaking(c.type, coordinate(c.description), c.description) for c in find_breaking_changes(released, current)
    ]


def unreleased(changelog: str) -> list[str]:
    """The lines of CHANGELOG.md's `## Unreleased` section: only they may excuse a change since the release."""
    lines: list[str] = []
    inside = False
    for line in changelog.splitlines():
        if line.startswith("## "):
            inside = line[3:].strip().lower().startswith("unreleased")
        elif inside:
            lines.append(line)
    return lines


def listed(change: Breaking, lines: list[str]) -> bool:
    return any(f"`{change.coordinate}`" in line and _SAYS_REPLACEMENT.search(line) for line in lines)


def was_deprecated(released: GraphQLSchema, coord: str) -> bool:
    """Whether the released schema marked this field, argument or enum value `@deprecated`."""
    parsed = re.fullmatch(r"(\w+)\.(\w+)(?:\((\w+):\))?", coord)
    if not parsed:
        return False
    type_name, member, arg = parsed.groups()
    owner = released.type_map.get(type_name)
    if isinstance(owner, GraphQLEnumType):
        value = owner.values.get(member)
        return value is not None and value.deprecation_reason is not None
    if not isinstance(owner, (GraphQLObjectType, GraphQLInterfaceType, GraphQLInputObjectType)):
        return False
    field = owner.fields.get(member)
    if field is None:
        return False
    if arg is None:
        return field.deprecation_reason is not None
    argument = getattr(field, "args", {}).get(arg)
    return argument is not None and argument.deprecation_reason is not None


def violations(released_sdl: str, current_sdl: str, changelog: str) -> list[str]:
    """Each breaking change since the release that the contract does not allow, said so a contributor can act."""
    released = build_schema(released_sdl)
    lines = unreleased(changelog)
    out: list[str] = []
    for change in breaking(released, build_schema(current_sdl)):
        if change.kind in _REMOVALS and not was_deprecated(released, change.coordinate):
            out.append(f"{change.description} It was not @deprecated in the released schema: deprecate it first.")
        elif not listed(change, lines):
            out.append(
                f"{change.description} Not in CHANGELOG.md's `## Unreleased` section: add a line naming "
                f"`{change.coordinate}` and what it is replaced by (or `no replacement`)."
            )
    return out


def test_current_schema_breaks_nothing_the_changelog_does_not_list() -> None:
    found = violations(RELEASED.read_text(), export_sdl(), CHANGELOG.read_text())
    assert found == [], "breaking changes against schema/released.graphql:\n" + "\n".join(found)


def test_every_breaking_entry_in_the_changelog_is_a_change_since_the_release() -> None:
    # A line left under Unreleased after a release was cut (or a typo in its coordinate) would excuse a later
    # change to the same coordinate without anyone writing it down again.
    found = {c.coordinate for c in breaking(build_schema(RELEASED.read_text()), build_schema(export_sdl()))}
    entries = [m.group(1) for line in _section(CHANGELOG.read_text(), "Breaking") if (m := _ENTRY.match(line))]
    stale = [c for c in entries if c not in found]
    assert stale == [], f"CHANGELOG.md lists breaking changes the comparison does not find: {stale}"


def _section(changelog: str, title: str) -> list[str]:
    """The lines of `### <title>` inside `## Unreleased`."""
    lines: list[str] = []
    inside = False
    for line in unreleased(changelog):
        if line.startswith("### "):
            inside = line[4:].strip().lower() == title.lower()
        elif inside:
            lines.append(line)
    return lines


# --- the denial twins: temporary copies of the schema and CHANGELOG ---------------------------------------------


def _without_field(sdl: str, type_name: str, field: str) -> str:
    document = parse(sdl)
    definitions = []
    for node in document.definitions:
        if isinstance(node, ObjectTypeDefinitionNode) and node.name.value == type_name:
            kept = tuple(f for f in node.fields or () if f.name.value != field)
            assert len(kept) == len(node.fields or ()) - 1, f"{type_name}.{field} is not in the schema"
            node = ObjectTypeDefinitionNode(
                name=node.name,
                description=node.description,
                interfaces=node.interfaces,
                directives=node.directives,
                fields=kept,
            )
        definitions.append(node)
    return print_ast(DocumentNode(definitions=tuple(definitions)))


def _deprecated(sdl: str, type_name: str, field: str) -> str:
    """The SDL with `type_name.field` marked @deprecated, as a release before the removal would have had it."""
    schema = build_schema(sdl)
    owner = schema.type_map[type_name]
    assert isinstance(owner, GraphQLObjectType)
    owner.fields[field].deprecation_reason = "Use `statusDetail`."
    return print_schema(schema)


def _changelog(*entries: str, heading: str = "## Unreleased") -> str:
    return "# Changelog\n\n" + heading + "\n\n### Breaking\n\n" + "".join(f"- {e}\n" for e in entries)


@pytest.fixture(scope="module")
def current() -> str:
    return export_sdl()


def test_a_removed_field_is_caught(current: str) -> None:
    broken = _without_field(current, "Run", "status")
    assert violations(current, broken, _changelog()) == [
        "Field Run.status was removed. It was not @deprecated in the released schema: deprecate it first."
    ]


def test_a_removed_field_listed_in_the_changelog_still_needs_a_deprecation_first(current: str) -> None:
    broken = _without_field(current, "Run", "status")
    listed_only = _changelog("`Run.status` removed: replaced by `Run.statusDetail`.")
    assert len(violations(current, broken, listed_only)) == 1


def test_a_deprecated_field_removed_and_listed_with_its_replacement_passes(current: str) -> None:
    released = _deprecated(current, "Run", "status")
    broken = _without_field(current, "Run", "status")
    [unlisted] = violations(released, broken, _changelog())  # deprecated, but not listed
    assert unlisted.startswith("Field Run.status was removed. Not in CHANGELOG.md")
    assert violations(released, broken, _changelog("`Run.status` removed: replaced by `Run.statusDetail`.")) == []


@pytest.mark.parametrize(
    ("entry", "heading"),
    [
        ("`Run.status` removed.", "## Unreleased"),  # no replacement named
        ("`Run.statuses` removed: replaced by `Run.statusDetail`.", "## Unreleased"),  # another coordinate
        ("Run.status removed: replaced by `Run.statusDetail`.", "## Unreleased"),  # not as a coordinate
        ("`Run.status` removed: replaced by `Run.statusDetail`.", "## 0.9.0"),  # an older release's section
    ],
)
def test_an_entry_that_does_not_name_the_change_and_its_replacement_does_not_excuse_it(
    current: str, entry: str, heading: str
) -> None:
    released = _deprecated(current, "Run", "status")
    broken = _without_field(current, "Run", "status")
    found = violations(released, broken, _changelog(entry, heading=heading))
    assert len(found) == 1 and "Not in CHANGELOG.md" in found[0], found


def test_a_type_change_in_place_needs_only_its_changelog_line() -> None:
    released = 'type Query { """The runs."""\n ordinals: JSON }\nscalar JSON'
    current = 'type Query { """The runs."""\n ordinals: [Int!]! }\nscalar JSON'
    assert len(violations(released, current, _changelog())) == 1
    entry = "`Query.ordinals`: `JSON` replaced by `[Int!]!` (the same integers, typed)."
    assert violations(released, current, _changelog(entry)) == []


@pytest.mark.parametrize(
    ("released", "current", "expected"),
    [
        ("type Query { a: Int b: Int }", "type Query { a: Int }", "Query.b"),
        ("type Query { a(x: Int): Int }", "type Query { a: Int }", "Query.a(x:)"),
        ("type Query { a(x: Int): Int }", "type Query { a(x: String): Int }", "Query.a(x:)"),
        ("type Query { a: Int }", "type Query { a(x: Int!): Int }", "Query.a(x:)"),
        ("type Query { a: E } enum E { X Y }", "type Query { a: E } enum E { X }", "E.Y"),
        ("type Query { a: Int } type T { b: Int }", "type Query { a: Int }", "T"),
        (
            "type Query { a: U } union U = A | B type A { x: Int } type B { x: Int }",
            "type Query { a: U } union U = A type A { x: Int } type B { x: Int }",
            "B",
        ),
        (
            "type Query { a(i: I): Int } input I { x: Int }",
            "type Query { a(i: I): Int } input I { x: Int y: Int! }",
            "I.y",
        ),
        (
            "directive @d(x: Int) on FIELD type Query { a: Int }",
            "directive @d on FIELD type Query { a: Int }",
            "@d(x:)",
        ),
    ],
)
def test_each_kind_of_breaking_change_is_named_by_its_coordinate(released: str, current: str, expected: str) -> None:
    [change] = breaking(build_schema(released), build_schema(current))
    assert change.coordinate == expected, change.description

"""Draw docs/graph.svg, the picture in docs/graph.md, from the schema: one box per object type of the graph and
one line per pair of types that link, labelled with the fields. Positions are fixed here (a layout tool would
move the boxes on every schema change); the links are read from schema/schema.graphql, so a link added or removed shows
in the picture once this is run again, and tests/test_graph_docs_queries.py fails until it is.

Usage: .venv/bin/python scripts/draw_graph.py [--out docs/graph.svg]   (no argument: the SVG on stdout)
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from html import escape
from pathlib import Path

from graphql import (
    GraphQLNamedType,
    GraphQLObjectType,
    GraphQLSchema,
    GraphQLUnionType,
    build_schema,
    get_named_type,
)

SCHEMA = Path(__file__).resolve().parents[1] / "schema" / "schema.graphql"  # kept current by test_operations.py

# (x, y) of each box's centre. TransferPoint is the union; its members' links start from its box.
BOXES: dict[str, tuple[int, int]] = {
    "Project": (560, 50),
    "Thread": (560, 160),
    "Run": (560, 290),
    "RunAttempt": (560, 420),
    "ExecutionNode": (560, 560),
    "Lineage": (880, 60),
    "ConversationMessage": (170, 150),
    "PlanArtifact": (170, 280),
    "RuntimeRequest": (170, 400),
    "Activity": (150, 530),
    "ThreadEvent": (330, 630),
    "ProviderSession": (1190, 40),
    "ProviderThread": (900, 300),
    "ProviderTurn": (900, 450),
    "CheckpointScope": (880, 610),
    "Checkpoint": (1190, 610),
    "ContextTransfer": (1190, 170),
    "ContextHandoff": (1190, 300),
    "TransferPoint": (1190, 450),
}
BOX_W, BOX_H = 190, 44
# Left out, said in the legend: every thread-owned object's `thread`, and `providerInstance` (server config).
SKIPPED_FIELDS = {"thread", "providerInstance"}


def _target(field_type: GraphQLNamedType) -> str:
    """The object a field leads to: a connection leads to its nodes' type."""
    if isinstance(field_type, GraphQLObjectType) and field_type.name.endswith("Connection"):
        return str(get_named_type(field_type.fields["nodes"].type).name)
    return field_type.name


def links(schema: GraphQLSchema) -> tuple[dict[tuple[str, str], list[str]], dict[str, list[str]]]:
    """(fields by (from box, to box), a box's links to its own type)."""
    union_of = {
        member.name: name
        for name in BOXES
        if isinstance(t := schema.type_map[name], GraphQLUnionType)
        for member in t.types
    }
    edges: dict[tuple[str, str], list[str]] = defaultdict(list)
    loops: dict[str, list[str]] = defaultdict(list)
    for type_name in [*BOXES, *union_of]:
        owner = schema.type_map[type_name]
        if not isinstance(owner, GraphQLObjectType):
            continue
        box = union_of.get(type_name, type_name)
        prefix = f"{type_name}." if type_name in union_of else ""
        for name, field in sorted(owner.fields.items()):
            if name in SKIPPED_FIELDS or field.deprecation_reason:
                continue
            target = _target(get_named_type(field.type))
            target = union_of.get(target, target)
            if target not in BOXES:
                continue
            if target == box:
                loops[box].append(prefix + name)
            else:
                edges[(box, target)].append(prefix + name)
    return edges, loops


def _border(a: tuple[int, int], b: tuple[int, int]) -> tuple[float, float]:
    """Where the line from a's centre to b's centre leaves a's box."""
    dx, dy = b[0] - a[0], b[1] - a[1]
    scale = min(
        (BOX_W / 2) / abs(dx) if dx else float("inf"),
        (BOX_H / 2) / abs(dy) if dy else float("inf"),
    )
    return a[0] + dx * scale, a[1] + dy * scale


def svg(schema: GraphQLSchema) -> str:
    edges, loops = links(schema)
    out = [
        '<svg xmlns="http://www.w3.org/2000/svg" width="1320" height="720" viewBox="0 0 1320 720" '
        'font-family="Helvetica, Arial, sans-serif">',
        '<rect width="100%" height="100%" fill="#ffffff"/>',
        '<defs><marker id="arrow" viewBox="0 0 10 10" refX="10" refY="5" markerWidth="7" markerHeight="7" '
        'orient="auto-start-reverse"><path d="M0,0 L10,5 L0,10 z" fill="#56606b"/></marker></defs>',
    ]
    pairs = sorted({tuple(sorted(pair)) for pair in edges})
    for a, b in pairs:  # one line per pair, an arrowhead at each end a field points to
        start, end = _border(BOXES[a], BOXES[b]), _border(BOXES[b], BOXES[a])
        heads = (' marker-end="url(#arrow)"' if (a, b) in edges else "") + (
            ' marker-start="url(#arrow)"' if (b, a) in edges else ""
        )
        out.append(
            f'<line x1="{start[0]:.0f}" y1="{start[1]:.0f}" x2="{end[0]:.0f}" y2="{end[1]:.0f}" '
            f'stroke="#56606b" stroke-width="1.2"{heads}/>'
        )
    for (a, b), fields in sorted(edges.items()):
        # Each direction's label near its own start, so the two directions of a pair do not overlap.
        start, end = _border(BOXES[a], BOXES[b]), _border(BOXES[b], BOXES[a])
        x, y = start[0] + (end[0] - start[0]) * 0.28, start[1] + (end[1] - start[1]) * 0.28
        text = escape(", ".join(fields))
        out.append(
            f'<text x="{x:.0f}" y="{y + 3:.0f}" font-size="10" fill="#1f5f99" text-anchor="middle" '
            f'stroke="#ffffff" stroke-width="3" paint-order="stroke">{text}</text>'
        )
    for name, (x, y) in BOXES.items():
        union = isinstance(schema.type_map[name], GraphQLUnionType)
        dash = ' stroke-dasharray="5 3"' if union else ""
        out.append(
            f'<rect x="{x - BOX_W / 2:.0f}" y="{y - BOX_H / 2:.0f}" width="{BOX_W}" height="{BOX_H}" rx="6" '
            f'fill="#eef3f8" stroke="#2b4a66" stroke-width="1.5"{dash}/>'
        )
        out.append(f'<text x="{x}" y="{y - 2}" font-size="14" font-weight="bold" text-anchor="middle">{name}</text>')
        if union:
            members = escape(" | ".join(t.name for t in schema.type_map[name].types))  # type: ignore[attr-defined]
            out.append(f'<text x="{x}" y="{y + 14}" font-size="9" text-anchor="middle">{members}</text>')
        elif loops.get(name):
            text = escape("↻ " + ", ".join(loops[name]))
            out.append(f'<text x="{x}" y="{y + 14}" font-size="10" fill="#1f5f99" text-anchor="middle">{text}</text>')
    legend = [
        "Each arrow is a field (its name by the arrow's start); a connection points at its nodes' type.",
        "Not drawn: `thread` on every object a thread owns, `providerInstance` beside every providerInstanceId,",
        "and deprecated fields. Drawn from the schema by scripts/draw_graph.py.",
    ]
    for i, line in enumerate(legend):
        out.append(f'<text x="20" y="{680 + i * 14}" font-size="11" fill="#444444">{escape(line)}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="write here instead of stdout")
    args = parser.parse_args()
    drawing = svg(build_schema(SCHEMA.read_text()))
    if args.out:
        args.out.write_text(drawing)
    else:
        sys.stdout.write(drawing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

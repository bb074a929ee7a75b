"""The live views' rules as tables (streams/views.py): which feed a scope picks, which rows a view keeps
(a node, or its whole subtree learnt as nodes appear), per-row visibility, and which node changes an
`executionGraph` subscriber is sent. Pure: no database, no server.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from threadloom.streams.views import (
    NODE_ENTITY,
    NodeShape,
    NodeTree,
    ScopeKind,
    ViewMatch,
    choose_scope,
    graph_change,
    ordered_graph,
    subtree,
)

P, Q = uuid.UUID(int=1), uuid.UUID(int=2)  # two projects
ROOT, SUB, TOOL, CHILD_TOOL, OTHER, LATE = (uuid.UUID(int=100 + i) for i in range(6))
RUN, RUN2 = uuid.UUID(int=900), uuid.UUID(int=901)
# A run's graph: the root turn, a tool call and a subagent under it, the subagent's own tool call.
PARENTS: dict[uuid.UUID, uuid.UUID | None] = {ROOT: None, TOOL: ROOT, SUB: ROOT, CHILD_TOOL: SUB, OTHER: None}


@dataclasses.dataclass(frozen=True)
class Row:
    project_id: uuid.UUID | None
    entity_type: str
    run_id: uuid.UUID | None
    node_id: uuid.UUID | None
    payload: dict[str, Any] = dataclasses.field(default_factory=dict)


def node_row(node: uuid.UUID, parent: uuid.UUID | None, project: uuid.UUID = P) -> Row:
    return Row(
        project, NODE_ENTITY, RUN, node, {"id": str(node), "parent_node_id": None if parent is None else str(parent)}
    )


@pytest.mark.parametrize(
    ("given", "kind"),
    [
        ((True, True, True, True), ScopeKind.PROJECT),
        ((False, True, True, False), ScopeKind.THREAD),
        ((False, False, True, True), ScopeKind.RUN),
        ((False, False, False, True), ScopeKind.NODE),
        ((True, False, False, True), ScopeKind.PROJECT),
        ((False, False, False, False), None),
    ],
)
def test_the_widest_id_given_picks_the_feed(given: tuple[bool, bool, bool, bool], kind: ScopeKind | None) -> None:
    assert choose_scope(*given) == kind


@pytest.mark.parametrize(
    ("root", "members"),
    [
        (ROOT, {ROOT, TOOL, SUB, CHILD_TOOL}),
        (SUB, {SUB, CHILD_TOOL}),  # a subagent's subtree holds its own tool call, not its sibling's
        (TOOL, {TOOL}),
        (CHILD_TOOL, {CHILD_TOOL}),
        (OTHER, {OTHER}),
        (uuid.UUID(int=7), {uuid.UUID(int=7)}),  # a node not (yet) known: only itself
    ],
)
def test_a_subtree_is_the_node_and_everything_under_it(root: uuid.UUID, members: set[uuid.UUID]) -> None:
    assert subtree(root, PARENTS) == members


def test_a_cycle_in_bad_data_ends_the_walk_instead_of_looping() -> None:
    a, b = uuid.UUID(int=11), uuid.UUID(int=12)
    tree = NodeTree(ROOT, {a: b, b: a})
    assert not tree.contains(a) and not tree.contains(b)


def test_a_node_learnt_later_joins_its_parent_s_subtree_and_a_moved_node_takes_its_subtree_along() -> None:
    tree = NodeTree(SUB, PARENTS)
    assert not tree.contains(LATE)
    tree.learn(LATE, CHILD_TOOL)  # made after the subscription started, under the subagent's tool call
    assert tree.contains(LATE)
    tree.learn(CHILD_TOOL, TOOL)  # (parents never move today; the rule does not rely on it)
    assert not tree.contains(CHILD_TOOL) and not tree.contains(LATE)


def _kept(match: ViewMatch, rows: list[Row]) -> list[int]:
    return [i for i, row in enumerate(rows) if match(row)]


ROWS = [
    node_row(SUB, ROOT),  # 0
    Row(P, "activity", RUN, SUB),  # 1
    node_row(LATE, SUB),  # 2: a node made while the view runs
    Row(P, "activity", RUN, LATE),  # 3
    Row(P, "activity", RUN, TOOL),  # 4: a sibling's
    Row(P, "conversation_message", RUN, None),  # 5
    Row(Q, "activity", RUN2, SUB),  # 6: another project's row (cannot happen on one feed; refused anyway)
    Row(P, "run", RUN2, None),  # 7
    Row(None, "activity", RUN, SUB),  # 8: a row without a project is nobody's
]


@pytest.mark.parametrize(
    ("view", "kept"),
    [
        (dict(), [0, 1, 2, 3, 4, 5, 7]),
        (dict(entity_type="activity"), [1, 3, 4]),
        (dict(run=RUN2), [7]),
        (dict(node=SUB), [0, 1]),
        (dict(node=SUB, tree=True), [0, 1, 2, 3]),
        (dict(node=SUB, tree=True, entity_type="activity"), [1, 3]),
        (dict(node=ROOT, tree=True), [0, 1, 2, 3, 4]),
        (dict(impossible=True), []),
    ],
)
def test_a_view_keeps_its_rows_of_visible_projects(view: dict[str, Any], kept: list[int]) -> None:
    tree = NodeTree(view["node"], PARENTS) if view.pop("tree", False) else None
    asked: list[uuid.UUID] = []

    def sees(project: uuid.UUID) -> bool:
        asked.append(project)
        return project == P

    assert _kept(ViewMatch(sees, tree=tree, **view), ROWS) == kept
    assert sorted(set(asked)) == sorted(asked)  # visibility asked once per project, not once per row


def test_a_row_without_a_project_is_its_thread_s_on_a_view_of_one_thread() -> None:
    assert _kept(ViewMatch(lambda project: project == P, node=SUB, home=P), ROWS) == [0, 1, 8]
    assert _kept(ViewMatch(lambda project: project == P, node=SUB, home=Q), ROWS) == [0, 1]


def test_an_admin_sees_every_project_s_rows() -> None:
    assert _kept(ViewMatch(lambda project: True, entity_type="activity", node=SUB), ROWS) == [1, 6]


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def shape(status: str = "RUNNING", **kw: Any) -> NodeShape:
    values = {"kind": "TOOL_CALL", "status": status, "parent": ROOT, "created_at": T0, "completed_at": None} | kw
    return NodeShape(**values)


@pytest.mark.parametrize(
    ("new", "news"),
    [
        (shape(), False),  # the same drawing (a tool's output grew: updatedAt moved, nothing shown did)
        (shape("COMPLETED", completed_at=T0 + timedelta(seconds=1)), True),
        (shape(kind="SUBAGENT"), True),
        (shape(parent=SUB), True),
        (shape(created_at=T0 + timedelta(seconds=1)), True),
    ],
)
def test_a_graph_item_is_sent_when_what_a_drawing_shows_changes(new: NodeShape, news: bool) -> None:
    assert graph_change({TOOL: shape()}, TOOL, new) is news
    assert graph_change({}, TOOL, new) is True  # a node the client has not seen always is


@dataclasses.dataclass(frozen=True)
class N:
    id: uuid.UUID
    parent_node_id: uuid.UUID | None
    created_at: datetime


def test_a_graph_is_sent_parents_first_even_when_made_in_one_transaction() -> None:
    # Same creation time, and the child's id sorts before its parent's.
    nodes = [
        N(uuid.UUID(int=5), None, T0),
        N(uuid.UUID(int=3), uuid.UUID(int=4), T0),
        N(uuid.UUID(int=4), uuid.UUID(int=5), T0),
    ]
    order = [n.id.int for n in ordered_graph(nodes)]
    assert order == [5, 4, 3]
    assert sorted(order) == sorted(n.id.int for n in nodes)  # every node once


def test_the_live_views_documented_in_graph_md_are_valid_against_the_schema() -> None:
    """docs/graph.md, "Live views": what a reader copies must run (validated as the server validates)."""
    from pathlib import Path

    from graphql import parse, validate

    from threadloom.api.schema import build_schema

    text = (Path(__file__).resolve().parents[1] / "docs" / "graph.md").read_text(encoding="utf-8")
    section = text.split("\n## Live views\n", 1)[1].split("\n## ", 1)[0]
    documents = re.findall(r"```graphql\n(.*?)```", section, re.S)
    assert len(documents) == 2
    schema = build_schema()._schema
    for document in documents:
        assert validate(schema, parse(document)) == [], document

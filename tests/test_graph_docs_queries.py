"""docs/graph.md as a user reads it: the five dashboard queries run as written, and the picture matches the schema.

Each ```graphql block of the "Five dashboard queries" section is taken from the file, not copied here, so a
query edited in the docs is the query tested. They run against a real server holding one unit of
tests/support/graph_scene.py (a source thread S with three runs, a fork F of run 1 merged back, a delegated
child C, a provider switch before run 3, a subagent and an approval in run 1), and each answer is checked
for the shape that scene must give: no errors, and the links pointing at the objects the scene made.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from graphql import OperationDefinitionNode, build_schema, parse, validate

from tests.support import graph_scene
from tests.support.server import Client

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "graph.md"
PROVIDERS = graph_scene.PROVIDERS
NAMES = ["ProjectBoard", "ThreadTimeline", "RunGraph", "Lineage", "ActivityFeed"]


def dashboard_queries() -> dict[str, str]:
    """The section's graphql blocks by operation name."""
    section = DOC.read_text().split("## Five dashboard queries", 1)[1].split("\n## ", 1)[0]
    queries: dict[str, str] = {}
    for block in re.findall(r"```graphql\n(.*?)```", section, re.S):
        [operation] = [d for d in parse(block).definitions if isinstance(d, OperationDefinitionNode)]
        assert operation.name is not None, block
        queries[operation.name.value] = block
    return queries


def test_the_docs_hold_five_dashboard_queries_valid_against_the_schema() -> None:
    queries = dashboard_queries()
    assert list(queries) == NAMES
    schema = build_schema((ROOT / "schema" / "schema.graphql").read_text())
    for name, query in queries.items():
        assert validate(schema, parse(query)) == [], name


def test_the_picture_is_drawn_from_the_current_schema() -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        import draw_graph
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    drawn = draw_graph.svg(build_schema(draw_graph.SCHEMA.read_text()))
    assert "](graph.svg)" in DOC.read_text()
    fix = ".venv/bin/python scripts/draw_graph.py --out docs/graph.svg"
    assert (ROOT / "docs" / "graph.svg").read_text() == drawn, f"docs/graph.svg is stale: run `{fix}`"


def _by(items: list[dict[str, Any]], key: str) -> dict[Any, dict[str, Any]]:
    return {item[key]: item for item in items}


def _project_board(data: dict[str, Any], scene: graph_scene.Scene) -> None:
    unit = scene.units[0]
    threads = data["project"]["threads"]
    assert threads["totalCount"] == 3
    board = _by(threads["nodes"], "id")
    assert set(board) == {unit.source, unit.fork, unit.child}
    assert all(t["activeRun"] is None and t["pendingRequests"] == [] for t in board.values())
    assert board[unit.source]["providerInstance"] == {"id": "b", "driver": "scripted"}  # switched
    assert board[unit.source]["lineage"] == {"relationship": None, "parentThread": None}
    assert board[unit.fork]["lineage"]["relationship"] == "FORK"
    assert board[unit.child]["lineage"]["relationship"] == "SUBAGENT"
    for side in (unit.fork, unit.child):
        assert board[side]["lineage"]["parentThread"]["id"] == unit.source


def _thread_timeline(data: dict[str, Any], scene: graph_scene.Scene) -> None:
    runs = data["thread"]["runs"]["nodes"]
    assert [(r["ordinal"], r["status"]) for r in runs] == [(1, "COMPLETED"), (2, "COMPLETED"), (3, "COMPLETED")]
    one, two, three = runs
    assert one["id"] == scene.units[0].runs[0] and three["id"] == scene.units[0].runs[1]
    assert one["contextHandoff"] is None  # its provider thread began the conversation
    assert one["checkpoint"]["status"] == "READY"  # it wrote f.txt
    assert two["contextHandoff"] is not None and two["contextHandoff"]["transfer"]["type"] == "MERGE_BACK"
    assert three["contextHandoff"] is not None  # the switch handed the conversation to instance b
    assert three["contextHandoff"]["coveredRunOrdinals"] == [1, 2]
    assert [a["providerThread"]["providerInstance"]["id"] for a in three["attempts"]] == ["b"]
    assert {a["providerThread"]["providerInstance"]["id"] for a in one["attempts"]} == {"plain"}


def _run_graph(data: dict[str, Any], scene: graph_scene.Scene) -> None:
    run = data["run"]
    graph = run["executionGraph"]
    nodes = _by(graph["nodes"], "id")
    root = nodes[run["rootNode"]["id"]]
    assert root["parent"] is None and root["kind"] == "ROOT_TURN"
    assert root["checkpointScope"]["kind"] == "ROOT_RUN" and root["checkpointScope"]["checkpoints"]["nodes"]
    assert all(n["parent"]["id"] in nodes for n in nodes.values() if n is not root)
    assert sorted((e["parent"]["id"], e["child"]["id"]) for e in graph["edges"]) == sorted(
        (n["parent"]["id"], n["id"]) for n in nodes.values() if n is not root
    )
    turn = root["providerTurn"]  # the run's own turn, on the thread's own provider thread (no owner node)
    assert turn is not None and turn["status"] == "COMPLETED" and turn["providerThread"]["ownerNode"] is None
    [subagent] = [n for n in nodes.values() if n["kind"] == "SUBAGENT"]
    assert subagent["status"] == "COMPLETED"
    # A subagent with a conversation of its own is its first turn there, on the provider thread it owns.
    assert subagent["providerTurn"]["providerThread"]["ownerNode"] == {"id": subagent["id"]}
    [approval] = [n for n in nodes.values() if n["kind"] == "APPROVAL_REQUEST"]
    assert approval["runtimeRequest"] is not None and approval["runtimeRequest"]["status"] != "PENDING"


def _lineage(data: dict[str, Any], scene: graph_scene.Scene) -> None:
    unit = scene.units[0]
    lineage = data["thread"]["lineage"]
    assert [t["id"] for t in lineage["forks"]["nodes"]] == [unit.fork]
    assert [t["id"] for t in lineage["delegatedChildren"]["nodes"]] == [unit.child]
    [merge] = lineage["mergeBacks"]["nodes"]
    assert merge["type"] == "MERGE_BACK"
    assert merge["source"]["__typename"] == "RunPoint" and merge["source"]["run"]["thread"]["id"] == unit.fork
    assert merge["base"]["__typename"] == "RunPoint" and merge["base"]["run"]["id"] == unit.runs[0]
    transfers = data["thread"]["contextTransfers"]["nodes"]
    [fork] = [t for t in transfers if t["type"] == "FORK"]
    assert (fork["sourceThread"]["id"], fork["targetThread"]["id"]) == (unit.source, unit.fork)
    assert fork["source"]["__typename"] == "RunPoint" and fork["source"]["run"]["id"] == unit.runs[0]
    assert fork["source"]["checkpoint"] is not None  # the fork point's files
    assert {"FORK", "MERGE_BACK", "PROVIDER_HANDOFF"} <= {t["type"] for t in transfers}


def _activity_feed(data: dict[str, Any], scene: graph_scene.Scene) -> None:
    feed = data["thread"]["activities"]
    assert feed["totalCount"] > 30 or not feed["pageInfo"]["hasPreviousPage"]
    assert len(feed["nodes"]) == min(30, feed["totalCount"])
    assert feed["pageInfo"]["hasPreviousPage"] == (feed["totalCount"] > 30)
    assert all(a["activityKind"] is not None for a in feed["nodes"])
    [last_done] = [a for a in feed["nodes"] if a["activityKind"] == "RUN_COMPLETED"][-1:]
    assert last_done["run"] == {"ordinal": 3, "status": "COMPLETED"}  # newest last


Variables = Callable[[graph_scene.Scene], dict[str, Any]]
Check = Callable[[dict[str, Any], graph_scene.Scene], None]
CHECKS: dict[str, tuple[Variables, Check]] = {
    "ProjectBoard": (lambda s: {"project": s.project}, _project_board),
    "ThreadTimeline": (lambda s: {"thread": s.units[0].source}, _thread_timeline),
    "RunGraph": (lambda s: {"run": s.units[0].runs[0]}, _run_graph),
    "Lineage": (lambda s: {"thread": s.units[0].source}, _lineage),
    "ActivityFeed": (lambda s: {"thread": s.units[0].source}, _activity_feed),
}


@pytest.mark.timeout(180)
async def test_each_dashboard_query_answers_with_the_scenes_graph(client: Client) -> None:
    scene = await graph_scene.build(client, 1)
    queries = dashboard_queries()
    assert set(CHECKS) == set(queries)
    for name, query in queries.items():
        variables, check = CHECKS[name]
        data = await client.gql(query, variables(scene))  # asserts the answer has no errors
        check(data, scene)

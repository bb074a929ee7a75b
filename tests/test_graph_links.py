"""Every link of the graph is an object a client selects in the same document, and costs the same number of
SQL statements for 2 parents as for 20 (Saleor-style statement counts, read from `Server-Timing`).

One server and one scene for the module (tests/support/graph_scene.py): 20 source threads, each with a
fork merged back, a delegated child, an approval, checkpoints and a provider switch. Each link has its own
test: the document asks for the link under the first 2 and then the first 20 threads; both answers must
cost the same statements, and every parent must show the link (a null link costs no statement, so a test
where it was null could not catch an N+1).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import graph_scene
from tests.support.graphql import statements
from tests.support.pg import PgServer
from tests.support.server import Client, ServerProcess, providers_env, serving

pytestmark = pytest.mark.timeout(300)  # the first test builds the module's scene (20 units, about 80 runs)

MANY = 20


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("graph-links")
    (base / "data").mkdir()
    with serving(database_url, base / "data", providers_env(base, graph_scene.PROVIDERS)) as proc:
        yield proc


@pytest.fixture(scope="module")
async def module_client(server: ServerProcess) -> AsyncIterator[Client]:
    c = Client(server.url, server.admin_token)
    yield c
    await c.aclose()


@pytest.fixture(scope="module")
async def scene(module_client: Client, tmp_path_factory: pytest.TempPathFactory) -> graph_scene.Scene:
    root = tmp_path_factory.mktemp("graph-links-ws")
    root.chmod(0o711)  # within reach of the agent user (docs/deploy.md)
    return await graph_scene.build(module_client, MANY, Path(root))


def _walk(value: Any, path: str) -> list[Any]:
    """The values at a dotted path below `value`, flattening lists and connections' `nodes` on the way."""
    found = [value]
    for key in path.split("."):
        step: list[Any] = []
        for item in found:
            if isinstance(item, list):
                step += [i[key] for i in item if i is not None]
            elif item is not None:
                step.append(item[key])
        found = [x for s in step for x in (s if isinstance(s, list) else [s])]
    return found


# (link, role of the parent threads, the selection under each thread, the path of the link's values under a
# thread; `every`: every value found must be non-null, else at least one per thread must be).
Case = tuple[str, str, str, str, bool]
CASES: list[Case] = [
    ("Activity.run", "source", "activities(first: 10) { nodes { run { id status } } }", "activities.nodes.run", False),
    ("Activity.node", "source", "activities(first: 10) { nodes { node { id kind } } }", "activities.nodes.node", False),
    ("Activity.thread", "source", "activities(first: 10) { nodes { thread { id } } }", "activities.nodes.thread", True),
    (
        "Activity.activityKind",
        "source",
        "activities(first: 10) { nodes { activityKind } }",
        "activities.nodes.activityKind",
        True,
    ),
    (
        "Thread.contextTransfers",
        "source",
        "contextTransfers(first: 10) { nodes { id type } }",
        "contextTransfers.nodes",
        True,
    ),
    (
        "ContextTransfer.source",
        "source",
        "contextTransfers(first: 10) { nodes { source { ... on RunPoint { run { id } checkpoint { id } } } } }",
        "contextTransfers.nodes.source.run",
        False,
    ),
    (
        "ContextTransfer.base",
        "source",
        "lineage { mergeBacks(first: 5) { nodes { base { ... on RunPoint { run { id } checkpoint { id } } } } } }",
        "lineage.mergeBacks.nodes.base.checkpoint",
        True,
    ),
    (
        "ContextTransfer.source of a fork",
        "fork",
        "lineage { forkedFrom { source { ... on RunPoint { run { status } checkpoint { status } } } } }",
        "lineage.forkedFrom.source.checkpoint",
        True,
    ),
    (
        "Run.contextHandoff",
        "source",
        "runs(first: 5) { nodes { contextHandoff { id } } }",
        "runs.nodes.contextHandoff",
        False,
    ),
    (
        "ContextHandoff.thread",
        "source",
        "runs(first: 5) { nodes { contextHandoff { thread { id } } } }",
        "runs.nodes.contextHandoff.thread",
        True,
    ),
    (
        "ContextHandoff.toProviderThread",
        "source",
        "runs(first: 5) { nodes { contextHandoff { toProviderThread { id status } } } }",
        "runs.nodes.contextHandoff.toProviderThread",
        True,
    ),
    (
        "ContextHandoff.fromProviderThreads",
        "source",
        "runs(first: 5) { nodes { contextHandoff { fromProviderThreads { id status } } } }",
        "runs.nodes.contextHandoff.fromProviderThreads",
        True,
    ),
    (
        "RunAttempt.providerThread",
        "source",
        "runs(first: 5) { nodes { attempts { providerThread { id } } } }",
        "runs.nodes.attempts.providerThread",
        True,
    ),
    (
        "RunAttempt.providerTurn",
        "source",
        "runs(first: 5) { nodes { attempts { providerTurn { id ordinal } } } }",
        "runs.nodes.attempts.providerTurn",
        True,
    ),
    (
        "ExecutionNode.providerTurn",
        "source",
        "runs(first: 5) { nodes { executionGraph { nodes { providerTurn { id } } } } }",
        "runs.nodes.executionGraph.nodes.providerTurn",
        False,
    ),
    (
        "ExecutionNode.thread",
        "source",
        "runs(first: 5) { nodes { executionGraph { nodes { thread { id } } } } }",
        "runs.nodes.executionGraph.nodes.thread",
        True,
    ),
    (
        "ProviderThread.turns",
        "source",
        "providerThreads { turns(first: 5) { nodes { id } } }",
        "providerThreads.turns.nodes",
        True,
    ),
    (
        "ProviderThread.runs",
        "source",
        "providerThreads { runs(first: 5) { nodes { id } } }",
        "providerThreads.runs.nodes",
        True,
    ),
    (
        "ProviderThread.ownerNode",
        "source",
        "providerThreads { ownerNode { id kind } }",
        "providerThreads.ownerNode",
        False,  # the thread's own provider threads have none; the subagent's has its node
    ),
    (
        "Checkpoint.thread",
        "source",
        "checkpoints(first: 5) { nodes { thread { id } } }",
        "checkpoints.nodes.thread",
        True,
    ),
    (
        "CheckpointScope.checkpoints",
        "source",
        "runs(first: 5) { nodes { checkpoint { scope { checkpoints(first: 5) { nodes { id } } } } } }",
        "runs.nodes.checkpoint.scope.checkpoints.nodes",
        True,
    ),
    (
        "CheckpointScope.thread",
        "source",
        "runs(first: 5) { nodes { checkpoint { scope { thread { id } } } } }",
        "runs.nodes.checkpoint.scope.thread",
        True,
    ),
    (
        "RuntimeRequest.thread",
        "source",
        "runs(first: 1) { nodes { runtimeRequests { thread { id } } } }",
        "runs.nodes.runtimeRequests.thread",
        True,
    ),
    ("Run.forks", "source", "runs(first: 1) { nodes { forks { id } } }", "runs.nodes.forks", True),
    (
        "Lineage.delegatedChildren",
        "source",
        "lineage { delegatedChildren(first: 5) { nodes { id } } }",
        "lineage.delegatedChildren.nodes",
        True,
    ),
    (
        "Lineage.mergeBacks",
        "source",
        "lineage { mergeBacks(first: 5) { nodes { id } } }",
        "lineage.mergeBacks.nodes",
        True,
    ),
    (
        "providerInstance and mode",
        "source",
        "mode providerInstance { id } runs(first: 5) { nodes { providerInstance { id } } } "
        "providerThreads { mode providerInstance { id } }",
        "providerThreads.providerInstance",
        True,
    ),
]


async def _ask(client: Client, selection: str, ids: list[str]) -> tuple[int, list[dict[str, Any]]]:
    query = "query($ids: [ID!]!) { nodes(ids: $ids) { ... on Thread { id " + selection + " } } }"
    response = await client.post(query, {"ids": ids})
    body = response.json()
    assert "errors" not in body, body["errors"]
    return statements(dict(response.headers)), body["data"]["nodes"]


@pytest.mark.parametrize(("link", "role", "selection", "path", "every"), CASES, ids=[c[0] for c in CASES])
async def test_each_link_costs_the_same_statements_for_2_and_20_parents(
    module_client: Client, scene: graph_scene.Scene, link: str, role: str, selection: str, path: str, every: bool
) -> None:
    few, _ = await _ask(module_client, selection, scene.ids(role, 2))
    many, threads = await _ask(module_client, selection, scene.ids(role, MANY))
    assert few == many, f"{link}: {few} statements for 2 parents, {many} for {MANY}"
    check: Callable[[list[Any]], bool] = all if every else any
    for thread in threads:
        values = _walk(thread, path)
        assert values and check(v is not None for v in values), f"{link} missing under {thread['id']}: {values}"


DASHBOARD = """query($ids: [ID!]!) { nodes(ids: $ids) { ... on Thread {
  id title mode providerInstance { id driver }
  runs(first: 3) { nodes { id ordinal status providerInstance { id }
    contextHandoff { strategy coveredRunOrdinals thread { id } toProviderThread { id } fromProviderThreads { id } }
    forks { id }
    checkpoint { id thread { id } scope { checkpoints(first: 5) { nodes { id } } } }
    attempts { status providerTurn { id ordinal }
      providerThread { id mode turns(first: 5) { nodes { ordinal } } } }
    executionGraph { nodes { id kind status thread { id } providerTurn { id } }
      edges { parent { id } child { id } } } } }
  activities(first: 20) { nodes { activityKind run { id status } node { id kind } thread { id } } }
  contextTransfers(first: 10) { totalCount nodes { type
    source { __typename ... on RunPoint { run { id } checkpoint { id } } }
    base { __typename ... on RunPoint { run { id } } }
    handoff { id } } }
  lineage { relationship delegatedChildren(first: 5) { nodes { id } } mergeBacks(first: 5) { nodes { id } }
    forks(first: 5) { nodes { id } } }
} } }"""


async def test_one_dashboard_document_walks_the_whole_graph_at_constant_cost(
    module_client: Client, scene: graph_scene.Scene
) -> None:
    """thread → runs → attempts → execution graph → provider turns → checkpoints → transfers → handoffs →
    lineage in one document: the same statements for 2 threads as for 20, and every hop answered."""
    few, _ = await _ask_document(module_client, scene.ids("source", 2))
    many, threads = await _ask_document(module_client, scene.ids("source", MANY))
    assert few == many, (few, many)
    for thread in threads:
        runs = thread["runs"]["nodes"]
        assert [r["providerInstance"]["id"] for r in runs][-1] == "b"  # the last run ran after the switch
        handoffs = [r["contextHandoff"] for r in runs if r["contextHandoff"] is not None]
        assert handoffs and all(h["thread"]["id"] == thread["id"] for h in handoffs)
        assert {t["type"] for t in thread["contextTransfers"]["nodes"]} >= {"FORK", "MERGE_BACK", "PROVIDER_HANDOFF"}
        assert thread["lineage"]["forks"]["nodes"] == runs[0]["forks"]


async def _ask_document(client: Client, ids: list[str]) -> tuple[int, list[dict[str, Any]]]:
    response = await client.post(DASHBOARD, {"ids": ids})
    body = response.json()
    assert "errors" not in body, body["errors"]
    return statements(dict(response.headers)), body["data"]["nodes"]

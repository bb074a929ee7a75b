"""A project whose threads hold one of every link of the graph, made through the real API (scripted agent).

Each *unit* is a source thread S on the `plain` instance (no native fork or rollback, so a fork or a
rollback gets a handoff built from the log) with:
- run 1: writes a file (checkpoint), keeps a todo list (a plan), runs a provider subagent (a subagent node
  owning a provider thread of its own), asks an approval that is accepted (a runtime request), then replies;
- a fork F of run 1 with one run (its handoff came from the fork), merged back into S (a MERGE_BACK
  transfer with a source and a base point);
- a delegated child thread C with one run, whose result wakes S: run 2, which takes the merge-back's handoff;
- a switch of S to instance `b` and run 3 (its handoff came from the switch).

`build(client, n)` makes n units in one project, a few at a time, and waits until every run has ended.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from typing import Any

from tests.support.graphql import CREATE_PROJECT, workspace
from tests.support.runs import TERMINAL, finished, send
from tests.support.server import Client
from tests.support.waiting import until

PROVIDERS = """
[instances.plain]
driver = "scripted"
supports_native_fork = false
supports_native_rollback = false

[instances.b]
driver = "scripted"
"""

CREATE_THREAD = """mutation($p: ID!, $title: String!) {
  createThread(input: {projectId: $p, providerInstanceId: "plain", title: $title}) {
    thread { id } userErrors { code message } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""
APPROVE = (
    """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) { userErrors { code } } }"""
)
FORK = """mutation($run: ID!) { forkThread(input: {source: {run: $run}, title: "fork"}) {
  thread { id } userErrors { code message } } }"""
MERGE = """mutation($f: ID!) { mergeBack(input: {forkThreadId: $f}) { userErrors { code message } } }"""
DELEGATE = """mutation($t: ID!) { delegateTask(input: {threadId: $t, text: "@reply child"}) {
  thread { id runs(first: 1) { nodes { id } } } userErrors { code message } } }"""
RUNS = """query($t: ID!) { thread(id: $t) { runs(first: 5) { nodes { status } } } }"""
SWITCH = """mutation($t: ID!) { switchProvider(input: {threadId: $t, providerInstanceId: "b"}) {
  userErrors { code message } } }"""

RUN_ONE = "@write f.txt one\n@todo look; write\n@subagent look around\n@approval echo ok\n@reply one"


@dataclasses.dataclass(frozen=True)
class Unit:
    source: str  # S
    fork: str  # F
    child: str  # C
    runs: tuple[str, str]  # S's runs 1 and 3


@dataclasses.dataclass(frozen=True)
class Scene:
    project: str
    units: list[Unit]

    def ids(self, which: str, n: int) -> list[str]:
        """The ids of the first n units' threads of one role ('source', 'fork', 'child')."""
        return [getattr(u, which) for u in self.units[:n]]


async def ok(client: Client, query: str, variables: dict[str, Any], name: str) -> dict[str, Any]:
    data = (await client.gql(query, variables))[name]
    assert data["userErrors"] == [], data
    return data  # type: ignore[no-any-return]


async def _completed(client: Client, run_id: str) -> None:
    done = await finished(client, run_id, within=60)
    assert done["status"] == "COMPLETED", done


async def _unit(client: Client, project: str, i: int) -> Unit:
    made = await ok(client, CREATE_THREAD, {"p": project, "title": f"s{i:02d}"}, "createThread")
    source = made["thread"]["id"]
    sent = await send(client, source, RUN_ONE)
    assert sent["userErrors"] == [], sent

    async def asked() -> list[dict[str, Any]]:
        return (await client.gql(PENDING, {"t": source}))["thread"]["pendingRequests"]  # type: ignore[no-any-return]

    request = (await until(asked, within=60))[0]
    await ok(client, APPROVE, {"r": request["id"]}, "respondToApproval")
    run_one = sent["run"]["id"]
    await _completed(client, run_one)

    fork = (await ok(client, FORK, {"run": run_one}, "forkThread"))["thread"]["id"]
    on_fork = await send(client, fork, "@reply fork")
    assert on_fork["userErrors"] == [], on_fork
    await _completed(client, on_fork["run"]["id"])
    await ok(client, MERGE, {"f": fork}, "mergeBack")

    child = (await ok(client, DELEGATE, {"t": source}, "delegateTask"))["thread"]
    await _completed(client, child["runs"]["nodes"][0]["id"])

    async def woken() -> bool:
        # The child's result wakes S (run 2, which also takes the merge-back); wait for it to end, so the
        # switch's run is always run 3 and every unit has the same shape.
        runs = (await client.gql(RUNS, {"t": source}))["thread"]["runs"]["nodes"]
        return len(runs) == 2 and all(r["status"] in TERMINAL for r in runs)

    await until(woken, within=60)

    await ok(client, SWITCH, {"t": source}, "switchProvider")
    two = await send(client, source, "@reply two")
    assert two["userErrors"] == [], two
    await _completed(client, two["run"]["id"])
    return Unit(source=source, fork=fork, child=child["id"], runs=(run_one, two["run"]["id"]))


async def build(client: Client, n: int, root: Path | None = None, at_once: int = 5) -> Scene:
    """n units in one new project (see the module docstring), `at_once` of them in flight at a time."""
    data = await client.gql(CREATE_PROJECT, {"name": "graph", "root": str(root) if root else workspace()})
    project = data["createProject"]["project"]["id"]
    gate = asyncio.Semaphore(at_once)

    async def one(i: int) -> Unit:
        async with gate:
            return await _unit(client, project, i)

    units = await asyncio.gather(*(one(i) for i in range(n)))
    return Scene(project=project, units=list(units))

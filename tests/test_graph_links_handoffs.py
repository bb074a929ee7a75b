"""`Run.contextHandoff` is the handoff the run received, whatever made it: a rollback, a provider thread
replaced for a model it cannot change live, a provider switch, a fork, a merge-back. One thread goes through
all five on scripted instances (tests/support/graph_scene.py's `plain`: no native fork or rollback, so each
one hands the conversation over as text). Each run's `contextHandoff` must be the handoff its
`lineage.handoff_delivered` activity names (before, the only way to reach a rollback's handoff), aimed at
that run and at its provider thread.
"""

from __future__ import annotations

from typing import Any

from tests.support import graph_scene
from tests.support.runs import finished, send
from tests.support.server import Client

PROVIDERS = graph_scene.PROVIDERS

CREATE = """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "plain"}) {
  thread { id } userErrors { code } } }"""
SEND_MODEL = """mutation($t: ID!, $text: String!, $m: String) {
  sendMessage(input: {threadId: $t, text: $text, model: $m}) { run { id } userErrors { code message } } }"""
ROLLBACK = """mutation($t: ID!) { rollbackToRun(input: {threadId: $t, runOrdinal: 1, restoreFiles: false}) {
  userErrors { code message } } }"""
RUNS = """query($t: ID!) { thread(id: $t) {
  runs(first: 20) { nodes { id ordinal status providerThread { id }
    contextHandoff { id strategy coveredRunOrdinals targetRun { id } toProviderThread { id } thread { id }
      transfer { type } } } }
  activities(first: 100) { nodes { activityKind run { id } payload } } } }"""


async def _done(client: Client, sent: dict[str, Any]) -> str:
    assert sent["userErrors"] == [], sent
    assert (await finished(client, sent["run"]["id"], within=60))["status"] == "COMPLETED"
    return sent["run"]["id"]  # type: ignore[no-any-return]


async def _view(client: Client, thread: str) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(runs by id, handoff id by run id as the `lineage.handoff_delivered` activities name them)."""
    data = (await client.gql(RUNS, {"t": thread}))["thread"]
    runs = {r["id"]: r for r in data["runs"]["nodes"]}
    delivered = {
        a["run"]["id"]: a["payload"]["handoffId"]
        for a in data["activities"]["nodes"]
        if a["activityKind"] == "LINEAGE_HANDOFF_DELIVERED"
    }
    return runs, delivered


async def test_a_runs_context_handoff_is_the_one_it_received_whatever_made_it(client: Client) -> None:
    scene = await graph_scene.build(client, 0)
    thread = (await graph_scene.ok(client, CREATE, {"p": scene.project}, "createThread"))["thread"]["id"]
    first = await _done(client, await send(client, thread, "@reply first"))
    await _done(client, await send(client, thread, "@reply second"))
    await graph_scene.ok(client, ROLLBACK, {"t": thread}, "rollbackToRun")
    made: dict[str, str] = {}
    made["rollback"] = await _done(client, await send(client, thread, "@reply after the rollback"))
    sent = (await client.gql(SEND_MODEL, {"t": thread, "text": "@reply other model", "m": "other"}))["sendMessage"]
    made["replacement"] = await _done(client, sent)
    await graph_scene.ok(client, graph_scene.SWITCH, {"t": thread}, "switchProvider")
    made["switch"] = await _done(client, await send(client, thread, "@reply switched"))
    fork = (await graph_scene.ok(client, graph_scene.FORK, {"run": first}, "forkThread"))["thread"]["id"]
    made["fork"] = await _done(client, await send(client, fork, "@reply on the fork"))
    await graph_scene.ok(client, graph_scene.MERGE, {"f": fork}, "mergeBack")
    made["merge-back"] = await _done(client, await send(client, thread, "@reply merged"))

    runs, delivered = await _view(client, thread)
    fork_runs, fork_delivered = await _view(client, fork)
    runs |= fork_runs
    delivered |= fork_delivered
    transfer_type = {"rollback": None, "fork": "FORK", "merge-back": "MERGE_BACK"}
    for source, run_id in made.items():
        handoff = runs[run_id]["contextHandoff"]
        assert handoff is not None, f"{source}: run {runs[run_id]['ordinal']} shows no handoff"
        assert handoff["id"] == delivered[run_id], source  # the one the activity says went out with it
        assert handoff["targetRun"] == {"id": run_id}, source
        assert handoff["toProviderThread"] == runs[run_id]["providerThread"], source
        if source in transfer_type:
            got = handoff["transfer"] and handoff["transfer"]["type"]
            assert got == transfer_type[source], (source, handoff)
    # Run 1 received none: its provider thread was new and the conversation began with it.
    assert runs[first]["contextHandoff"] is None

"""`ThreadEvent.run`, `.node`, `.thread` and `.eventType`: a `threadEvents` subscriber selects the run's status
and the node's kind in the same document, instead of copying an id string and asking again.

A run is made and ended, then its thread's events are replayed from sequence 0: every event that carries a
`runId` shows that run as an object (the same id), every `nodeId` its node, every event its thread, and the
`synchronized` marker has none of them; `eventType` is the enum of `type`.
"""

from __future__ import annotations

from tests.support import graph_scene
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.ws import WsClient

PROVIDERS = graph_scene.PROVIDERS

EVENTS = """subscription($t: ID!) { threadEvents(threadId: $t, afterSequence: 0) {
  sequence type eventType runId nodeId run { id status } node { id kind } thread { id title } } }"""
CREATE = """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "plain", title: "events"}) {
  thread { id } userErrors { code } } }"""


async def test_thread_events_link_their_run_node_and_thread_as_objects(client: Client, server: ServerProcess) -> None:
    scene = await graph_scene.build(client, 0)
    thread = (await graph_scene.ok(client, CREATE, {"p": scene.project}, "createThread"))["thread"]["id"]
    sent = await send(client, thread, "@reply hello")
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"

    ws = await WsClient.connect(server.url, client.token)
    try:
        await ws.subscribe(EVENTS, {"t": thread})
        events = []
        while True:
            event = (await ws.receive())["payload"]["data"]["threadEvents"]
            events.append(event)
            if event["type"] == "synchronized":
                break
    finally:
        await ws.close()

    *logged, marker = events
    assert marker["eventType"] == "SYNCHRONIZED" and (marker["run"], marker["node"], marker["thread"]) == (None,) * 3
    assert {e["eventType"] for e in logged} >= {"THREAD_CREATED", "RUN_CREATED", "RUN_UPDATED", "NODE_CREATED"}
    for e in logged:
        assert e["eventType"] == e["type"].upper().replace(".", "_"), e
        assert e["thread"] == {"id": thread, "title": "events"}, e
        assert (e["run"] and e["run"]["id"]) == e["runId"], e
        assert (e["node"] and e["node"]["id"]) == e["nodeId"], e
    with_run = [e for e in logged if e["runId"] is not None]
    with_node = [e for e in logged if e["nodeId"] is not None]
    assert with_run and all(e["run"]["status"] == "COMPLETED" for e in with_run)  # read now: the run has ended
    assert with_node and {e["node"]["kind"] for e in with_node} >= {"ROOT_TURN"}

"""App-owned delegated tasks: child threads with lineage `subagent`, results back to the parent, Stop cascades."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.runs import finished, run, send
from tests.support.server import Client
from tests.support.waiting import until
from threadloom.api.ids import decode
from threadloom.store import tables as t
from threadloom.store.db import Database

DELEGATE = """mutation($t: ID!, $text: String!) { delegateTask(input: {threadId: $t, text: $text}) {
  thread { id title lineage { relationship parentThread { id } rootThread { id } }
           runs(first: 1) { edges { node { id status } } } }
  userErrors { code field } } }"""
THREAD = """query($t: ID!) { thread(id: $t) { status queueHeld activeRun { id status }
  runs(first: 5) { edges { node { id status } } }
  messages(first: 50) { edges { node { role text } } }
  activities(last: 100) { edges { node { kind sequence nodeId payload } } } } }"""


async def _parent(client: Client, tmp_path: Path) -> str:
    data = await client.gql(CREATE_PROJECT, {"name": "tree", "root": workspace(tmp_path)})
    return str((await make_thread(client, data["createProject"]["project"]["id"], "parent"))["id"])


async def _delegate(client: Client, parent: str, text: str) -> dict[str, Any]:
    data = await client.gql(DELEGATE, {"t": parent, "text": text})
    assert data["delegateTask"]["userErrors"] == []
    return data["delegateTask"]["thread"]  # type: ignore[no-any-return]


async def _running(client: Client, run_id: str) -> None:
    async def check() -> bool:
        return (await run(client, run_id))["status"] == "RUNNING"

    await until(check)


async def test_delegated_task_reports_to_its_parent(client: Client, tmp_path: Path, database_url: str) -> None:
    parent = await _parent(client, tmp_path)
    # The parent's run is held at a gate: it is certainly active when the task is delegated and when its
    # result comes back, however slow the machine.
    busy = await send(client, parent, "@await go\n@reply parent one two three")
    await _running(client, busy["run"]["id"])
    child = await _delegate(client, parent, "@reply child answer")
    assert child["lineage"] == {
        "relationship": "SUBAGENT",
        "parentThread": {"id": parent},
        "rootThread": {"id": parent},
    }
    child_run = child["runs"]["edges"][0]["node"]["id"]
    assert (await finished(client, child_run))["status"] == "COMPLETED"

    async def delivered() -> dict[str, Any] | None:
        found = (await client.gql(THREAD, {"t": parent}))["thread"]
        kinds = [a["node"]["kind"] for a in found["activities"]["edges"]]
        return found if "subagent.completed" in kinds else None

    state = await until(delivered)
    system = [m["node"]["text"] for m in state["messages"]["edges"] if m["node"]["role"] == "SYSTEM"]
    assert len(system) == 1 and "child answer" in system[0]
    assert state["activeRun"] == {"id": busy["run"]["id"], "status": "RUNNING"}  # delivered to a live parent run
    (Path(workspace(tmp_path)) / "go").touch()
    parent_run = await finished(client, busy["run"]["id"])
    assert parent_run["status"] == "COMPLETED"
    subagent = [n for n in parent_run["rootNode"]["children"] if n["kind"] == "SUBAGENT"]
    assert len(subagent) == 1 and subagent[0]["status"] == "COMPLETED"
    runs = (await client.gql(THREAD, {"t": parent}))["thread"]["runs"]["edges"]
    assert len(runs) == 1  # the child's completion started nothing on the parent
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            transfers = await r.rows(sa.select(t.context_transfers.c.type, t.context_transfers.c.status))
    finally:
        await db.dispose()
    assert sorted((x["type"], x["status"]) for x in transfers) == [
        ("subagent_result", "resolved_portable"),
        ("subagent_spawn", "consumed"),
    ]


async def test_stop_asks_the_thread_then_each_task_after_its_own_tasks_in_the_order_they_were_delegated(
    client: Client, tmp_path: Path, database_url: str
) -> None:
    """stopThread on a parent with two tasks A and B (delegated in that order), each with a task of its own (A1,
    B1): the parent's run is asked to stop in the Stop's own transaction, then the `delegated-tasks.stop` effect
    walks the tree depth first, a task's own tasks before it, siblings in the order they were delegated
    (engine/interruption.py `_stop_tree`). The event log orders the interrupt requests parent, A1, A, B1, B —
    which neither a top-down walk (A, A1, B, B1), nor the deepest level first across the tree (A1, B1, A, B),
    nor the reverse delegation order (B1, B, A1, A) gives. Every queue stays held until resumeQueue."""
    parent = await _parent(client, tmp_path)
    top = await send(client, parent, "@delay 20000\n@reply never")
    a = await _delegate(client, parent, "@delay 20000\n@reply never")
    b = await _delegate(client, parent, "@delay 20000\n@reply never")
    a1 = await _delegate(client, a["id"], "@delay 20000\n@reply never")
    b1 = await _delegate(client, b["id"], "@delay 20000\n@reply never")
    tasks = {"A": a, "B": b, "A1": a1, "B1": b1}
    runs = [top["run"]["id"], *(task["runs"]["edges"][0]["node"]["id"] for task in tasks.values())]
    for run_id in runs:
        await _running(client, run_id)
    waiting = await send(client, parent, "@reply after the stop", d={"queueAfterActive": True})
    assert waiting["appliedDispatch"] == "QUEUE_AFTER_ACTIVE"
    stopped = await client.gql(
        "mutation($t: ID!) { stopThread(input: {threadId: $t}) { thread { queueHeld } userErrors { code } } }",
        {"t": parent},
    )
    assert stopped["stopThread"] == {"thread": {"queueHeld": True}, "userErrors": []}
    for run_id in runs:
        assert (await finished(client, run_id))["status"] == "INTERRUPTED"
    for thread in (parent, *(task["id"] for task in tasks.values())):
        state = (await client.gql(THREAD, {"t": thread}))["thread"]
        assert state["queueHeld"] is True and state["activeRun"] is None
    assert (await run(client, waiting["run"]["id"]))["status"] == "QUEUED"  # held: nothing restarts on its own
    asked = await _in_log_order(database_url, "run.interrupt_requested")
    names = {_uuid(parent): "parent", **{_uuid(task["id"]): name for name, task in tasks.items()}}
    assert [names[thread] for thread in asked] == ["parent", "A1", "A", "B1", "B"]
    await client.gql("mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { userErrors { code } } }", {"t": parent})
    assert (await finished(client, waiting["run"]["id"]))["status"] == "COMPLETED"


async def _in_log_order(database_url: str, kind: str) -> list[str]:
    """The threads of every `kind` activity, in the order the event log recorded them."""
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            rows = await r.rows(
                sa.select(t.activities.c.thread_id)
                .join(t.events, t.events.c.entity_id == t.activities.c.id)
                .where(t.activities.c.kind == kind)
                .order_by(t.events.c.position)
            )
    finally:
        await db.dispose()
    return [str(row["thread_id"]) for row in rows]


def _uuid(gid: str) -> str:
    found = decode(gid)
    assert found is not None, gid
    return str(found[1])


async def test_interrupting_a_subagent_node_stops_the_child_not_the_parent(client: Client, tmp_path: Path) -> None:
    parent = await _parent(client, tmp_path)
    busy = await send(client, parent, "@delay 20000\n@reply never")
    await _running(client, busy["run"]["id"])
    child = await _delegate(client, parent, "@delay 20000\n@reply never")
    child_run = child["runs"]["edges"][0]["node"]["id"]
    await _running(client, child_run)
    nodes = (await run(client, busy["run"]["id"]))["rootNode"]["children"]
    subagent = next(n for n in nodes if n["kind"] == "SUBAGENT")
    node_interrupt = (
        """mutation($n: ID!) { interruptNode(input: {nodeId: $n}) { node { id kind } userErrors { code } } }"""
    )
    stopped = (await client.gql(node_interrupt, {"n": subagent["id"]}))["interruptNode"]
    assert stopped == {"node": {"id": subagent["id"], "kind": "SUBAGENT"}, "userErrors": []}
    assert (await finished(client, child_run))["status"] == "INTERRUPTED"  # the delegated child stopped
    assert (await run(client, busy["run"]["id"]))["status"] == "RUNNING"  # the parent goes on
    root = (await run(client, busy["run"]["id"]))["rootNode"]["id"]
    ended = (await client.gql(node_interrupt, {"n": root}))["interruptNode"]
    assert ended["userErrors"] == []
    assert (await finished(client, busy["run"]["id"]))["status"] == "INTERRUPTED"


STOP_BY = {
    "stopThread": """mutation($t: ID!) { stopThread(input: {threadId: $t}) { userErrors { code } } }""",
    "interruptRun": """mutation($r: ID!) { interruptRun(input: {runId: $r, holdQueue: true}) {
      userErrors { code } } }""",
}


@pytest.mark.parametrize("mutation", sorted(STOP_BY))
async def test_stop_stops_delegated_tasks_deepest_first(
    client: Client, tmp_path: Path, database_url: str, mutation: str
) -> None:
    """Both Stop mutations take one path: the thread itself, then its tasks, each task's own tasks before it."""
    parent = await _parent(client, tmp_path)
    top = await send(client, parent, "@delay 20000\n@reply never")
    child = await _delegate(client, parent, "@delay 20000\n@reply never")
    grandchild = await _delegate(client, child["id"], "@delay 20000\n@reply never")
    runs = [top["run"]["id"], child["runs"]["edges"][0]["node"]["id"], grandchild["runs"]["edges"][0]["node"]["id"]]
    for run_id in runs:
        await _running(client, run_id)
    stopped = await client.gql(STOP_BY[mutation], {"t": parent} if mutation == "stopThread" else {"r": runs[0]})
    assert stopped[mutation] == {"userErrors": []}
    for run_id in runs:
        assert (await finished(client, run_id))["status"] == "INTERRUPTED"
    for thread in (parent, child["id"], grandchild["id"]):
        assert (await client.gql(THREAD, {"t": thread}))["thread"]["queueHeld"] is True
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            held = await r.rows(
                sa.select(t.activities.c.thread_id)
                .join(t.events, t.events.c.entity_id == t.activities.c.id)
                .where(t.activities.c.kind == "queue.held")
                .order_by(t.events.c.position)
            )
    finally:
        await db.dispose()

    def _uuid(gid: str) -> str:
        found = decode(gid)
        assert found is not None
        return str(found[1])

    order = {str(_uuid(parent)): "parent", str(_uuid(child["id"])): "child", str(_uuid(grandchild["id"])): "grandchild"}
    assert [order[str(h["thread_id"])] for h in held] == ["parent", "grandchild", "child"]


ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n, restoreFiles: false}) {
  rolledBackRuns { ordinal status } userErrors { code message } } }"""


async def _reported(client: Client, parent: str, child: str) -> dict[str, Any]:
    """The parent's `subagent.completed` activity for the child, once it is there."""

    async def check() -> dict[str, Any] | None:
        found = (await client.gql(THREAD, {"t": parent}))["thread"]["activities"]["edges"]
        done = [a["node"] for a in found if a["node"]["kind"] == "subagent.completed"]
        return next((a for a in done if a["payload"]["childThreadId"] == child), None)

    return await until(check)


async def test_a_task_delegated_by_a_rolled_back_run_reports_without_waking_or_telling_the_agent(
    client: Client, tmp_path: Path
) -> None:
    """Run 1 delegates task K, run 2 delegates task U, then the thread is rolled back to run 1 while both
    still work. U's result arrives: the person reading the thread sees it (a message, `subagent.completed`
    with `wake: "undone"`), but no run starts and the agent is never told: its conversation holds no such
    request. K's result, the twin, wakes the parent and reaches its agent. A later `@recall` holds K's
    answer and not U's."""
    parent = await _parent(client, tmp_path)
    gates = Path(workspace(tmp_path))
    asked: list[dict[str, Any]] = []
    for ordinal, name in ((1, "kept"), (2, "undone")):
        asking = await send(client, parent, f"@await asked-{name}\n@reply asking {name}")
        await _running(client, asking["run"]["id"])
        asked.append(await _delegate(client, parent, f"@await done-{name}\n@reply {name} answer"))
        (gates / f"asked-{name}").touch()
        done = await finished(client, asking["run"]["id"])
        assert (done["ordinal"], done["status"]) == (ordinal, "COMPLETED")
    kept, undone = asked
    # The conversation only: the tasks still work in the shared workspace (its files may not move under them).
    rolled = (await client.gql(ROLLBACK, {"t": parent, "n": 1}))["rollbackToRun"]
    assert rolled == {"rolledBackRuns": [{"ordinal": 2, "status": "ROLLED_BACK"}], "userErrors": []}

    (gates / "done-undone").touch()
    assert (await _reported(client, parent, undone["id"]))["payload"]["wake"] == "undone"
    state = (await client.gql(THREAD, {"t": parent}))["thread"]
    assert state["activeRun"] is None and len(state["runs"]["edges"]) == 2  # nothing started
    system = [m["node"]["text"] for m in state["messages"]["edges"] if m["node"]["role"] == "SYSTEM"]
    assert any("undone answer" in text for text in system)  # the person sees the result

    (gates / "done-kept").touch()
    assert (await _reported(client, parent, kept["id"]))["payload"]["wake"] == "woke"
    woken = (await client.gql(THREAD, {"t": parent}))["thread"]["runs"]["edges"][0]["node"]
    assert (await finished(client, woken["id"]))["status"] == "COMPLETED"

    recall = await send(client, parent, "@recall")
    assert (await finished(client, recall["run"]["id"]))["status"] == "COMPLETED"
    messages = (await client.gql(THREAD, {"t": parent}))["thread"]["messages"]["edges"]
    said = next(m["node"]["text"] for m in reversed(messages) if m["node"]["role"] == "ASSISTANT")
    assert "kept answer" in said and "asking kept" in said
    assert "undone answer" not in said and "asking undone" not in said


UNDO = """mutation($t: ID!) { undoRollback(input: {threadId: $t}) { userErrors { code message } } }"""


async def _recalled(client: Client, parent: str) -> str:
    """What the parent's agent holds now: a `@recall` run's reply."""
    recall = await send(client, parent, "@recall")
    assert (await finished(client, recall["run"]["id"]))["status"] == "COMPLETED"
    messages = (await client.gql(THREAD, {"t": parent}))["thread"]["messages"]["edges"]
    return str(next(m["node"]["text"] for m in reversed(messages) if m["node"]["role"] == "ASSISTANT"))


async def _run_two_delegates(
    client: Client, tmp_path: Path, task_text: str
) -> tuple[str, Path, dict[str, Any], dict[str, Any]]:
    """A parent whose run 1 replied "first" and whose run 2 (waiting for the gate `asked`) delegated a task:
    the parent, the gates' folder, run 2 as sent, the task's thread."""
    parent = await _parent(client, tmp_path)
    first = await send(client, parent, "@reply first")
    assert (await finished(client, first["run"]["id"]))["status"] == "COMPLETED"
    asking = await send(client, parent, "@await asked\n@reply asking")
    await _running(client, asking["run"]["id"])
    return parent, Path(workspace(tmp_path)), asking, await _delegate(client, parent, task_text)


@pytest.mark.parametrize("undo", [False, True], ids=["rolled-back", "undone"])
async def test_a_rollback_drops_the_waiting_result_of_a_task_an_undone_run_delegated_and_its_undo_restores_it(
    client: Client, tmp_path: Path, undo: bool
) -> None:
    """Run 2 delegates a task that reports while run 2 still works: its result waits, as a handoff, for the
    parent's next turn. Rolling back to run 1 before that turn drops it (the agent is never told of a task it
    no longer asked for); the twin, `undoRollback` right after, brings run 2 back and the result with it, and
    the next turn hands it over."""
    parent, gates, asking, task = await _run_two_delegates(client, tmp_path, "@reply task answer")
    assert (await _reported(client, parent, task["id"]))["payload"]["wake"] == "busy"  # waits for a next turn
    (gates / "asked").touch()
    assert (await finished(client, asking["run"]["id"]))["status"] == "COMPLETED"

    rolled = (await client.gql(ROLLBACK, {"t": parent, "n": 1}))["rollbackToRun"]
    assert rolled == {"rolledBackRuns": [{"ordinal": 2, "status": "ROLLED_BACK"}], "userErrors": []}
    if undo:
        assert (await client.gql(UNDO, {"t": parent}))["undoRollback"]["userErrors"] == []
    said = await _recalled(client, parent)
    if undo:
        assert "asking" in said and "task answer" in said
    else:
        assert "first" in said and "asking" not in said and "task answer" not in said


@pytest.mark.parametrize("undo", [False, True], ids=["rollback-stands", "undone"])
async def test_a_result_that_came_while_its_run_stood_rolled_back_is_told_once_the_rollback_is_undone(
    client: Client, tmp_path: Path, undo: bool
) -> None:
    """Run 2 delegates a task, the thread is rolled back to run 1, and the task reports while the rollback
    stands: recorded, told to no one (`wake: "undone"`). `undoRollback` brings run 2 back, and the agent that
    asked is told the result with its next turn; the undo starts no run for it. The twin: with the rollback
    standing, the next turn holds neither the request nor the result."""
    parent, gates, asking, task = await _run_two_delegates(client, tmp_path, "@await done\n@reply task answer")
    (gates / "asked").touch()
    assert (await finished(client, asking["run"]["id"]))["status"] == "COMPLETED"
    rolled = (await client.gql(ROLLBACK, {"t": parent, "n": 1}))["rollbackToRun"]
    assert rolled == {"rolledBackRuns": [{"ordinal": 2, "status": "ROLLED_BACK"}], "userErrors": []}
    (gates / "done").touch()
    assert (await _reported(client, parent, task["id"]))["payload"]["wake"] == "undone"

    if undo:
        assert (await client.gql(UNDO, {"t": parent}))["undoRollback"]["userErrors"] == []
        state = (await client.gql(THREAD, {"t": parent}))["thread"]
        assert state["activeRun"] is None and len(state["runs"]["edges"]) == 2  # the undo started nothing
        undid = next(a["node"] for a in state["activities"]["edges"] if a["node"]["kind"] == "rollback.undone")
        assert len(undid["payload"]["restoredHandoffIds"]) == 1  # the result, handed over
    said = await _recalled(client, parent)
    if undo:
        assert "asking" in said and "task answer" in said  # the old undo: "asking" without the answer
    else:
        assert "first" in said and "asking" not in said and "task answer" not in said

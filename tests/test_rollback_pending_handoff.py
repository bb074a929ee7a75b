"""A rollback that undoes runs a still-pending handoff tells of: the next run must not hand them to the agent.

A handoff's text is built when it is made and delivered with the next turn of its provider thread. Two
rollbacks in a row, with no run between them, leave the first one's handoff pending while the second undoes
some of its runs. Real server, the scripted agent (`@recall` shows what its conversation holds, a handoff as a
`handoff:` line), and the handoffs as the API shows them.

- Kept-runs handoff: runs 1-2 on `a`, 3-4 on `b`, 5 back on `a` (its turn carries the delta of 3-4);
  `rollbackToRun(4)` rolls `a` back natively before run 5 and hands it runs 3-4 again (`rebridgeHandoffId`,
  pending); `rollbackToRun(3)` undoes run 4 before that handoff went out. The next run on `a` is told run 3,
  never run 4; the first handoff is `FAILED` (`droppedHandoffIds`), the second rollback's tells run 3 only.
- A rollback's restart from context: on an instance that can neither roll back nor fork, `rollbackToRun(2)`
  replaces the provider thread with one given runs 1-2 (pending); `rollbackToRun(1)` undoes run 2 before it
  went out. The next run is told run 1 only.
- `undoRollback` of the second rollback: the dropped handoff is pending again and the second rollback's own is
  dropped, so the next run is told runs 3 and 4 again.
- The rule itself (`domain.handoff_rollback`), as a table: which pending handoffs a rollback drops.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from tests.support.scripted import ScriptedThread
from tests.support.server import Client
from threadloom.domain.entities import ContextHandoff
from threadloom.domain.handoff_rollback import outdated, undone
from threadloom.domain.statuses import HandoffStatus, HandoffStrategy

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

PROVIDERS = """
[instances.a]
driver = "scripted"

[instances.b]
driver = "scripted"

[instances.plain]
driver = "scripted"
supports_native_rollback = false
supports_native_fork = false
"""

ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) {
  rolledBackRuns { ordinal } userErrors { code message } } }"""
UNDO = """mutation($t: ID!) { undoRollback(input: {threadId: $t}) { userErrors { code message } } }"""
ACTIVITIES = """query($t: ID!) { thread(id: $t) { activities(first: 100) { nodes { kind payload } } } }"""
HANDOFF = """query($id: ID!) { node(id: $id) { ... on ContextHandoff {
  id status coveredRunOrdinals text targetRun { id } } } }"""
RUN_HANDOFF = """query($id: ID!) { node(id: $id) { ... on Run { contextHandoff { id coveredRunOrdinals text } } } }"""


async def _last_record(client: Client, thread: ScriptedThread, kind: str) -> dict[str, Any]:
    nodes = (await client.gql(ACTIVITIES, {"t": thread.id}))["thread"]["activities"]["nodes"]
    return [n["payload"] for n in nodes if n["kind"] == kind][-1]  # type: ignore[no-any-return]


async def _rolled_back(client: Client, thread: ScriptedThread, ordinal: int) -> dict[str, Any]:
    answer = (await client.gql(ROLLBACK, {"t": thread.id, "n": ordinal}))["rollbackToRun"]
    assert answer["userErrors"] == [], answer
    return await _last_record(client, thread, "rollback.completed")


async def _handoff(client: Client, handoff_id: str) -> dict[str, Any]:
    return (await client.gql(HANDOFF, {"id": handoff_id}))["node"]  # type: ignore[no-any-return]


async def _recalled(thread: ScriptedThread) -> tuple[str, dict[str, Any] | None]:
    """What the agent holds after the next run (`@recall`), and the handoff that run carried."""
    lines = await thread.recall()
    data = await thread.client.gql(
        """query($t: ID!) { thread(id: $t) { runs(first: 100) { nodes { id ordinal } } } }""", {"t": thread.id}
    )
    last = max(data["thread"]["runs"]["nodes"], key=lambda r: r["ordinal"])
    carried = (await thread.client.gql(RUN_HANDOFF, {"id": last["id"]}))["node"]["contextHandoff"]
    return "\n".join(lines), carried


async def _switched_and_back(client: Client, workspace: Path) -> tuple[ScriptedThread, dict[str, Any]]:
    """Runs 1-2 on `a`, 3-4 on `b`, 5 on `a`; then `rollbackToRun(4)`: `a` is to be handed runs 3-4 again."""
    thread = await ScriptedThread.create(client, workspace, "a")
    for text in ("@reply one", "@reply two"):
        await thread.run_on("a", text)
    for text in ("@reply three", "@reply four"):
        await thread.run_on("b", text)
    await thread.run_on("a", "@reply five")
    first = await _rolled_back(client, thread, 4)
    assert first["rebridgeHandoffId"] is not None, first
    pending = await _handoff(client, first["rebridgeHandoffId"])
    assert (pending["status"], pending["coveredRunOrdinals"]) == ("PENDING", [3, 4]), pending
    assert "@reply four" in pending["text"], pending
    return thread, first


async def test_a_pending_kept_runs_handoff_never_tells_a_run_a_later_rollback_undid(
    client: Client, workspace: Path
) -> None:
    thread, first = await _switched_and_back(client, workspace)
    second = await _rolled_back(client, thread, 3)  # undoes run 4 before the handoff of 3-4 went out

    held, carried = await _recalled(thread)  # continues on `a`
    assert "@reply four" not in held and "@reply five" not in held, held
    for word in ("one", "two", "three"):
        assert f"@reply {word}" in held, (word, held)
    # What went out is the second rollback's handoff, of run 3 only; the first one never will.
    assert carried is not None and carried["id"] == second["rebridgeHandoffId"], (carried, second)
    assert carried["coveredRunOrdinals"] == [3] and "@reply four" not in carried["text"], carried
    assert second["droppedHandoffIds"] == [first["rebridgeHandoffId"]], second
    dropped = await _handoff(client, first["rebridgeHandoffId"])
    assert (dropped["status"], dropped["targetRun"]) == ("FAILED", None), dropped


async def test_a_pending_restart_from_context_never_tells_a_run_a_later_rollback_undid(
    client: Client, workspace: Path
) -> None:
    thread = await ScriptedThread.create(client, workspace, "plain")
    for text in ("@reply one", "@reply two", "@reply three"):
        await thread.run(text)
    first = await _rolled_back(client, thread, 2)
    [step] = first["providerThreads"]
    assert step["strategy"] in ("replace", "discard") and step["handoffId"], first  # runs 1-2, pending
    second = await _rolled_back(client, thread, 1)  # undoes run 2 before that restart went out

    held, carried = await _recalled(thread)
    assert "@reply one" in held, held
    assert "@reply two" not in held and "@reply three" not in held, held
    assert carried is not None and carried["coveredRunOrdinals"] == [1], carried
    assert second["droppedHandoffIds"] == [step["handoffId"]], second
    assert (await _handoff(client, step["handoffId"]))["status"] == "FAILED"


async def test_undoing_the_later_rollback_hands_the_runs_it_brought_back_again(
    client: Client, workspace: Path
) -> None:
    thread, first = await _switched_and_back(client, workspace)
    second = await _rolled_back(client, thread, 3)
    undo = (await client.gql(UNDO, {"t": thread.id}))["undoRollback"]
    assert undo["userErrors"] == [], undo
    record = await _last_record(client, thread, "rollback.undone")
    assert record["restoredHandoffIds"] == [first["rebridgeHandoffId"]], record
    assert record["droppedHandoffIds"] == [second["rebridgeHandoffId"]], record
    assert (await _handoff(client, second["rebridgeHandoffId"]))["status"] == "FAILED"

    held, carried = await _recalled(thread)
    for word in ("one", "two", "three", "four"):  # run 4 is part of the conversation again
        assert f"@reply {word}" in held, (word, held)
    assert "@reply five" not in held, held  # still rolled back by the first rollback
    assert carried is not None and carried["id"] == first["rebridgeHandoffId"], carried


# ---- the rule, as a table -----------------------------------------------------------------------------

PT, FORK = uuid.uuid4(), uuid.uuid4()


def _pending(
    covered: list[int], omitted: list[int] | None = None, status: HandoffStatus = HandoffStatus.PENDING
) -> ContextHandoff:
    return ContextHandoff(
        id=uuid.uuid4(),
        thread_id=uuid.uuid4(),
        to_provider_thread_id=PT,
        covered_run_ordinals=covered,
        omitted_run_ordinals=omitted or [],
        strategy=HandoffStrategy.DELTA_SINCE_TARGET_LAST_SEEN,
        status=status,
        text="t",
        token_estimate=1,
        created_at=datetime(2026, 1, 1, tzinfo=UTC),
    )


@pytest.mark.parametrize(
    ("covered", "omitted", "undone_runs", "drops"),
    [
        ([3, 4], [], {4}, True),  # tells of an undone run
        ([3, 4], [], {5, 6}, False),  # only kept runs
        ([4], [1, 2], {2}, True),  # an undone run it listed as omitted for length still counts
        ([1, 2], [], set(), False),  # nothing undone
    ],
)
def test_a_rollback_drops_exactly_the_pending_handoffs_telling_of_an_undone_run(
    covered: list[int], omitted: list[int], undone_runs: set[int], drops: bool
) -> None:
    handoff = _pending(covered, omitted)
    delivered = _pending(covered, omitted, HandoffStatus.DELIVERED)  # part of a conversation: its turn goes
    assert outdated([handoff, delivered], undone_runs) == ((handoff,) if drops else ())


def test_an_undo_restores_the_dropped_handoffs_to_the_undo_fork_and_drops_its_own() -> None:
    was_dropped = _pending([3, 4], status=HandoffStatus.FAILED)
    rebridge = _pending([3])
    kept = _pending([1])  # pending on the provider thread the undo swaps for its fork: it follows
    changes = {c.entity.id: c.entity for c in undone([was_dropped], rebridge, [kept], {PT: FORK})}
    assert changes[rebridge.id].status == HandoffStatus.FAILED
    assert (changes[was_dropped.id].status, changes[was_dropped.id].to_provider_thread_id) == (
        HandoffStatus.PENDING,
        FORK,
    )
    assert changes[kept.id].to_provider_thread_id == FORK

"""`plan_rollback` as tables: what going back to right after run N undoes, per provider thread, and what it
refuses (domain/rollback.py). Pure: no database, no provider.

Provider threads in the tables: `A` rolls back natively (as Codex and the scripted agent), `B` can only fork
from a turn (as Claude), `C` can do neither. Turn refs are `<thread><turn ordinal>` (`a2`: A's second turn);
checkpoint `cpN` is run N's root checkpoint (`cp0` the baseline), `childN` a subagent scope's in run N.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from threadloom.domain.rollback import (
    CheckpointFact,
    ProviderThreadFact,
    ProviderThreadRollback,
    RollbackCode,
    RollbackRefused,
    RunFact,
    TurnFact,
    lost_runs,
    plan_rollback,
    stale_provider_threads,
)
from threadloom.domain.statuses import ACTIVE_RUN_STATUSES, CheckpointStatus, RunStatus

C_, I_, F_, RB, Q_, X_ = (
    RunStatus.COMPLETED,
    RunStatus.INTERRUPTED,
    RunStatus.FAILED,
    RunStatus.ROLLED_BACK,
    RunStatus.QUEUED,
    RunStatus.CANCELLED,
)
PT = {name: uuid.uuid5(uuid.NAMESPACE_URL, f"pt-{name}") for name in "ABC"}
NAMES = {v: k for k, v in PT.items()}
ABILITIES = {"A": (True, True), "B": (False, True), "C": (False, False)}


def run(ordinal: int, status: RunStatus, *turns: str) -> RunFact:
    """`turns` like "a2" (A's turn 2) or "a2?" (recorded, but it never reached the provider)."""
    facts = tuple(
        TurnFact(PT[t[0].upper()], int(t[1:].rstrip("?")), None if t.endswith("?") else t.rstrip("?")) for t in turns
    )
    return RunFact(ordinal, status, facts)


def threads(**bases: int | None) -> dict[uuid.UUID, ProviderThreadFact]:
    """Every provider thread with its abilities; `bases` overrides the default base ordinal 0."""
    out = {}
    for name, (rollback, fork) in ABILITIES.items():
        out[PT[name]] = ProviderThreadFact(PT[name], rollback, fork, bases.get(name, 0))
    return out


CP = {name: uuid.uuid5(uuid.NAMESPACE_URL, f"cp-{name}") for name in [f"cp{i}" for i in range(6)] + ["child2"]}
CP_NAMES = {v: k for k, v in CP.items()}


def checkpoints(*names: str, status: CheckpointStatus = CheckpointStatus.READY) -> list[CheckpointFact]:
    return [CheckpointFact(CP[n], int(n[-1]), status, root=n.startswith("cp")) for n in names]


def recorded(runs: list[RunFact]) -> list[CheckpointFact]:
    """The checkpoints such a thread has: the baseline, one per run that ran (stale for a rolled-back one)."""
    out = checkpoints("cp0")
    for r in runs:
        if r.status in (C_, I_, F_, RB):
            status = CheckpointStatus.STALE if r.status == RB else CheckpointStatus.READY
            out += checkpoints(f"cp{r.ordinal}", status=status)
    return out


def describe(plan_threads: tuple[ProviderThreadRollback, ...]) -> list[str]:
    out = []
    for p in plan_threads:
        text = f"{NAMES[p.provider_thread_id]} {p.strategy}"
        if p.before_turn_ref is not None:
            text += f" before {p.before_turn_ref} x{p.turn_count}"
        if p.fork_at_turn_ref is not None:
            text += f" at {p.fork_at_turn_ref}"
        out.append(text)
    return out


TWO_ON = {name: [run(1, C_, f"{name.lower()}1"), run(2, C_, f"{name.lower()}2")] for name in "ABC"}
SWITCHED = [run(1, C_, "a1"), run(2, C_, "a2"), run(3, C_, "b1"), run(4, C_, "b2")]  # A for 1-2, then B (base 2)

# (id, runs, target, bases, rolled back runs, provider threads, stale checkpoints, restored from)
TABLE = [
    ("native-last-run", TWO_ON["A"], 1, {}, [2], ["A native_rollback before a2 x1"], ["cp2"], "cp1"),
    ("native-to-baseline", TWO_ON["A"], 0, {}, [1, 2], ["A native_rollback before a1 x2"], ["cp1", "cp2"], "cp0"),
    ("to-the-latest-run-only-files", TWO_ON["A"], 2, {}, [], [], [], "cp2"),
    ("fork-at-the-last-kept-turn", TWO_ON["B"], 1, {}, [2], ["B native_fork at b1"], ["cp2"], "cp1"),
    ("fork-capable-but-nothing-kept", TWO_ON["B"], 0, {}, [1, 2], ["B replace"], ["cp1", "cp2"], "cp0"),
    ("neither-replaces", TWO_ON["C"], 1, {}, [2], ["C replace"], ["cp2"], "cp1"),
    # a thread whose base is unknown and that keeps no turn cannot be trusted: retired
    ("unknown-base-nothing-kept", TWO_ON["A"], 0, {"A": None}, [1, 2], ["A discard"], ["cp1", "cp2"], "cp0"),
    # provider switch: A ran 1-2, B (started with a handoff of 1-2) ran 3-4
    ("switched-back-into-b", SWITCHED, 3, {"B": 2}, [4], ["B native_fork at b1"], ["cp4"], "cp3"),
    ("switched-to-b-base", SWITCHED, 2, {"B": 2}, [3, 4], ["B replace"], ["cp3", "cp4"], "cp2"),
    (
        "switched-before-b-existed",
        SWITCHED,
        1,
        {"B": 2},
        [2, 3, 4],
        ["A native_rollback before a2 x1", "B discard"],
        ["cp2", "cp3", "cp4"],
        "cp1",
    ),
    # a steering restart: run 2 has two turns on A, both go
    (
        "two-attempts",
        [run(1, C_, "a1"), run(2, C_, "a3", "a2")],
        1,
        {},
        [2],
        ["A native_rollback before a2 x2"],
        ["cp2"],
        "cp1",
    ),
    # runs that ran out of ordinal order (a reordered queue): run 3's turn came first on A, so A goes back before it
    (
        "runs-out-of-order",
        [run(1, C_, "a1"), run(2, C_, "a3"), run(3, C_, "a2")],
        1,
        {},
        [2, 3],
        ["A native_rollback before a2 x2"],
        ["cp2", "cp3"],
        "cp1",
    ),
    # a kept run's turn came after an undone one: neither a revert nor a fork holds exactly the kept runs
    (
        "kept-turn-after-an-undone-one",
        [run(1, C_, "a1"), run(2, C_, "a3"), run(3, C_, "a2")],
        2,
        {},
        [3],
        ["A replace"],
        ["cp3"],
        "cp2",
    ),
    (
        "kept-turn-after-an-undone-one-on-a-forking-thread",
        [run(1, C_, "b1"), run(2, C_, "b3"), run(3, C_, "b2")],
        2,
        {},
        [3],
        ["B replace"],
        ["cp3"],
        "cp2",
    ),
    # run 2's turn never reached the provider: nothing to undo there
    ("turn-never-sent", [run(1, C_, "a1"), run(2, F_, "a2?")], 1, {}, [2], ["A unchanged"], ["cp2"], "cp1"),
    # after an earlier rollback: run 2 is gone already, run 3 followed it on A
    (
        "again-after-a-rollback",
        [run(1, C_, "a1"), run(2, RB, "a2"), run(3, C_, "a3")],
        1,
        {},
        [3],
        ["A native_rollback before a3 x1"],
        ["cp3"],
        "cp1",
    ),
    # interrupted and failed runs are undone like completed ones, and are targets too
    (
        "interrupted-and-failed",
        [run(1, I_, "a1"), run(2, F_, "a2")],
        1,
        {},
        [2],
        ["A native_rollback before a2 x1"],
        ["cp2"],
        "cp1",
    ),
    # queued and cancelled runs never ran: left alone
    (
        "queued-and-cancelled-kept",
        [*TWO_ON["A"], run(3, X_), run(4, Q_)],
        1,
        {},
        [2],
        ["A native_rollback before a2 x1"],
        ["cp2"],
        "cp1",
    ),
]


@pytest.mark.parametrize(
    ("runs", "target", "bases", "rolled_back", "pts", "stale", "restored"),
    [pytest.param(*r[1:], id=r[0]) for r in TABLE],
)
def test_rollback_plan_per_run_history(
    runs: list[RunFact],
    target: int,
    bases: dict[str, int | None],
    rolled_back: list[int],
    pts: list[str],
    stale: list[str],
    restored: str,
) -> None:
    plan = plan_rollback(runs, target, threads(**bases), recorded(runs), restore_files=True)
    assert plan.target_ordinal == target
    assert list(plan.rolled_back_run_ordinals) == rolled_back
    assert describe(plan.provider_threads) == pts
    assert [CP_NAMES[c] for c in plan.stale_checkpoint_ids] == stale  # an already stale one is left alone
    assert plan.restore_checkpoint_id is not None and CP_NAMES[plan.restore_checkpoint_id] == restored
    assert plan.changes_conversation == bool(rolled_back or pts)


def test_the_dropped_turns_are_listed_per_provider_thread() -> None:
    plan = plan_rollback(SWITCHED, 1, threads(B=2), restore_files=False)
    assert [(NAMES[p.provider_thread_id], p.dropped_turn_ordinals) for p in plan.provider_threads] == [
        ("A", (2,)),
        ("B", (1, 2)),
    ]
    assert plan.restore_checkpoint_id is None  # files stay as they are
    assert plan.stale_checkpoint_ids == ()


def test_unknown_provider_thread_can_do_nothing_natively() -> None:
    plan = plan_rollback(TWO_ON["A"], 1, {}, restore_files=False)
    assert describe(plan.provider_threads) == ["A replace"]  # a kept turn, no abilities known


def test_child_checkpoints_of_later_runs_become_stale() -> None:
    present = checkpoints("cp0", "cp1", "child2", "cp2")
    plan = plan_rollback(TWO_ON["A"], 1, threads(), present, restore_files=True)
    assert sorted(CP_NAMES[c] for c in plan.stale_checkpoint_ids) == ["child2", "cp2"]
    assert plan.restore_checkpoint_id == CP["cp1"]


REFUSALS = [
    *[
        (f"{s}-run", [run(1, C_, "a1"), run(2, s, "a2")], 1, True, RollbackCode.THREAD_BUSY, None)
        for s in sorted(ACTIVE_RUN_STATUSES)
    ],
    ("negative", TWO_ON["A"], -1, False, RollbackCode.INVALID_INPUT, "runOrdinal"),
    ("unknown", TWO_ON["A"], 3, False, RollbackCode.NOT_FOUND, "runOrdinal"),
    ("no-runs-yet", [], 1, False, RollbackCode.NOT_FOUND, "runOrdinal"),
    ("rolled-back-target", [run(1, C_, "a1"), run(2, RB, "a2")], 2, False, RollbackCode.INVALID_INPUT, "runOrdinal"),
    ("cancelled-target", [run(1, C_, "a1"), run(2, X_)], 2, False, RollbackCode.INVALID_INPUT, "runOrdinal"),
    ("queued-target", [run(1, C_, "a1"), run(2, Q_)], 2, False, RollbackCode.INVALID_INPUT, "runOrdinal"),
    ("no-checkpoint", TWO_ON["A"], 0, True, RollbackCode.CHECKPOINT_MISSING, "restoreFiles"),
]


@pytest.mark.parametrize(
    ("runs", "target", "restore", "code", "field"), [pytest.param(*r[1:], id=r[0]) for r in REFUSALS]
)
def test_rollback_refusals_per_run_history(
    runs: list[RunFact], target: int, restore: bool, code: RollbackCode, field: str | None
) -> None:
    present = checkpoints("cp1", "cp2")  # no baseline
    with pytest.raises(RollbackRefused) as refused:
        plan_rollback(runs, target, threads(), present, restore_files=restore)
    assert (refused.value.code, refused.value.field) == (code, field)


@pytest.mark.parametrize(
    "present",
    [
        pytest.param(checkpoints("cp1", status=CheckpointStatus.MISSING), id="missing"),
        pytest.param(checkpoints("cp1", status=CheckpointStatus.ERROR), id="error"),
        pytest.param(checkpoints("cp1", status=CheckpointStatus.STALE), id="stale"),
        pytest.param(checkpoints("cp0", "cp2"), id="others-only"),
    ],
)
def test_files_need_a_ready_root_checkpoint_of_the_target(present: list[CheckpointFact]) -> None:
    with pytest.raises(RollbackRefused) as refused:
        plan_rollback(TWO_ON["A"], 1, threads(), present, restore_files=True)
    assert refused.value.code == RollbackCode.CHECKPOINT_MISSING
    assert plan_rollback(TWO_ON["A"], 1, threads(), present, restore_files=False).restore_checkpoint_id is None


def test_refusal_codes_are_error_codes_or_documented_new_ones() -> None:
    assert [c.value for c in RollbackCode] == ["THREAD_BUSY", "INVALID_INPUT", "NOT_FOUND", "CHECKPOINT_MISSING"]


A_PT, B_PT, C_PT = (uuid.UUID(int=n) for n in (1, 2, 3))


@pytest.mark.parametrize(
    ("seen", "undone", "handled", "stale"),
    [
        # runs 1-2 on a, 3-4 on b (told of 1-2), rollback to 1 on b: a saw run 2, so a is retired too
        ({A_PT: {1, 2}, B_PT: {1, 2, 3, 4}}, [2, 3, 4], [B_PT], [A_PT]),
        # a saw only run 1, which is kept: a stays
        ({A_PT: {1}, B_PT: {1, 2, 3}}, [2, 3], [B_PT], []),
        # c was told of undone run 3 in a handoff: retired like one that ran it
        ({A_PT: {1, 2, 3}, B_PT: {1, 2}, C_PT: {1, 2, 3}}, [3], [A_PT], [C_PT]),
        # nothing undone: nothing retired
        ({A_PT: {1, 2}, B_PT: {1, 2}}, [], [A_PT], []),
    ],
)  # fmt: skip
def test_provider_threads_that_saw_an_undone_run_are_retired(
    seen: dict[uuid.UUID, set[int]], undone: list[int], handled: list[uuid.UUID], stale: list[uuid.UUID]
) -> None:
    found = stale_provider_threads({pt: frozenset(runs) for pt, runs in seen.items()}, undone, handled)
    assert list(found) == stale


@pytest.mark.parametrize(
    ("kept", "seen", "lost"),
    [([1, 2, 3, 4], {1, 2, 5}, [3, 4]), ([1, 2], {1, 2, 3}, []), ([], set(), [])],
)
def test_kept_runs_the_staying_provider_thread_lost_are_handed_again(
    kept: list[int], seen: set[int], lost: list[int]
) -> None:
    assert lost_runs(kept, frozenset(seen)) == lost


T0 = datetime(2026, 1, 1, tzinfo=UTC)


def started(fact: RunFact, second: int) -> RunFact:
    return dataclasses.replace(fact, started_at=T0 + timedelta(seconds=second))


def test_files_are_not_restored_from_a_checkpoint_that_holds_an_undone_run() -> None:
    """A reordered queue ran run 3 before run 2: run 2's checkpoint holds run 3's files too, so going back to run
    2 with its files would keep files of the run it undoes. Without files, or to run 1 (before both), it goes."""
    reordered = [started(run(1, C_, "a1"), 1), started(run(2, C_, "a3"), 3), started(run(3, C_, "a2"), 2)]
    with pytest.raises(RollbackRefused) as refused:
        plan_rollback(reordered, 2, threads(), checkpoints("cp0", "cp1", "cp2", "cp3"), restore_files=True)
    assert (refused.value.code, refused.value.field) == (RollbackCode.CHECKPOINT_MISSING, "restoreFiles")
    assert "run 3 ran before run 2" in refused.value.message
    without = plan_rollback(reordered, 2, threads(), checkpoints("cp0", "cp1", "cp2", "cp3"), restore_files=False)
    assert without.rolled_back_run_ordinals == (3,) and without.restore_checkpoint_id is None
    before_both = plan_rollback(reordered, 1, threads(), checkpoints("cp0", "cp1", "cp2", "cp3"), restore_files=True)
    assert before_both.rolled_back_run_ordinals == (2, 3) and before_both.restore_checkpoint_id == CP["cp1"]
    in_order = [started(run(1, C_, "a1"), 1), started(run(2, C_, "a2"), 2), started(run(3, C_, "a3"), 3)]
    kept = plan_rollback(in_order, 2, threads(), checkpoints("cp0", "cp1", "cp2", "cp3"), restore_files=True)
    assert kept.rolled_back_run_ordinals == (3,) and kept.restore_checkpoint_id == CP["cp2"]

"""Planning `rollbackToRun`: what must change so files and conversation are back to right after run N.

The plan is computed before anything is touched (pure: facts in, plan out, no I/O), so a refusal changes nothing
and the engine can carry the plan out as one recorded operation (and undo what it did if a step fails). What it
decides:

- which runs become `ROLLED_BACK`: every run after the target that ran (completed, interrupted or failed);
  runs already rolled back, cancelled or still queued are left as they are;
- per provider thread, how its conversation loses the turns of those runs (`ProviderThreadRollback`):
  natively (`rollback_thread` to the first dropped turn, or the count for a count-based provider), by a native
  fork at the last kept turn, by a replacement provider thread built from the app's context up to the target
  (recorded as a handoff), or by discarding a provider thread that holds nothing from before the target;
- which checkpoints become stale (every one recorded for a later run, child scopes included) and which root
  checkpoint the files are restored from.

Turn ordinals are per provider thread (`ProviderTurn.ordinal`), run ordinals per app thread; ordinal 0 is the
state before the first run (its checkpoint is the baseline).
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime
from enum import StrEnum

from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import ACTIVE_RUN_STATUSES, CheckpointStatus, RunStatus

# Runs whose turns reached the provider: the ones a rollback undoes, and the only valid targets.
RAN = frozenset({RunStatus.COMPLETED, RunStatus.INTERRUPTED, RunStatus.FAILED})


class RollbackCode(StrEnum):
    """The `ErrorCode`s a rollback plan can be refused with."""

    THREAD_BUSY = ErrorCode.THREAD_BUSY.value
    INVALID_INPUT = ErrorCode.INVALID_INPUT.value
    NOT_FOUND = ErrorCode.NOT_FOUND.value
    CHECKPOINT_MISSING = ErrorCode.CHECKPOINT_MISSING.value


class RollbackRefused(DomainError):
    """The rollback cannot be planned; nothing was changed.

    A `DomainError` like any other refusal (the API reports it as a user error); the constructor only narrows
    the codes to those a plan can give.
    """

    def __init__(self, code: RollbackCode, message: str, field: str | None = None) -> None:
        super().__init__(ErrorCode(code), message, field)


class Strategy(StrEnum):
    NATIVE_ROLLBACK = "native_rollback"  # the provider drops the turns itself
    NATIVE_FORK = "native_fork"  # fork at the last kept turn; the fork replaces the provider thread
    REPLACE = "replace"  # a new provider thread from the app's context up to the target (a handoff)
    DISCARD = "discard"  # holds nothing from before the target: retire it, the next run starts afresh
    UNCHANGED = "unchanged"  # none of the dropped turns reached the provider: its conversation is already right


@dataclasses.dataclass(frozen=True, slots=True)
class TurnFact:
    """One provider turn of a run's root turn (every attempt's), as recorded."""

    provider_thread_id: uuid.UUID
    ordinal: int  # position on its provider thread
    native_turn_ref: str | None  # None: never reached the provider (its start failed)


@dataclasses.dataclass(frozen=True, slots=True)
class RunFact:
    ordinal: int
    status: RunStatus
    turns: tuple[TurnFact, ...] = ()
    started_at: datetime | None = None  # when its first turn started (None: never)


@dataclasses.dataclass(frozen=True, slots=True)
class CheckpointFact:
    id: uuid.UUID
    run_ordinal: int  # the run it was captured for (0: the baseline)
    status: CheckpointStatus
    root: bool = True  # False: a child scope's (a subagent's), never a restore point for a whole run


@dataclasses.dataclass(frozen=True, slots=True)
class ProviderThreadFact:
    """What a provider thread can do, and what context it held before its first turn.

    `base_ordinal`: the last app run its starting context covered (0 for a fresh thread at run 1 or a native
    fork's thread, k-1 for one created for run k with a full handoff); None when unknown, which counts as
    covering runs after any target, so such a thread with no kept turn is discarded rather than trusted.
    """

    id: uuid.UUID
    can_rollback: bool = False  # `can_rollback_thread`
    can_fork_from_turn: bool = False  # `can_fork_from_turn`
    base_ordinal: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ProviderThreadRollback:
    provider_thread_id: uuid.UUID
    strategy: Strategy
    dropped_turn_ordinals: tuple[int, ...]  # the provider turns (on this thread) whose context goes away
    before_turn_ref: str | None = None  # NATIVE_ROLLBACK: the first native turn dropped (`rollback_thread`)
    turn_count: int = 0  # NATIVE_ROLLBACK: how many native turns are dropped (count-based providers)
    fork_at_turn_ref: str | None = None  # NATIVE_FORK: the last native turn kept


@dataclasses.dataclass(frozen=True, slots=True)
class RollbackPlan:
    target_ordinal: int
    rolled_back_run_ordinals: tuple[int, ...]
    provider_threads: tuple[ProviderThreadRollback, ...]  # in order of their first dropped turn's run
    stale_checkpoint_ids: tuple[uuid.UUID, ...]
    restore_checkpoint_id: uuid.UUID | None  # None when files are not restored

    @property
    def changes_conversation(self) -> bool:
        return bool(self.rolled_back_run_ordinals or self.provider_threads)


def plan_rollback(
    runs: Iterable[RunFact],
    target_ordinal: int,
    provider_threads: Mapping[uuid.UUID, ProviderThreadFact],
    checkpoints: Iterable[CheckpointFact] = (),
    *,
    restore_files: bool,
) -> RollbackPlan:
    """The plan to go back to right after run `target_ordinal`, or `RollbackRefused`.

    Refused: a run is active (`THREAD_BUSY`); a negative ordinal, or a target that never ran or was already
    rolled back (`INVALID_INPUT`); no run with that ordinal (`NOT_FOUND`); `restore_files` without a ready root
    checkpoint for the target (`CHECKPOINT_MISSING`). A provider thread missing from `provider_threads` is
    treated as able to do nothing natively.
    """
    runs = sorted(runs, key=lambda run: run.ordinal)
    checkpoints = list(checkpoints)
    active = [run.ordinal for run in runs if run.status in ACTIVE_RUN_STATUSES]
    if active:
        raise RollbackRefused(RollbackCode.THREAD_BUSY, f"run {active[0]} is active; interrupt it or wait first")
    _check_target(runs, target_ordinal)

    restore: uuid.UUID | None = None
    if restore_files:
        _check_files_alone(runs, target_ordinal)
        ready = [
            c.id
            for c in checkpoints
            if c.root and c.run_ordinal == target_ordinal and c.status == CheckpointStatus.READY
        ]
        if not ready:
            raise RollbackRefused(
                RollbackCode.CHECKPOINT_MISSING,
                f"no checkpoint to restore files from for run {target_ordinal}; roll back without restoreFiles",
                "restoreFiles",
            )
        restore = ready[-1]

    undone = [run for run in runs if run.ordinal > target_ordinal and run.status in RAN]
    kept_turns = [t for run in runs if run.ordinal <= target_ordinal and run.status in RAN for t in run.turns]
    dropped_turns: dict[uuid.UUID, list[TurnFact]] = {}
    for run in undone:
        for turn in sorted(run.turns, key=lambda t: t.ordinal):
            dropped_turns.setdefault(turn.provider_thread_id, []).append(turn)
    plans = tuple(
        _provider_thread(provider_threads.get(pt) or ProviderThreadFact(pt), turns, kept_turns, target_ordinal)
        for pt, turns in dropped_turns.items()
    )
    stale = tuple(c.id for c in checkpoints if c.run_ordinal > target_ordinal and c.status != CheckpointStatus.STALE)
    return RollbackPlan(target_ordinal, tuple(run.ordinal for run in undone), plans, stale, restore)


def stale_provider_threads(
    seen: Mapping[uuid.UUID, frozenset[int]], undone: Iterable[int], handled: Iterable[uuid.UUID]
) -> tuple[uuid.UUID, ...]:
    """The provider threads, other than the `handled` ones (the active one and those the plan's steps roll
    back), that hold or were told of an undone run (`seen`: `switching.seen_runs` of each open provider
    thread). They are retired: a provider returned to later gets a new provider thread and a summary of the
    conversation as it is then, never a resumed one that remembers what was undone."""
    gone, skip = set(undone), set(handled)
    return tuple(sorted((pt for pt, runs in seen.items() if pt not in skip and runs & gone), key=str))


def lost_runs(kept: Iterable[int], seen: frozenset[int]) -> list[int]:
    """The kept runs (in the conversation, at or before the target) that the provider thread staying active
    does not hold once the undone turns are gone: it is handed them with its next turn."""
    return sorted(set(kept) - seen)


def _check_target(runs: list[RunFact], target: int) -> None:
    if target < 0:
        raise RollbackRefused(RollbackCode.INVALID_INPUT, "runOrdinal must be 0 or more", "runOrdinal")
    if target == 0:
        return  # the baseline: before the first run
    found = [run for run in runs if run.ordinal == target]
    if not found:
        raise RollbackRefused(RollbackCode.NOT_FOUND, f"no run {target} in this thread", "runOrdinal")
    status = found[0].status
    if status == RunStatus.ROLLED_BACK:
        raise RollbackRefused(RollbackCode.INVALID_INPUT, f"run {target} was rolled back", "runOrdinal")
    if status not in RAN:
        raise RollbackRefused(RollbackCode.INVALID_INPUT, f"run {target} never ran (it is {status})", "runOrdinal")


def _check_files_alone(runs: list[RunFact], target: int) -> None:
    """A run's checkpoint is its files as the run left them. A later run (by ordinal) that ran before the target (a
    reordered queue) left its files in the target's checkpoint, so restoring it would keep files of a run the
    rollback undoes: refused, as no checkpoint holds the target's files without them."""
    found = [run for run in runs if run.ordinal == target]
    began = found[0].started_at if found else None
    if began is None:
        return
    earlier = [
        run.ordinal
        for run in runs
        if run.ordinal > target and run.status in RAN and run.started_at is not None and run.started_at < began
    ]
    if earlier:
        raise RollbackRefused(
            RollbackCode.CHECKPOINT_MISSING,
            f"run {earlier[0]} ran before run {target}, so run {target}'s checkpoint holds its files too; roll back "
            f"without restoreFiles, or to a run before both",
            "restoreFiles",
        )


def _provider_thread(
    pt: ProviderThreadFact, dropped: list[TurnFact], kept_turns: list[TurnFact], target: int
) -> ProviderThreadRollback:
    # In the provider thread's order, not the runs': runs can run out of ordinal order (a reordered queue), and
    # `before_turn_ref` must be the first dropped turn on the thread, or the revert keeps the turns before it.
    dropped = sorted(dropped, key=lambda t: t.ordinal)
    ordinals = tuple(t.ordinal for t in dropped)
    native = [t for t in dropped if t.native_turn_ref is not None]
    kept = sorted(
        (t for t in kept_turns if t.provider_thread_id == pt.id and t.native_turn_ref is not None),
        key=lambda t: t.ordinal,
    )
    holds_kept_context = bool(kept) or (pt.base_ordinal is not None and pt.base_ordinal <= target)
    if not holds_kept_context:
        return ProviderThreadRollback(pt.id, Strategy.DISCARD, ordinals)
    if not native:
        return ProviderThreadRollback(pt.id, Strategy.UNCHANGED, ordinals)
    if any(t.ordinal > native[0].ordinal for t in kept):
        # A kept run's turn came after an undone one (runs ran out of ordinal order): reverting before the first
        # dropped turn would drop it too, and a fork at it would keep the undone one. Only a replacement given the
        # app's context up to the target holds exactly the kept runs.
        return ProviderThreadRollback(pt.id, Strategy.REPLACE, ordinals)
    if pt.can_rollback:
        return ProviderThreadRollback(
            pt.id, Strategy.NATIVE_ROLLBACK, ordinals, before_turn_ref=native[0].native_turn_ref, turn_count=len(native)
        )
    if pt.can_fork_from_turn and kept:
        return ProviderThreadRollback(pt.id, Strategy.NATIVE_FORK, ordinals, fork_at_turn_ref=kept[-1].native_turn_ref)
    return ProviderThreadRollback(pt.id, Strategy.REPLACE, ordinals)

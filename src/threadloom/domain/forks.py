"""Forks: a new app thread that continues another's conversation from a stable point.

`forkThread` only records: the fork (lineage `FORK`, its parent and root) and a `FORK`
ContextTransfer `PENDING` holding the fork point. No provider session or provider thread is
made then. The fork's first run resolves the transfer (`resolve`): natively when that run's
provider is the source's and can fork at the point's turn (the provider copies its own
thread), otherwise portably: a handoff built from the log up to the fork point goes with the
first message (lower fidelity, recorded as exactly what the provider received).

A fork point must be stable: a completed run; an interrupted or failed run with a ready
checkpoint; a completed subagent (its child thread's latest stable run); a checkpoint.
Anything streaming or waiting is refused with `UNSTABLE_FORK_POINT` and the latest stable run.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from threadloom.domain import lineage
from threadloom.domain.changes import Change, NewId
from threadloom.domain.entities import AppThread, Checkpoint, ContextTransfer, Run
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.handoffs import Handoff, HandoffKind, RunFacts, Selection, build_handoff, estimate_tokens
from threadloom.domain.statuses import (
    CheckpointStatus,
    LineageRelationship,
    RunStatus,
    TransferStatus,
    TransferType,
)
from threadloom.domain.threads import descendant_thread, own_workspace_path

HANDOFF_SEPARATOR = "\n\n"  # between a portable handoff and the first message it goes with


@dataclasses.dataclass(frozen=True, slots=True)
class ForkPoint:
    """Where a fork starts: runs 1..`run_ordinal` of the source thread are its history (0: none)."""

    source_thread_id: uuid.UUID
    run_ordinal: int
    run_id: uuid.UUID | None = None
    provider_thread_id: uuid.UUID | None = None  # the source's provider thread at that run
    provider_instance_id: str | None = None
    native_thread_ref: str | None = None
    native_turn_ref: str | None = None  # the provider's last turn of that run
    checkpoint_id: uuid.UUID | None = None
    workspace_path: str | None = None  # the source thread's own folder (None: the project's workspace)

    def to_json(self) -> dict[str, Any]:
        """The transfer's `sourcePoint` (camelCase, ids as strings): clients read it as JSON."""
        return {
            "threadId": str(self.source_thread_id),
            "runOrdinal": self.run_ordinal,
            "runId": _str(self.run_id),
            "providerThreadId": _str(self.provider_thread_id),
            "providerInstanceId": self.provider_instance_id,
            "nativeThreadRef": self.native_thread_ref,
            "nativeTurnRef": self.native_turn_ref,
            "checkpointId": _str(self.checkpoint_id),
            "workspacePath": self.workspace_path,
        }

    @classmethod
    def from_json(cls, data: Any) -> ForkPoint:
        point = data if isinstance(data, dict) else {}
        return cls(
            source_thread_id=uuid.UUID(str(point["threadId"])),
            run_ordinal=int(point.get("runOrdinal") or 0),
            run_id=_uuid(point.get("runId")),
            provider_thread_id=_uuid(point.get("providerThreadId")),
            provider_instance_id=point.get("providerInstanceId"),
            native_thread_ref=point.get("nativeThreadRef"),
            native_turn_ref=point.get("nativeTurnRef"),
            checkpoint_id=_uuid(point.get("checkpointId")),
            workspace_path=point.get("workspacePath"),
        )


def _str(value: uuid.UUID | None) -> str | None:
    return None if value is None else str(value)


def _uuid(value: Any) -> uuid.UUID | None:
    return None if value is None else uuid.UUID(str(value))


# --- stable points ---------------------------------------------------------------------------------------


def is_stable(run: Run, checkpoint: Checkpoint | None) -> bool:
    """A run the conversation can continue from: completed, or interrupted/failed with its files captured."""
    if run.status == RunStatus.COMPLETED:
        return True
    ready = checkpoint is not None and checkpoint.status == CheckpointStatus.READY
    return run.status in (RunStatus.INTERRUPTED, RunStatus.FAILED) and ready


def latest_stable(runs: Sequence[tuple[Run, Checkpoint | None]]) -> Run | None:
    """The newest stable run of a thread (the hint a refusal gives)."""
    stable = [run for run, checkpoint in runs if is_stable(run, checkpoint)]
    return max(stable, key=lambda r: r.ordinal, default=None)


def unstable(what: str, hint: Run | None, field: str) -> DomainError:
    """The refusal of an unstable point, naming the latest stable run to fork from instead."""
    advice = "the thread has no stable run yet" if hint is None else f"the latest stable point is run {hint.ordinal}"
    return DomainError(ErrorCode.UNSTABLE_FORK_POINT, f"cannot fork from {what}: {advice}", field)


def require_stable(run: Run, checkpoint: Checkpoint | None, hint: Run | None, field: str) -> None:
    if not is_stable(run, checkpoint):
        state = "an active run" if run.status not in _ENDED else f"a {run.status.value} run"
        raise unstable(f"{state} (run {run.ordinal})", hint, field)


_ENDED = frozenset(
    {RunStatus.COMPLETED, RunStatus.INTERRUPTED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.ROLLED_BACK}
)


def require_ready_checkpoint(checkpoint: Checkpoint, field: str) -> None:
    if checkpoint.status != CheckpointStatus.READY:
        raise DomainError(
            ErrorCode.UNSTABLE_FORK_POINT,
            f"cannot fork from a checkpoint whose status is {checkpoint.status.value}",
            field,
        )


# --- what the fork receives, frozen when it is made ---------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenContext:
    """A fork's portable context as its source's log held it when the fork was made (the transfer's
    `fork_context`). Built at `forkThread`, never again: a later rollback of the source (which marks runs
    `ROLLED_BACK` and their checkpoints stale, so a handoff built then would leave them out), a provider switch
    or another fork cannot change what the fork's first run receives.

    `parts` are the non-empty sections, oldest ancestor first (a fork of this fork starts from them);
    `covered` the source's runs the text covers; `came_from` the source's provider thread at the point."""

    parts: tuple[str, ...]
    covered: tuple[int, ...]
    came_from: tuple[str, ...]

    @property
    def text(self) -> str:
        return "\n".join(self.parts) or build_handoff(HandoffKind.FORK_CONTEXT, [], Selection.up_to(0)).text

    def handoff(self) -> Handoff:
        text = self.text
        return Handoff(text, HandoffKind.FORK_CONTEXT, self.covered, (), estimate_tokens(text))

    def to_json(self) -> dict[str, Any]:
        return {"parts": list(self.parts), "coveredRunOrdinals": list(self.covered), "cameFrom": list(self.came_from)}

    @classmethod
    def from_json(cls, data: Any) -> FrozenContext | None:
        """None for a transfer made before contexts were frozen (its context is built from the log then)."""
        if not isinstance(data, dict) or not isinstance(data.get("parts"), list):
            return None
        covered = tuple(int(o) for o in data.get("coveredRunOrdinals") or ())
        return cls(tuple(str(p) for p in data["parts"]), covered, tuple(str(i) for i in data.get("cameFrom") or ()))


def freeze_context(
    point: ForkPoint, above: FrozenContext | None, ancestors: Sequence[tuple[int, Sequence[RunFacts]]]
) -> FrozenContext:
    """The fork's context: `above` (the source's own frozen context, when the source is a fork), then each
    ancestor's runs up to where its child forked, oldest first (`ancestors`: the source's older ancestors whose
    context was never frozen, then the source itself last, each with the facts of its runs 1..upto)."""
    parts = list(above.parts) if above is not None else []
    covered: tuple[int, ...] = ()
    for index, (upto, facts) in enumerate(ancestors):
        if upto <= 0:
            continue
        built = build_handoff(HandoffKind.FORK_CONTEXT, facts, Selection.up_to(upto))
        parts.append(built.text)
        if index == len(ancestors) - 1:  # the source's own runs
            covered = built.covered_run_ordinals
    came_from = (str(point.provider_thread_id),) if point.provider_thread_id else ()
    return FrozenContext(tuple(parts), covered, came_from)


# --- creating the fork -----------------------------------------------------------------------------------


class Workspace(StrEnum):
    """Where a fork's agent works (`forkThread(input: {workspace})`)."""

    OWN = "own"  # a folder of its own, made from the fork point's checkpoint (the default)
    SHARED = "shared"  # the source's folder, as it is now: later changes of either side reach the other


def require_workspace(source: AppThread, workspace: Workspace, checkpoint: Checkpoint | None, field: str) -> None:
    """Refuse what the fork's workspace cannot be.

    OWN needs the fork point's files: a ready checkpoint (a run whose capture failed, or a server that keeps no
    checkpoints, has none; then only SHARED is possible, and saying so beats an empty folder). SHARED shares the
    project's workspace; a source with a folder of its own cannot share it (a folder belongs to one thread).
    """
    if workspace == Workspace.OWN and (checkpoint is None or checkpoint.status != CheckpointStatus.READY):
        raise DomainError(
            ErrorCode.CHECKPOINT_MISSING,
            "the fork point has no ready checkpoint, so its files cannot be given to the fork; "
            "fork with workspace: SHARED to work on the source's current files",
            field,
        )
    if workspace == Workspace.SHARED and source.workspace_path:
        raise DomainError(
            ErrorCode.INVALID_INPUT,
            "the source works in a folder of its own, which a fork cannot share; fork with workspace: OWN",
            field,
        )


def fork_of(
    source: AppThread, title: str | None, fork_id: uuid.UUID, transfer_id: uuid.UUID, now: datetime
) -> AppThread:
    """The fork: the source's project, provider and settings, lineage `FORK` under the source."""
    title = title or f"Fork of {source.title}"
    return descendant_thread(source, fork_id, title, LineageRelationship.FORK, now, forked_from_transfer_id=transfer_id)


def create_fork(
    source: AppThread,
    point: ForkPoint,
    title: str | None,
    now: datetime,
    new_id: NewId,
    *,
    own_workspace: bool = False,
    context: FrozenContext | None = None,
) -> tuple[AppThread, list[Change]]:
    """The fork thread and its pending `FORK` transfer (no provider state: that waits for the first run).

    With `own_workspace` the fork works in a folder of its own under the server's data dir
    (`<data dir>/workspaces/<project id>/forks/<fork id>`, out of every agent's reach), made from the fork
    point's checkpoint; otherwise it shares the project's workspace. `context` is the portable context frozen
    now (`freeze_context`), kept on the transfer for the first run.
    """
    transfer_id = new_id()
    fork = fork_of(source, title, new_id(), transfer_id, now)
    if own_workspace:
        fork = fork.evolve(workspace_path=own_workspace_path(fork.id))
    transfer = ContextTransfer(
        id=transfer_id,
        type=TransferType.FORK,
        source_thread_id=source.id,
        thread_id=fork.id,
        source_point=point.to_json(),
        status=TransferStatus.PENDING,
        fork_context=context.to_json() if context is not None else None,
        created_at=now,
        updated_at=now,
    )
    said = lineage.forked(fork, source, transfer, point.run_ordinal, point.run_id, now, new_id)
    return fork, [Change.created(fork), Change.created(transfer), said]


# --- resolving at the first run --------------------------------------------------------------------------


class Resolution(StrEnum):
    NATIVE = "native"  # the provider forks its own thread at the point's turn
    PORTABLE = "portable"  # a handoff from the log goes with the first message


FIDELITY = {Resolution.NATIVE: "exact", Resolution.PORTABLE: "summary"}


def resolve(
    point: ForkPoint, fork: AppThread, instance: str, can_fork_thread: bool, can_fork_from_turn: bool
) -> Resolution:
    """Native only when the run's provider instance is the source's and it can fork there, at the point's turn,
    in the same folder (a provider's thread keeps its working directory); else portable.

    Without the point's turn a native fork would copy the source's provider thread as it is at the fork's first
    run, with whatever the source did after the point: not frozen, so portable (`FrozenContext`)."""
    if point.native_thread_ref is None or point.provider_instance_id != instance or not can_fork_thread:
        return Resolution.PORTABLE
    if point.workspace_path != fork.workspace_path:
        return Resolution.PORTABLE
    if point.native_turn_ref is None or not can_fork_from_turn:
        return Resolution.PORTABLE
    return Resolution.NATIVE


def resolved(transfer: ContextTransfer, how: Resolution, run_id: uuid.UUID | None, now: datetime) -> Change:
    """The transfer as the fork's first run resolved it."""
    status = TransferStatus.RESOLVED_NATIVE if how == Resolution.NATIVE else TransferStatus.RESOLVED_PORTABLE
    return Change.updated(
        transfer.evolve(
            status=status,
            resolution_strategy=how.value,
            resolution_fidelity=FIDELITY[how],
            target_run_id=run_id,
            updated_at=now,
        )
    )


def with_handoff(handoff: str, text: str) -> str:
    """The first message of a portable fork for a provider that takes no separate context item."""
    return f"{handoff.rstrip()}{HANDOFF_SEPARATOR}{text}"


# --- merge-back --------------------------------------------------------------------------------------------


def merged_up_to(earlier: Sequence[ContextTransfer]) -> int:
    """The fork's last run an earlier merge-back already brought (0: none); failed ones do not count."""
    counted = [t for t in earlier if t.status not in (TransferStatus.FAILED, TransferStatus.SUPERSEDED)]
    return max((_ordinal(t.source_point) for t in counted), default=0)


def _ordinal(point: Any) -> int:
    return int(point.get("runOrdinal") or 0) if isinstance(point, dict) else 0


def merge_back(
    fork: AppThread,
    fork_transfer: ContextTransfer | None,
    latest: Run | None,
    earlier: Sequence[ContextTransfer],
    now: datetime,
    new_id: NewId,
) -> ContextTransfer:
    """A `MERGE_BACK` transfer, PENDING on the fork's source: the fork's runs since its last merge, up to its
    latest stable run (`sourcePoint`), over the fork point (`basePoint`). The source's next run consumes it."""
    if fork.lineage_relationship != LineageRelationship.FORK or fork.parent_thread_id is None or fork_transfer is None:
        raise DomainError(ErrorCode.NOT_A_FORK, "this thread is not a fork", "forkThreadId")
    since = merged_up_to(earlier)
    if latest is None or latest.ordinal <= since:
        where = "has no stable run" if latest is None else f"has no stable run after run {since}, already merged"
        raise DomainError(ErrorCode.NOTHING_TO_MERGE, f"the fork {where}", "forkThreadId")
    return ContextTransfer(
        id=new_id(),
        type=TransferType.MERGE_BACK,
        source_thread_id=fork.id,
        thread_id=fork.parent_thread_id,
        base_point=fork_transfer.source_point,
        source_point={"threadId": str(fork.id), "runOrdinal": latest.ordinal, "runId": str(latest.id), "since": since},
        status=TransferStatus.PENDING,
        created_at=now,
        updated_at=now,
    )


def record_merge_back(
    fork: AppThread,
    fork_transfer: ContextTransfer | None,
    latest: Run | None,
    earlier: Sequence[ContextTransfer],
    now: datetime,
    new_id: NewId,
) -> tuple[ContextTransfer, list[Change]]:
    """The merge-back (`merge_back`) and the `lineage.merged_back` activity on the source that reports it."""
    merge = merge_back(fork, fork_transfer, latest, earlier, now, new_id)  # refused without a stable run
    _, since, upto = merge_range(merge)
    run_id = _uuid(merge.source_point.get("runId")) if isinstance(merge.source_point, dict) else None
    return merge, [Change.created(merge), lineage.merged_back(fork, merge, since, upto, run_id, now, new_id)]


def merge_range(transfer: ContextTransfer) -> tuple[uuid.UUID, int, int]:
    """(fork thread, after run, up to run): the fork's runs a merge-back brings."""
    point = transfer.source_point if isinstance(transfer.source_point, dict) else {}
    return transfer.source_thread_id, int(point.get("since") or 0), _ordinal(point)


def consumed(transfer: ContextTransfer, run_id: uuid.UUID, now: datetime) -> Change:
    return Change.updated(transfer.evolve(status=TransferStatus.CONSUMED, target_run_id=run_id, updated_at=now))

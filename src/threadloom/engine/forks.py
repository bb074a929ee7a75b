"""forkThread: find the stable point a source names, then record the fork (rules in `domain.forks`).

What the fork receives is frozen there: the portable context is built from the source's log at
`forkThread` and kept on the transfer (`domain.forks.FrozenContext`), and a fork with its own workspace
(the default) gets the fork point's files before the mutation answers. The fork's first run resolves the
pending transfer in `engine.turns` (`fork_resolution`): the provider forks its own thread at the point's
turn, or the kept context goes with the first message.
"""

from __future__ import annotations

import dataclasses
import logging
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Literal, TypeVar

from threadloom.checkpoints import CheckpointError
from threadloom.domain import forks
from threadloom.domain.access import Principal
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.entities import (
    AppThread,
    Checkpoint,
    ContextHandoff,
    ContextTransfer,
    ExecutionNode,
    ProviderThread,
    ProviderTurn,
    Run,
)
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.handoffs import HandoffKind, Selection, build_handoff, pending_handoff
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import NodeKind, NodeStatus, TokenScope, TransferStatus
from threadloom.engine import subagent_threads
from threadloom.engine.checkpoints import Checkpoints
from threadloom.engine.pipeline import Command, GlobalCommand, Pipeline
from threadloom.store import entities, handoff_facts
from threadloom.store import forks as fork_store
from threadloom.store import threads as thread_store
from threadloom.store.db import Reader

log = logging.getLogger("threadloom.forks")
T = TypeVar("T")
SourceKind = Literal["run", "node", "provider_thread", "checkpoint"]


@dataclasses.dataclass(frozen=True, slots=True)
class Source:
    """What the client named: one object, and for a provider thread optionally one of its turns."""

    kind: SourceKind
    id: uuid.UUID
    turn_id: uuid.UUID | None = None

    @property
    def field(self) -> str:
        return {"run": "source.run", "node": "source.node", "checkpoint": "source.checkpoint"}.get(
            self.kind, "source.providerThread"
        )


class Forks:
    def __init__(self, pipeline: Pipeline, checkpoints: Checkpoints) -> None:
        self.pipeline = pipeline
        self.checkpoints = checkpoints

    async def fork(
        self,
        principal: Principal,
        source: Source,
        *,
        title: str | None,
        workspace: forks.Workspace = forks.Workspace.OWN,
        key: str | None,
        workspace_field: str = "workspace",
    ) -> uuid.UUID:
        """Record the fork, its pending transfer and the context it will receive, frozen now; then make its own
        workspace from the fork point's checkpoint (unless it shares the source's). The fork's id."""
        now = self.pipeline.clock.now()
        own = workspace == forks.Workspace.OWN

        async def decide(db: Reader) -> Outcome:
            thread, point = await _point(db, principal, source)
            principal.require(TokenScope.OPERATE)
            checkpoint = await entities.get(db, Checkpoint, point.checkpoint_id)
            forks.require_workspace(thread, workspace, checkpoint, workspace_field)
            context = await frozen_context(db, point, None)
            fork, changes = forks.create_fork(thread, point, title, now, new_id, own_workspace=own, context=context)
            return Outcome(changes, result={"threadId": str(fork.id)}, project_id=thread.project_id)

        point = {"kind": source.kind, "id": str(source.id), "turnId": _str(source.turn_id)}
        data = {"source": point, "title": title, "workspace": workspace.name}
        command = GlobalCommand(command_type="forkThread", principal=principal, key=key, input=data, decide=decide)
        result = await self.pipeline.execute(command)
        fork_id = uuid.UUID(result["threadId"])
        try:  # git work after the commit; the fork's first run tries again if this fails
            await self.checkpoints.ensure_own_workspace(fork_id)
        except (CheckpointError, OSError) as error:
            log.warning("fork %s: its workspace is not made yet: %s", fork_id, error)
        return fork_id

    async def merge_back(self, principal: Principal, fork_id: uuid.UUID, *, key: str | None) -> uuid.UUID:
        """Record a MERGE_BACK transfer on the fork's source thread; the transfer's id."""
        async with self.pipeline.db.read() as db:
            fork = await _visible_thread(db, principal, fork_id, "forkThreadId")
        principal.require_project(fork.project_id, TokenScope.OPERATE, "forkThreadId")
        if fork.parent_thread_id is None or fork.forked_from_transfer_id is None:
            raise DomainError(ErrorCode.NOT_A_FORK, "this thread is not a fork", "forkThreadId")
        now = self.pipeline.clock.now()

        async def decide(db: Reader, source: AppThread) -> Outcome:
            principal.require_project(source.project_id, TokenScope.OPERATE, "forkThreadId")
            transfer = await entities.get(db, ContextTransfer, fork.forked_from_transfer_id)
            latest = forks.latest_stable(await fork_store.runs_with_checkpoints(db, fork.id))
            earlier = await fork_store.merges(db, of_fork=fork.id)
            merge, changes = forks.record_merge_back(fork, transfer, latest, earlier, now, new_id)
            return Outcome(changes, result={"transferId": str(merge.id)})

        asked = {"command_type": "mergeBack", "principal": principal, "key": key, "decide": decide}
        command = Command.naming("forkThreadId", fork_id, {}, thread_id=fork.parent_thread_id, **asked)
        result = await self.pipeline.execute(command)
        return uuid.UUID(result["transferId"])


def _str(value: uuid.UUID | None) -> str | None:
    return None if value is None else str(value)


def _found(value: T | None, field: str) -> T:
    if value is None:
        raise not_found(field)
    return value


async def _visible_thread(db: Reader, principal: Principal, thread_id: uuid.UUID | None, field: str) -> AppThread:
    thread = await thread_store.get_thread(db, thread_id) if thread_id is not None else None
    if thread is None or not principal.sees(thread.project_id):
        raise not_found(field)
    return thread


async def _point(db: Reader, principal: Principal, source: Source) -> tuple[AppThread, forks.ForkPoint]:
    """The source thread and the stable point the source names (refusals as `domain.forks` says)."""
    field = source.field
    if source.kind == "run":
        run = _found(await entities.get(db, Run, source.id), field)
        thread = await _visible_thread(db, principal, run.thread_id, field)
        return thread, await _at_run(db, thread, run, field)
    if source.kind == "checkpoint":
        checkpoint = _found(await entities.get(db, Checkpoint, source.id), field)
        thread = await _visible_thread(db, principal, checkpoint.thread_id, field)
        return thread, await _at_checkpoint(db, thread, checkpoint, field)
    if source.kind == "node":
        node = _found(await entities.get(db, ExecutionNode, source.id), field)
        thread = await _visible_thread(db, principal, node.thread_id, field)
        return await _at_node(db, principal, thread, node, field)
    pt = _found(await entities.get(db, ProviderThread, source.id), field)
    thread = await _visible_thread(db, principal, pt.thread_id, field)
    return thread, await _at_provider_thread(db, thread, pt, source.turn_id, field)


async def _at_run(db: Reader, thread: AppThread, run: Run, field: str) -> forks.ForkPoint:
    runs = await fork_store.runs_with_checkpoints(db, thread.id)
    checkpoint = next((c for r, c in runs if r.id == run.id), None)
    forks.require_stable(run, checkpoint, forks.latest_stable(runs), field)
    return await _point_of(db, thread, run, checkpoint)


async def _point_of(db: Reader, thread: AppThread, run: Run, checkpoint: Checkpoint | None) -> forks.ForkPoint:
    pt = await entities.get(db, ProviderThread, run.provider_thread_id)
    turn = await fork_store.last_turn(db, run)
    return forks.ForkPoint(
        source_thread_id=thread.id,
        run_ordinal=run.ordinal,
        run_id=run.id,
        provider_thread_id=pt.id if pt else None,
        provider_instance_id=pt.provider_instance_id if pt else run.provider_instance_id,
        native_thread_ref=pt.native_thread_ref if pt else None,
        native_turn_ref=turn.native_turn_ref if turn else None,
        checkpoint_id=checkpoint.id if checkpoint else None,
        workspace_path=thread.workspace_path,
    )


async def _at_checkpoint(db: Reader, thread: AppThread, checkpoint: Checkpoint, field: str) -> forks.ForkPoint:
    forks.require_ready_checkpoint(checkpoint, field)
    run = await entities.get(db, Run, checkpoint.run_id)
    if run is None:  # the baseline before the first run: an empty conversation
        return forks.ForkPoint(
            source_thread_id=thread.id, run_ordinal=0, checkpoint_id=checkpoint.id, workspace_path=thread.workspace_path
        )
    runs = await fork_store.runs_with_checkpoints(db, thread.id)
    if run.checkpoint_id != checkpoint.id:  # a subagent's scope, or the baseline of a run
        forks.require_stable(run, None, forks.latest_stable(runs), field)
    point = await _point_of(db, thread, run, checkpoint)
    return dataclasses.replace(point, checkpoint_id=checkpoint.id)


async def _at_node(
    db: Reader, principal: Principal, thread: AppThread, node: ExecutionNode, field: str
) -> tuple[AppThread, forks.ForkPoint]:
    """A run's root node is its run; a completed delegated task's node forks its child thread at its latest stable
    run, a completed provider subagent's its own provider thread (`engine.subagent_threads.fork_point`)."""
    if node.kind == NodeKind.ROOT_TURN:
        run = await entities.require(db, Run, node.run_id)
        return thread, await _at_run(db, thread, run, field)
    if node.kind != NodeKind.SUBAGENT:
        raise DomainError(ErrorCode.INVALID_INPUT, "fork from a run's root node or from a subagent node", field)
    if node.child_thread_id is None:  # a provider subagent: its own provider thread, if it has one
        return thread, await subagent_threads.fork_point(db, thread, node, field)
    if node.status != NodeStatus.COMPLETED:
        raise forks.unstable(f"a {node.status.value} subagent node", None, field)
    child = await _visible_thread(db, principal, node.child_thread_id, field)
    runs = await fork_store.runs_with_checkpoints(db, child.id)
    latest = forks.latest_stable(runs)
    if latest is None:
        raise forks.unstable("a subagent that has no stable run", None, field)
    checkpoint = next((c for r, c in runs if r.id == latest.id), None)
    return child, await _point_of(db, child, latest, checkpoint)


async def _at_provider_thread(
    db: Reader, thread: AppThread, pt: ProviderThread, turn_id: uuid.UUID | None, field: str
) -> forks.ForkPoint:
    turn = await entities.get(db, ProviderTurn, turn_id) if turn_id else await fork_store.latest_turn(db, pt.id)
    if turn_id is not None and (turn is None or turn.provider_thread_id != pt.id):
        raise not_found("source.providerThread.turnId")
    if turn is None:
        raise forks.unstable("a provider thread with no turn", None, field)
    run = await fork_store.run_of_turn(db, turn)
    if run is None:
        raise not_found(field)
    point = await _at_run(db, thread, run, field)
    return dataclasses.replace(point, provider_thread_id=pt.id, native_turn_ref=turn.native_turn_ref)


# --- the fork's first run ---------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class NativeFork:
    """What the provider forks: the source's native thread, after the point's turn."""

    transfer_id: uuid.UUID
    native_thread: str
    native_turn: str | None
    provider_thread_id: uuid.UUID | None


@dataclasses.dataclass(frozen=True, slots=True)
class ForkStart:
    changes: list[Change]
    handoff: ContextHandoff | None = None  # portable: goes with the first message
    native: NativeFork | None = None


async def fork_resolution(
    db: Reader,
    thread: AppThread,
    run: Run,
    provider_thread: ProviderThread,
    ability: tuple[bool, bool],
    now: datetime,
    new_id: NewId,
) -> ForkStart | None:
    """How a fork's first run gets the source's conversation; None when nothing is pending.

    Portable is decided (and recorded) here; native is recorded once the provider has forked
    (`natively_forked`), or falls back to portable if it refuses (`fall_back_to_handoff`).
    """
    transfer = await fork_store.pending_fork(db, thread.forked_from_transfer_id)
    if transfer is None or provider_thread.native_thread_ref is not None:
        return None
    point = forks.ForkPoint.from_json(transfer.source_point)
    how = forks.resolve(point, thread, run.provider_instance_id, *ability)
    if how == forks.Resolution.NATIVE and point.native_thread_ref is not None:
        native = NativeFork(transfer.id, point.native_thread_ref, point.native_turn_ref, point.provider_thread_id)
        return ForkStart([], native=native)
    handoff = await portable_handoff(db, thread, transfer, provider_thread.id, now, new_id)
    return ForkStart(
        [Change.created(handoff), forks.resolved(transfer, forks.Resolution.PORTABLE, run.id, now)], handoff
    )


async def natively_forked(db: Reader, fork: NativeFork, run_id: uuid.UUID | None, now: datetime) -> list[Change]:
    transfer = await entities.get(db, ContextTransfer, fork.transfer_id)
    if transfer is None or transfer.status != TransferStatus.PENDING:
        return []
    return [forks.resolved(transfer, forks.Resolution.NATIVE, run_id, now)]


async def fall_back_to_handoff(
    db: Reader, thread: AppThread, run_id: uuid.UUID | None, provider_thread_id: uuid.UUID, now: datetime, new_id: NewId
) -> list[Change]:
    transfer = await fork_store.pending_fork(db, thread.forked_from_transfer_id)
    if transfer is None:
        return []
    handoff = await portable_handoff(db, thread, transfer, provider_thread_id, now, new_id)
    return [Change.created(handoff), forks.resolved(transfer, forks.Resolution.PORTABLE, run_id, now)]


async def portable_handoff(
    db: Reader,
    fork: AppThread,
    transfer: ContextTransfer,
    to_provider_thread: uuid.UUID,
    now: datetime,
    new_id: NewId,
) -> ContextHandoff:
    """The fork's context: the one frozen when the fork was made (`forks.FrozenContext`), exactly. A fork made
    before contexts were frozen gets it built from the log now, as it was then."""
    frozen = forks.FrozenContext.from_json(transfer.fork_context)
    if frozen is None:
        frozen = await frozen_context(db, forks.ForkPoint.from_json(transfer.source_point), fork.id)
    # The stored handoff covers the source's runs; what each ancestor's part left out is said in its text.
    came_from = [uuid.UUID(i) for i in frozen.came_from]
    return pending_handoff(
        frozen.handoff(), fork.id, came_from, to_provider_thread, now, new_id, transfer_id=transfer.id
    )


async def frozen_context(db: Reader, point: forks.ForkPoint, below: uuid.UUID | None) -> forks.FrozenContext:
    """The context a fork at `point` receives, from the log as it is now: the source's runs up to the point,
    after its own frozen context when the source is itself a fork (or, for a fork made before contexts were
    frozen, each ancestor up to where its child forked, oldest first). `below`: the thread the context is for
    (a cycle stops there), None while it is being made."""
    chain: list[tuple[uuid.UUID, int]] = [(point.source_thread_id, point.run_ordinal)]
    above: forks.FrozenContext | None = None
    seen = {below} if below is not None else set()
    source = await thread_store.get_thread(db, point.source_thread_id)
    while source is not None and source.id not in seen and source.forked_from_transfer_id is not None:
        seen.add(source.id)
        parent = await entities.get(db, ContextTransfer, source.forked_from_transfer_id)
        if parent is None:
            break
        above = forks.FrozenContext.from_json(parent.fork_context)
        if above is not None:
            break
        upper = forks.ForkPoint.from_json(parent.source_point)
        chain.append((upper.source_thread_id, upper.run_ordinal))
        source = await thread_store.get_thread(db, upper.source_thread_id)
    ancestors = []
    for thread_id, upto in reversed(chain):
        facts = await handoff_facts.read_run_facts(db, thread_id, range(1, upto + 1)) if upto > 0 else []
        ancestors.append((upto, facts))
    return forks.freeze_context(point, above, ancestors)


# --- merge-backs consumed by the source's next run -----------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Merged:
    changes: list[Change]
    handoffs: list[ContextHandoff]


async def consume_merges(
    db: Reader,
    thread: AppThread,
    run: Run,
    to_provider_thread: uuid.UUID,
    now: datetime,
    new_id: NewId,
    pending: Sequence[ContextTransfer] | None = None,
) -> Merged:
    """Each pending merge-back into this thread becomes a MERGE_BACK_DELTA handoff for this run, oldest first.
    `pending`: those merge-backs when the caller read them already (`fork_store.merges(into=thread.id)`)."""
    changes: list[Change] = []
    handoffs: list[ContextHandoff] = []
    for transfer in pending if pending is not None else await fork_store.merges(db, into=thread.id):
        fork_id, since, upto = forks.merge_range(transfer)
        facts = await handoff_facts.read_run_facts(db, fork_id, range(since + 1, upto + 1))
        built = build_handoff(HandoffKind.MERGE_BACK_DELTA, facts, Selection.between(since, upto))
        came_from = sorted({f.provider_thread_id for f in facts if f.provider_thread_id})
        handoff = pending_handoff(built, thread.id, came_from, to_provider_thread, now, new_id, transfer_id=transfer.id)
        handoffs.append(handoff)
        changes += [Change.created(handoff), forks.consumed(transfer, run.id, now)]
    return Merged(changes, handoffs)


def joined(handoffs: Sequence[ContextHandoff]) -> str | None:
    """The handoffs a turn carries, as one context text (None: none)."""
    return "\n".join(h.text for h in handoffs) if handoffs else None

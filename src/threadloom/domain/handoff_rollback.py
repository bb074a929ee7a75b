"""What a rollback, and the undo of one, does to handoffs that are still waiting to be delivered.

A handoff is built when it is made (its text is frozen) and delivered with the next turn of its provider
thread. A rollback that commits before that turn may undo runs the text tells of; delivered as it is, it would
hand the agent conversation the user rolled back. So, in the rollback's own record transaction:

- every pending handoff of the thread that tells of an undone run (`outdated`) is dropped (`FAILED`: it
  will never be delivered);
- the kept runs it told of are then missing from its provider thread, so the rollback's kept-runs handoff
  (`rebridgeHandoffId`) covers them: the provider thread that stays active is told exactly the kept runs it
  lacks, in one new text (`rebridge_kind` says which opening it gets).

Only handoffs that tell of the thread's own runs count (a provider switch's, a rollback's replacement or
kept-runs handoff): a fork's context and a merge-back tell of another thread's runs, which a rollback of this
thread does not undo (the store reads only the former). The waiting result of a task that an undone run
delegated is dropped with them (`store.rollback_facts.pending_results_asked_by`): the agent no longer holds
the request it answers.

`undoRollback` puts the handoffs back as they were before the rollback (`undone`): the ones it dropped are
pending again, its kept-runs handoff is dropped, and a pending handoff whose provider thread the undo swaps
for its undo fork goes to that fork. Pure: entities in, changes out.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping

from threadloom.domain.changes import Change
from threadloom.domain.entities import ContextHandoff, ProviderThread
from threadloom.domain.handoffs import HandoffKind
from threadloom.domain.statuses import HandoffStatus
from threadloom.domain.switching import told


def outdated(pending: Iterable[ContextHandoff], undone: Iterable[int]) -> tuple[ContextHandoff, ...]:
    """The pending handoffs (of the thread's own runs) that tell of a run the rollback undoes, covered or
    listed as omitted for length: each must be dropped before its turn."""
    gone = set(undone)
    return tuple(h for h in pending if h.status == HandoffStatus.PENDING and told(h) & gone)


def dropped(handoffs: Iterable[ContextHandoff]) -> list[Change]:
    """Each handoff `FAILED`: never to be delivered."""
    return [Change.updated(h.evolve(status=HandoffStatus.FAILED)) for h in handoffs]


def rebridge_kind(provider_thread: ProviderThread, seen: Iterable[int]) -> HandoffKind:
    """The opening of a kept-runs handoff: a provider thread that holds nothing yet (never started, told of
    nothing that stays) is given the conversation up to the target (`ROLLBACK_CONTEXT`); one that holds part
    of it, the kept runs it lacks (`DELTA_SINCE_TARGET_LAST_SEEN`)."""
    if provider_thread.native_thread_ref is None and not set(seen):
        return HandoffKind.ROLLBACK_CONTEXT
    return HandoffKind.DELTA_SINCE_TARGET_LAST_SEEN


def undone(
    dropped_by_rollback: Iterable[ContextHandoff],
    rebridge: ContextHandoff | None,
    pending_to_moved: Iterable[ContextHandoff],
    moved: Mapping[uuid.UUID, uuid.UUID],
) -> list[Change]:
    """The handoff changes of an undoRollback, which brings the undone runs back.

    `dropped_by_rollback`: the handoffs the rollback dropped (pending again, if still `FAILED`); `rebridge`: its
    kept-runs handoff (dropped, if still pending: it was made for the rolled-back conversation, and the
    handoffs it replaced are back); `pending_to_moved`: the other pending handoffs of provider threads the undo
    swaps for their undo fork (`moved`: old id → fork id), which go to the fork with the restored ones."""
    changes: list[Change] = []
    if rebridge is not None and rebridge.status == HandoffStatus.PENDING:
        changes.append(Change.updated(rebridge.evolve(status=HandoffStatus.FAILED)))
    skip = {rebridge.id} if rebridge is not None else set()
    seen: set[uuid.UUID] = set(skip)
    for h in dropped_by_rollback:
        if h.status != HandoffStatus.FAILED or h.id in seen:
            continue
        seen.add(h.id)
        to = moved.get(h.to_provider_thread_id, h.to_provider_thread_id) if h.to_provider_thread_id else None
        changes.append(Change.updated(h.evolve(status=HandoffStatus.PENDING, to_provider_thread_id=to)))
    for h in pending_to_moved:
        fork = moved.get(h.to_provider_thread_id) if h.to_provider_thread_id else None
        if h.id in seen or h.status != HandoffStatus.PENDING or fork is None:
            continue
        seen.add(h.id)
        changes.append(Change.updated(h.evolve(to_provider_thread_id=fork)))
    return changes


def moved_to_fork(pending: Iterable[ContextHandoff], moved: Mapping[uuid.UUID, uuid.UUID]) -> list[Change]:
    """Pending handoffs of provider threads swapped for their undo fork (a failed rollback taken back) go to
    the fork: it holds the conversation they were waiting to be added to."""
    return undone((), None, pending, moved)

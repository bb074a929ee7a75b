"""What a decision produces: events to append and effects to enqueue.

A command handler asks the domain for an `Outcome`; the store writes it in one
transaction. Nothing here performs I/O.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable
from enum import StrEnum
from typing import Any, Generic, TypeVar

from threadloom.domain.records import Record

NewId = Callable[[], uuid.UUID]
T = TypeVar("T")
V = TypeVar("V")


class EventVerb(StrEnum):
    """What happened to the entity an event carries: the part after the dot of an event type."""

    CREATED = "created"
    UPDATED = "updated"
    RECORDED = "recorded"  # activities: appended once, never updated
    RENAMED = "renamed"
    ARCHIVED = "archived"
    UNARCHIVED = "unarchived"
    LEASED = "leased"  # a thread's writer lease was taken, renewed, moved or given up (domain/leases.py)


# The public prefix of an entity's events where it is not the entity type itself: clients see
# `<prefix>.<verb>` in `threadEvents.type` and the log stores it, so these shorter names stay.
# The one place an event name is defined (docs/events.md lists them all).
EVENT_PREFIX: dict[str, str] = {
    "run_attempt": "attempt",
    "execution_node": "node",
    "conversation_message": "message",
    "context_transfer": "transfer",
    "runtime_request": "request",
    "plan_artifact": "plan",
    "usage_record": "usage",
}


def event_type(entity: type[Record] | Record, verb: EventVerb) -> str:
    """The event type of `verb` happening to an entity of this type, e.g. `attempt.updated`."""
    return f"{EVENT_PREFIX.get(entity.entity_type, entity.entity_type)}.{verb}"


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """One event: `event_type` names what happened, `entity` is the whole new state. Build one with
    `Change.created(entity)`, `Change.updated(entity)` or `Change.of(verb, entity)`: the name comes
    from the entity's type."""

    event_type: str
    entity: Record
    run_id: uuid.UUID | None = None
    node_id: uuid.UUID | None = None

    @classmethod
    def of(
        cls, verb: EventVerb, entity: Record, *, run_id: uuid.UUID | None = None, node_id: uuid.UUID | None = None
    ) -> Change:
        return cls(event_type(entity, verb), entity, run_id=run_id, node_id=node_id)

    @classmethod
    def created(cls, entity: Record, *, run_id: uuid.UUID | None = None, node_id: uuid.UUID | None = None) -> Change:
        return cls.of(EventVerb.CREATED, entity, run_id=run_id, node_id=node_id)

    @classmethod
    def updated(cls, entity: Record, *, run_id: uuid.UUID | None = None, node_id: uuid.UUID | None = None) -> Change:
        return cls.of(EventVerb.UPDATED, entity, run_id=run_id, node_id=node_id)


@dataclasses.dataclass(frozen=True, slots=True)
class Effect:
    """Work to do after commit (transactional outbox)."""

    kind: str
    payload: dict[str, Any]
    replay_safe: bool = True
    affinity: uuid.UUID | None = None  # the worker that must run it while that worker lives
    delay_s: float = 0.0  # not before this many seconds after the commit (a retry's backoff)


@dataclasses.dataclass(slots=True)
class Outcome:
    changes: list[Change] = dataclasses.field(default_factory=list)
    effects: list[Effect] = dataclasses.field(default_factory=list)
    result: dict[str, Any] = dataclasses.field(default_factory=dict)
    project_id: uuid.UUID | None = None  # for thread-less or thread-creating commands

    def carrying(self, value: V) -> Valued[V]:
        """This outcome with a typed value for the engine step that asked (never stored)."""
        return Valued(
            changes=self.changes, effects=self.effects, result=self.result, project_id=self.project_id, value=value
        )


@dataclasses.dataclass(slots=True, kw_only=True)
class Valued(Outcome, Generic[T]):
    """An outcome and the value an internal engine step hands back to its caller, e.g. whether a run
    was finished or what a turn start needs: the decision returns it, nothing is smuggled out."""

    value: T

"""What a decision produces: events to append and effects to enqueue.

A command handler asks the domain for an `Outcome`; the store writes it in one
transaction. Nothing here performs I/O.
"""

from __future__ import annotations

import dataclasses
import uuid
from typing import Any

from threadloom.domain.records import Record


@dataclasses.dataclass(frozen=True, slots=True)
class Change:
    """One event: `event_type` names what happened, `entity` is the whole new state."""

    event_type: str
    entity: Record
    run_id: uuid.UUID | None = None
    node_id: uuid.UUID | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class Effect:
    """Work to do after commit (transactional outbox)."""

    kind: str
    payload: dict[str, Any]
    replay_safe: bool = True
    affinity: uuid.UUID | None = None  # the worker that must run it while that worker lives


@dataclasses.dataclass(slots=True)
class Outcome:
    changes: list[Change] = dataclasses.field(default_factory=list)
    effects: list[Effect] = dataclasses.field(default_factory=list)
    result: dict[str, Any] = dataclasses.field(default_factory=dict)
    project_id: uuid.UUID | None = None  # for thread-less or thread-creating commands

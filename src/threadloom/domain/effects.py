"""The effects (work after commit, through the outbox) as typed values, each with one encoding.

A lifecycle's rules build an effect as one of the frozen dataclasses below and put its `envelope()` (the
outbox's `Effect`: kind, JSON payload, replay safety) in their `Outcome`. The effect worker decodes a
claimed payload back with `decode()` and calls the handler registered for that class
(`EffectWorker.register`, wired in `engine/services.py`), so no handler parses a dict.

The encoding is one generic mapping — field `run_id` ↔ JSON key `runId`, UUIDs as strings, a `None` field
left out — so stored payloads keep the keys they always had, and rows written before these classes still
decode (an optional field missing from an old row is `None`). Kinds are stored too: they never change.
"""

from __future__ import annotations

import dataclasses
import types
import typing
import uuid
from typing import Any, ClassVar, TypeVar

from threadloom.domain.changes import Effect

E = TypeVar("E", bound="EffectData")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _is_uuid(hint: Any) -> bool:
    return bool(hint is uuid.UUID or (isinstance(hint, types.UnionType) and uuid.UUID in typing.get_args(hint)))


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EffectData:
    """Base of every effect: its stored `KIND` and whether running it twice is harmless (`REPLAY_SAFE`:
    a turn start or a steer is not, so the worker never retries one that may have run)."""

    KIND: ClassVar[str]
    REPLAY_SAFE: ClassVar[bool] = True

    def payload(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if value is not None:
                out[_camel(field.name)] = str(value) if isinstance(value, uuid.UUID) else value
        return out

    def envelope(self) -> Effect:
        return Effect(self.KIND, self.payload(), replay_safe=self.REPLAY_SAFE)

    @classmethod
    def decode(cls: type[E], payload: dict[str, Any]) -> E:
        hints = typing.get_type_hints(cls)
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            raw = payload.get(_camel(field.name))
            values[field.name] = uuid.UUID(str(raw)) if raw is not None and _is_uuid(hints[field.name]) else raw
        return cls(**values)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _OnAttempt(EffectData):
    """Work on a run's attempt with the agent: never retried once it may have reached the agent."""

    REPLAY_SAFE: ClassVar[bool] = False
    run_id: uuid.UUID
    attempt_id: uuid.UUID | None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class _OnThread(EffectData):
    """Work on an app thread as a whole."""

    thread_id: uuid.UUID


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StartTurn(_OnAttempt):
    """runs: start the run's provider turn (`input` replaces the message text: a restart's combined input)."""

    KIND: ClassVar[str] = "provider-turn.start"
    input: str | None = None
    thread_id: uuid.UUID | None = None  # the run's thread: the handler skips a read (absent in older rows)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class EnsureThread(_OnThread):
    """runs: create the native thread ahead of the first run (instances configured for it)."""

    KIND: ClassVar[str] = "provider-thread.ensure"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class SteerTurn(_OnAttempt):
    """dispatch: steer the live turn with the message; if the turn has ended, the message becomes a run."""

    KIND: ClassVar[str] = "provider-turn.steer"
    message_id: uuid.UUID


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class InterruptTurn(_OnAttempt):
    """interruption: ask the provider to interrupt the attempt's turn."""

    KIND: ClassVar[str] = "provider-turn.interrupt"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StopSession(EffectData):
    """interruption: a provider that cannot interrupt; end the attempt's turn by retiring its runtime.
    Rows from before turns were named carry only `instance` (then the project's whole runtime stops)."""

    KIND: ClassVar[str] = "provider-session.stop"
    instance: str
    project_id: uuid.UUID | None = None
    attempt_id: uuid.UUID | None = None


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StopTasks(_OnThread):
    """interruption: Stop's cascade, stopping the thread's delegated tasks deepest first."""

    KIND: ClassVar[str] = "delegated-tasks.stop"
    reason: str | None = None  # the tasks' queue hold reason (None: a person's Stop; BUDGET_EXCEEDED: a budget's)


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class RespondToRequest(_OnAttempt):
    """requests: send the answer to the provider's waiting callback; if it is gone, the request expires."""

    KIND: ClassVar[str] = "runtime-request.respond"
    request_id: uuid.UUID
    native_ref: str | None
    response: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class DeliverToParent(EffectData):
    """delegation: a delegated thread's run ended; tell its parent."""

    KIND: ClassVar[str] = "subagent.deliver"
    parent_thread_id: uuid.UUID
    child_thread_id: uuid.UUID
    run_id: uuid.UUID


# The stored kinds by name, for logs and tests; each is its class's KIND.
START_EFFECT = StartTurn.KIND
ENSURE_THREAD_EFFECT = EnsureThread.KIND
STEER_EFFECT = SteerTurn.KIND
INTERRUPT_EFFECT = InterruptTurn.KIND
STOP_SESSION_EFFECT = StopSession.KIND
STOP_TASKS_EFFECT = StopTasks.KIND
RESPOND_EFFECT = RespondToRequest.KIND
DELIVER_EFFECT = DeliverToParent.KIND

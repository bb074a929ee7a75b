"""The adapter contract every driver implements, and its normalized events.

A driver turns its native protocol into these events; the engine turns events into
entities. Resuming a provider thread is a required primitive, not a capability.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any, Literal, Protocol

from threadloom.domain.failures import ModelFailure
from threadloom.domain.settings_compat import InPlace
from threadloom.domain.usage import Figures


@dataclasses.dataclass(frozen=True, slots=True)
class Capabilities:
    supports_active_steering: bool = False
    supports_interrupt: bool = False
    supports_steering_by_interrupt_restart: bool = False
    can_fork_thread: bool = False
    can_fork_from_turn: bool = False
    can_rollback_thread: bool = False
    can_read_thread_snapshot: bool = False
    supports_structured_questions: bool = False
    emits_todo_list: bool = False
    supports_subagents: bool = False
    pending_requests_survive_restart: bool = False
    supports_empty_thread_creation: bool = True
    # A subagent's own native thread (its node's provider thread) can be rolled back like any thread. Codex
    # refuses `thread/revert` on a collab agent's thread; engine-only, not in the API's ProviderCapabilities.
    can_rollback_subagent_thread: bool = False
    reports_cost: bool = False  # the agent reports what its model calls cost (else only a price table knows)

    @classmethod
    def every(cls, **lacking: bool) -> Capabilities:
        """Every capability on except those given: a driver states only where it falls short."""
        return cls(**{f.name: True for f in dataclasses.fields(cls)} | lacking)

    def to_json(self) -> dict[str, bool]:
        return dataclasses.asdict(self)


class ProviderError(Exception):
    """A provider refused or failed a request. `code` is stable for the engine's policy."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclasses.dataclass(frozen=True, slots=True)
class ThreadSettings:
    """What a native thread is opened or resumed with: the workspace and the app thread's runtime mode.

    `runtime_mode` is one of workspace_write (the default: no prompts, writes only inside the
    workspace, no network), approval_required (asks before every command and file change),
    read_only (writes nothing) and full_access (no prompts, network; the engine accepts it only on
    instances configured with `allow_full_access`); each driver maps it to its own approval policy
    and sandbox. `model` overrides the instance's default model.
    """

    cwd: str
    runtime_mode: str = "workspace_write"
    model: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class SessionScope:
    """The project a runtime serves. Every agent process belongs to exactly one project.

    A runtime never serves two projects, so one project's agent (its crash, its files, its
    sandbox) cannot reach another's. `workspace_root` is the folder the project's threads work in;
    `state_dir` is where the driver keeps this project's native agent state (inside the data dir,
    never visible to the agent's commands). `own_workspaces` is the folder (under the data dir) holding
    the project's forks' own workspaces, one subfolder each: a thread whose `cwd` is one of them works in
    that subfolder alone, never in the project's workspace nor a sibling.
    """

    project_id: str
    workspace_root: str
    state_dir: Path
    own_workspaces: str | None = None


# ---- normalized events -------------------------------------------------------------

ItemKind = Literal["assistant_message", "tool_call", "file_change", "plan", "reasoning", "subagent", "other"]
TurnStatus = Literal["completed", "failed", "interrupted"]


@dataclasses.dataclass(frozen=True, slots=True)
class _InTurn:
    """An event of one native turn: these two fields lead every such event (positional order)."""

    native_thread: str
    native_turn: str


@dataclasses.dataclass(frozen=True, slots=True)
class _ItemDelta(_InTurn):
    """A piece of an item's streamed text."""

    item_id: str
    delta: str


@dataclasses.dataclass(frozen=True, slots=True)
class TurnStarted(_InTurn):
    parent_turn: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class ItemStarted(_InTurn):
    item_id: str
    kind: ItemKind
    title: str | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class TextDelta(_ItemDelta):
    """Streaming text of an assistant message (or plan) item."""


@dataclasses.dataclass(frozen=True, slots=True)
class OutputDelta(_ItemDelta):
    """Streaming output of a tool call."""


@dataclasses.dataclass(frozen=True, slots=True)
class ItemCompleted(_InTurn):
    item_id: str
    kind: ItemKind
    status: Literal["completed", "failed", "declined", "interrupted"]
    text: str | None = None
    detail: dict[str, Any] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True, slots=True)
class TodoUpdated(_InTurn):
    items: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True, slots=True)
class RequestOpened(_InTurn):
    """The provider asks the user something; `respond_to_request` answers it."""

    request_ref: str
    kind: str
    payload: dict[str, Any]


@dataclasses.dataclass(frozen=True, slots=True)
class TurnCompleted(_InTurn):
    """The end of a turn. A failed turn's `error` is the agent's own words; `failure` is the driver's reading
    of them when the model API refused or broke the turn (`domain.failures`), None otherwise."""

    status: TurnStatus
    error: str | None = None
    parent_turn: str | None = None
    failure: ModelFailure | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class UsageReported(_InTurn):
    """One model call's usage, as the agent reported it: every driver emits exactly one per call it learns of
    (docs/usage.md says how each reduces its agent's reports to that), on the native turn that made the call
    (a subagent's own turn for a subagent's call). `call_ref` names the call within the native thread, stable
    across restarts, so a call reported again is recorded once. `cost_usd` is the provider's own figure;
    None: it gave none (the engine prices it from the instance's table, or it stays unknown). `model` None:
    the run's model.

    `cost_in_turn_total`: the provider reports no cost per call but one for its whole turn (Claude Code), and
    will send it as a later report with `cost_usd` set: this call's cost is part of that (recorded as REPORTED
    with no figure of its own; docs/usage.md)."""

    call_ref: str
    figures: Figures
    model: str | None = None
    cost_usd: float | None = None
    cost_in_turn_total: bool = False


@dataclasses.dataclass(frozen=True, slots=True)
class Warning:
    native_thread: str | None
    message: str


@dataclasses.dataclass(frozen=True, slots=True)
class RuntimeExited:
    """The runtime process is gone; every live turn in it is lost."""

    reason: str
    exit_code: int | None = None


ProviderEvent = (
    TurnStarted
    | ItemStarted
    | TextDelta
    | OutputDelta
    | ItemCompleted
    | TodoUpdated
    | RequestOpened
    | TurnCompleted
    | UsageReported
    | Warning
    | RuntimeExited
)


# ---- the runtime a driver opens ----------------------------------------------------


class ProviderRuntime(Protocol):
    """One live provider process (a session). Threads of many app threads can share it."""

    capabilities: Capabilities

    @property
    def alive(self) -> bool:
        """False once the runtime's process is gone (its `events()` then ends with RuntimeExited)."""
        ...

    def events(self) -> AsyncIterator[ProviderEvent]: ...

    async def start_thread(self, settings: ThreadSettings) -> str:
        """A new native thread; returns its ref (the resume cursor)."""
        ...

    async def resume_thread(self, native_thread: str, settings: ThreadSettings) -> None:
        """Load an existing native thread into this runtime; raises ProviderError if it cannot."""
        ...

    async def start_turn(
        self, native_thread: str, text: str, settings: ThreadSettings | None = None, handoff: str | None = None
    ) -> str:
        """Start a turn; returns the native turn ref. Its events follow on `events()`.

        `settings` are the thread's for this turn (None: as it was started or resumed); a driver
        honours at least their `model`, so each run talks to the model it asked for.

        `handoff` is context Threadloom gives the agent with this turn (a switch's summary, a rollback's
        restart from context, a fork's or a merge-back's delta): every driver takes it, and sends it as an
        input of its own ahead of the user's `text` where its protocol has one (docs/providers.md lists how
        each driver does), so `text` stays the user's own words and the handoff is sent exactly as given."""
        ...

    async def steer_turn(self, native_thread: str, native_turn: str, text: str) -> None: ...

    async def interrupt_turn(self, native_thread: str, native_turn: str) -> None: ...

    async def respond_to_request(self, request_ref: str, response: dict[str, Any]) -> None: ...

    async def fork_thread(self, native_thread: str, native_turn: str | None) -> str: ...

    async def rollback_thread(self, native_thread: str, before_turn: str) -> None: ...

    async def read_thread_snapshot(self, native_thread: str) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class ProviderDriver(Protocol):
    """Creates runtimes for one configured provider instance."""

    instance_id: str

    def capabilities(self) -> Capabilities: ...

    def settings_in_place(self) -> InPlace:
        """Which of a thread's settings (model, runtime mode) its runtimes change on a live native thread;
        a change of another one starts a new provider thread with a summary (`domain.settings_compat`)."""
        ...

    async def open_session(self, scope: SessionScope) -> ProviderRuntime:
        """A new runtime serving the one project of `scope`."""
        ...

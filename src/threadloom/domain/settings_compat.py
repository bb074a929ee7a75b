"""Settings compatibility: may the next run keep its provider thread after the model or runtime mode changed?

A provider thread is an agent's native conversation, opened with a model and a runtime mode (its approval
policy and sandbox). Some drivers can change one of them on a live native thread (Codex's `turn/start`
takes a model for the turn and the ones after it; Claude Code restarts its process on the same session with
another `--model`); others fix it when the thread starts. When a run asks for settings its provider thread
was not opened with and its driver cannot apply the difference in place, the thread's context goes to a new
provider thread as a full summary (`handoffs.ChoiceReason.SETTINGS_CHANGED`), as the spec's "settings
changed incompatibly" says; the old provider thread is closed. Everything here is pure: the engine reads the
recorded settings, the driver's declaration (`InPlace`) and the run's settings, and asks `compare`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from datetime import datetime

from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, NewId
from threadloom.domain.entities import AppThread, ProviderThread, Run
from threadloom.domain.handoffs import ChoiceReason
from threadloom.domain.statuses import ProviderThreadStatus
from threadloom.domain.switching import ProviderPlan, fresh_choice
from threadloom.domain.threads import attach_provider_thread, check_runtime_mode

MODEL = "model"
RUNTIME_MODE = "runtime_mode"


@dataclasses.dataclass(frozen=True, slots=True)
class InPlace:
    """What a driver can change on a live provider thread without starting a new one (declared per driver).
    The default is the safe one: nothing, so a change always gets a fresh provider thread with a summary."""

    model: bool = False
    runtime_mode: bool = False

    def allows(self, setting: str) -> bool:
        return bool(getattr(self, setting))


NOTHING_IN_PLACE = InPlace()


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    """What a provider thread runs with. `model` None: the provider instance's default model."""

    model: str | None
    runtime_mode: str


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """`keep`: the provider thread goes on (`changed` is applied in place, if anything); else it is replaced
    because of `blocking`, the changes its driver cannot make on a live thread."""

    keep: bool
    changed: tuple[str, ...] = ()
    blocking: tuple[str, ...] = ()


def wanted(thread: AppThread, run: Run) -> Settings:
    """The settings `run` asks for: its own model (sendMessage's `model`), else the thread's; the thread's mode.
    The same values the turn is started with (`engine.native_threads.thread_settings`)."""
    return Settings(model=run.model or thread.model, runtime_mode=thread.runtime_mode)


def recorded(pt: ProviderThread) -> Settings | None:
    """The settings the provider thread last ran a turn with; None when never recorded (no turn yet, or made by
    a release that did not record them). A recorded thread always has its runtime mode."""
    if pt.runtime_mode is None:
        return None
    return Settings(model=pt.model, runtime_mode=pt.runtime_mode)


def compare(before: Settings | None, after: Settings, in_place: InPlace) -> Verdict:
    """Keep the provider thread, or replace it: replaced only when a setting changed that the driver cannot
    change in place. Nothing recorded means nothing to compare: the thread is kept (and its settings recorded)."""
    if before is None:
        return Verdict(keep=True)
    changed = tuple(name for name in (MODEL, RUNTIME_MODE) if getattr(before, name) != getattr(after, name))
    blocking = tuple(name for name in changed if not in_place.allows(name))
    return Verdict(keep=not blocking, changed=changed, blocking=blocking)


def keeps(pt: ProviderThread, want: Settings, in_place: InPlace) -> bool:
    """Whether the provider thread can run a turn with `want` (`compare` with what it recorded)."""
    return compare(recorded(pt), want, in_place).keep


def recording(
    pt: ProviderThread, changes: list[Change], settings: Settings, now: datetime
) -> tuple[ProviderThread, list[Change]]:
    """`pt` recording `settings`, and `changes` writing that: the last change of `pt` among them carries it
    (a new provider thread is created with its settings), else an update is added; nothing when already so."""
    if recorded(pt) == settings:
        return pt, changes
    after = pt.evolve(model=settings.model, runtime_mode=settings.runtime_mode, updated_at=now)
    out = list(changes)
    for i in range(len(out) - 1, -1, -1):
        if isinstance(out[i].entity, ProviderThread) and out[i].entity.id == pt.id:
            out[i] = dataclasses.replace(out[i], entity=after)
            return after, out
    return after, [*out, Change.updated(after)]


def superseded(
    old: ProviderThread, after: Settings, verdict: Verdict, run: Run, now: datetime, new_id: NewId
) -> list[Change]:
    """The provider thread `run` could not keep: closed (no later run resumes it), and the activity saying why
    on the run."""
    before = recorded(old)
    assert before is not None and not verdict.keep
    text = describe(before, after, verdict.blocking, old.provider_instance_id)
    said = activity(
        run.thread_id,
        ActivityKind.LINEAGE_PROVIDER_THREAD_REPLACED,
        text,
        now,
        new_id,
        run_id=run.id,
        payload={
            "providerThreadId": str(old.id),
            "changed": list(verdict.blocking),
            "fromModel": before.model,
            "toModel": after.model,
            "fromRuntimeMode": before.runtime_mode,
            "toRuntimeMode": after.runtime_mode,
        },
    )
    return [Change.updated(old.evolve(status=ProviderThreadStatus.CLOSED, updated_at=now)), said]


_NAMES = {MODEL: "model", RUNTIME_MODE: "runtime mode"}


def _value(settings: Settings, name: str) -> str:
    value = getattr(settings, name)
    return "the default" if value is None else str(value)


def describe(before: Settings, after: Settings, blocking: tuple[str, ...], instance: str) -> str:
    """The line a person reads: what changed, from what to what, and that `instance` cannot change it in place."""
    parts = [f"{_NAMES[n]} {_value(before, n)} → {_value(after, n)}" for n in blocking]
    return (
        f"{' and '.join(parts)}: {instance} cannot change {'these' if len(blocking) > 1 else 'this'} on a live "
        "provider thread, so the run starts a new one with a summary of the conversation"
    )


def replacing(
    thread: AppThread,
    run: Run,
    target: ProviderThread | None,
    want: Settings,
    in_place: InPlace,
    earlier: Iterable[int],
    now: datetime,
    new_id: NewId,
) -> ProviderPlan | None:
    """A new provider thread for `run`, given a full summary of `earlier` (reason `settings_changed`), when
    `target` (the provider thread it would continue or return to) cannot take `want`; the target is closed
    (`superseded`). None when the target can (or there is none, it is unusable anyway, or the run asked for a
    fresh context: `switching.plan_provider` decides those)."""
    if (
        target is None
        or run.fresh_context
        or target.status in (ProviderThreadStatus.ERROR, ProviderThreadStatus.CLOSED)
    ):
        return None
    verdict = compare(recorded(target), want, in_place)
    if verdict.keep:
        return None
    choice = fresh_choice(ChoiceReason.SETTINGS_CHANGED, sorted(set(earlier)))
    pt, changes = attach_provider_thread(thread, None, run.provider_instance_id, now, new_id)
    return ProviderPlan(pt, [*superseded(target, want, verdict, run, now, new_id), *changes], choice)


def with_recorded(plan: ProviderPlan, want: Settings, now: datetime) -> ProviderPlan:
    """`plan`, its provider thread recording the settings the run starts it with."""
    pt, changes = recording(plan.provider_thread, plan.changes, want, now)
    return dataclasses.replace(plan, provider_thread=pt, changes=changes)


def set_runtime_mode(thread: AppThread, runtime_mode: str, full_access: Iterable[str], now: datetime) -> Change:
    """`setRuntimeMode`: the thread's later runs use `runtime_mode` (checked as `createThread` checks it, for the
    thread's provider instance). The run in progress keeps its own; the next one keeps its provider thread only
    where the driver changes the mode in place (`compare`), else it starts a new one with a summary."""
    check_runtime_mode(runtime_mode, thread.provider_instance_id, frozenset(full_access))
    return Change.updated(thread.evolve(runtime_mode=runtime_mode, updated_at=now))

"""Settings compatibility rules (domain/settings_compat.py) as tables: whether a run keeps its provider thread
after the model or runtime mode changed, what each driver declares it can change in place, and what a
replacement records. Pure: no database, no provider process."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support import builders as b
from threadloom.domain import settings_compat as sc
from threadloom.domain.activities import ActivityKind
from threadloom.domain.changes import Change
from threadloom.domain.entities import Activity, AppThread, ProviderThread
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.handoffs import ChoiceReason, HandoffKind
from threadloom.domain.statuses import ProviderThreadStatus
from threadloom.providers.registry import build_driver, load_instances

NOTHING = sc.InPlace()
MODEL_ONLY = sc.InPlace(model=True)
BOTH = sc.InPlace(model=True, runtime_mode=True)
WW, RO = "workspace_write", "read_only"


def s(model: str | None, mode: str = WW) -> sc.Settings:
    return sc.Settings(model=model, runtime_mode=mode)


@pytest.mark.parametrize(
    ("before", "after", "in_place", "keep", "changed", "blocking"),
    [
        # nothing recorded (no turn yet, or a provider thread older than the record): kept, then recorded
        (None, s("m2", RO), NOTHING, True, (), ()),
        # nothing changed: kept by every driver
        (s("m1"), s("m1"), NOTHING, True, (), ()),
        (s(None), s(None), NOTHING, True, (), ()),
        # a model change: applied in place where the driver can, else a new provider thread
        (s("m1"), s("m2"), MODEL_ONLY, True, ("model",), ()),
        (s("m1"), s("m2"), NOTHING, False, ("model",), ("model",)),
        # the instance's default (None) and a named model are different settings
        (s(None), s("m2"), NOTHING, False, ("model",), ("model",)),
        (s("m1"), s(None), MODEL_ONLY, True, ("model",), ()),
        # a runtime mode change: no shipped driver changes it in place
        (s("m1", WW), s("m1", RO), MODEL_ONLY, False, ("runtime_mode",), ("runtime_mode",)),
        (s("m1", WW), s("m1", RO), BOTH, True, ("runtime_mode",), ()),
        # both changed: only what the driver cannot change blocks
        (s("m1", WW), s("m2", RO), MODEL_ONLY, False, ("model", "runtime_mode"), ("runtime_mode",)),
        (s("m1", WW), s("m2", RO), NOTHING, False, ("model", "runtime_mode"), ("model", "runtime_mode")),
        (s("m1", WW), s("m2", RO), BOTH, True, ("model", "runtime_mode"), ()),
    ],
)
def test_compare_keeps_the_provider_thread_unless_the_driver_cannot_apply_a_change(
    before: sc.Settings | None,
    after: sc.Settings,
    in_place: sc.InPlace,
    keep: bool,
    changed: tuple[str, ...],
    blocking: tuple[str, ...],
) -> None:
    verdict = sc.compare(before, after, in_place)
    assert (verdict.keep, verdict.changed, verdict.blocking) == (keep, changed, blocking)


@pytest.mark.parametrize(
    ("driver", "model", "runtime_mode"),
    [("scripted", False, False), ("codex", True, False), ("claude", True, False)],
)
def test_each_driver_declares_what_it_changes_in_place(
    tmp_path: Path, driver: str, model: bool, runtime_mode: bool
) -> None:
    config = load_instances(None)[driver]
    declared = build_driver(config, tmp_path).settings_in_place()
    assert declared == sc.InPlace(model=model, runtime_mode=runtime_mode)


def owner(**fields: object) -> AppThread:
    return b.thread(provider_instance_id="a", runtime_mode=WW, **fields)


def recorded_pt(thread: AppThread, settings: sc.Settings | None, status: str = "idle") -> ProviderThread:
    pt = b.provider_thread_of(thread).evolve(provider_instance_id="a", status=ProviderThreadStatus(status))
    return pt if settings is None else pt.evolve(model=settings.model, runtime_mode=settings.runtime_mode)


@pytest.mark.parametrize(
    ("thread_model", "run_model", "expected"),
    [(None, None, None), ("t", None, "t"), (None, "r", "r"), ("t", "r", "r")],
)
def test_a_run_wants_its_own_model_else_the_threads(
    thread_model: str | None, run_model: str | None, expected: str | None
) -> None:
    thread = owner(model=thread_model)
    assert sc.wanted(thread, b.run(thread, 2, model=run_model)) == s(expected)


def test_recorded_settings_are_none_until_the_runtime_mode_is_recorded() -> None:
    thread = owner()
    assert sc.recorded(recorded_pt(thread, None)) is None
    assert sc.recorded(recorded_pt(thread, s(None, RO))) == s(None, RO)


def test_an_incompatible_change_replaces_the_provider_thread_with_a_full_summary_and_closes_the_old() -> None:
    thread = owner(model="m2")
    old = recorded_pt(thread, s("m1"))
    thread = thread.evolve(active_provider_thread_id=old.id)
    run = b.run(thread, 3)
    plan = sc.replacing(thread, run, old, sc.wanted(thread, run), NOTHING, [2, 1], b.NOW, b.uid)
    assert plan is not None and plan.choice is not None
    assert plan.choice.reason == ChoiceReason.SETTINGS_CHANGED
    assert plan.choice.strategy == HandoffKind.FULL_THREAD_SUMMARY
    assert sorted(plan.choice.selection.ordinals) == [1, 2]
    assert plan.provider_thread.id != old.id and plan.provider_thread.provider_instance_id == "a"
    latest = b.latest(plan.changes, ProviderThread)
    assert latest[old.id].status == ProviderThreadStatus.CLOSED
    assert b.latest(plan.changes, AppThread)[thread.id].active_provider_thread_id == plan.provider_thread.id
    said = [c.entity for c in plan.changes if isinstance(c.entity, Activity)]
    assert [(a.kind, a.run_id) for a in said] == [(ActivityKind.LINEAGE_PROVIDER_THREAD_REPLACED, run.id)]
    assert said[0].summary == (
        "model m1 → m2: a cannot change this on a live provider thread, so the run starts a new one with a "
        "summary of the conversation"
    )
    assert said[0].payload == {
        "providerThreadId": str(old.id),
        "changed": ["model"],
        "fromModel": "m1",
        "toModel": "m2",
        "fromRuntimeMode": WW,
        "toRuntimeMode": WW,
    }


def test_a_replacement_before_any_earlier_run_hands_off_nothing() -> None:
    thread = owner(model="m2")
    run = b.run(thread, 1)
    plan = sc.replacing(thread, run, recorded_pt(thread, s("m1")), sc.wanted(thread, run), NOTHING, [], b.NOW, b.uid)
    assert plan is not None and plan.choice is not None
    assert (plan.choice.reason, plan.choice.strategy) == (ChoiceReason.SETTINGS_CHANGED, None)


@pytest.mark.parametrize(
    ("target_settings", "status", "fresh", "in_place"),
    [
        (s("m1"), "idle", False, MODEL_ONLY),  # the driver applies the model in place
        (s("m2"), "idle", False, NOTHING),  # nothing changed
        (None, "idle", False, NOTHING),  # nothing recorded
        (s("m1"), "error", False, NOTHING),  # unusable anyway: switching says CANNOT_RESUME
        (s("m1"), "closed", False, NOTHING),
        (s("m1"), "idle", True, NOTHING),  # freshContext: switching says FRESH_CONTEXT
    ],
)
def test_no_settings_replacement_where_another_rule_or_the_driver_decides(
    target_settings: sc.Settings | None, status: str, fresh: bool, in_place: sc.InPlace
) -> None:
    thread = owner(model="m2")
    run = b.run(thread, 2, fresh_context=fresh)
    target = recorded_pt(thread, target_settings, status)
    assert sc.replacing(thread, run, target, sc.wanted(thread, run), in_place, [1], b.NOW, b.uid) is None


def test_no_settings_replacement_without_a_provider_thread_to_keep() -> None:
    thread = owner(model="m2")
    run = b.run(thread, 1)
    assert sc.replacing(thread, run, None, sc.wanted(thread, run), NOTHING, [], b.NOW, b.uid) is None


def test_recording_writes_the_settings_into_the_provider_threads_own_change_or_adds_one() -> None:
    thread = owner()
    fresh = recorded_pt(thread, None)
    other = Change.updated(thread)
    pt, changes = sc.recording(fresh, [Change.created(fresh), other], s("m", RO), b.NOW)
    assert (pt.model, pt.runtime_mode) == ("m", RO)
    assert [c.event_type for c in changes] == ["provider_thread.created", "thread.updated"]
    assert changes[0].entity == pt
    kept, added = sc.recording(fresh, [], s("m", RO), b.NOW)
    assert [c.event_type for c in added] == ["provider_thread.updated"] and added[0].entity == kept
    same, none = sc.recording(pt, [], s("m", RO), b.NOW)
    assert (same, none) == (pt, [])


def test_describe_names_every_blocking_change_and_the_default_model() -> None:
    text = sc.describe(s(None, WW), s("m2", RO), ("model", "runtime_mode"), "codex")
    assert text.startswith(
        "model the default → m2 and runtime mode workspace_write → read_only: codex cannot change these"
    )


@pytest.mark.parametrize(
    ("mode", "allowed", "error"),
    [
        ("read_only", (), None),
        ("full_access", ("a",), None),
        ("full_access", ("other",), ErrorCode.RUNTIME_MODE_NOT_ALLOWED),
        ("yolo", ("a",), ErrorCode.INVALID_INPUT),
    ],
)
def test_set_runtime_mode_checks_the_mode_for_the_threads_instance(
    mode: str, allowed: tuple[str, ...], error: ErrorCode | None
) -> None:
    thread = owner()
    if error is not None:
        with pytest.raises(DomainError) as refused:
            sc.set_runtime_mode(thread, mode, allowed, b.NOW)
        assert (refused.value.code, refused.value.field) == (error, "runtimeMode")
        return
    change = sc.set_runtime_mode(thread, mode, allowed, b.NOW)
    assert change.event_type == "thread.updated" and change.entity == thread.evolve(runtime_mode=mode, updated_at=b.NOW)

"""Handoff text: the context Threadloom gives an agent about runs it did not see, built from the log.

One builder serves every place where an agent must be told what happened elsewhere: a provider switch (a full
summary for a new provider thread, or only the runs a returning provider thread missed), a fork resolved
without a native fork (the source's runs up to the fork point), a merge-back (the fork's runs since it was
forked) and a rollback on a provider that cannot roll back (a replacement thread from the runs up to the
target). The text is built here and nowhere else, deterministically (same facts, same budget → same bytes),
so what is stored on the ContextHandoff is exactly what the agent received. The format is documented in
docs/lifecycles/handoffs.md; change both together.

Pure: facts in (`RunFacts`, read by `store.handoff_facts`), `Handoff` out. No I/O.
"""

from __future__ import annotations

import dataclasses
import math
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime
from enum import StrEnum

from threadloom.domain.changes import NewId
from threadloom.domain.entities import ContextHandoff
from threadloom.domain.statuses import HandoffStatus, HandoffStrategy, RunStatus

DEFAULT_TOKEN_BUDGET = 8_000
MAX_TEXT_CHARS = 4_000  # one message, plan or result; longer texts are cut (and say so)
MAX_ITEMS = 40  # entries per list in a section; the rest is counted, not listed
EN_DASH = "\u2013"  # between the ends of a range of runs


class HandoffKind(StrEnum):
    """Why a handoff is built, which decides its selection and its opening line.

    The first two are the stored `HandoffStrategy` values of a provider switch; the others are the same
    builder used for forks, merge-back and rollback (`stored_strategy` maps them onto the stored vocabulary).
    """

    FULL_THREAD_SUMMARY = HandoffStrategy.FULL_THREAD_SUMMARY.value
    DELTA_SINCE_TARGET_LAST_SEEN = HandoffStrategy.DELTA_SINCE_TARGET_LAST_SEEN.value
    FORK_CONTEXT = "fork_context"
    MERGE_BACK_DELTA = "merge_back_delta"
    ROLLBACK_CONTEXT = "rollback_context"

    @property
    def stored_strategy(self) -> HandoffStrategy:
        """The `ContextHandoff.strategy` to record (the table accepts only the three stored values)."""
        return _STORED[self]


_STORED: dict[HandoffKind, HandoffStrategy] = {
    HandoffKind.FULL_THREAD_SUMMARY: HandoffStrategy.FULL_THREAD_SUMMARY,
    HandoffKind.DELTA_SINCE_TARGET_LAST_SEEN: HandoffStrategy.DELTA_SINCE_TARGET_LAST_SEEN,
    HandoffKind.FORK_CONTEXT: HandoffStrategy.FULL_THREAD_SUMMARY,  # the whole thread up to the fork point
    HandoffKind.MERGE_BACK_DELTA: HandoffStrategy.FORK_DELTA_SUMMARY,
    HandoffKind.ROLLBACK_CONTEXT: HandoffStrategy.FULL_THREAD_SUMMARY,  # the whole thread up to the target
}

_OPENING: dict[HandoffKind, str] = {
    HandoffKind.FULL_THREAD_SUMMARY: "Summary of this conversation so far, from work done with another agent.",
    HandoffKind.DELTA_SINCE_TARGET_LAST_SEEN: "What happened in this conversation since you last took part.",
    HandoffKind.FORK_CONTEXT: "This conversation was forked from another one; its history up to the fork point.",
    HandoffKind.MERGE_BACK_DELTA: "What was done in a fork of this conversation since it was forked.",
    HandoffKind.ROLLBACK_CONTEXT: "This conversation up to the run it was rolled back to; later runs were undone.",
}

# Runs that are not part of the conversation: never started, or undone by a rollback.
NOT_IN_CONVERSATION = frozenset({RunStatus.QUEUED, RunStatus.CANCELLED, RunStatus.ROLLED_BACK})


# --- facts -----------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class FileChange:
    path: str
    status: str  # "added" | "modified" | "deleted" | "renamed" | what the source said
    additions: int | None = None  # None: not known (no checkpoint, only the agent's own report)
    deletions: int | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class CommandRun:
    command: str
    exit_code: int | None  # None: it did not exit (declined, interrupted, failed to start)
    status: str  # the tool-call node's status: completed, failed, cancelled (declined), interrupted …


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """An approval or question the user answered."""

    kind: str  # the request kind: command_approval, file_change_approval, permission, user_input …
    subject: str  # the command, or the question(s)
    answer: str  # the decision (accept, decline …) or the chosen answers


@dataclasses.dataclass(frozen=True, slots=True)
class OpenRequest:
    """An approval or question that never got an answer (still pending, expired or cancelled)."""

    kind: str
    subject: str
    status: str


@dataclasses.dataclass(frozen=True, slots=True)
class TodoItem:
    step: str
    status: str  # pending | inProgress | completed


@dataclasses.dataclass(frozen=True, slots=True)
class PlanFact:
    kind: str  # todo_list | proposed_plan
    status: str
    text: str | None = None
    items: tuple[TodoItem, ...] = ()


@dataclasses.dataclass(frozen=True, slots=True)
class SubagentResult:
    """A subagent turn or delegated task started by the run, with what it answered."""

    title: str
    status: str
    result: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class RunFacts:
    """What one run of an app thread contributes to a handoff, in the order it happened."""

    ordinal: int
    status: RunStatus
    provider_instance_id: str
    model: str | None = None
    provider_thread_id: uuid.UUID | None = None
    user_messages: tuple[str, ...] = ()  # the run's message, then its steering messages
    assistant_messages: tuple[str, ...] = ()  # the final (no longer streaming) replies of the root turn
    decisions: tuple[Decision, ...] = ()
    files_changed: tuple[FileChange, ...] = ()
    files_from_checkpoint: bool = False  # True: the list (with line counts) comes from the run's checkpoint
    commands: tuple[CommandRun, ...] = ()
    plans: tuple[PlanFact, ...] = ()
    unresolved: tuple[OpenRequest, ...] = ()
    subagents: tuple[SubagentResult, ...] = ()


# --- selection ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Selection:
    """Which run ordinals a handoff covers. Build it with `up_to`, `of` or `between`."""

    ordinals: frozenset[int]

    @classmethod
    def up_to(cls, last: int) -> Selection:
        """Runs 1..last (a full summary, fork context, rollback context)."""
        return cls(frozenset(range(1, last + 1)))

    @classmethod
    def of(cls, ordinals: Iterable[int]) -> Selection:
        """Exactly these runs (a delta)."""
        return cls(frozenset(ordinals))

    @classmethod
    def between(cls, base: int, source: int) -> Selection:
        """Runs after `base` up to and including `source` (a fork's runs since its fork point)."""
        return cls(frozenset(range(base + 1, source + 1)))


@dataclasses.dataclass(frozen=True, slots=True)
class Handoff:
    text: str
    strategy: HandoffKind
    covered_run_ordinals: tuple[int, ...]  # ascending: the runs whose section is in the text
    omitted_run_ordinals: tuple[int, ...]  # ascending: selected runs left out for the budget
    token_estimate: int


def estimate_tokens(text: str) -> int:
    """A deterministic estimate: one token per 4 bytes of UTF-8, rounded up."""
    return math.ceil(len(text.encode("utf-8")) / 4)


def ranges(ordinals: Iterable[int]) -> str:
    """ "1-3, 5" for {1, 2, 3, 5}, with an en dash (`EN_DASH`) between a range's ends; "" for none."""
    values = sorted(set(ordinals))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        parts.append(str(values[i]) if i == j else f"{values[i]}{EN_DASH}{values[j]}")
        i = j + 1
    return ", ".join(parts)


def _runs_label(ordinals: Sequence[int]) -> str:
    if not ordinals:
        return "none"
    return f"{'run' if len(ordinals) == 1 else 'runs'} {ranges(ordinals)}"


# --- the text --------------------------------------------------------------------------------------------

INDENT = "    "


def _cut(text: str) -> str:
    if len(text) <= MAX_TEXT_CHARS:
        return text
    return f"{text[:MAX_TEXT_CHARS]}… [cut: {len(text) - MAX_TEXT_CHARS} more characters]"


def _block(text: str) -> list[str]:
    """A free text, every line indented, so nothing in it can look like a section heading."""
    return [INDENT + line if line else "" for line in _cut(text).replace("\r\n", "\n").split("\n")]


def _one_line(text: str) -> str:
    """A short value on one line (commands, paths, answers): newlines shown as `\\n`, long ones cut."""
    flat = text.replace("\\", "\\\\").replace("\r", "\\r").replace("\n", "\\n")
    return flat if len(flat) <= 300 else f"{flat[:300]}… [cut]"


def _listed(title: str, entries: Sequence[str]) -> list[str]:
    if not entries:
        return []
    lines = [f"{title}:"]
    lines += [f"  - {entry}" for entry in entries[:MAX_ITEMS]]
    if len(entries) > MAX_ITEMS:
        lines.append(f"  - … and {len(entries) - MAX_ITEMS} more")
    return lines


def _counts(change: FileChange) -> str:
    if change.additions is None and change.deletions is None:
        return ""
    return f" (+{change.additions or 0} -{change.deletions or 0})"


def _command(command: CommandRun) -> str:
    ended = f"exit {command.exit_code}" if command.exit_code is not None else command.status
    return f"`{_one_line(command.command)}` → {ended}"


_MARK = {"completed": "x", "inProgress": "~", "in_progress": "~"}


def _plan_lines(plan: PlanFact) -> list[str]:
    if plan.kind == "todo_list":
        lines = [f"Todo list ({plan.status}):"]
        lines += [f"  - [{_MARK.get(i.status, ' ')}] {_one_line(i.step)}" for i in plan.items[:MAX_ITEMS]]
        if len(plan.items) > MAX_ITEMS:
            lines.append(f"  - … and {len(plan.items) - MAX_ITEMS} more")
        return lines
    return [f"Proposed plan ({plan.status}):", *_block(plan.text or "")]


def run_section(run: RunFacts) -> str:
    """One run's section of the text (documented in docs/lifecycles/handoffs.md)."""
    agent = run.provider_instance_id + (f" ({run.model})" if run.model else "")
    lines = [f"## Run {run.ordinal} · {run.status.value} · {agent}"]
    for text in run.user_messages:
        lines += ["User:", *_block(text)]
    for text in run.assistant_messages:
        lines += ["Assistant:", *_block(text)]
    lines += _listed("Decisions", [f"{d.kind} `{_one_line(d.subject)}`: {_one_line(d.answer)}" for d in run.decisions])
    files_title = "Files changed (checkpoint)" if run.files_from_checkpoint else "Files changed (reported by the agent)"
    lines += _listed(files_title, [f"{f.status} {_one_line(f.path)}{_counts(f)}" for f in run.files_changed])
    lines += _listed("Commands", [_command(c) for c in run.commands])
    for plan in run.plans:
        lines += _plan_lines(plan)
    lines += _listed("Unresolved requests", [f"{r.kind} `{_one_line(r.subject)}` ({r.status})" for r in run.unresolved])
    for sub in run.subagents:
        lines.append(f"Subagent `{_one_line(sub.title)}` ({sub.status}):")
        lines += _block(sub.result) if sub.result else [f"{INDENT}(no result)"]
    return "\n".join(lines)


def _header(kind: HandoffKind, selected: Sequence[int]) -> str:
    return (
        f"# Threadloom handoff: {kind.value}, {_runs_label(selected)}\n"
        f"{_OPENING[kind]} Built by Threadloom from its record of the conversation; "
        "it is context, not new instructions. Runs are listed newest first."
    )


def _omitted_line(omitted: Sequence[int]) -> str:
    return f"Omitted for length: {_runs_label(omitted)}"


def build_handoff(
    kind: HandoffKind,
    runs: Sequence[RunFacts],
    selection: Selection,
    token_budget: int = DEFAULT_TOKEN_BUDGET,
) -> Handoff:
    """The handoff text for the selected runs, newest first, within `token_budget`.

    Runs not in `selection`, and runs that are not part of the conversation (`NOT_IN_CONVERSATION`), are
    ignored. Whole runs are kept, newest first, while the text (header, sections and the final "Omitted for
    length" line) fits the budget; the older rest is listed as omitted. A budget too small for even the header
    gives the header and the omitted line alone (its `token_estimate` then exceeds the budget).
    """
    chosen = sorted(
        (r for r in runs if r.ordinal in selection.ordinals and r.status not in NOT_IN_CONVERSATION),
        key=lambda r: r.ordinal,
        reverse=True,
    )
    ordinals = sorted(r.ordinal for r in chosen)
    header = _header(kind, ordinals)
    sections: list[str] = []
    for run in chosen:
        candidate = [*sections, run_section(run)]
        rest = ordinals[: len(ordinals) - len(candidate)]
        if estimate_tokens(_compose(header, candidate, rest)) > token_budget:
            break
        sections = candidate
    covered = ordinals[len(ordinals) - len(sections) :]
    omitted = ordinals[: len(ordinals) - len(sections)]
    text = _compose(header, sections, omitted)
    return Handoff(
        text=text,
        strategy=kind,
        covered_run_ordinals=tuple(covered),
        omitted_run_ordinals=tuple(omitted),
        token_estimate=estimate_tokens(text),
    )


def _compose(header: str, sections: Sequence[str], omitted: Sequence[int]) -> str:
    return "\n\n".join([header, *sections, _omitted_line(omitted)]) + "\n"


def pending_handoff(
    built: Handoff,
    thread_id: uuid.UUID,
    came_from: Iterable[uuid.UUID],
    to_provider_thread_id: uuid.UUID,
    now: datetime,
    new_id: NewId,
    *,
    transfer_id: uuid.UUID | None = None,
) -> ContextHandoff:
    """The stored handoff of `built`, waiting to go with the next turn to `to_provider_thread_id`; it records
    the provider threads the runs `came_from` and exactly the text the agent will receive."""
    return ContextHandoff(
        id=new_id(),
        transfer_id=transfer_id,
        thread_id=thread_id,
        from_provider_thread_ids=[str(i) for i in came_from],
        to_provider_thread_id=to_provider_thread_id,
        covered_run_ordinals=list(built.covered_run_ordinals),
        omitted_run_ordinals=list(built.omitted_run_ordinals),
        strategy=built.strategy.stored_strategy,
        status=HandoffStatus.PENDING,
        text=built.text,
        token_estimate=built.token_estimate,
        created_at=now,
    )


# --- choosing a strategy for a provider switch -----------------------------------------------------------


class ChoiceReason(StrEnum):
    FIRST_TIME = "first_time"  # the target provider has no provider thread for this app thread
    FRESH_CONTEXT = "fresh_context"  # the user asked for a clean provider context
    CANNOT_RESUME = "cannot_resume"  # its provider thread is unavailable (runtime error, native state gone)
    SETTINGS_CHANGED = "settings_changed"  # model/runtime settings changed incompatibly
    TOO_STALE = "too_stale"  # too many runs or handoffs behind
    RETURNING = "returning"  # resume its own provider thread and bridge what it missed
    UP_TO_DATE = "up_to_date"  # its provider thread already holds every run: nothing to hand off


@dataclasses.dataclass(frozen=True, slots=True)
class TargetThread:
    """The target provider's existing provider thread for this app thread, as the engine knows it."""

    provider_thread_id: uuid.UUID
    # The app runs it holds or was told of: its own, those its handoffs covered (or left out for length),
    # and for a native fork those its source held before the fork point. A set, not a last ordinal: runs
    # can run out of ordinal order (a queued run moved ahead), so "after the last one it saw" misses some.
    seen_run_ordinals: frozenset[int]
    resumable: bool = True
    settings_compatible: bool = True
    handoffs_received: int = 0  # delta handoffs it was given since its last full context


@dataclasses.dataclass(frozen=True, slots=True)
class SwitchPolicy:
    """When a returning provider thread is too stale to bridge with a delta."""

    max_runs_behind: int = 20
    max_handoffs: int = 5


DEFAULT_POLICY = SwitchPolicy()


@dataclasses.dataclass(frozen=True, slots=True)
class StrategyChoice:
    reason: ChoiceReason
    new_provider_thread: bool  # True: create one; False: resume `resume_provider_thread_id`
    resume_provider_thread_id: uuid.UUID | None
    strategy: HandoffKind | None  # None: nothing to hand off
    selection: Selection


def choose_strategy(
    *,
    conversation_run_ordinals: Iterable[int],
    target: TargetThread | None,
    fresh_context: bool = False,
    policy: SwitchPolicy = DEFAULT_POLICY,
) -> StrategyChoice:
    """How the next run reaches its provider: which provider thread, and what handoff it needs.

    `conversation_run_ordinals`: the app thread's earlier runs that are part of its conversation (they ran and
    were not rolled back), not the run being started. A new provider thread gets a full summary of all of them
    (nothing when there are none); a returning provider thread is resumed and given exactly the runs after the
    ones it has not seen, whatever their order (nothing when it saw them all).
    """
    earlier = sorted(set(conversation_run_ordinals))
    fresh_reason: ChoiceReason | None = None
    if target is None:
        fresh_reason = ChoiceReason.FIRST_TIME
    elif fresh_context:
        fresh_reason = ChoiceReason.FRESH_CONTEXT
    elif not target.resumable:
        fresh_reason = ChoiceReason.CANNOT_RESUME
    elif not target.settings_compatible:
        fresh_reason = ChoiceReason.SETTINGS_CHANGED
    if target is None or fresh_reason is not None:
        return _fresh(fresh_reason or ChoiceReason.FIRST_TIME, earlier)
    missed = [o for o in earlier if o not in target.seen_run_ordinals]
    if not missed:
        return StrategyChoice(ChoiceReason.UP_TO_DATE, False, target.provider_thread_id, None, Selection.of(()))
    if len(missed) > policy.max_runs_behind or target.handoffs_received >= policy.max_handoffs:
        return _fresh(ChoiceReason.TOO_STALE, earlier)
    return StrategyChoice(
        ChoiceReason.RETURNING,
        False,
        target.provider_thread_id,
        HandoffKind.DELTA_SINCE_TARGET_LAST_SEEN,
        Selection.of(missed),
    )


def _fresh(reason: ChoiceReason, earlier: Sequence[int]) -> StrategyChoice:
    strategy = HandoffKind.FULL_THREAD_SUMMARY if earlier else None
    return StrategyChoice(reason, True, None, strategy, Selection.of(earlier))

"""Budgets: spending limits that stop a tree of work or ask a person (docs/usage.md, "Budgets").

Pure rules. A budget limits a project, or a thread with its delegated tasks, in USD and/or tokens over a
window (one RUN, the UTC DAY, the UTC MONTH, or TOTAL). The engine asks `breach()` before every turn it
starts and after every batch of usage it records; what a breach does is the budget's action: STOP (the
budget's thread, or the root of the delegation tree for a project budget, is stopped with its tasks and its
queue held `BUDGET_EXCEEDED`) or ASK (a BUDGET runtime request on the run; approved, this run may go past the
budget; declined, as STOP). A budget is checked against what was already recorded, so the call that crosses
it is spent: overshoot is at most one model call.
"""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime
from typing import Any

from threadloom.domain.activities import ActivityKind, activity, run_activity
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.entities import Budget, ExecutionNode, Run, RuntimeRequest
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import (
    BudgetAction,
    BudgetWindow,
    NodeKind,
    NodeStatus,
    ResponseCapability,
    RunStatus,
    RuntimeRequestKind,
    RuntimeRequestStatus,
)
from threadloom.domain.usage import Totals, nano_to_usd, usd_to_nano

HOLD_REASON = "BUDGET_EXCEEDED"  # the queue hold reason a budget's stop leaves (a stable code, not prose)
MAX_USD = 1_000_000_000.0  # a limit above this is a typo, not a budget


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """What `setBudget` asked for, validated."""

    window: BudgetWindow
    action: BudgetAction
    max_cost_nano_usd: int | None
    max_tokens: int | None


def limits(window: BudgetWindow, action: BudgetAction, max_cost_usd: float | None, max_tokens: int | None) -> Limits:
    """Validate a budget's limits: at least one, each above zero (INVALID_INPUT naming the field)."""
    if max_cost_usd is None and max_tokens is None:
        raise DomainError(ErrorCode.INVALID_INPUT, "a budget needs maxCostUsd, maxTokens or both", "maxCostUsd")
    if max_cost_usd is not None and not 0 < max_cost_usd <= MAX_USD:
        raise DomainError(
            ErrorCode.INVALID_INPUT, f"maxCostUsd must be above 0 and at most {MAX_USD:.0f}", "maxCostUsd"
        )
    if max_tokens is not None and max_tokens <= 0:
        raise DomainError(ErrorCode.INVALID_INPUT, "maxTokens must be above 0", "maxTokens")
    nano = None if max_cost_usd is None else usd_to_nano(max_cost_usd)
    return Limits(window=window, action=action, max_cost_nano_usd=nano, max_tokens=max_tokens)


def unknown_cost(instances: dict[str, bool]) -> None:
    """A USD budget over instances whose calls' cost nobody can tell (no cost reported, no price for the
    model) would never fire: refused with BUDGET_COST_UNKNOWN naming them. `instances`: instance → known."""
    unknown = sorted(name for name, known in instances.items() if not known)
    if unknown:
        raise DomainError(
            ErrorCode.BUDGET_COST_UNKNOWN,
            f"provider instance(s) {', '.join(unknown)} report no cost and have no price for the model: a USD "
            "budget would never fire (add a `prices` table to the instance, or limit maxTokens)",
            "maxCostUsd",
        )


def set_budget(
    existing: Budget | None,
    project_id: uuid.UUID,
    thread_id: uuid.UUID | None,
    asked: Limits,
    now: datetime,
    new_id: NewId,
) -> Change:
    """The budget of this scope and window, made or changed (a cleared one is set again)."""
    fields: dict[str, Any] = {
        "action": asked.action,
        "max_cost_nano_usd": asked.max_cost_nano_usd,
        "max_tokens": asked.max_tokens,
        "cleared_at": None,
        "updated_at": now,
    }
    if existing is not None:
        return Change.updated(existing.evolve(**fields))
    made = Budget(
        id=new_id(), project_id=project_id, thread_id=thread_id, time_window=asked.window, created_at=now, **fields
    )
    return Change.created(made)


def clear(budget: Budget, now: datetime) -> Change:
    if budget.cleared_at is not None:
        return Change.updated(budget)  # cleared already: the same answer, nothing new but the event
    return Change.updated(budget.evolve(cleared_at=now, updated_at=now))


def since(window: BudgetWindow, now: datetime) -> datetime | None:
    """Where the window starts (UTC); None: no start (RUN is narrowed by run, TOTAL by nothing)."""
    now = now.astimezone(UTC)
    if window == BudgetWindow.DAY:
        return now.replace(hour=0, minute=0, second=0, microsecond=0)
    if window == BudgetWindow.MONTH:
        return now.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Breach:
    """A budget past its limit: what was spent against it (known cost, tokens)."""

    budget: Budget
    spent: Totals

    def describe(self) -> str:
        b, parts = self.budget, []
        if b.max_cost_nano_usd is not None:
            parts.append(f"${nano_to_usd(self.spent.known_cost_nano):.6g} of ${nano_to_usd(b.max_cost_nano_usd):.6g}")
        if b.max_tokens is not None:
            parts.append(f"{self.spent.tokens} of {b.max_tokens} tokens")
        scope = "thread" if b.thread_id is not None else "project"
        return f"{scope} budget ({b.time_window.lower()}) exceeded: {', '.join(parts)}"

    def payload(self, run: Run | None) -> dict[str, Any]:
        b = self.budget
        return {
            "budgetId": str(b.id),
            "window": b.time_window.upper(),
            "action": b.action.upper(),
            "maxCostUsd": None if b.max_cost_nano_usd is None else nano_to_usd(b.max_cost_nano_usd),
            "maxTokens": b.max_tokens,
            "spentCostUsd": nano_to_usd(self.spent.known_cost_nano),
            "spentTokens": self.spent.tokens,
            "runId": None if run is None else str(run.id),
        }


def past(budget: Budget, spent: Totals) -> bool:
    """Past the limit: more spent than allowed. Known costs only count (an unknown cost adds nothing known;
    `unknown_cost` refuses USD budgets where costs cannot be known)."""
    over_cost = budget.max_cost_nano_usd is not None and spent.known_cost_nano > budget.max_cost_nano_usd
    over_tokens = budget.max_tokens is not None and spent.tokens > budget.max_tokens
    return over_cost or over_tokens


def breach(budget: Budget, spent: Totals) -> Breach | None:
    return Breach(budget, spent) if budget.cleared_at is None and past(budget, spent) else None


def exceeded(thread_id: uuid.UUID, found: Breach, run: Run | None, now: datetime, new_id: NewId) -> Change:
    """The `budget.exceeded` activity on the thread that is stopped (or asked about)."""
    payload = found.payload(run)
    if run is not None and run.thread_id == thread_id:
        return run_activity(run, ActivityKind.BUDGET_EXCEEDED, found.describe(), now, new_id, payload=payload)
    return activity(thread_id, ActivityKind.BUDGET_EXCEEDED, found.describe(), now, new_id, payload=payload)


def ask(run: Run, root: ExecutionNode, found: Breach, now: datetime, new_id: NewId) -> Outcome:
    """ASK: a BUDGET request on the run, its node under the root turn; a running run waits for the answer
    (one whose turn the gate held stays PREPARING: its turn starts once approved)."""
    request_id, node_id = new_id(), new_id()
    payload = found.payload(run)
    summary = found.describe()
    request = RuntimeRequest(
        id=request_id,
        thread_id=run.thread_id,
        run_id=run.id,
        node_id=node_id,
        kind=RuntimeRequestKind.BUDGET,
        status=RuntimeRequestStatus.PENDING,
        response_capability=ResponseCapability.LIVE,
        payload={**payload, "reason": summary},
        created_at=now,
    )
    node = ExecutionNode(
        id=node_id,
        parent_node_id=root.id,
        thread_id=run.thread_id,
        run_id=run.id,
        attempt_id=root.attempt_id,
        root_node_id=root.id,
        kind=NodeKind.APPROVAL_REQUEST,
        status=NodeStatus.WAITING,
        runtime_request_id=request_id,
        title=summary[:200],
        created_at=now,
        updated_at=now,
    )
    changes = [Change.created(node), Change.created(request, node_id=node_id)]
    if run.status == RunStatus.RUNNING:
        changes.append(Change.updated(run.evolve(status=RunStatus.WAITING)))
    note = {**payload, "requestId": str(request_id)}
    changes.append(run_activity(run, ActivityKind.BUDGET_EXCEEDED, summary, now, new_id, node_id=node_id, payload=note))
    changes.append(
        run_activity(
            run,
            ActivityKind.APPROVAL_REQUESTED,
            summary,
            now,
            new_id,
            node_id=node_id,
            payload={"requestId": str(request_id), "kind": RuntimeRequestKind.BUDGET.value},
        )
    )
    return Outcome(changes)


def answered(
    run: Run,
    request: RuntimeRequest,
    node: ExecutionNode,
    other_pending: int,
    accepted: bool,
    response: dict[str, Any],
    summary: str,
    now: datetime,
    new_id: NewId,
) -> Outcome:
    """A BUDGET request answered: recorded, its node closed, a waiting run running again when nothing else
    is pending. Nothing goes to the agent (it never asked); the engine starts a held turn or stops the tree."""
    changes = [
        Change.updated(
            request.evolve(status=RuntimeRequestStatus.RESOLVED, response=response, resolved_at=now), node_id=node.id
        ),
        Change.updated(
            node.evolve(
                status=NodeStatus.COMPLETED if accepted else NodeStatus.CANCELLED, updated_at=now, completed_at=now
            )
        ),
    ]
    if accepted and run.status == RunStatus.WAITING and other_pending == 0:
        changes.append(Change.updated(run.evolve(status=RunStatus.RUNNING)))
    changes.append(
        run_activity(
            run,
            ActivityKind.APPROVAL_RESOLVED,
            summary,
            now,
            new_id,
            node_id=node.id,
            payload={"requestId": str(request.id), "response": response},
        )
    )
    return Outcome(changes, result={"requestId": str(request.id)})


def granted(request: RuntimeRequest) -> bool:
    """An approved BUDGET request: its run may go past that budget."""
    return (
        request.kind == RuntimeRequestKind.BUDGET
        and request.status == RuntimeRequestStatus.RESOLVED
        and str((request.response or {}).get("decision")) in ("accept", "accept_for_session")
    )


def budget_of(request: RuntimeRequest) -> uuid.UUID | None:
    value = (request.payload or {}).get("budgetId")
    return uuid.UUID(str(value)) if value else None

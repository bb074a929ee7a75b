"""The pure rules of budgets (domain/budgets.py): what a valid limit is, where windows start, when a budget
is past its limit (known costs only), and which answer grants a run past it."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta, timezone

import pytest

from threadloom.domain import budgets as rules
from threadloom.domain.entities import Budget, RuntimeRequest
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import (
    BudgetAction,
    BudgetWindow,
    ResponseCapability,
    RuntimeRequestKind,
    RuntimeRequestStatus,
)
from threadloom.domain.usage import NANO, Totals

NOW = datetime(2026, 12, 2, 17, 30, 5, tzinfo=UTC)


def _budget(cost_usd: float | None = None, tokens: int | None = None, cleared: bool = False) -> Budget:
    return Budget(
        id=uuid.uuid4(),
        project_id=uuid.uuid4(),
        time_window=BudgetWindow.TOTAL,
        action=BudgetAction.STOP,
        max_cost_nano_usd=None if cost_usd is None else round(cost_usd * NANO),
        max_tokens=tokens,
        cleared_at=NOW if cleared else None,
        created_at=NOW,
        updated_at=NOW,
    )


@pytest.mark.parametrize(
    ("cost", "tokens", "field"),
    [(None, None, "maxCostUsd"), (0.0, None, "maxCostUsd"), (-1.0, 5, "maxCostUsd"), (None, 0, "maxTokens")],
)
def test_a_budget_needs_a_limit_above_zero(cost: float | None, tokens: int | None, field: str) -> None:
    with pytest.raises(DomainError) as refused:
        rules.limits(BudgetWindow.DAY, BudgetAction.STOP, cost, tokens)
    assert (refused.value.code, refused.value.field) == (ErrorCode.INVALID_INPUT, field)


def test_a_usd_limit_is_kept_exactly_in_billionths() -> None:
    asked = rules.limits(BudgetWindow.RUN, BudgetAction.ASK, 0.1, None)
    assert (asked.max_cost_nano_usd, asked.max_tokens) == (100_000_000, None)


def test_windows_start_at_the_utc_day_and_month_and_run_and_total_have_no_start() -> None:
    local = NOW.astimezone(timezone(timedelta(hours=-8)))  # the same instant elsewhere: still the UTC day
    assert rules.since(BudgetWindow.DAY, local) == datetime(2026, 12, 2, tzinfo=UTC)
    assert rules.since(BudgetWindow.MONTH, NOW) == datetime(2026, 12, 1, tzinfo=UTC)
    assert rules.since(BudgetWindow.RUN, NOW) is None and rules.since(BudgetWindow.TOTAL, NOW) is None


def test_past_means_more_than_the_limit_counting_known_costs_only() -> None:
    budget = _budget(cost_usd=1.0, tokens=100)
    assert not rules.past(budget, Totals(calls=1, input_tokens=60, output_tokens=40, known_cost_nano=NANO))
    assert rules.past(budget, Totals(calls=1, input_tokens=60, output_tokens=41))  # tokens past
    assert rules.past(budget, Totals(calls=1, known_cost_nano=NANO + 1))  # cost past
    unknown = Totals(calls=3, input_tokens=10, known_cost_nano=NANO // 2, unknown=2)
    assert not rules.past(budget, unknown)  # an unknown cost adds nothing known
    assert rules.breach(_budget(tokens=1, cleared=True), Totals(calls=1, input_tokens=5)) is None


def test_only_an_accepted_budget_request_grants_its_run_past_the_budget() -> None:
    budget_id = uuid.uuid4()

    def request(status: RuntimeRequestStatus, decision: str | None) -> RuntimeRequest:
        return RuntimeRequest(
            id=uuid.uuid4(),
            thread_id=uuid.uuid4(),
            run_id=uuid.uuid4(),
            node_id=uuid.uuid4(),
            kind=RuntimeRequestKind.BUDGET,
            status=status,
            response_capability=ResponseCapability.LIVE,
            payload={"budgetId": str(budget_id)},
            response=None if decision is None else {"decision": decision},
            created_at=NOW,
        )

    assert rules.granted(request(RuntimeRequestStatus.RESOLVED, "accept"))
    assert rules.granted(request(RuntimeRequestStatus.RESOLVED, "accept_for_session"))
    assert not rules.granted(request(RuntimeRequestStatus.RESOLVED, "decline"))
    assert not rules.granted(request(RuntimeRequestStatus.PENDING, None))
    assert rules.budget_of(request(RuntimeRequestStatus.PENDING, None)) == budget_id

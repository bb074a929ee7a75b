"""Proposed plans become work (docs/lifecycles/plans-and-todos.md): a new run, or a new thread."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum

from threadloom.domain.changes import Change
from threadloom.domain.entities import PlanArtifact
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.statuses import PlanKind, PlanStatus


class PlanTarget(StrEnum):
    NEW_RUN = "new_run"
    NEW_THREAD = "new_thread"


def implementation_input(plan: PlanArtifact) -> str:
    return f"Implement this plan:\n\n{(plan.text or '').strip()}"


def implement(plan: PlanArtifact, now: datetime) -> Change:
    if plan.kind != PlanKind.PROPOSED_PLAN:
        raise DomainError(
            ErrorCode.INVALID_INPUT, f"a {plan.kind} cannot be implemented; only a proposed plan", "planId"
        )
    if plan.status == PlanStatus.IMPLEMENTED:
        raise DomainError(ErrorCode.PLAN_ALREADY_IMPLEMENTED, "this plan was implemented already", "planId")
    if not (plan.text or "").strip():
        raise DomainError(ErrorCode.INVALID_INPUT, "the plan has no text yet", "planId")
    return Change.updated(plan.evolve(status=PlanStatus.IMPLEMENTED, updated_at=now), node_id=plan.node_id)

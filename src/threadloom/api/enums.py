"""GraphQL enums: the domain's statuses, upper-cased (`RUNNING`, `ROLLED_BACK` …).

The domain enums are registered with Strawberry here (in place) and re-exported, so
annotations in the API use the domain types directly.
"""

from __future__ import annotations

from enum import Enum
from typing import TypeVar

import strawberry

from threadloom.domain import checkpoints as c
from threadloom.domain import dispatch as r
from threadloom.domain import failures as f
from threadloom.domain import plans as p
from threadloom.domain import projects as w
from threadloom.domain import requests as q
from threadloom.domain import statuses as s
from threadloom.domain import tokens as k

for _enum in (
    r.AppliedDispatch,
    q.Decision,
    p.PlanTarget,
    s.RunStatus,
    s.ThreadStatus,
    s.AttemptReason,
    s.AttemptStatus,
    s.NodeKind,
    s.NodeStatus,
    s.MessageRole,
    s.InputIntent,
    s.ProviderSessionStatus,
    s.ProviderThreadStatus,
    s.ProviderTurnStatus,
    s.LineageRelationship,
    s.TransferType,
    s.TransferStatus,
    s.HandoffStrategy,
    s.HandoffStatus,
    s.CheckpointScopeKind,
    s.CheckpointStatus,
    c.CheckpointFileStatus,
    s.RuntimeRequestKind,
    s.RuntimeRequestStatus,
    s.ResponseCapability,
    s.PlanKind,
    s.PlanStatus,
    s.TokenScope,
):
    strawberry.enum(_enum)

strawberry.enum(
    s.BudgetWindow,
    description="A budget's window: RUN (one run, with the tasks it delegated), DAY and MONTH (UTC, from their "
    "start), TOTAL (everything ever).",
)
strawberry.enum(
    s.BudgetAction,
    description="What passing a budget does: STOP (the tree is stopped at once, the queue held BUDGET_EXCEEDED) "
    "or ASK (a BUDGET request a person approves, letting the run go on, or declines, as STOP).",
)

strawberry.enum(
    f.RunFailureCode,
    description="Why a FAILED run failed. MODEL_*: the model API refused or broke the agent's request, as the "
    "agent's CLI reported it, after the CLI's own retries (if any): MODEL_AUTH_FAILED (401/403, the API key was "
    "refused: fix the key), MODEL_RATE_LIMITED (429: wait, then send again), MODEL_OVERLOADED (529: the API is "
    "over capacity: wait, then send again), MODEL_SERVER_ERROR (5xx), MODEL_STREAM_CUT (the reply broke off "
    "mid-stream), MODEL_REQUEST_FAILED (another refusal of the request). AGENT_ERROR: the agent reported "
    "another failure (statusReason has its words). AGENT_EXITED: the agent process exited during the turn. "
    "PROVIDER_REFUSED: the agent refused to start the turn. SERVER_LOST: the server holding the turn stopped or "
    "went away. WORKSPACE_ERROR: the thread's workspace could not be prepared. The thread stays usable: the next "
    "message runs normally, with the conversation so far.",
)

strawberry.enum(
    w.WorkspaceStatus,
    description="What the server finds at a project's workspace root: OK, MISSING (nothing there, or a link to "
    "nothing), NOT_A_DIRECTORY (a file where the folder was).",
)
strawberry.enum(
    k.TokenState,
    description="ACTIVE (authenticates), EXPIRED (past its expiresAt), REVOKED (revokeToken or the CLI).",
)

RunStatus = s.RunStatus
ThreadStatus = s.ThreadStatus
AttemptReason = s.AttemptReason
AttemptStatus = s.AttemptStatus
NodeKind = s.NodeKind
NodeStatus = s.NodeStatus
MessageRole = s.MessageRole
InputIntent = s.InputIntent
ProviderSessionStatus = s.ProviderSessionStatus
ProviderThreadStatus = s.ProviderThreadStatus
ProviderTurnStatus = s.ProviderTurnStatus
LineageRelationship = s.LineageRelationship
TransferType = s.TransferType
TransferStatus = s.TransferStatus
HandoffStrategy = s.HandoffStrategy
HandoffStatus = s.HandoffStatus
CheckpointScopeKind = s.CheckpointScopeKind
CheckpointStatus = s.CheckpointStatus
CheckpointFileStatus = c.CheckpointFileStatus
RuntimeRequestKind = s.RuntimeRequestKind
RuntimeRequestStatus = s.RuntimeRequestStatus
ResponseCapability = s.ResponseCapability
PlanKind = s.PlanKind
PlanStatus = s.PlanStatus
TokenScope = s.TokenScope
AppliedDispatch = r.AppliedDispatch
Decision = q.Decision
PlanTarget = p.PlanTarget
RunFailureCode = f.RunFailureCode


E = TypeVar("E", bound=Enum)


def member(enum: type[E], given: object) -> E:
    """The member of `enum` an argument or input field names. Strawberry hands over an enum given inline as
    its member but one given through a variable as its plain value ("fork", "overwrite"): every enum a
    resolver reads goes through here, so `.value`, `.name` and comparisons see a member either way."""
    return enum(given)

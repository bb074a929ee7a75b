"""Exhaustive status and kind vocabularies (docs/lifecycles/).

Each vocabulary is one line of member names; a member's value, the stored string, is its name in
lower case (`RunStatus.ROLLED_BACK == "rolled_back"`).
"""

from __future__ import annotations

from enum import StrEnum

RunStatus = StrEnum(
    "RunStatus",
    "QUEUED PREPARING STARTING RUNNING WAITING COMPLETED INTERRUPTED FAILED CANCELLED ROLLED_BACK",
)
# Derived: `idle`, or the status of the thread's active run.
ThreadStatus = StrEnum("ThreadStatus", "IDLE PREPARING STARTING RUNNING WAITING ROLLING_BACK")
AttemptReason = StrEnum("AttemptReason", "INITIAL STEERING_RESTART RETRY PROVIDER_RECOVERY WAKE")
AttemptStatus = StrEnum("AttemptStatus", "PENDING RUNNING COMPLETED INTERRUPTED FAILED CANCELLED SUPERSEDED")
NodeStatus = StrEnum("NodeStatus", "PENDING RUNNING WAITING COMPLETED INTERRUPTED FAILED CANCELLED")
MessageRole = StrEnum("MessageRole", "USER ASSISTANT SYSTEM")
InputIntent = StrEnum("InputIntent", "TURN_START QUEUED_TURN STEER RESTART")
ProviderSessionStatus = StrEnum("ProviderSessionStatus", "STARTING READY RUNNING STOPPED ERROR")
ProviderThreadStatus = StrEnum("ProviderThreadStatus", "NOT_LOADED IDLE ACTIVE CLOSED ERROR")
ProviderTurnStatus = StrEnum("ProviderTurnStatus", "PENDING RUNNING COMPLETED INTERRUPTED FAILED ROLLED_BACK")
LineageRelationship = StrEnum("LineageRelationship", "FORK SUBAGENT")
TransferType = StrEnum("TransferType", "FORK PROVIDER_HANDOFF MERGE_BACK SUBAGENT_SPAWN SUBAGENT_RESULT")
TransferStatus = StrEnum("TransferStatus", "PENDING RESOLVED_NATIVE RESOLVED_PORTABLE CONSUMED FAILED SUPERSEDED")
HandoffStrategy = StrEnum("HandoffStrategy", "DELTA_SINCE_TARGET_LAST_SEEN FULL_THREAD_SUMMARY FORK_DELTA_SUMMARY")
HandoffStatus = StrEnum("HandoffStatus", "PENDING DELIVERED FAILED")
CheckpointScopeKind = StrEnum("CheckpointScopeKind", "ROOT_RUN SUBAGENT")
CheckpointStatus = StrEnum("CheckpointStatus", "READY MISSING ERROR STALE")
RuntimeRequestStatus = StrEnum("RuntimeRequestStatus", "PENDING RESOLVED EXPIRED CANCELLED")
ResponseCapability = StrEnum("ResponseCapability", "LIVE NOT_RESUMABLE")
PlanKind = StrEnum("PlanKind", "TODO_LIST PROPOSED_PLAN QUESTIONS")
PlanStatus = StrEnum("PlanStatus", "ACTIVE FINALIZED IMPLEMENTED SUPERSEDED")
TokenScope = StrEnum("TokenScope", "READ OPERATE ADMIN")
# Where a usage record's cost comes from (domain.usage): the provider said it, our price table, or nobody.
CostSource = StrEnum("CostSource", "REPORTED PRICED UNKNOWN")
EffectStatus = StrEnum("EffectStatus", "PENDING RUNNING DONE FAILED CANCELLED")
NodeKind = StrEnum(
    "NodeKind",
    "ROOT_TURN ASSISTANT_MESSAGE REASONING PLAN TODO_LIST "
    "TOOL_CALL APPROVAL_REQUEST USER_INPUT_REQUEST SUBAGENT SYSTEM",
)
RuntimeRequestKind = StrEnum(
    "RuntimeRequestKind",
    "COMMAND_APPROVAL FILE_CHANGE_APPROVAL PERMISSION USER_INPUT ELICITATION BUDGET",
)
# A budget's time window (domain.budgets): one run (with the tasks it delegated), the UTC day, the UTC month, ever.
BudgetWindow = StrEnum("BudgetWindow", "RUN DAY MONTH TOTAL")
# What passing a budget does: stop the tree at once, or ask a person (a BUDGET runtime request).
BudgetAction = StrEnum("BudgetAction", "STOP ASK")

ACTIVE_RUN_STATUSES = frozenset({RunStatus.PREPARING, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.WAITING})
TERMINAL_RUN_STATUSES = frozenset(
    {
        RunStatus.COMPLETED,
        RunStatus.INTERRUPTED,
        RunStatus.FAILED,
        RunStatus.CANCELLED,
        RunStatus.ROLLED_BACK,
    }
)

"""GraphQL enums: the domain's statuses, upper-cased (`RUNNING`, `ROLLED_BACK` …)."""

from __future__ import annotations

import strawberry

from threadloom.domain import statuses as s

RunStatus = strawberry.enum(s.RunStatus, name="RunStatus")
ThreadStatus = strawberry.enum(s.ThreadStatus, name="ThreadStatus")
AttemptReason = strawberry.enum(s.AttemptReason, name="AttemptReason")
AttemptStatus = strawberry.enum(s.AttemptStatus, name="AttemptStatus")
NodeKind = strawberry.enum(s.NodeKind, name="NodeKind")
NodeStatus = strawberry.enum(s.NodeStatus, name="NodeStatus")
MessageRole = strawberry.enum(s.MessageRole, name="MessageRole")
InputIntent = strawberry.enum(s.InputIntent, name="InputIntent")
ProviderSessionStatus = strawberry.enum(s.ProviderSessionStatus, name="ProviderSessionStatus")
ProviderThreadStatus = strawberry.enum(s.ProviderThreadStatus, name="ProviderThreadStatus")
ProviderTurnStatus = strawberry.enum(s.ProviderTurnStatus, name="ProviderTurnStatus")
LineageRelationship = strawberry.enum(s.LineageRelationship, name="LineageRelationship")
TransferType = strawberry.enum(s.TransferType, name="TransferType")
TransferStatus = strawberry.enum(s.TransferStatus, name="TransferStatus")
HandoffStrategy = strawberry.enum(s.HandoffStrategy, name="HandoffStrategy")
HandoffStatus = strawberry.enum(s.HandoffStatus, name="HandoffStatus")
CheckpointScopeKind = strawberry.enum(s.CheckpointScopeKind, name="CheckpointScopeKind")
CheckpointStatus = strawberry.enum(s.CheckpointStatus, name="CheckpointStatus")
RuntimeRequestKind = strawberry.enum(s.RuntimeRequestKind, name="RuntimeRequestKind")
RuntimeRequestStatus = strawberry.enum(s.RuntimeRequestStatus, name="RuntimeRequestStatus")
ResponseCapability = strawberry.enum(s.ResponseCapability, name="ResponseCapability")
PlanKind = strawberry.enum(s.PlanKind, name="PlanKind")
PlanStatus = strawberry.enum(s.PlanStatus, name="PlanStatus")
TokenScope = strawberry.enum(s.TokenScope, name="TokenScope")

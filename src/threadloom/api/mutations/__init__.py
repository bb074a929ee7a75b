"""Mutations, one module per lifecycle (named like `domain/` and `engine/`), merged into one `Mutation` type.

Each mutation is its engine command under `payloads.mutation`; see that module for what they share.
"""

from __future__ import annotations

import strawberry.tools

from threadloom.api.mutations.budgets import BudgetMutation
from threadloom.api.mutations.delegation import DelegationMutation
from threadloom.api.mutations.forks import ForkMutation
from threadloom.api.mutations.interruption import InterruptionMutation
from threadloom.api.mutations.leases import LeaseMutation
from threadloom.api.mutations.plans import PlanMutation
from threadloom.api.mutations.project_admin import ProjectAdminMutation
from threadloom.api.mutations.queue import QueueMutation
from threadloom.api.mutations.requests import RequestMutation
from threadloom.api.mutations.retry import RetryMutation
from threadloom.api.mutations.rollback import RollbackMutation
from threadloom.api.mutations.runs import RunMutation
from threadloom.api.mutations.threads import ThreadMutation
from threadloom.api.mutations.webhooks import WebhookMutation

Mutation = strawberry.tools.merge_types(
    "Mutation",
    (
        ThreadMutation,
        RunMutation,
        QueueMutation,
        InterruptionMutation,
        RequestMutation,
        PlanMutation,
        DelegationMutation,
        RollbackMutation,
        ForkMutation,
        RetryMutation,
        ProjectAdminMutation,
        WebhookMutation,
        LeaseMutation,
        BudgetMutation,
    ),
)

__all__ = ["Mutation"]

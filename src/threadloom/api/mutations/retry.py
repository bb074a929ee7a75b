"""retryRun: a new attempt (`RETRY`) of a failed run (engine/retry.py, rules in domain/retries.py)."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api.context import Context
from threadloom.api.mutations.payloads import RUN, KeyedInput, mutation, run_id


@strawberry.input
class RetryRunInput(KeyedInput):
    run_id: strawberry.ID


@strawberry.type
class RetryMutation:
    @mutation(RUN)
    async def retry_run(ctx: Context, input: RetryRunInput) -> uuid.UUID:
        """Run a FAILED run again: a new attempt (reason RETRY) with the run's input (its message and every message
        steered into it, in order) on its provider thread; every attempt stays under the run. Only the thread's
        latest run that ran (RUN_NOT_LATEST), only a failed one (RUN_NOT_RETRYABLE), and only while no other run of
        the thread is active (THREAD_BUSY). A held queue stays held (resumeQueue releases it)."""
        return await ctx.services.retries.retry_run(ctx.principal, run_id(input.run_id), input.key())

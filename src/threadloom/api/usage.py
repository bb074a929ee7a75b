"""Usage in the API: the `Usage` roll-up every scope shows, and the grouped report of a project (docs/usage.md).

Roll-ups are read through the request's loaders (`Loaders.usage(scope)`), so a page of runs, threads or nodes
asks one statement for all of them.
"""

from __future__ import annotations

import datetime as dt
import enum
import uuid
from typing import TYPE_CHECKING, Annotated, NewType

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Info
from threadloom.domain.statuses import CostSource
from threadloom.domain.usage import Totals
from threadloom.store import usage as usage_reads

if TYPE_CHECKING:
    from threadloom.api.types import Thread

strawberry.enum(
    CostSource,
    description="Where a cost comes from: REPORTED by the provider, PRICED from the instance's price table in "
    "the providers file, or UNKNOWN (nobody said; shown as a null cost, never as zero).",
)

BigInt = NewType("BigInt", int)
# Its definition, for the schema's scalar map (api.schema).
BIG_INT = strawberry.scalar(
    name="BigInt",
    description="A whole number that may pass 2^31 (token counts): a JSON number, exact up to 2^53.",
    serialize=int,
    parse_value=int,
)


@strawberry.type(
    description="What a scope's model calls used and cost. Token kinds nest: `inputTokens` counts every input "
    "token (cache reads and writes included), `outputTokens` every output token (reasoning included)."
)
class Usage:
    calls: int = strawberry.field(description="How many model calls the agents reported.")
    input_tokens: BigInt = strawberry.field(description="Input tokens, cached and cache-write ones included.")
    cached_input_tokens: BigInt = strawberry.field(
        description="Input tokens read from the provider's prompt cache (part of inputTokens)."
    )
    cache_write_tokens: BigInt = strawberry.field(
        description="Input tokens written to the provider's prompt cache (part of inputTokens; Claude reports them)."
    )
    output_tokens: BigInt = strawberry.field(description="Output tokens, reasoning included.")
    reasoning_tokens: BigInt = strawberry.field(description="Reasoning tokens (part of outputTokens).")
    cost_usd: float | None = strawberry.field(
        description="The cost in USD; null when any call's cost is unknown (never a zero standing for unknown). "
        "0 only when there were no calls."
    )
    cost_source: CostSource | None = strawberry.field(
        description="UNKNOWN when any call's cost is unknown, else PRICED when any was priced from the price "
        "table, else REPORTED; null when there were no calls."
    )


def usage_of(totals: Totals) -> Usage:
    return Usage(
        calls=totals.calls,
        input_tokens=BigInt(totals.input_tokens),
        cached_input_tokens=BigInt(totals.cached_input_tokens),
        cache_write_tokens=BigInt(totals.cache_write_tokens),
        output_tokens=BigInt(totals.output_tokens),
        reasoning_tokens=BigInt(totals.reasoning_tokens),
        cost_usd=totals.cost_usd,
        cost_source=totals.cost_source,
    )


async def load_usage(info: Info, scope: str, key: uuid.UUID) -> Usage:
    """One key's roll-up through the request's loader of `scope` (batched with every other key asked)."""
    return usage_of(await info.context.loaders.usage(scope).load(key))


@strawberry.enum(description="What a project's usage report is broken down by.")
class UsageGroupBy(enum.Enum):
    DAY = usage_reads.GroupBy.DAY
    THREAD = usage_reads.GroupBy.THREAD
    MODEL = usage_reads.GroupBy.MODEL
    PROVIDER_INSTANCE = usage_reads.GroupBy.PROVIDER_INSTANCE


@strawberry.type(description="One row of a project's usage report: the group it stands for and its usage.")
class UsageGroup:
    day: dt.date | None = strawberry.field(description="The day (UTC) when grouped by DAY; else null.")
    thread_id: strawberry.ID | None = strawberry.field(
        description="The thread whose runs made the calls when grouped by THREAD (a delegated task's calls are "
        "its own thread's); else null."
    )
    model: str | None = strawberry.field(description="The model when grouped by MODEL (null: not named); else null.")
    provider_instance_id: str | None = strawberry.field(
        description="The provider instance when grouped by PROVIDER_INSTANCE; else null."
    )
    usage: Usage = strawberry.field(description="What the group's calls used and cost.")
    _thread: strawberry.Private[uuid.UUID | None] = None

    @strawberry.field(description="That thread (by THREAD); else null. Loaded for all groups at once.")
    async def thread(self, info: Info) -> Annotated[Thread, strawberry.lazy("threadloom.api.types")] | None:
        from threadloom.api.types import Thread  # api.types reads usage from here

        row = await info.context.load_visible(Thread.table(), self._thread)
        return None if row is None else Thread.from_row(row)


async def project_usage(
    info: Info,
    project: uuid.UUID,
    since: dt.datetime | None,
    until: dt.datetime | None,
    group_by: list[UsageGroupBy],
) -> list[UsageGroup]:
    async with info.context.loaders.reader() as db:
        groups = await usage_reads.grouped(db, project, [g.value for g in group_by], since, until)
    return [
        UsageGroup(
            day=g.day,
            thread_id=None if g.thread_id is None else strawberry.ID(gid.encode("Thread", g.thread_id)),
            model=g.model,
            provider_instance_id=g.provider_instance_id,
            usage=usage_of(g.totals),
            _thread=g.thread_id,
        )
        for g in groups
    ]


GroupByArgument = Annotated[
    list[UsageGroupBy] | None,
    strawberry.argument(description="Break the report down by these (none: one row for the whole range)."),
]

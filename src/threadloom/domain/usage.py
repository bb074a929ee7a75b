"""What model calls cost: the figures an agent reports, their price, and how records add up (docs/usage.md).

Pure rules. A driver reduces its agent's reports to one `ReportedUsage` per model call (`providers.contract`);
the engine turns each into a `UsageRecord` with `record()`, pricing it from the instance's price table when
the provider gave no cost; the store sums records (`store.usage`) and `Totals` says what the sum means.

Token kinds nest, so no kind is counted twice in a sum: `input` counts every input token, cache reads
(`cached_input`) and cache writes (`cache_write`) included; `output` counts every output token, `reasoning`
included. A cost is exact (integer billionths of a dollar), and an unknown cost is never a zero: one unknown
record makes its whole roll-up's cost unknown.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from threadloom.domain.entities import UsageRecord
from threadloom.domain.statuses import CostSource

NANO = 1_000_000_000  # billionths of a dollar in a dollar
PER_MILLION = 1_000_000


@dataclasses.dataclass(frozen=True, slots=True)
class Figures:
    """One model call's tokens by kind (nested as the module says)."""

    input: int = 0
    cached_input: int = 0
    cache_write: int = 0
    output: int = 0
    reasoning: int = 0

    def __post_init__(self) -> None:
        for name in ("input", "cached_input", "cache_write", "output", "reasoning"):
            if getattr(self, name) < 0:
                raise ValueError(f"usage figure {name} is negative")


@dataclasses.dataclass(frozen=True, slots=True)
class Price:
    """USD per million tokens of each kind (a price table row). Reasoning tokens are output tokens."""

    input: float
    output: float
    cached_input: float | None = None  # None: as `input`
    cache_write: float | None = None  # None: as `input`

    def cost_nano(self, figures: Figures) -> int:
        cached = self.input if self.cached_input is None else self.cached_input
        write = self.input if self.cache_write is None else self.cache_write
        plain = max(figures.input - figures.cached_input - figures.cache_write, 0)
        usd_per_million = (
            plain * self.input
            + figures.cached_input * cached
            + figures.cache_write * write
            + figures.output * self.output
        )
        return round(usd_per_million * NANO / PER_MILLION)


PriceTable = Mapping[str, Price]  # by model name


def usd_to_nano(usd: float) -> int:
    return round(usd * NANO)


def nano_to_usd(nano: int) -> float:
    return nano / NANO


def parse_prices(raw: Any) -> dict[str, Price]:
    """An instance's `prices` option (`[instances.X.prices."model"]` tables, USD per million tokens) → a price
    table; ValueError naming what is wrong, so a bad providers file is refused at start."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError("`prices` must be a table of models")
    table: dict[str, Price] = {}
    for model, row in raw.items():
        if not isinstance(row, dict):
            raise ValueError(f"`prices.{model}` must be a table")
        unknown = sorted(set(row) - {"input", "output", "cached_input", "cache_write"})
        if unknown:
            raise ValueError(f"`prices.{model}`: unknown key(s) {', '.join(unknown)}")
        for key, value in row.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
                raise ValueError(f"`prices.{model}.{key}` must be a number of USD per million tokens >= 0")
        if "input" not in row or "output" not in row:
            raise ValueError(f"`prices.{model}` needs `input` and `output`")
        table[str(model)] = Price(
            input=float(row["input"]),
            output=float(row["output"]),
            cached_input=None if "cached_input" not in row else float(row["cached_input"]),
            cache_write=None if "cache_write" not in row else float(row["cache_write"]),
        )
    return table


def cost_of(
    figures: Figures,
    reported_usd: float | None,
    model: str | None,
    prices: PriceTable,
    in_turn_total: bool = False,
) -> tuple[int | None, CostSource]:
    """A call's cost and where it comes from: the provider's own figure wins, then the price table's row for
    its model; neither is UNKNOWN (None, never 0). A call whose cost the provider reports with its turn's
    total (`in_turn_total`) is REPORTED with no figure of its own: the turn's record carries it."""
    if reported_usd is not None:
        return usd_to_nano(reported_usd), CostSource.REPORTED
    if in_turn_total:
        return None, CostSource.REPORTED
    price = prices.get(model) if model is not None else None
    if price is not None:
        return price.cost_nano(figures), CostSource.PRICED
    return None, CostSource.UNKNOWN


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Call:
    """Where a reported call belongs: its thread, run, attempt and the node that made it."""

    thread_id: uuid.UUID
    run_id: uuid.UUID
    attempt_id: uuid.UUID
    node_id: uuid.UUID
    provider_instance_id: str


def record(
    call: Call,
    call_ref: str,
    figures: Figures,
    model: str | None,
    reported_usd: float | None,
    prices: PriceTable,
    now: datetime,
    record_id: uuid.UUID,
    in_turn_total: bool = False,
) -> UsageRecord:
    nano, source = cost_of(figures, reported_usd, model, prices, in_turn_total)
    return UsageRecord(
        id=record_id,
        thread_id=call.thread_id,
        run_id=call.run_id,
        attempt_id=call.attempt_id,
        node_id=call.node_id,
        provider_instance_id=call.provider_instance_id,
        model=model,
        call_ref=call_ref,
        input_tokens=figures.input,
        cached_input_tokens=figures.cached_input,
        cache_write_tokens=figures.cache_write,
        output_tokens=figures.output,
        reasoning_tokens=figures.reasoning,
        cost_nano_usd=nano,
        cost_source=source,
        created_at=now,
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Totals:
    """A sum of usage records (`store.usage` adds them in SQL): tokens by kind, the known costs' sum, and how
    many records were priced by us or had no cost at all. A call REPORTED as part of its turn's total counts as
    unknown unless that total's record is in the same sum (an attempt's calls without it: `store.usage`)."""

    calls: int = 0
    input_tokens: int = 0
    cached_input_tokens: int = 0
    cache_write_tokens: int = 0
    output_tokens: int = 0
    reasoning_tokens: int = 0
    known_cost_nano: int = 0
    priced: int = 0
    unknown: int = 0
    records: int = 0  # the calls, and the records carrying only a turn's cost (no tokens)

    @property
    def cost_source(self) -> CostSource | None:
        """UNKNOWN if any record's cost is; else PRICED if any was priced by us; else REPORTED; None: no
        records."""
        if self.records == 0:
            return None
        if self.unknown:
            return CostSource.UNKNOWN
        return CostSource.PRICED if self.priced else CostSource.REPORTED

    @property
    def cost_nano(self) -> int | None:
        """The cost in billionths of a dollar; None when any part is unknown (0 only for no records at all)."""
        return None if self.unknown else self.known_cost_nano

    @property
    def cost_usd(self) -> float | None:
        nano = self.cost_nano
        return None if nano is None else nano_to_usd(nano)

    @property
    def tokens(self) -> int:
        """Every token of the calls: input (cache reads and writes in it) and output (reasoning in it)."""
        return self.input_tokens + self.output_tokens

    def plus(self, other: Totals) -> Totals:
        return Totals(*(a + b for a, b in zip(dataclasses.astuple(self), dataclasses.astuple(other), strict=True)))


@dataclasses.dataclass(frozen=True, slots=True)
class Pricing:
    """What an instance's calls are priced with: its price table, and the model a call of a run that named
    none was made with (the instance's `model` option; None: unnamed, so only a provider's own cost counts)."""

    prices: PriceTable = dataclasses.field(default_factory=dict)
    default_model: str | None = None

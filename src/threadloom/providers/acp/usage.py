"""What an ACP agent reports about usage, reduced to the ledger's one report per model call (docs/usage.md).

ACP gives two things: a `session/prompt` answer's `usage` (that prompt's tokens, all its model calls together,
so one ledger call per prompt, named `<turn>:prompt`), and `usage_update` notifications whose `cost` is the
session's cumulative spend. The cost becomes reports of its own, with no tokens: each the growth since the
session's last figure, named by the cumulative figure it reached (stable, so a report seen again is recorded
once). Only USD is recorded. While a session has reported a cost, its prompts' tokens are marked as costed by
those reports (`cost_in_turn_total`), so a roll-up is not made unknown by them; an agent that never reports a
cost leaves its tokens to the instance's price table, or unknown.
"""

from __future__ import annotations

from threadloom.domain.usage import Figures
from threadloom.providers.acp.updates import AcpUsage
from threadloom.providers.contract import UsageReported


class CostMeter:
    """Each session's last cumulative cost, to turn `usage_update`'s running figure into growth."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}

    def reports_cost(self, thread: str) -> bool:
        return thread in self._last

    def grew(self, thread: str, turn: str, usage: AcpUsage) -> UsageReported | None:
        amount, currency = usage.cost_amount, (usage.cost_currency or "USD").upper()
        if amount is None or currency != "USD" or amount < 0:
            return None
        before = self._last.get(thread, 0.0)
        self._last[thread] = amount
        # A smaller figure: the agent's process (and its running sum) started again; all of it is new.
        growth = amount - before if amount >= before else amount
        if growth <= 0:
            return None
        return UsageReported(thread, turn, f"{turn}:cost@{amount!r}", Figures(), cost_usd=growth)


def prompt_report(thread: str, turn: str, usage: AcpUsage, costed: bool) -> UsageReported | None:
    """The prompt's tokens as one call; None when the answer carried no token counts."""
    if usage.input_tokens is None and usage.output_tokens is None:
        return None
    figures = Figures(
        input=usage.input_tokens or 0,
        cached_input=usage.cached_read_tokens or 0,
        cache_write=usage.cached_write_tokens or 0,
        output=usage.output_tokens or 0,
        reasoning=usage.thought_tokens or 0,
    )
    return UsageReported(thread, turn, f"{turn}:prompt", figures, cost_in_turn_total=costed)

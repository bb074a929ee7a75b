"""Claude Code's usage reports → one `UsageReported` per model call, and its cost once per query (docs/usage.md).

What Claude Code 2.1.197 prints (`-p --output-format stream-json --verbose --include-partial-messages`),
checked against the fake model in tests/test_usage_agents.py and on recorded output in
tests/test_usage_rules.py:

- each main-loop API call streams as `stream_event`s: `message_start` (the message id, the model, and the
  call's input, cache-write and cache-read tokens, with the output so far, 1) and `message_delta` (the final
  output tokens). The `assistant` lines repeat `message_start`'s usage on every content block of the message,
  with that provisional output count: summing them would count a call once per block and undercount its
  output, so they are not read.
- a subagent's calls are not printed; its `Agent` tool result carries a `usage` (and `resolvedModel`).
- each query ends with a `result`: `usage` (that query's main loop only), and `modelUsage` per model with
  `costUSD`, and `total_cost_usd`, both **cumulative over the process** (every query since it started,
  subagents and side requests included; a process resuming a session starts from zero again).

So: a call is reported when its `message_delta` arrives (its `message_start` figures, its final output);
a subagent's when its result arrives, on the subagent's own turn; both without a cost of their own
(`cost_in_turn_total`). At each `result`, per model, the difference of `modelUsage` since the previous result
of the process is what the query used: the part not reported call by call (a subagent's other calls, side
requests) becomes one more report, carrying the query's whole `costUSD` for that model (REPORTED).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from threadloom.domain.usage import Figures
from threadloom.providers.contract import ProviderEvent, UsageReported


def model_name(name: Any) -> str | None:
    """The model as the API names it: Claude Code's own names carry a context suffix the API's do not
    (`modelUsage` and `resolvedModel` say `claude-opus-4-8[1m]` where `message_start` says `claude-opus-4-8`)."""
    return re.sub(r"\[[^\]]*\]$", "", str(name)) or None if name else None


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def figures_of(usage: dict[str, Any]) -> Figures:
    """A Messages API `usage` (snake_case) → figures: its `input_tokens` leave the cache's reads and writes
    out, the ledger's input counts them."""
    read, write = _count(usage.get("cache_read_input_tokens")), _count(usage.get("cache_creation_input_tokens"))
    return Figures(
        input=_count(usage.get("input_tokens")) + read + write,
        cached_input=read,
        cache_write=write,
        output=_count(usage.get("output_tokens")),
    )


def _model_figures(entry: dict[str, Any]) -> Figures:
    """A `modelUsage` entry (camelCase) → figures, as `figures_of`."""
    read, write = _count(entry.get("cacheReadInputTokens")), _count(entry.get("cacheCreationInputTokens"))
    return Figures(
        input=_count(entry.get("inputTokens")) + read + write,
        cached_input=read,
        cache_write=write,
        output=_count(entry.get("outputTokens")),
    )


def _minus(a: Figures, b: Figures) -> Figures:
    return Figures(*(max(x - y, 0) for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True)))


def _plus(a: Figures, b: Figures) -> Figures:
    return Figures(*(x + y for x, y in zip(dataclasses.astuple(a), dataclasses.astuple(b), strict=True)))


@dataclasses.dataclass(slots=True)
class _Call:
    message_id: str
    model: str | None
    usage: dict[str, Any]


class Meter:
    """The usage of one Claude Code process (made anew with each process: its cumulative figures restart)."""

    def __init__(self, thread: str) -> None:
        self.thread = thread
        self._open: dict[str | None, _Call] = {}  # parent_tool_use_id -> the call streaming
        self._seen: dict[str, Figures] = {}  # by model: reported call by call since the last result
        self._cost: dict[str, float] = {}  # by model: cumulative costUSD at the last result
        self._used: dict[str, Figures] = {}  # by model: cumulative figures at the last result

    def started(self, parent: str | None, message: dict[str, Any]) -> None:
        """A call's `message_start`."""
        usage = message.get("usage")
        self._open[parent] = _Call(
            str(message.get("id")),
            model_name(message.get("model")),
            dict(usage) if isinstance(usage, dict) else {},
        )

    def ended(self, parent: str | None, turn: str, delta_usage: Any) -> list[ProviderEvent]:
        """A call's `message_delta`: the call, reported (its final figures override the start's)."""
        call = self._open.pop(parent, None)
        if call is None or not turn:
            return []
        usage = {**call.usage, **(delta_usage if isinstance(delta_usage, dict) else {})}
        return [self._report(turn, call.message_id, figures_of(usage), call.model)]

    def subagent(self, turn: str, tool_use_id: str, result: dict[str, Any]) -> list[ProviderEvent]:
        """An `Agent` tool's result: the subagent's usage, on its own turn."""
        usage = result.get("usage")
        if not isinstance(usage, dict) or not turn:
            return []
        model = model_name(result.get("resolvedModel"))
        return [self._report(turn, f"{tool_use_id}:agent", figures_of(usage), model)]

    def _report(self, turn: str, ref: str, figures: Figures, model: str | None) -> UsageReported:
        key = model or ""
        self._seen[key] = _plus(self._seen.get(key, Figures()), figures)
        return UsageReported(self.thread, turn, ref, figures, model, None, cost_in_turn_total=True)

    def result(self, turn: str, message: dict[str, Any]) -> list[ProviderEvent]:
        """A query's `result`: per model, what the query used beyond the calls already reported, with the
        query's cost (the difference of the process's cumulative `modelUsage` since the last result)."""
        by_model = message.get("modelUsage")
        if not isinstance(by_model, dict) or not turn:
            return []
        ref = str(message.get("uuid") or message.get("session_id") or "")
        out: list[ProviderEvent] = []
        seen, self._seen = self._seen, {}
        for named, entry in sorted(by_model.items()):
            model = model_name(named)
            if not isinstance(entry, dict) or model is None:
                continue
            total, cost = _model_figures(entry), entry.get("costUSD")
            used = _minus(total, self._used.get(model, Figures()))
            self._used[model] = total
            rest = _minus(used, _plus(seen.pop(model, Figures()), seen.pop("", Figures())))
            spent = None
            if isinstance(cost, int | float) and not isinstance(cost, bool):
                spent = max(float(cost) - self._cost.get(model, 0.0), 0.0)
                self._cost[model] = float(cost)
            if spent is None and rest == Figures():
                continue
            # Without a cost the remainder is an ordinary call; with one, it carries the query's cost.
            out.append(UsageReported(self.thread, turn, f"{ref}:{model}", rest, model, spent))
        return out

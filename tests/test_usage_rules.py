"""Usage rules without a server (docs/usage.md): pricing and sums (`domain.usage`), the scripted agent's
`@usage`, and each driver's reduction of what its real CLI printed (tests/recorded/) to one report per call.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from threadloom.agent.directives import DirectiveError, Usage, parse
from threadloom.domain.statuses import CostSource
from threadloom.domain.usage import Figures, Price, Totals, cost_of, parse_prices
from threadloom.providers import contract as ev
from threadloom.providers.claude.events import ThreadTranslator
from threadloom.providers.claude.usage import Meter
from threadloom.providers.codex_events import Translator
from threadloom.providers.registry import ConfigError, load_instances

RECORDED = Path(__file__).parent / "recorded"
# The fake model's figures (tests/support/fake_anthropic.py, fake_openai.py) as the ledger counts them.
CLAUDE_CALL = Figures(input=12 + 30 + 200, cached_input=200, cache_write=30, output=7)
CODEX_CALL = Figures(input=120, cached_input=80, output=30, reasoning=12)


def _lines(name: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (RECORDED / name).read_text().splitlines() if line.strip()]


def test_a_price_table_row_prices_each_kind_and_a_reported_cost_wins() -> None:
    price = Price(input=3.0, output=15.0, cached_input=0.3, cache_write=3.75)
    figures = Figures(input=1_000_000, cached_input=200_000, cache_write=100_000, output=10_000, reasoning=4_000)
    # 700k plain input at 3, 200k cached at 0.3, 100k written at 3.75, 10k output at 15 (reasoning inside it)
    assert price.cost_nano(figures) == round((2.1 + 0.06 + 0.375 + 0.15) * 1e9)
    assert cost_of(figures, 0.5, "m", {"m": price}) == (500_000_000, CostSource.REPORTED)
    assert cost_of(figures, None, "m", {"m": price})[1] == CostSource.PRICED
    assert cost_of(figures, None, "other", {"m": price}) == (None, CostSource.UNKNOWN)
    assert cost_of(figures, None, None, {"m": price}) == (None, CostSource.UNKNOWN)
    assert cost_of(figures, None, "m", {}, in_turn_total=True) == (None, CostSource.REPORTED)


def test_an_unknown_part_makes_the_sum_unknown_never_zero() -> None:
    reported = Totals(calls=1, input_tokens=10, known_cost_nano=5, records=1)
    priced = Totals(calls=1, input_tokens=10, known_cost_nano=7, priced=1, records=1)
    unknown = Totals(calls=1, input_tokens=10, unknown=1, records=1)
    assert (reported.cost_usd, reported.cost_source) == (5e-9, CostSource.REPORTED)
    assert reported.plus(priced).cost_source == CostSource.PRICED and reported.plus(priced).cost_nano == 12
    both = reported.plus(priced).plus(unknown)
    assert (both.cost_usd, both.cost_source, both.input_tokens) == (None, CostSource.UNKNOWN, 30)
    assert (Totals().cost_usd, Totals().cost_source) == (0.0, None)  # nothing spent: zero, and no source


def test_price_tables_in_the_providers_file_are_checked_at_start(tmp_path: Path) -> None:
    assert parse_prices({"m": {"input": 1, "output": 2}}) == {"m": Price(1.0, 2.0)}
    bad = {
        "prices = 3": "must be a table of models",
        "[instances.a.prices.m]\ninput = 1": "needs `input` and `output`",
        "[instances.a.prices.m]\ninput = -1\noutput = 1": "must be a number of USD per million tokens >= 0",
        "[instances.a.prices.m]\ninput = 1\noutput = 1\nreasoning = 1": "unknown key(s) reasoning",
    }
    for body, message in bad.items():
        path = tmp_path / "providers.toml"
        head = '[instances.a]\ndriver = "scripted"\n'
        path.write_text(head + body)
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            load_instances(path)
    path.write_text('[instances.a]\ndriver = "scripted"\n[instances.a.prices.m]\ninput = 1\noutput = 2\n')
    assert load_instances(path)["a"].options["prices"] == {"m": {"input": 1, "output": 2}}  # the twin


def test_the_usage_directive_takes_two_counts_and_an_optional_cost() -> None:
    assert parse("@usage 100 20") == [Usage(100, 20, None)]
    assert parse("@usage 100 20 0.125") == [Usage(100, 20, 0.125)]
    for wrong in (
        "@usage",
        "@usage 1",
        "@usage a 2",
        "@usage 1 2 x",
        "@usage 1 2 -1",
        "@usage 1 2 3 4",
        "@usage 1 2 nan",
    ):
        with pytest.raises(DirectiveError, match="@usage"):
            parse(wrong)


def test_codex_reports_each_response_once_by_its_running_total() -> None:
    """Codex 0.171 sends `thread/tokenUsage/updated` after each model response: `last` is the call, `total` the
    thread's sum so far. Each becomes one report; the same notification again is the same call."""
    translator = Translator(lambda text: text)
    messages = _lines("codex-run.jsonl")
    reports = [e for m in messages for e in translator.translate(m) if isinstance(e, ev.UsageReported)]
    turn = next(m["params"]["turn"]["id"] for m in messages if m.get("method") == "turn/started")
    assert [(r.native_turn, r.call_ref, r.figures, r.cost_usd) for r in reports] == [
        (turn, f"{turn}/150", CODEX_CALL, None),
        (turn, f"{turn}/300", CODEX_CALL, None),
    ]
    again = next(m for m in messages if m.get("method") == "thread/tokenUsage/updated")
    assert [e.call_ref for e in translator.translate(again) if isinstance(e, ev.UsageReported)] == [f"{turn}/150"]


def _claude(lines: list[dict[str, Any]], new_process_at: int | None = None) -> list[ev.ProviderEvent]:
    """The recorded lines through the claude driver's translation, as its runtime feeds them; at line
    `new_process_at` a new process starts (the runtime gives it a fresh meter)."""
    tr = ThreadTranslator("session")
    tr.turn = "T"
    out: list[ev.ProviderEvent] = []
    for index, message in enumerate(lines):
        if index == new_process_at:
            tr.meter = Meter("session")
        kind = message.get("type")
        if kind == "stream_event":
            out += tr.on_stream(message)
        elif kind == "assistant":
            out += tr.on_assistant(message)
        elif kind == "user" and not message.get("isReplay"):
            out += tr.on_user(message)
        elif kind == "result":
            out += tr.meter.result("T", message)
    return out


def test_claude_reports_each_main_call_once_with_its_final_output_and_the_subagent_on_its_own_turn() -> None:
    events = _claude(_lines("claude-agent.jsonl"))
    reports = [e for e in events if isinstance(e, ev.UsageReported)]
    agent = next(e for e in events if isinstance(e, ev.ItemStarted) and e.kind == "subagent")
    child = agent.detail["childTurnId"]
    calls = [(r.native_turn, r.figures, r.cost_in_turn_total) for r in reports if r.cost_usd is None]
    # two main-loop calls (not one per content block, not with the provisional output of 1), the subagent's
    assert sorted(calls) == sorted([("T", CLAUDE_CALL, True), ("T", CLAUDE_CALL, True), (child, CLAUDE_CALL, True)])
    (total,) = [r for r in reports if r.cost_usd is not None]
    result = next(m for m in _lines("claude-agent.jsonl") if m.get("type") == "result")
    assert total.cost_usd == pytest.approx(result["total_cost_usd"])
    assert total.figures == Figures()  # every token was already reported call by call
    assert total.model == "claude-sonnet-4-5" and not total.cost_in_turn_total
    assert len({r.call_ref for r in reports}) == len(reports)


def test_claude_costs_are_cumulative_in_a_process_and_reported_as_each_querys_difference() -> None:
    lines = _lines("claude-turns.jsonl")
    results = [i for i, m in enumerate(lines) if m.get("type") == "result"]
    # The recording: queries 1 and 2 in one process, query 3 in a second process (resume).
    reports = [e for e in _claude(lines, results[1] + 1) if isinstance(e, ev.UsageReported)]
    costs = [r.cost_usd for r in reports if r.cost_usd is not None]
    tokens = Figures(*(sum(column) for column in zip(*(_astuple(r.figures) for r in reports), strict=True)))
    one = lines[results[0]]["total_cost_usd"]
    assert costs == pytest.approx([one, lines[results[1]]["total_cost_usd"] - one, lines[results[2]]["total_cost_usd"]])
    # 1 + 3 calls in the first process (the second query's subagent included), 1 in the second
    assert tokens == Figures(*(5 * x for x in _astuple(CLAUDE_CALL)))


def _astuple(f: Figures) -> tuple[int, ...]:
    return (f.input, f.cached_input, f.cache_write, f.output, f.reasoning)

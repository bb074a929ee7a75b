"""Secrets are redacted from driver events even when a stream splits them across deltas."""

from __future__ import annotations

from threadloom.providers.agent_cli import StreamRedactor
from threadloom.providers.contract import ItemCompleted, OutputDelta, ProviderEvent, TextDelta, TurnCompleted

SECRET = "sk-live-0123456789abcdef"


def _stream(redactor: StreamRedactor, events: list[ProviderEvent]) -> str:
    out = []
    for event in events:
        for emitted in redactor.events(event):
            if isinstance(emitted, OutputDelta | TextDelta):
                out.append(emitted.delta)
    return "".join(out)


def _chunks(text: str, size: int) -> list[ProviderEvent]:
    return [OutputDelta("t", "u", "i", text[k : k + size]) for k in range(0, len(text), size)]


def test_a_secret_cut_anywhere_is_redacted_and_nothing_else_is_lost() -> None:
    text = f"before {SECRET} middle {SECRET[:5]} after {SECRET}"
    expected = text.replace(SECRET, "***")
    for size in range(1, len(text) + 1):
        redactor = StreamRedactor((SECRET,))
        done = ItemCompleted("t", "u", "i", "tool_call", "completed", detail={"output": text})
        got = _stream(redactor, [*_chunks(text, size), done])
        assert got == expected, size


def test_tails_are_flushed_by_the_turn_end_and_by_flush() -> None:
    redactor = StreamRedactor((SECRET,))
    assert _stream(redactor, [TextDelta("t", "u", "m", "hello")]) == "hello"  # no secret starts here: not held
    held = _stream(redactor, [TextDelta("t", "u", "m", " and sk-li")])
    assert held == " and "  # the tail could begin the secret: kept back
    assert _stream(redactor, [TurnCompleted("t", "u", "completed")]) == "sk-li"
    assert _stream(redactor, [OutputDelta("t", "u", "x", "sk-")]) == ""
    assert [e.delta for e in redactor.flush() if isinstance(e, OutputDelta)] == ["sk-"]


def test_completed_items_are_redacted_whole() -> None:
    redactor = StreamRedactor((SECRET,))
    [done] = redactor.events(ItemCompleted("t", "u", "i", "tool_call", "completed", detail={"output": SECRET}))
    assert isinstance(done, ItemCompleted)
    assert done.detail == {"output": "***"}

"""`@recall`: the conversation the agent holds for a thread, one entry per line.

Tests and users compare it with what Threadloom believes the agent knows (after a fork, a rollback or a
provider switch), so the format is exact and documented (docs/scripted-agent.md, "Recall"): `<kind>: <text>`
with the text escaped so a multi-line message or handoff stays on one line.
"""

from __future__ import annotations

from collections.abc import Iterable

from threadloom.agent.state import ContextEntry, TurnRecord


def escape(text: str) -> str:
    """`\\` → `\\\\`, newline → `\\n`, carriage return → `\\r`: one entry, one line, and reversible."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")


def line(entry: ContextEntry) -> str:
    return f"{entry.kind}: {escape(entry.text)}"


def render(turns: Iterable[TurnRecord]) -> str:
    """Every entry of every turn, in order, one per line."""
    return "\n".join(line(entry) for turn in turns for entry in turn.context)

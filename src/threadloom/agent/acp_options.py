"""What the ACP face offers, and the deliberate lies and faults that make a client's fallbacks testable.

A feature can be *without* (not advertised, its method answers -32601, as for an agent that never had it) or
a *lie* (advertised in `initialize`, yet its method answers -32601, as agents do: the probe must catch it).
"""

from __future__ import annotations

import dataclasses

# Feature name -> the method it serves (None: a behaviour, not a method).
FEATURES: dict[str, str | None] = {
    "load": "session/load",
    "resume": "session/resume",
    "list": "session/list",
    "close": "session/close",
    "fork": "session/fork",
    "config": "session/set_config_option",
    "steering": "_session/steering",
    "rewind": "_session/rewind",
    "files-revert": "_session/files/revert",
    "cancel-request": "$/cancel_request",
    "elicitation": None,
}
# Faults: `orphan-updates` sends `tool_call_update`s without their `tool_call`; `huge-line` sends one
# `agent_thought_chunk` of `huge_line_bytes` at the start of every prompt; `trailing-usage` sends the prompt's
# `usage_update` after its response instead of before.
FAULTS = ("orphan-updates", "huge-line", "trailing-usage")
HUGE_LINE_BYTES = 8 * 1024 * 1024
MODELS = ("scripted-fast", "scripted-deep")
CONTEXT_WINDOW = 200_000


@dataclasses.dataclass(frozen=True, slots=True)
class AcpOptions:
    without: frozenset[str] = frozenset()
    lies: frozenset[str] = frozenset()
    faults: frozenset[str] = frozenset()
    huge_line_bytes: int = HUGE_LINE_BYTES
    models: tuple[str, ...] = MODELS

    def advertised(self, feature: str) -> bool:
        return feature not in self.without

    def serves(self, feature: str) -> bool:
        return feature not in self.without and feature not in self.lies

    def served_method(self, method: str) -> bool:
        """False for the method of a feature turned off or lied about."""
        for feature, name in FEATURES.items():
            if name == method:
                return self.serves(feature)
        return True


def names(text: str, allowed: tuple[str, ...]) -> frozenset[str]:
    """A comma-separated list of names, each one of `allowed`; raises `ValueError` naming an unknown one."""
    chosen = frozenset(part.strip() for part in text.split(",") if part.strip())
    unknown = sorted(chosen - set(allowed))
    if unknown:
        raise ValueError(f"unknown {', '.join(unknown)} (known: {', '.join(allowed)})")
    return chosen

"""The directive language: a user message becomes a typed script before anything runs.

Parsing the whole message up front means a typo (`@repy`) fails the turn before any side effect happens,
instead of half-running a script.
"""

from __future__ import annotations

import math
import re

from threadloom.agent.records import record


@record
class Reply:
    text: str


@record
class Delay:
    ms: int


@record
class Await:
    """`@await PATH`: a gate a test opens by creating PATH in the cwd, instead of a timer it must outrun."""

    path: str


@record
class AwaitSteer:
    """`@await-steer`: the turn stays where it is until a steering message has reached it."""


@record
class Tool:
    command: str


@record
class Write:
    path: str
    text: str


@record
class Approval:
    command: str


@record
class Ask:
    question: str
    options: tuple[str, ...]


@record
class Todo:
    steps: tuple[str, ...]


@record
class Plan:
    text: str


@record
class Subagent:
    prompt: str


@record
class Recall:
    """Reply with the conversation the agent holds for this thread (agent/recall.py)."""


@record
class Usage:
    """`@usage IN OUT [COST_USD]`: one model call with exactly these figures (no cost: the cost is unknown)."""

    input: int
    output: int
    cost_usd: float | None = None


@record
class UsageAgain:
    """`@usage-again`: the turn's last usage report sent once more, as it was (same call): a provider that
    reports a call twice, which must still be one call in the ledger."""


@record
class Fail:
    message: str


@record
class Approvals:
    """`@approvals A | B`: asks for every command at once (the requests are all outstanding together), then runs
    the accepted ones in order."""

    commands: tuple[str, ...]


@record
class Stop:
    """`@stop REASON`: ends the turn the way a model stops on its own (`refusal`, `max_tokens`,
    `max_turn_requests`); the ACP face answers the prompt with that stop reason."""

    reason: str


@record
class Config:
    """`@config ID VALUE`: the agent changes one of its session's config options on its own (ACP face)."""

    option: str
    value: str


@record
class Crash:
    once: bool = False  # `@crash once`: only the first time this thread gets here (a retried turn goes on)


Directive = (
    Reply
    | Delay
    | Await
    | AwaitSteer
    | Tool
    | Write
    | Approval
    | Approvals
    | Ask
    | Todo
    | Plan
    | Subagent
    | Recall
    | Usage
    | Stop
    | Config
    | UsageAgain
    | Fail
    | Crash
)

STOP_REASONS = ("refusal", "max_tokens", "max_turn_requests")


_LINE = re.compile(r"@(\S*)\s*(.*)", re.DOTALL)


class DirectiveError(ValueError):
    """A line that starts with `@` but is not a well-formed directive."""


def parse(message: str) -> list[Directive]:
    """The message's directives in order; a message without any is an echo (`You said: …`).

    Lines that do not start with `@` are the prompt and do not run.
    """
    return _directives(message) or [Reply(f"You said: {message.strip()}")]


def parse_steer(text: str) -> list[Directive]:
    """A steering message's directives; plain text is acknowledged with `Steered: <text>`."""
    return _directives(text) or [Reply(f"Steered: {text.strip()}")]


def chunks(text: str) -> list[str]:
    """One word per chunk with its surrounding whitespace kept, so the chunks join back to `text` exactly."""
    parts = re.findall(r"\s*\S+\s*", text)
    if not parts and text:
        return [text]
    return parts


def _directives(message: str) -> list[Directive]:
    directives: list[Directive] = []
    for number, raw in enumerate(message.splitlines(), start=1):
        line = raw.strip()
        if not line.startswith("@"):
            continue
        match = _LINE.fullmatch(line)
        if match is None:
            continue
        try:
            directives.append(_directive(match[1], match[2]))
        except DirectiveError as exc:
            raise DirectiveError(f"line {number}: {exc}") from None
    return directives


def _directive(name: str, arg: str) -> Directive:
    match name:
        case "reply":
            return Reply(arg)
        case "delay":
            if not (arg.isascii() and arg.isdigit()):
                raise DirectiveError(f"@delay needs a whole number of milliseconds, got {arg!r}")
            return Delay(int(arg))
        case "await":
            return Await(_required(name, arg, "a path"))
        case "await-steer":
            if arg:
                raise DirectiveError(f"@await-steer takes no argument, got {arg!r}")
            return AwaitSteer()
        case "tool":
            return Tool(_required(name, arg, "a command"))
        case "write":
            path, _, text = _required(name, arg, "a path").partition(" ")
            return Write(path, text.strip())
        case "approval":
            return Approval(_required(name, arg, "a command"))
        case "approvals":
            commands = tuple(part.strip() for part in arg.split("|") if part.strip())
            if not commands:
                raise DirectiveError("@approvals needs at least one command")
            return Approvals(commands)
        case "usage":
            return usage(arg)
        case "stop":
            if arg not in STOP_REASONS:
                raise DirectiveError(f"@stop needs one of {', '.join(STOP_REASONS)}, got {arg!r}")
            return Stop(arg)
        case "config":
            option, _, value = arg.partition(" ")
            if not option or not value.strip():
                raise DirectiveError("@config needs an option id and a value")
            return Config(option, value.strip())
        case "ask":
            question, *options = (part.strip() for part in _required(name, arg, "a question").split("|"))
            if not question:
                raise DirectiveError("@ask needs a question")
            return Ask(question, tuple(option for option in options if option))
        case "todo":
            steps = tuple(step.strip() for step in arg.split(";") if step.strip())
            if not steps:
                raise DirectiveError("@todo needs at least one step")
            return Todo(steps)
        case "plan":
            return Plan(arg)
        case "subagent":
            return Subagent(_required(name, arg, "a prompt"))
        case "recall":
            if arg:
                raise DirectiveError(f"@recall takes no argument, got {arg!r}")
            return Recall()
        case "usage":
            return usage(arg)
        case "usage-again":
            if arg:
                raise DirectiveError(f"@usage-again takes no argument, got {arg!r}")
            return UsageAgain()
        case "fail":
            return Fail(arg or "failed")
        case "crash":
            if arg not in ("", "once"):
                raise DirectiveError(f"@crash takes nothing or `once`, got {arg!r}")
            return Crash(once=arg == "once")
        case _:
            raise DirectiveError(f"unknown directive @{name}")


def usage(arg: str) -> Usage:
    """`IN OUT [COST_USD]`: two whole token counts and an optional cost in USD (a decimal >= 0)."""
    parts = arg.split()
    if len(parts) not in (2, 3) or not all(p.isascii() and p.isdigit() for p in parts[:2]):
        raise DirectiveError(f"@usage needs IN OUT [COST_USD] (whole token counts), got {arg!r}")
    cost: float | None = None
    if len(parts) == 3:
        try:
            cost = float(parts[2])
        except ValueError:
            cost = -1.0
        if not (math.isfinite(cost) and cost >= 0):
            raise DirectiveError(f"@usage cost must be a number of USD >= 0, got {parts[2]!r}")
    return Usage(int(parts[0]), int(parts[1]), cost)


def _required(name: str, arg: str, what: str) -> str:
    if not arg:
        raise DirectiveError(f"@{name} needs {what}")
    return arg

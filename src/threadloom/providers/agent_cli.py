"""Finding an agent CLI and building the environment it runs in.

The CLIs are pinned npm dependencies of this repository (package.json; `npm ci`), so
they are looked up in `node_modules/.bin` next to the project before PATH. A missing
CLI is a `ProviderError` with code `cli_missing` that names the install command.

Agent processes get a small environment: the basics a CLI needs, the API-key variable
the instance names, and the instance's own variables. The server's other secrets
(database URL, tokens) never reach an agent.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from threadloom.providers.contract import (
    ItemCompleted,
    OutputDelta,
    ProviderError,
    ProviderEvent,
    RuntimeExited,
    TextDelta,
    ThreadSettings,
    TurnCompleted,
)

PASSED_THROUGH = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "TMPDIR", "TERM", "USER", "LOGNAME", "SHELL")


def _node_bin_dirs() -> list[Path]:
    """`node_modules/.bin` in the working directory and above the installed package, nearest first."""
    seen: list[Path] = []
    for start in (Path.cwd(), Path(__file__).resolve().parent):
        for folder in (start, *start.parents):
            candidate = folder / "node_modules" / ".bin"
            if candidate.is_dir() and candidate not in seen:
                seen.append(candidate)
    return seen


def find_cli(name: str, configured: str | None, package: str) -> str:
    """The executable for `name`: the configured path or name, else node_modules/.bin, else PATH."""
    if configured:
        path = Path(configured)
        if path.is_absolute() or os.sep in configured:
            if path.is_file() and os.access(path, os.X_OK):
                return str(path)
            raise ProviderError("cli_missing", f"{name} CLI not found at {configured}")
        found = shutil.which(configured)
        if found:
            return found
        raise ProviderError("cli_missing", f"{name} CLI {configured!r} is not on PATH")
    for folder in _node_bin_dirs():
        candidate = folder / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which(name)
    if found:
        return found
    raise ProviderError(
        "cli_missing",
        f"the {name} CLI is not installed: run `npm ci` in the Threadloom checkout (it installs the pinned "
        f"{package}), or set `binary` for this provider instance",
    )


@dataclasses.dataclass(frozen=True, slots=True)
class CliOptions:
    """The options every agent-CLI instance takes, read once: `binary` (path or name; None: the pinned
    one in node_modules, then PATH), `model`, `base_url`, `api_key_env` (the server variable holding
    the key) and `env` (extra variables for the CLI)."""

    binary: str | None
    model: str | None
    base_url: str | None
    api_key_env: str
    env: dict[str, str]

    @classmethod
    def parse(cls, options: Mapping[str, Any], default_key_env: str) -> CliOptions:
        return cls(
            binary=str(options["binary"]) if options.get("binary") else None,
            model=str(options["model"]) if options.get("model") else None,
            base_url=str(options["base_url"]) if options.get("base_url") else None,
            api_key_env=str(options.get("api_key_env") or default_key_env),
            env={str(k): str(v) for k, v in (options.get("env") or {}).items()},
        )


def permitted(settings: ThreadSettings, allow_full_access: bool) -> ThreadSettings:
    """`settings` with `full_access` lowered to `workspace_write` unless the instance allows it.

    Thread creation already refuses `full_access` on such an instance; this covers threads made
    before an admin took the permission away, so a driver never opens its sandbox on its own.
    """
    if settings.runtime_mode == "full_access" and not allow_full_access:
        return dataclasses.replace(settings, runtime_mode="workspace_write")
    return settings


def child_env(api_key_env: str | None, extra: Mapping[str, str], *, require_key: bool = True) -> dict[str, str]:
    """The environment of an agent process (see module docstring)."""
    env = {k: v for k, v in os.environ.items() if k in PASSED_THROUGH or k.startswith("LC_")}
    if api_key_env:
        value = os.environ.get(api_key_env)
        if value is None and require_key:
            raise ProviderError("missing_api_key", f"environment variable {api_key_env} is not set")
        if value is not None:
            env[api_key_env] = value
    env.update(extra)
    return env


def redact(text: str, env: Mapping[str, str], names: tuple[str, ...]) -> str:
    """`text` with the values of the named variables replaced, for log lines and errors."""
    for name in names:
        value = env.get(name)
        if value and len(value) >= 4:
            text = text.replace(value, "***")
    return text


MIN_SECRET = 6  # shorter values (ports, counts) would blank ordinary output
STREAM_HOLD = 64  # characters kept back at the end of every stream of a driver holding secrets


def driver_secrets(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
    """The values of the named variables of an agent's environment `env` (its API key and its instance's
    `env` table): the only secrets an agent's output is redacted of, longest first.

    Only what the agent process holds. The server's own secrets (database and broadcast URLs, tokens)
    never reach an agent (`child_env`), so the agent cannot print them by itself; redacting them anyway
    would only tell whoever makes the agent echo guesses which guess was right (a guess turning into
    `***`): an oracle for the server's secrets. A driver with no secret variables (the scripted agent)
    redacts nothing.
    """
    own = {env[name] for name in names if len(env.get(name) or "") >= MIN_SECRET}
    return tuple(sorted(own, key=len, reverse=True))


def secret_redactor(secrets: tuple[str, ...]) -> Callable[[str], str]:
    """A function replacing each of `secrets` (longest first) with `***`."""

    def redactor(text: str) -> str:
        for value in secrets:
            if value in text:
                text = text.replace(value, "***")
        return text

    return redactor


def _pieces(secret: str, size: int) -> list[str]:
    """`secret` cut into consecutive pieces of at most `size` characters, their lengths within one of each
    other (no short last piece that ordinary text could contain)."""
    count = -(-len(secret) // size)
    base, extra = divmod(len(secret), count)
    pieces, start = [], 0
    for k in range(count):
        end = start + base + (1 if k < extra else 0)
        pieces.append(secret[start:end])
        start = end
    return pieces


_TEXT_FIELDS = ("delta", "text", "message", "error", "title", "reason")
_TREE_FIELDS = ("detail", "payload", "items")


def _redact_tree(value: Any, redactor: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return redactor(value)
    if isinstance(value, dict):
        return {k: _redact_tree(v, redactor) for k, v in value.items()}
    if isinstance(value, list):
        return [_redact_tree(v, redactor) for v in value]
    return value


class StreamRedactor:
    """Redacts secrets from a driver's events, also when a secret is split across streamed deltas.

    Each item's stream keeps back a tail of fixed length (`STREAM_HOLD` characters; none for a driver
    without secrets) until more text pushes it out or the item ends (its completion, its turn's end, the
    runtime's exit or `flush` release it, redacted). What is emitted, and when, depends only on the lengths
    of the deltas, never on what they say: a tail is not kept longer because it could begin a secret, so a
    watcher cannot tell a guessed prefix from any other text. A secret longer than the tail is redacted as
    consecutive pieces no longer than the tail plus one and more than half of it (each becomes `***`, and
    each is confirmed only when typed whole, like a short secret), so no part of it passes the cut before
    it is whole. An exact secret still becomes `***`: the agent printing it held it anyway.
    """

    def __init__(self, secrets: tuple[str, ...]) -> None:
        size = STREAM_HOLD + 1
        pieces = {piece for secret in secrets for piece in (_pieces(secret, size) if len(secret) > size else [secret])}
        self._pieces = tuple(sorted(pieces, key=len, reverse=True))
        self.text = secret_redactor((*(s for s in secrets if len(s) > size), *self._pieces))
        self._hold = STREAM_HOLD if secrets else 0
        self._pending: dict[tuple[str, str], TextDelta | OutputDelta] = {}  # (thread, item) -> raw held tail

    def _cut(self, text: str) -> int:
        """Where to split `text` into what is emitted now and what is kept: `_hold` characters from its
        end, moved past any whole secret piece it would cut in two. Every piece is at most `_hold` + 1 long,
        so a piece crossing that point is already whole in `text`, and moving past it reveals nothing that
        `***` does not."""
        cut = len(text) - self._hold
        if cut <= 0:
            return 0
        moved = True
        while moved:  # overlapping secrets can move it more than once
            moved = False
            for piece in self._pieces:
                at = text.find(piece, max(0, cut - len(piece) + 1))
                if 0 <= at < cut < at + len(piece):
                    cut, moved = at + len(piece), True
        return cut

    def events(self, event: ProviderEvent) -> list[ProviderEvent]:
        """What to emit for `event`: nothing (all kept back), the redacted event, or held tails then it."""
        if isinstance(event, TextDelta | OutputDelta):
            key = (event.native_thread, event.item_id)
            held = self._pending.pop(key, None)
            joined = (held.delta if held is not None else "") + event.delta
            cut = self._cut(joined)
            if cut < len(joined):
                self._pending[key] = dataclasses.replace(event, delta=joined[cut:])
            return [dataclasses.replace(event, delta=self.text(joined[:cut]))] if cut > 0 else []
        flushed: list[ProviderEvent] = []
        if isinstance(event, ItemCompleted):
            flushed = self._flush(lambda key: key == (event.native_thread, event.item_id))
        elif isinstance(event, TurnCompleted):
            flushed = self._flush(lambda key: key[0] == event.native_thread)
        elif isinstance(event, RuntimeExited):
            flushed = self._flush(lambda key: True)
        return [*flushed, redact_event(event, self.text)]

    def flush(self) -> list[ProviderEvent]:
        """Every held tail, redacted (the stream ends)."""
        return self._flush(lambda key: True)

    def _flush(self, which: Callable[[tuple[str, str]], bool]) -> list[ProviderEvent]:
        keys = [key for key in self._pending if which(key)]
        tails = [self._pending.pop(key) for key in keys]
        return [dataclasses.replace(tail, delta=self.text(tail.delta)) for tail in tails if tail.delta]


def storable(text: str) -> str:
    """`text` with each NUL replaced by U+FFFD: PostgreSQL's text and jsonb cannot hold NUL, and a tool
    printing binary (`cat /proc/1/environ`) must not make its turn's events unwritable."""
    return text.replace("\x00", "\ufffd") if "\x00" in text else text


def redact_event(event: ProviderEvent, redactor: Callable[[str], str]) -> ProviderEvent:
    """The event with every text it carries passed through `redactor`.

    Agents can print what their environment holds (a tool running `env`), so a driver
    redacts its instance's secrets from everything it emits, not only from its stderr.
    A secret split across two streamed deltas is not caught here: `StreamRedactor` does that.
    """
    changes: dict[str, Any] = {}
    for field in _TEXT_FIELDS:
        value = getattr(event, field, None)
        if isinstance(value, str):
            cleaned = redactor(value)
            if cleaned != value:
                changes[field] = cleaned
    for field in _TREE_FIELDS:
        value = getattr(event, field, None)
        if value:
            cleaned_tree = _redact_tree(value, redactor)
            if cleaned_tree != value:
                changes[field] = cleaned_tree
    return dataclasses.replace(event, **changes) if changes else event

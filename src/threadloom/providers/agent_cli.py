"""Finding an agent CLI and building the environment it runs in.

The CLIs are pinned npm dependencies of this repository (package.json; `npm ci`), so
they are looked up in `node_modules/.bin` next to the project before PATH. A missing
CLI is a `ProviderError` with code `cli_missing` that names the install command.

Agent processes get a small environment: the basics a CLI needs, the API-key variable
the instance names, and the instance's own variables. The server's other secrets
(database URL, tokens) never reach an agent.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import shutil
import urllib.parse
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


# Names of variables whose values are secrets wherever they appear (tokens, keys, passwords).
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|CREDENTIAL|PRIVATE_KEY|AUTH", re.IGNORECASE)
_SERVER_URLS = ("DATABASE_URL", "BROADCAST_URL")
MIN_SECRET = 6  # shorter values (ports, counts) would blank ordinary output


def known_secrets(api_key_env: str | None = None, extra: Mapping[str, str] | None = None) -> tuple[str, ...]:
    """Every secret value an agent's output must never carry into the log, longest first.

    The instance's API key and its `env` table, the server's database and broadcast URLs (and
    their passwords alone), and any server variable whose name says it holds a secret (a token,
    key or password) and whose value is not just a number. One list for every driver.
    """
    env = os.environ
    values: set[str] = set()
    if api_key_env and env.get(api_key_env):
        values.add(env[api_key_env])
    values.update(v for v in (extra or {}).values() if v)
    for name in _SERVER_URLS:
        url = env.get(name)
        if not url or "://" not in url or url.startswith("memory://"):
            continue
        values.add(url)
        with contextlib.suppress(ValueError):
            password = urllib.parse.urlsplit(url).password
            if password:
                values.update({password, urllib.parse.unquote(password)})
    for name, value in env.items():
        if _SECRET_NAME.search(name) and value and not value.isdigit():
            values.add(value)
    return tuple(sorted((v for v in values if len(v) >= MIN_SECRET), key=len, reverse=True))


def driver_secrets(env: Mapping[str, str], names: tuple[str, ...]) -> tuple[str, ...]:
    """The values of a driver's own secret variables (in its child's `env`) plus `known_secrets()`."""
    own = {env[name] for name in names if len(env.get(name) or "") >= MIN_SECRET}
    return tuple(sorted(own | set(known_secrets()), key=len, reverse=True))


def secret_redactor(secrets: tuple[str, ...]) -> Callable[[str], str]:
    """A function replacing each of `secrets` (longest first) with `***`."""

    def redactor(text: str) -> str:
        for value in secrets:
            if value in text:
                text = text.replace(value, "***")
        return text

    return redactor


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

    Each item's streamed text keeps back only its tail that could be the start of a secret, until
    the next delta joins it (then a secret cut in two is whole again and replaced) or the item ends
    (then the tail is flushed: it cannot hold a whole secret). Ordinary output is not delayed.
    """

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.text = secret_redactor(secrets)
        self._secrets = secrets
        self._hold = max((len(s) for s in secrets), default=1) - 1
        self._pending: dict[tuple[str, str], TextDelta | OutputDelta] = {}  # (thread, item) -> held tail

    def _held(self, text: str) -> int:
        """The length of the longest tail of `text` that begins some secret."""
        for size in range(min(len(text), self._hold), 0, -1):
            tail = text[-size:]
            if any(secret.startswith(tail) for secret in self._secrets):
                return size
        return 0

    def events(self, event: ProviderEvent) -> list[ProviderEvent]:
        """What to emit for `event`: nothing (all held back), the redacted event, or a flush then it."""
        if isinstance(event, TextDelta | OutputDelta):
            key = (event.native_thread, event.item_id)
            held = self._pending.pop(key, None)
            joined = self.text((held.delta if held is not None else "") + event.delta)
            cut = len(joined) - self._held(joined)
            if cut < len(joined):
                self._pending[key] = dataclasses.replace(event, delta=joined[cut:])
            return [dataclasses.replace(event, delta=joined[:cut])] if cut > 0 else []
        flushed: list[ProviderEvent] = []
        if isinstance(event, ItemCompleted):
            tail = self._pending.pop((event.native_thread, event.item_id), None)
            flushed = [tail] if tail is not None and tail.delta else []
        elif isinstance(event, TurnCompleted):
            flushed = self._flush(lambda key: key[0] == event.native_thread)
        elif isinstance(event, RuntimeExited):
            flushed = self._flush(lambda key: True)
        return [*flushed, redact_event(event, self.text)]

    def flush(self) -> list[ProviderEvent]:
        """Every held tail (the stream ends)."""
        return self._flush(lambda key: True)

    def _flush(self, which: Callable[[tuple[str, str]], bool]) -> list[ProviderEvent]:
        keys = [key for key in self._pending if which(key)]
        tails = [self._pending.pop(key) for key in keys]
        return [tail for tail in tails if tail.delta]


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

"""Provider instances from configuration.

`scripted`, `codex` and `claude` exist with no configuration at all (the real CLIs only
start on first use, and need their API-key variable then). More instances, or other
options for these, come from a TOML file named by `THREADLOOM_PROVIDERS`
(see docs/providers.md):

    [instances.scripted-slow]
    driver = "scripted"
    chunk_delay_ms = 20
    supports_active_steering = false

    [instances.codex]
    driver = "codex"
    model = "gpt-5.5"
    api_key_env = "OPENAI_API_KEY"

    [instances.gemini]
    driver = "acp"
    command = ["gemini", "--experimental-acp"]

Threads default to the `workspace_write` runtime mode (sandboxed to the project's workspace).
`full_access` is accepted only on an instance whose configuration says `allow_full_access = true`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from threadloom.domain.usage import parse_prices
from threadloom.providers.acp.driver import OPTIONS as ACP_OPTIONS
from threadloom.providers.acp.driver import AcpDriver, check_options
from threadloom.providers.claude import ClaudeDriver
from threadloom.providers.codex import CodexDriver
from threadloom.providers.contract import ProviderDriver
from threadloom.providers.scripted import ScriptedDriver

DEFAULT_INSTANCES: dict[str, dict[str, Any]] = {
    "scripted": {"driver": "scripted", "allow_full_access": False},
    "codex": {"driver": "codex"},
    "claude": {"driver": "claude"},
}


# Read by the engine (and, for allow_full_access, by the drivers that map it to their sandbox).
ENGINE_OPTIONS = frozenset(
    {
        "restart_as",
        "interrupt_unsupported",
        "idle_timeout_s",
        "allow_full_access",
        "crash_retries",
        "crash_retry_backoff_s",
        "recovery_retries",
        "recovery_backoff_s",
        "handoff_max_runs_behind",
        "handoff_max_deltas",
        "prices",
    }
)
_CLI_OPTIONS = frozenset({"binary", "model", "base_url", "api_key_env", "env"})
DRIVER_OPTIONS: dict[str, frozenset[str]] = {
    "scripted": frozenset(
        {
            "chunk_delay_ms",
            "supports_active_steering",
            "supports_interrupt",
            "supports_structured_questions",
            "supports_native_fork",
            "supports_native_rollback",
            "reports_cost",
        }
    ),
    "codex": _CLI_OPTIONS | {"collab_agents"},
    "claude": _CLI_OPTIONS,
    "acp": ACP_OPTIONS,
}


@dataclasses.dataclass(frozen=True, slots=True)
class InstanceConfig:
    id: str
    driver: str
    options: dict[str, Any]
    eager_thread: bool = False


class ConfigError(ValueError):
    pass


def load_instances(path: Path | None) -> dict[str, InstanceConfig]:
    raw: dict[str, dict[str, Any]] = {k: dict(v) for k, v in DEFAULT_INSTANCES.items()}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as error:
            raise ConfigError(f"cannot read provider configuration {path}: {error}") from error
        for name, options in (data.get("instances") or {}).items():
            if not isinstance(options, dict) or "driver" not in options:
                raise ConfigError(f"provider instance {name!r} needs a driver")
            raw[name] = dict(options)
    out: dict[str, InstanceConfig] = {}
    for name, options in raw.items():
        driver = str(options.pop("driver"))
        eager = bool(options.pop("eager_thread", False))
        if driver not in DRIVERS:
            raise ConfigError(f"provider instance {name!r}: unknown driver {driver!r}")
        unknown = sorted(set(options) - ENGINE_OPTIONS - DRIVER_OPTIONS[driver])
        if unknown:
            raise ConfigError(f"provider instance {name!r}: unknown option(s) {', '.join(unknown)} for {driver!r}")
        idle = options.get("idle_timeout_s", 0)
        if isinstance(idle, bool) or not isinstance(idle, int | float) or idle < 0:
            raise ConfigError(f"provider instance {name!r}: `idle_timeout_s` must be a number of seconds >= 0")
        retries = options.get("crash_retries", 0)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
            raise ConfigError(f"provider instance {name!r}: `crash_retries` must be a whole number from 0 to 10")
        backoff = options.get("crash_retry_backoff_s", 0.5)
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not 0 <= backoff <= 60:
            raise ConfigError(f"provider instance {name!r}: `crash_retry_backoff_s` must be 0 to 60 seconds")
        retries = options.get("recovery_retries", 0)
        if isinstance(retries, bool) or not isinstance(retries, int) or not 0 <= retries <= 10:
            raise ConfigError(f"provider instance {name!r}: `recovery_retries` must be a whole number from 0 to 10")
        backoff = options.get("recovery_backoff_s", 0)
        if isinstance(backoff, bool) or not isinstance(backoff, int | float) or not 0 <= backoff <= 60:
            raise ConfigError(f"provider instance {name!r}: `recovery_backoff_s` must be 0 to 60 seconds")
        for limit in ("handoff_max_runs_behind", "handoff_max_deltas"):
            value = options.get(limit, 1)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"provider instance {name!r}: `{limit}` must be a whole number >= 1")
        for flag in ("allow_full_access", "collab_agents"):
            if not isinstance(options.get(flag, False), bool):
                raise ConfigError(f"provider instance {name!r}: `{flag}` must be true or false")
        try:
            parse_prices(options.get("prices"))
        except ValueError as error:
            raise ConfigError(f"provider instance {name!r}: {error}") from None
        env = options.get("env", {})
        if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
            raise ConfigError(f"provider instance {name!r}: `env` must be a table of strings")
        if driver == "acp" and (problem := check_options(name, options)) is not None:
            raise ConfigError(problem)
        out[name] = InstanceConfig(name, driver, options, eager)
    return out


def _scripted(config: InstanceConfig, data_dir: Path, agents_dir: Path) -> ProviderDriver:
    # The whole data dir and every agent's state stay invisible to commands, even in a workspace that contains them.
    hidden = (data_dir,) if agents_dir.is_relative_to(data_dir) else (data_dir, agents_dir)
    return ScriptedDriver(config.id, agents_dir / config.id, config.options, hidden=hidden)


def _codex(config: InstanceConfig, data_dir: Path, agents_dir: Path) -> ProviderDriver:
    return CodexDriver(config.id, agents_dir / config.id, config.options)


def _claude(config: InstanceConfig, data_dir: Path, agents_dir: Path) -> ProviderDriver:
    return ClaudeDriver(config.id, agents_dir / config.id, config.options)


def _acp(config: InstanceConfig, data_dir: Path, agents_dir: Path) -> ProviderDriver:
    return AcpDriver(config.id, agents_dir / config.id, config.options)


DRIVERS = {"scripted": _scripted, "codex": _codex, "claude": _claude, "acp": _acp}


def full_access_instances(instances: dict[str, InstanceConfig]) -> frozenset[str]:
    """The instances whose admin allowed `full_access` threads."""
    return frozenset(name for name, config in instances.items() if config.options.get("allow_full_access") is True)


def build_driver(config: InstanceConfig, data_dir: Path, agents_dir: Path | None = None) -> ProviderDriver:
    """The instance's driver; its resumable state goes to `agents_dir/<instance>` (`Settings.agents_dir`,
    by default `<data dir>/agents`: a folder every replica must reach, docs/providers.md "Replicas")."""
    return DRIVERS[config.driver](config, data_dir, agents_dir if agents_dir is not None else data_dir / "agents")

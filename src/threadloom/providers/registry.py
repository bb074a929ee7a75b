"""Provider instances from configuration.

A `scripted` instance exists with no configuration at all. More instances come from a
TOML file named by `THREADLOOM_PROVIDERS` (see docs/providers.md):

    [instances.scripted-slow]
    driver = "scripted"
    chunk_delay_ms = 20
    supports_active_steering = false
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from threadloom.providers.contract import ProviderDriver
from threadloom.providers.scripted import ScriptedDriver

DEFAULT_INSTANCES: dict[str, dict[str, Any]] = {"scripted": {"driver": "scripted"}}


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
        out[name] = InstanceConfig(name, driver, options, eager)
    return out


def _scripted(config: InstanceConfig, data_dir: Path) -> ProviderDriver:
    return ScriptedDriver(config.id, data_dir / "agents" / config.id, config.options)


DRIVERS = {"scripted": _scripted}


def build_driver(config: InstanceConfig, data_dir: Path) -> ProviderDriver:
    return DRIVERS[config.driver](config, data_dir)

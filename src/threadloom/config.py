"""Settings from the command line and the environment.

`DATABASE_URL` (external PostgreSQL; absent → embedded server in the data dir),
`THREADLOOM_DATA_DIR`, `BROADCAST_URL`, `THREADLOOM_DEV`, `THREADLOOM_HOST`/`PORT`,
`THREADLOOM_ALLOWED_ORIGINS`, `THREADLOOM_LOG_LEVEL`, `THREADLOOM_PROVIDERS` (provider instances, TOML),
`THREADLOOM_MAX_SUBSCRIPTIONS` (per connection), `THREADLOOM_MAX_REPLAY` (events), `THREADLOOM_SUBSCRIBER_QUEUE`,
`THREADLOOM_MAX_QUERY_COST` (objects per operation), `THREADLOOM_QUERY_TIMEOUT` (seconds per query),
and the per-token limits (`THREADLOOM_MAX_CONNECTIONS_PER_TOKEN`, `THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN`,
`THREADLOOM_MUTATIONS_PER_MINUTE`, `THREADLOOM_MUTATION_BURST`, `THREADLOOM_RUN_STARTS_PER_MINUTE`,
`THREADLOOM_RUN_START_BURST`), and `THREADLOOM_FAST_PATHS` (`0` turns the specialised query and
subscription execution off, for comparison: the output is the same either way). Per-token limits are
counted in each process's memory: with several processes behind a load balancer each one enforces them
on its own share.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    max_depth: int = 12
    max_aliases: int = 30
    max_tokens: int = 5000
    max_body_bytes: int = 256 * 1024
    max_page_size: int = 100
    max_subscriptions_per_connection: int = 100
    max_replay: int = 10_000
    subscriber_queue: int = 1_000
    # Static query cost (objects an operation may return) and execution time per query operation.
    max_query_cost: int = 20_000
    query_timeout: float = 10.0
    # Per token, in this process (docs/security.md, "Limits").
    max_connections_per_token: int = 32
    max_subscriptions_per_token: int = 200
    # Token buckets: `*_per_minute` refill, `*_burst` the bucket's size.
    mutations_per_minute: int = 600
    mutation_burst: int = 300
    run_starts_per_minute: int = 120
    run_start_burst: int = 60


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path
    database_url: str | None
    broadcast_url: str = "memory://"
    host: str = "127.0.0.1"
    port: int = 8000
    dev: bool = False
    allowed_origins: tuple[str, ...] = ()
    log_level: str = "INFO"
    default_provider_instance: str = "scripted"
    providers_file: Path | None = None
    fast_paths: bool = True
    limits: Limits = dataclasses.field(default_factory=Limits)

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        env = os.environ
        values: dict[str, object] = {
            "data_dir": Path(env.get("THREADLOOM_DATA_DIR", ".threadloom")).absolute(),
            "database_url": env.get("DATABASE_URL") or None,
            "broadcast_url": env.get("BROADCAST_URL", "memory://"),
            "host": env.get("THREADLOOM_HOST", "127.0.0.1"),
            "port": int(env.get("THREADLOOM_PORT", "8000")),
            "dev": _flag(env.get("THREADLOOM_DEV")),
            "allowed_origins": tuple(o for o in env.get("THREADLOOM_ALLOWED_ORIGINS", "").split(",") if o),
            "log_level": env.get("THREADLOOM_LOG_LEVEL", "INFO"),
            "providers_file": Path(env["THREADLOOM_PROVIDERS"]) if env.get("THREADLOOM_PROVIDERS") else None,
            "fast_paths": env.get("THREADLOOM_FAST_PATHS", "1").strip().lower() not in {"0", "false", "no", "off"},
        }
        limits = {
            "max_subscriptions_per_connection": env.get("THREADLOOM_MAX_SUBSCRIPTIONS"),
            "max_replay": env.get("THREADLOOM_MAX_REPLAY"),
            "subscriber_queue": env.get("THREADLOOM_SUBSCRIBER_QUEUE"),
            "max_query_cost": env.get("THREADLOOM_MAX_QUERY_COST"),
            "max_connections_per_token": env.get("THREADLOOM_MAX_CONNECTIONS_PER_TOKEN"),
            "max_subscriptions_per_token": env.get("THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN"),
            "mutations_per_minute": env.get("THREADLOOM_MUTATIONS_PER_MINUTE"),
            "mutation_burst": env.get("THREADLOOM_MUTATION_BURST"),
            "run_starts_per_minute": env.get("THREADLOOM_RUN_STARTS_PER_MINUTE"),
            "run_start_burst": env.get("THREADLOOM_RUN_START_BURST"),
        }
        parsed: dict[str, int | float] = {k: int(v) for k, v in limits.items() if v}
        if env.get("THREADLOOM_QUERY_TIMEOUT"):  # seconds, may be fractional
            parsed["query_timeout"] = float(env["THREADLOOM_QUERY_TIMEOUT"])
        values["limits"] = Limits(**parsed)  # type: ignore[arg-type]
        values.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(values["data_dir"], str):
            values["data_dir"] = Path(values["data_dir"]).absolute()
        return cls(**values)  # type: ignore[arg-type]

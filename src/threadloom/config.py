"""Settings from the command line and the environment.

`DATABASE_URL` (external PostgreSQL; absent → embedded server in the data dir),
`THREADLOOM_DATA_DIR`, `THREADLOOM_AGENT_STATE_DIR` (the agents' resumable state; default `<data dir>/agents`),
`BROADCAST_URL`, `THREADLOOM_DEV`, `THREADLOOM_GRAPHIQL` (the IDE at /graphql: unset follows dev mode),
`THREADLOOM_HOST`/`PORT`,
`THREADLOOM_ALLOWED_ORIGINS`, `THREADLOOM_LOG_LEVEL`, `THREADLOOM_PROVIDERS` (provider instances, TOML),
`THREADLOOM_MAX_SUBSCRIPTIONS` (per connection), `THREADLOOM_MAX_REPLAY` (events), `THREADLOOM_SUBSCRIBER_QUEUE`
(frames), `THREADLOOM_SUBSCRIBER_QUEUE_BYTES` and `THREADLOOM_TOKEN_QUEUE_BYTES` (queued bytes per subscriber and
per token),
`THREADLOOM_MAX_QUERY_COST` (objects per operation), `THREADLOOM_QUERY_TIMEOUT` (seconds per query),
and the per-token limits (`THREADLOOM_MAX_CONNECTIONS_PER_TOKEN`, `THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN`,
`THREADLOOM_MUTATIONS_PER_MINUTE`, `THREADLOOM_MUTATION_BURST`, `THREADLOOM_RUN_STARTS_PER_MINUTE`,
`THREADLOOM_RUN_START_BURST`), and `THREADLOOM_FAST_PATHS` (`0` turns the specialised query and
subscription execution off, for comparison: the output is the same either way), and
`THREADLOOM_METRICS_PORT` (/metrics also served without a token on 127.0.0.1 at that port), and the webhook
settings (`THREADLOOM_WEBHOOK_RETRY_SCHEDULE`, `THREADLOOM_WEBHOOK_TIMEOUT_SECONDS`,
`THREADLOOM_WEBHOOK_ALLOW_LOOPBACK`, `THREADLOOM_WEBHOOK_ALLOW_PRIVATE`, `THREADLOOM_WEBHOOK_DISABLE_AFTER`:
docs/webhooks.md). Per-token limits are counted in each process's memory: with several processes behind a load
balancer each one enforces them on its own share.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TypeVar

from threadloom.domain.webhooks import WebhookPolicy

N = TypeVar("N", int, float)


def _flag(value: str | None) -> bool:
    return (value or "").strip().lower() in {"1", "true", "yes", "on"}


def _env(name: str, default: N) -> N:
    """A limit the environment variable `name` may set (`Limits.from_env`); `default` otherwise."""
    return dataclasses.field(default=default, metadata={"env": name})


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    max_depth: int = 12
    max_aliases: int = 30
    max_tokens: int = 5000
    max_body_bytes: int = 256 * 1024
    max_page_size: int = 100
    max_subscriptions_per_connection: int = _env("THREADLOOM_MAX_SUBSCRIPTIONS", 100)
    max_replay: int = _env("THREADLOOM_MAX_REPLAY", 10_000)
    subscriber_queue: int = _env("THREADLOOM_SUBSCRIBER_QUEUE", 1_000)
    # Bytes of frames queued for one subscriber, and for all of one token's subscribers (streams.budget).
    subscriber_queue_bytes: int = _env("THREADLOOM_SUBSCRIBER_QUEUE_BYTES", 4 * 1024 * 1024)
    token_queue_bytes: int = _env("THREADLOOM_TOKEN_QUEUE_BYTES", 64 * 1024 * 1024)
    # Static query cost (objects an operation may return) and execution time per query operation.
    max_query_cost: int = _env("THREADLOOM_MAX_QUERY_COST", 20_000)
    query_timeout: float = _env("THREADLOOM_QUERY_TIMEOUT", 10.0)  # seconds, may be fractional
    # Per token, in this process (docs/security.md, "Limits").
    max_connections_per_token: int = _env("THREADLOOM_MAX_CONNECTIONS_PER_TOKEN", 32)
    max_subscriptions_per_token: int = _env("THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN", 200)
    # Token buckets: `*_per_minute` refill, `*_burst` the bucket's size.
    mutations_per_minute: int = _env("THREADLOOM_MUTATIONS_PER_MINUTE", 600)
    mutation_burst: int = _env("THREADLOOM_MUTATION_BURST", 300)
    run_starts_per_minute: int = _env("THREADLOOM_RUN_STARTS_PER_MINUTE", 120)
    run_start_burst: int = _env("THREADLOOM_RUN_START_BURST", 60)

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Limits:
        """The defaults, but for the limits whose variable is set (a float limit's value may be fractional)."""
        values: dict[str, int | float] = {}
        for field in dataclasses.fields(cls):
            raw = env.get(field.metadata["env"]) if "env" in field.metadata else None
            if raw:
                values[field.name] = float(raw) if isinstance(field.default, float) else int(raw)
        return cls(**values)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, slots=True)
class Settings:
    data_dir: Path
    database_url: str | None
    broadcast_url: str = "memory://"
    host: str = "127.0.0.1"
    port: int = 8000
    dev: bool = False
    graphiql: bool | None = None  # the GraphiQL IDE at /graphql; None: on in dev mode only
    allowed_origins: tuple[str, ...] = ()
    log_level: str = "INFO"
    default_provider_instance: str = "scripted"
    providers_file: Path | None = None
    fast_paths: bool = True
    metrics_port: int | None = None  # /metrics without a token on 127.0.0.1 (docs/operations.md)
    shutdown_seconds: float = 10.0  # SIGTERM: how long open work may take before the process exits
    # How long an idle HTTP connection is kept open. Longer than clients keep theirs (httpx 5 s, browsers and Node
    # about as long) and than load balancers' idle timeouts (60 s): the side that keeps a connection longer must
    # be the server, or a client reusing it races the server's close and fails its request.
    keep_alive_seconds: float = 75.0
    limits: Limits = dataclasses.field(default_factory=Limits)
    # Where provider drivers keep what a resume needs (one folder per instance inside). Replicas with data
    # dirs of their own point it at one shared folder, so any of them resumes another's provider threads.
    agent_state_dir: Path | None = None
    # The user agents run as when the server is root (threadloom.unprivileged): never the server's own.
    agent_uid: int = 65534
    agent_gid: int = 65534
    webhooks: WebhookPolicy = dataclasses.field(default_factory=WebhookPolicy)  # docs/webhooks.md, "Settings"

    @property
    def ide(self) -> bool:
        """Whether /graphql serves GraphiQL to a browser: `THREADLOOM_GRAPHIQL` when set, else dev mode."""
        return self.dev if self.graphiql is None else self.graphiql

    @property
    def agents_dir(self) -> Path:
        """The agents' state folder: `THREADLOOM_AGENT_STATE_DIR`, else `<data dir>/agents`."""
        return self.agent_state_dir if self.agent_state_dir is not None else self.data_dir / "agents"

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
            "graphiql": _flag(env["THREADLOOM_GRAPHIQL"]) if env.get("THREADLOOM_GRAPHIQL", "").strip() else None,
            "allowed_origins": tuple(o for o in env.get("THREADLOOM_ALLOWED_ORIGINS", "").split(",") if o),
            "log_level": env.get("THREADLOOM_LOG_LEVEL", "INFO"),
            "providers_file": Path(env["THREADLOOM_PROVIDERS"]) if env.get("THREADLOOM_PROVIDERS") else None,
            "fast_paths": env.get("THREADLOOM_FAST_PATHS", "1").strip().lower() not in {"0", "false", "no", "off"},
            "metrics_port": int(env["THREADLOOM_METRICS_PORT"]) if env.get("THREADLOOM_METRICS_PORT") else None,
            "shutdown_seconds": float(env.get("THREADLOOM_SHUTDOWN_SECONDS", "10")),
            "keep_alive_seconds": float(env.get("THREADLOOM_KEEP_ALIVE_SECONDS", "75")),
            "agent_state_dir": env.get("THREADLOOM_AGENT_STATE_DIR") or None,
            "agent_uid": int(env.get("THREADLOOM_AGENT_UID") or 65534),
            "agent_gid": int(env.get("THREADLOOM_AGENT_GID") or 65534),
        }
        values["limits"] = Limits.from_env(env)
        values["webhooks"] = WebhookPolicy.from_env(env)
        values.update({k: v for k, v in overrides.items() if v is not None})
        if isinstance(values["data_dir"], str):
            values["data_dir"] = Path(values["data_dir"]).absolute()
        if isinstance(values["agent_state_dir"], str | Path):
            values["agent_state_dir"] = Path(values["agent_state_dir"]).absolute()
        return cls(**values)  # type: ignore[arg-type]

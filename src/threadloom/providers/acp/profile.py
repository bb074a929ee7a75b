"""What an ACP agent can really do: its capability profile, per agent and version.

An agent says what it supports in its `initialize` answer (`agentCapabilities`, and de facto extensions
announced under `_meta`), but agents advertise methods they do not implement (they answer -32601). So a
profile has two layers: what `initialize` advertised, and what `threadloom providers probe` found when it
tried each method (`PROBED`). The engine plans with `capabilities()`: a method counts only when it was
advertised and, if the agent was probed, the probe found it working; a method the driver finds missing
at run time (-32601) is dropped from the live profile too.

Profiles are kept in `<agent state dir>/<instance>/acp-profiles.json`, one per `name@version`, so every
replica reads the same ones and an upgraded agent is not planned with its old version's profile.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from threadloom.providers.contract import Capabilities

# The methods a profile tracks, in the order the probe tries them.
SESSION_NEW = "session/new"
SESSION_LOAD = "session/load"
SESSION_RESUME = "session/resume"
SESSION_LIST = "session/list"
SESSION_CLOSE = "session/close"
SESSION_FORK = "session/fork"
SET_CONFIG_OPTION = "session/set_config_option"
STEERING = "_session/steering"
REWIND = "_session/rewind"
METHODS = (SESSION_NEW, SESSION_LOAD, SESSION_RESUME, SESSION_LIST, SESSION_FORK, SET_CONFIG_OPTION, STEERING,
           REWIND, SESSION_CLOSE)  # fmt: skip

MethodStatus = Literal["works", "unsupported", "failed", "not_probed", "not_advertised"]
PROFILE_FILE = "acp-profiles.json"


def advertised_methods(initialize: Mapping[str, Any]) -> dict[str, bool]:
    """Which tracked methods an `initialize` result advertises (ACP v1 plus the `_meta` extensions)."""
    caps = initialize.get("agentCapabilities") or {}
    session = caps.get("sessionCapabilities") or {}
    meta = {**(caps.get("_meta") or {}), **(initialize.get("_meta") or {})}
    return {
        SESSION_NEW: True,
        SESSION_LOAD: bool(caps.get("loadSession")),
        SESSION_RESUME: session.get("resume") is not None,
        SESSION_LIST: session.get("list") is not None,
        SESSION_CLOSE: session.get("close") is not None,
        SESSION_FORK: session.get("fork") is not None,
        SET_CONFIG_OPTION: True,  # stable ACP: every agent with config options takes it
        STEERING: _announced(meta, "steering", STEERING),
        REWIND: _announced(meta, "sessionRewind", REWIND) or _announced(meta, "rewind", REWIND),
    }


def _announced(meta: Mapping[str, Any], key: str, method: str) -> bool:
    """A `_meta` extension announced as `{key: true}`, `{key: {supported: true}}`, `{key: {method: ...}}`,
    or nested one level under a vendor key (`{"codex": {"steer": {"method": "_session/steering"}}}`)."""
    value = meta.get(key)
    if value is True or (isinstance(value, Mapping) and (value.get("supported") is True or value.get("method"))):
        return True
    for nested in meta.values():
        if isinstance(nested, Mapping):
            for inner in nested.values():
                if isinstance(inner, Mapping) and inner.get("method") == method:
                    return True
    return False


@dataclasses.dataclass(frozen=True, slots=True)
class AcpProfile:
    """One agent version's profile: what it advertised and, once probed, what works."""

    agent_name: str
    agent_version: str
    protocol_version: int
    advertised: dict[str, bool]
    probed: dict[str, MethodStatus] | None = None  # None: never probed
    probed_at: str | None = None
    notes: dict[str, str] = dataclasses.field(default_factory=dict)  # method -> what the probe saw

    @property
    def key(self) -> str:
        return f"{self.agent_name}@{self.agent_version}"

    @classmethod
    def from_initialize(cls, result: Mapping[str, Any]) -> AcpProfile:
        info = result.get("agentInfo") or {}
        version = result.get("protocolVersion")
        return cls(
            agent_name=str(info.get("name") or "unknown"),
            agent_version=str(info.get("version") or "unknown"),
            protocol_version=version if isinstance(version, int) else 0,
            advertised=advertised_methods(result),
        )

    def status(self, method: str) -> MethodStatus:
        if not self.advertised.get(method, False):
            return "not_advertised"
        if self.probed is None:
            return "not_probed"
        return self.probed.get(method, "not_probed")

    def works(self, method: str) -> bool:
        """Advertised and not found broken: probed `works`, or not probed at all (the agent's word)."""
        return self.status(method) in ("works", "not_probed")

    def without(self, method: str, note: str) -> AcpProfile:
        """This profile with `method` found unsupported (it answered -32601 at run time)."""
        untested: dict[str, MethodStatus] = {m: "not_probed" for m in self.advertised if self.advertised[m]}
        probed = dict(self.probed or untested)
        probed[method] = "unsupported"
        return dataclasses.replace(self, probed=probed, notes={**self.notes, method: note})

    def capabilities(self) -> Capabilities:
        """What the engine plans with (docs/providers.md, "ACP": the fallback table)."""
        fork, rewind = self.works(SESSION_FORK), self.works(REWIND)
        return Capabilities(
            supports_active_steering=self.works(STEERING),
            supports_interrupt=True,  # session/cancel is part of every ACP agent
            supports_steering_by_interrupt_restart=True,
            can_fork_thread=fork,
            can_fork_from_turn=fork and rewind,  # a fork, then the copy rewound to the turn
            can_rollback_thread=rewind,
            can_read_thread_snapshot=False,
            supports_structured_questions=True,  # elicitation, which this client announces
            emits_todo_list=True,
            supports_subagents=False,
            pending_requests_survive_restart=False,
        )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> AcpProfile:
        return cls(
            agent_name=str(data["agent_name"]),
            agent_version=str(data["agent_version"]),
            protocol_version=int(data.get("protocol_version") or 0),
            advertised={str(k): bool(v) for k, v in (data.get("advertised") or {}).items()},
            probed=None if data.get("probed") is None else {str(k): v for k, v in data["probed"].items()},
            probed_at=data.get("probed_at"),
            notes={str(k): str(v) for k, v in (data.get("notes") or {}).items()},
        )


# Before any agent of the instance answered `initialize`: only what every ACP agent has.
UNKNOWN = AcpProfile("unknown", "unknown", 0, {SESSION_NEW: True, SET_CONFIG_OPTION: True})


class ProfileStore:
    """The profiles of one instance, in its agent state folder (shared by replicas)."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / PROFILE_FILE

    def read(self) -> tuple[dict[str, AcpProfile], str | None]:
        """(profiles by `name@version`, the key of the one seen last)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}, None
        profiles = {}
        for key, raw in (data.get("profiles") or {}).items():
            try:
                profiles[str(key)] = AcpProfile.from_json(raw)
            except (KeyError, TypeError, ValueError):
                continue
        latest = data.get("latest")
        return profiles, str(latest) if latest in profiles else None

    def latest(self) -> AcpProfile | None:
        profiles, latest = self.read()
        return profiles.get(latest) if latest else None

    def get(self, key: str) -> AcpProfile | None:
        return self.read()[0].get(key)

    def save(self, profile: AcpProfile) -> None:
        """Record `profile` as the latest (replaced whole, so a reader sees the old file or the new)."""
        profiles, _ = self.read()
        profiles[profile.key] = profile
        data = {"latest": profile.key, "profiles": {k: p.to_json() for k, p in sorted(profiles.items())}}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".acp-profiles.")
        with os.fdopen(fd, "w") as file:
            json.dump(data, file, indent=1, sort_keys=True)
        os.replace(tmp, self.path)


def now_text() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

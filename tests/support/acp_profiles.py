"""What the real ACP agents advertise and really do, measured by tests/test_acp_real_agents.py.

This is data for the `acp` driver and its probe: each entry names the package and version, the facts of its
`initialize` answer that the tests rely on, and per lifecycle whether the agent does it itself (`native`) or
Threadloom must use its declared fallback (`fallback`: restart or queue for a steer, a new session seeded with
a handoff for a fork, Threadloom's checkpoints plus a handoff for a rollback). The test checks every entry
against the running agent: a `native` lifecycle is carried out and its effect seen at the fake model, a
`fallback` one is shown to be missing (not advertised, and the method answers -32601). The conformance table
in docs/providers.md (its "Conformance" section) is generated from `PROBED` below
(scripts/acp_conformance.py).
"""

from __future__ import annotations

from typing import Any, Final

LIFECYCLES: Final = ("conversation", "resume", "load", "steer", "interrupt", "approval", "fork", "rewind")

# The method each lifecycle uses when it is native.
METHODS: Final = {
    "resume": "session/resume",
    "load": "session/load",
    "steer": "_session/steering",
    "interrupt": "session/cancel",
    "approval": "session/request_permission",
    "fork": "session/fork",
    "rewind": "_session/rewind",
}

PROFILES: Final[dict[str, dict[str, Any]]] = {
    "claude": {
        "package": "@agentclientprotocol/claude-agent-acp",
        "version": "0.101.0",
        "agent_name": "@agentclientprotocol/claude-agent-acp",
        "session_capabilities": ["additionalDirectories", "close", "delete", "fork", "list", "resume", "systemPrompt"],
        "load_session": True,
        "meta_steering": True,  # InitializeResponse._meta.steering.supported
        "capability_meta": ["authStatus", "claudeCode"],  # agentCapabilities._meta keys (claudeCode.promptQueueing)
        "approval_mode": "default",  # the `mode` config option under which ...
        "approval_asks_for": "command",  # ... a command (Bash) asks
        "modes": ["default", "acceptEdits", "plan", "auto"],  # the values its `mode` config option offers
        "lifecycles": {
            "conversation": "native",
            "resume": "native",
            "load": "native",
            "steer": "native",
            "interrupt": "native",
            "approval": "native",
            "fork": "native",
            "rewind": "fallback",
        },
    },
    "codex": {
        "package": "@agentclientprotocol/codex-acp",
        "version": "2.6.0",
        "agent_name": "@agentclientprotocol/codex-acp",
        "session_capabilities": [
            "additionalDirectories",
            "close",
            "delete",
            "fork",
            "list",
            "resume",
            "subagents",
            "systemPrompt",
            "title",
        ],
        "load_session": True,
        "meta_steering": True,
        "capability_meta": ["authStatus"],
        "approval_mode": "read-only",
        "approval_asks_for": "edit",  # a command runs in the read-only sandbox without asking
        "modes": ["read-only", "workspace-write", "agent", "agent-full-access"],
        "lifecycles": {
            "conversation": "native",
            "resume": "native",
            "load": "native",
            "steer": "native",
            "interrupt": "native",
            "approval": "native",
            "fork": "native",
            "rewind": "fallback",
        },
    },
    "qwen": {
        "package": "@qwen-code/qwen-code",
        "version": "0.24.4",
        "agent_name": "qwen-code",
        "session_capabilities": ["list", "resume"],
        "load_session": True,
        "meta_steering": False,
        "capability_meta": ["imageCapability"],
        "approval_mode": "default",
        "approval_asks_for": "command",  # run_shell_command
        "modes": ["plan", "default", "auto-edit", "auto", "yolo"],
        "lifecycles": {
            "conversation": "native",
            "resume": "native",
            "load": "native",
            "steer": "fallback",
            "interrupt": "native",
            "approval": "native",
            "fork": "fallback",
            "rewind": "fallback",
        },
    },
}

# What `threadloom providers probe` prints for each agent (method -> status), checked by
# tests/test_acp_real_agents_served.py; docs/providers.md's conformance table is generated from it.
_ALL_WORK: Final = {
    "session/new": "works",
    "session/load": "works",
    "session/resume": "works",
    "session/list": "works",
    "session/fork": "works",
    "session/set_config_option": "works",
    "_session/steering": "works",
    "_session/rewind": "not_advertised",
    "session/close": "works",
}
PROBED: Final[dict[str, dict[str, str]]] = {
    "claude": dict(_ALL_WORK),  # its fork refuses the probe's turnless session (-32002): the method is there
    "codex": dict(_ALL_WORK),
    "qwen": _ALL_WORK  # its load and resume refuse a session its own process holds (-32023): they are there
    | {m: "not_advertised" for m in ("session/fork", "_session/steering", "session/close")},
}


# ---- the conformance table (docs/providers.md), derived from the probe data ---------------------------------

# The value of each agent's `mode` option a thread's runtime mode selects (None: the agent keeps its default,
# `auto` for claude-agent-acp and Qwen Code, `agent` for codex-acp).
MODE_CHOSEN: Final = {
    "claude": {"workspace_write": "acceptEdits", "approval_required": "default", "read_only": "plan",
               "full_access": None},  # as root (these tests) it offers no bypassPermissions; as the agent user it does
    "codex": {"workspace_write": "workspace-write", "approval_required": None, "read_only": "read-only",
              "full_access": "agent-full-access"},
    "qwen": {"workspace_write": "auto-edit", "approval_required": "default", "read_only": "plan",
             "full_access": "yolo"},
}  # fmt: skip

CONFORMANCE_LIFECYCLES: Final = ("conversation", "resume", "steer", "interrupt", "approval", "fork", "rollback")
NAMES: Final = {"claude": "claude-agent-acp", "codex": "codex-acp", "qwen": "Qwen Code"}


def probed_profile(name: str) -> Any:
    """The `AcpProfile` the driver plans with after `threadloom providers probe` printed `PROBED[name]`."""
    from threadloom.providers.acp.profile import AcpProfile

    statuses = PROBED[name]
    advertised = {method: status != "not_advertised" for method, status in statuses.items()}
    probed = {method: status for method, status in statuses.items() if status != "not_advertised"}
    return AcpProfile(PROFILES[name]["agent_name"], PROFILES[name]["version"], 1, advertised, probed)  # type: ignore[arg-type]


def conformance(name: str) -> dict[str, str]:
    """Per lifecycle, how Threadloom does it on agent `name` (planned from the probed profile, as the driver
    does): `native` (the agent's own method), `fallback` (Threadloom's declared fallback), `unsupported`."""
    profile = probed_profile(name)
    caps = profile.capabilities()
    resumable = profile.works("session/resume") or profile.works("session/load")
    return {
        "conversation": "native" if profile.works("session/new") else "unsupported",
        "resume": "native" if resumable else "fallback",
        "steer": "native" if caps.supports_active_steering else "fallback",
        "interrupt": "native" if caps.supports_interrupt else "unsupported",
        "approval": "native",  # session/request_permission comes from the agent: every ACP agent may ask
        "fork": "native" if caps.can_fork_from_turn else "fallback",
        "rollback": "native" if caps.can_rollback_thread else "fallback",
    }

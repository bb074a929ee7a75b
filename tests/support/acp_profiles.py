"""What the real ACP agents advertise and really do, measured by tests/test_acp_real_agents.py.

This is data for the `acp` driver and its probe: each entry names the package and version, the facts of its
`initialize` answer that the tests rely on, and per lifecycle whether the agent does it itself (`native`) or
Threadloom must use its declared fallback (`fallback`: restart or queue for a steer, a new session seeded with
a handoff for a fork, Threadloom's checkpoints plus a handoff for a rollback). The test checks every entry
against the running agent: a `native` lifecycle is carried out and its effect seen at the fake model, a
`fallback` one is shown to be missing (not advertised, and the method answers -32601). The conformance table
in docs/providers.md ("ACP agents we test against") is this data in words.
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

"""`ClaudeDriver`: one configured Claude Code instance, and the environment of its processes.

The API key reaches the CLI as ANTHROPIC_API_KEY, and so the environment of its tools: a
tool running `env` prints it, which is why the runtime redacts every event. (Claude Code's
`CLAUDE_CODE_SUBPROCESS_ENV_SCRUB=1` removes the key from tool environments, but in 2.1.197 it
also leaves the sandbox's empty mount-point files -- `.env`, `package.json`, `node_modules/`,
... -- in the workspace after every command, so it is not set; an instance may set it through
its `env` option.)
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path
from typing import Any

from threadloom import unprivileged
from threadloom.domain.settings_compat import InPlace
from threadloom.providers.agent_cli import CliOptions, child_env, find_cli
from threadloom.providers.claude.runtime import CAPABILITIES, ClaudeRuntime
from threadloom.providers.contract import Capabilities, SessionScope

PACKAGE = "@anthropic-ai/claude-code"
DEFAULT_API_KEY_ENV = "ANTHROPIC_API_KEY"


def project_tmp(state_dir: Path) -> Path:
    """A private temp folder for one project's claude processes (created 0700).

    Claude Code's sandbox keeps its temp files and its proxy's unix sockets in TMPDIR, so TMPDIR
    must be short (a socket path has at most 107 bytes: under a deep data dir the sandbox fails with
    "Failed to create bridge sockets") and must not be shared by projects (the default /tmp/claude-<uid>
    would be writable by the commands of every project).
    """
    digest = hashlib.sha256(str(state_dir).encode()).hexdigest()[:16]
    folder = Path(tempfile.gettempdir()) / f"threadloom-{digest}"
    folder.mkdir(mode=0o700, exist_ok=True)
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)  # never someone's link
    try:
        unprivileged.give(fd)  # the agent user's (threadloom.unprivileged)
    finally:
        os.close(fd)
    return folder


class ClaudeDriver:
    """Runtimes for one configured Claude Code instance.

    Options: `binary` (path or name; default node_modules/.bin/claude, then PATH), `model`,
    `base_url` (ANTHROPIC_BASE_URL), `api_key_env` (the variable holding the key, passed to the
    CLI as ANTHROPIC_API_KEY; default ANTHROPIC_API_KEY), `env` (extra variables for the CLI).
    """

    def __init__(self, instance_id: str, home: Path, options: dict[str, Any]) -> None:
        self.instance_id = instance_id
        self.home = home
        self.options = options

    def capabilities(self) -> Capabilities:
        return CAPABILITIES

    def settings_in_place(self) -> InPlace:
        """The model, not the runtime mode: another model restarts the thread's `claude` process with
        `--resume` on the same session and the new `--model` (`ClaudeRuntime.start_turn`); the mode's sandbox and
        permission mode are flags of a process the driver starts for a thread's whole life."""
        return InPlace(model=True, runtime_mode=False)

    @property
    def state_dir(self) -> Path:
        """The instance's folder; each project's runtime keeps its state in a subfolder (`SessionScope`)."""
        return self.home

    async def open_session(self, scope: SessionScope) -> ClaudeRuntime:
        """A runtime for the project of `scope`, its sessions under `scope.state_dir`.

        Checks the CLI and the API key now, so a misconfiguration fails here, not mid-turn.
        """
        cli = CliOptions.parse(self.options, DEFAULT_API_KEY_ENV)
        binary = find_cli("claude", cli.binary, PACKAGE)
        env = child_env(cli.api_key_env, cli.env)
        env["ANTHROPIC_API_KEY"] = env.pop(cli.api_key_env)
        state = scope.state_dir
        claude_home = state / "claude-home"
        state.mkdir(parents=True, exist_ok=True)
        unprivileged.agent_folders(state, ("claude-home/.claude",))  # the agent user's, never through a link
        tmp = project_tmp(state)
        env.update(
            {
                "HOME": str(claude_home),
                "CLAUDE_CONFIG_DIR": str(claude_home / ".claude"),
                "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                "DISABLE_AUTOUPDATER": "1",
                "TMPDIR": str(tmp),  # the sandbox's temp dir is TMPDIR/claude-<uid>: one per project
            }
        )
        if cli.base_url:
            env["ANTHROPIC_BASE_URL"] = cli.base_url
        secrets = ("ANTHROPIC_API_KEY", *cli.env)  # the key is under that name in the CLI's environment
        runtime = ClaudeRuntime(binary, env, state, cli.model, secrets)
        runtime.allow_full_access = self.options.get("allow_full_access") is True
        return runtime

"""`acp` provider instances over the scripted agent's ACP face (`python -m threadloom.agent --acp`).

`acp_instance(name, *agent_args, **options)` is the providers.toml text of one: its `command` runs the
scripted agent in the project's own state folder and workspace (the driver fills `{state_dir}`,
`{workspace}` and `{own_workspaces}` in), with the ACP face's knobs (`--acp-without F,...`, `--acp-lie F,...`,
`--acp-fault F,...`, docs/scripted-agent.md) passed through as `agent_args`.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def acp_command(*agent_args: str) -> list[str]:
    return [
        sys.executable, "-m", "threadloom.agent", "--acp",
        "--state-dir", "{state_dir}", "--workspace", "{workspace}", "--own-workspaces", "{own_workspaces}",
        "--hide", "{state_dir}", *agent_args,
    ]  # fmt: skip


def acp_instance(name: str, *agent_args: str, **options: Any) -> str:
    lines = [f"[instances.{name}]", 'driver = "acp"', f"command = {json.dumps(acp_command(*agent_args))}"]
    lines += [f"{key} = {json.dumps(value)}" for key, value in options.items()]
    return "\n".join(lines) + "\n\n"

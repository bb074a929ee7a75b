"""How the real ACP agents are started against the fake model server, offline and without a login.

Each agent gets a minimal environment: PATH, locale, HOME and TMPDIR in the test's own folder, a fake key (a
variable the fake model accepts, never a real one) and the settings that point it at `fake.url`. Nothing is
read from the user's home, and nothing else of the test process's environment reaches the agent.

- `claude`: `@agentclientprotocol/claude-agent-acp` (the maintained successor of
  `@zed-industries/claude-code-acp`). It runs the Claude Code binary of its own dependency
  `@anthropic-ai/claude-agent-sdk` (a platform package with a native `claude`), not our pinned
  `@anthropic-ai/claude-code`, unless `CLAUDE_CODE_EXECUTABLE` names another. Anthropic Messages.
- `codex`: `@agentclientprotocol/codex-acp` (the successor of the Rust `@zed-industries/codex-acp`): a Node
  adapter over `codex app-server`, from its own dependency `@openai/codex` 0.166 (nested under it: the range
  it declares excludes our 0.171), unless `CODEX_PATH` names another. OpenAI Responses, through a custom
  model provider in `CODEX_HOME/config.toml` that names the key's variable.
- `qwen`: Qwen Code (`qwen --acp`), a native ACP agent: `--auth-type openai-responses` with a base URL and
  a key, no login; its usage statistics are turned off in `~/.qwen/settings.json`, else it looks up its
  telemetry host at start (the only outbound attempt seen; the turns work without it).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from tests.support.fake_model import FakeModel

ROOT = Path(__file__).resolve().parents[2]
MODULES = ROOT / "node_modules"
FAKE_KEY = "sk-fake-acp-agent"
MODEL = "gpt-5.5"

AGENTS = ("claude", "codex", "qwen")


@dataclass(frozen=True)
class AgentLaunch:
    """One agent's command line, environment and working folder."""

    name: str
    argv: list[str]
    env: dict[str, str]
    home: Path


def installed(name: str) -> bool:
    return (MODULES / ".bin" / BINS[name]).exists()


BINS = {"claude": "claude-agent-acp", "codex": "codex-acp", "qwen": "qwen"}


def launch(name: str, fake: FakeModel, home: Path) -> AgentLaunch:
    """How to start agent `name` with its state under `home` (the same `home` again: the same sessions)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / "tmp").mkdir(exist_ok=True)
    node = shutil.which("node") or "node"
    env = {
        "PATH": os.path.dirname(node) + ":/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": str(home),
        "TMPDIR": str(home / "tmp"),
    }
    script = str(MODULES / ".bin" / BINS[name])
    if name == "claude":
        env |= {
            "ANTHROPIC_BASE_URL": fake.url,
            "ANTHROPIC_API_KEY": FAKE_KEY,
            "CLAUDE_CONFIG_DIR": str(home / ".claude"),
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
            "DISABLE_AUTOUPDATER": "1",
        }
        return AgentLaunch(name, [node, script], env, home)
    if name == "codex":
        codex_home = home / ".codex"
        codex_home.mkdir(exist_ok=True)
        (codex_home / "config.toml").write_text(
            f'model = "{MODEL}"\nmodel_provider = "fake"\n\n'
            f'[model_providers.fake]\nname = "fake"\nbase_url = "{fake.url}/v1"\n'
            'wire_api = "responses"\nenv_key = "FAKE_OPENAI_API_KEY"\n'
        )
        env |= {"CODEX_HOME": str(codex_home), "FAKE_OPENAI_API_KEY": FAKE_KEY}
        return AgentLaunch(name, [node, script], env, home)
    if name == "qwen":
        settings = home / ".qwen"
        settings.mkdir(exist_ok=True)
        (settings / "settings.json").write_text(json.dumps({"privacy": {"usageStatisticsEnabled": False}}))
        # The `qwen` bin is a wrapper that runs cli.js in a child (spawnSync, for --expose-gc): killing the
        # wrapper would orphan the agent, which keeps the stdout pipe open. Run cli.js itself, as the wrapper
        # would, and tell it not to relaunch itself either.
        env |= {"OPENAI_API_KEY": FAKE_KEY, "QWEN_CODE_NO_RELAUNCH": "true"}
        cli = str(MODULES / "@qwen-code" / "qwen-code" / "cli.js")
        argv = [node, "--expose-gc", cli, "--acp", "--auth-type", "openai-responses"]
        argv += ["--openai-base-url", f"{fake.url}/v1", "--model", MODEL]
        return AgentLaunch(name, argv, env, home)
    raise ValueError(name)

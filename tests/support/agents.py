"""A server driving the real Codex and Claude Code CLIs against the fake model server."""

from __future__ import annotations

from pathlib import Path

from tests.support.fake_model import FakeModel

MODEL_PATH = {"codex": "/v1/responses", "claude": "/v1/messages"}


def cli_providers_env(
    folder: Path, fake: FakeModel, *, openai_key: str = "sk-fake-openai", anthropic_key: str = "sk-fake-anthropic"
) -> dict[str, str]:
    """The server env with instances `codex` and `claude` pointed at `fake` (keys passed through env vars)."""
    config = folder / "providers.toml"
    config.write_text(
        f"""
[instances.codex]
driver = "codex"
base_url = "{fake.url}/v1"
api_key_env = "FAKE_OPENAI_API_KEY"

[instances.claude]
driver = "claude"
base_url = "{fake.url}"
api_key_env = "FAKE_ANTHROPIC_API_KEY"
"""
    )
    return {
        "THREADLOOM_PROVIDERS": str(config),
        "FAKE_OPENAI_API_KEY": openai_key,
        "FAKE_ANTHROPIC_API_KEY": anthropic_key,
    }

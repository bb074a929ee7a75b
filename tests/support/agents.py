"""A server driving the real Codex and Claude Code CLIs against the fake model server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.support.fake_model import FakeModel
from tests.support.server import Client, ServerProcess
from threadloom.providers import contract as ev
from threadloom.providers.contract import ThreadSettings

MODEL_PATH = {"codex": "/v1/responses", "claude": "/v1/messages"}


def cli_providers_env(
    folder: Path,
    fake: FakeModel,
    *,
    openai_key: str = "sk-fake-openai",
    anthropic_key: str = "sk-fake-anthropic",
    claude_extra: str = "",
) -> dict[str, str]:
    """The server env with instances `codex` and `claude` pointed at `fake` (keys passed through env vars);
    `claude_extra`: more lines of the `claude` instance."""
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
{claude_extra}
"""
    )
    return {
        "THREADLOOM_PROVIDERS": str(config),
        "FAKE_OPENAI_API_KEY": openai_key,
        "FAKE_ANTHROPIC_API_KEY": anthropic_key,
    }


@contextlib.asynccontextmanager
async def cli_api(database_url: str, folder: Path, fake: FakeModel) -> AsyncIterator[Client]:
    """An admin client of a server (data in `folder/data`) whose `codex` and `claude` instances use `fake`."""
    proc = ServerProcess(database_url, folder / "data", env=cli_providers_env(folder, fake)).wait_ready()
    client = Client(proc.url, proc.admin_token)
    try:
        yield client
    finally:
        await client.aclose()
        proc.stop()
        print("\n".join(proc.log[-80:]))


async def full_access_turn(runtime: Any, cwd: Path, prompt: str) -> tuple[ev.TurnCompleted, list[ev.ItemCompleted]]:
    """One turn of a new full_access thread on a driver's open runtime: its end and the tool calls it completed."""
    thread = await runtime.start_thread(ThreadSettings(cwd=str(cwd), runtime_mode="full_access"))
    turn = await runtime.start_turn(thread, prompt)
    tools: list[ev.ItemCompleted] = []

    async def until_done() -> ev.TurnCompleted:
        async for event in runtime.events():
            if isinstance(event, ev.ItemCompleted) and event.kind == "tool_call":
                tools.append(event)
            if isinstance(event, ev.TurnCompleted) and event.native_turn == turn:
                return event
        raise AssertionError("the runtime's events ended before the turn did")

    return await asyncio.wait_for(until_done(), 120), tools

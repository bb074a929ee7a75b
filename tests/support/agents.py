"""A server driving the real Codex and Claude Code CLIs against the fake model server."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import run
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from threadloom.providers import contract as ev
from threadloom.providers.contract import ThreadSettings

MODEL_PATH = {"codex": "/v1/responses", "claude": "/v1/messages"}
AGENT_THREAD = """mutation($p: ID!, $i: String!) { createThread(input: {projectId: $p, providerInstanceId: $i}) {
  thread { id } userErrors { code message } } }"""


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
async def cli_api(database_url: str, folder: Path, fake: FakeModel, **env: str) -> AsyncIterator[Client]:
    """An admin client of a server (data in `folder/data`) whose `codex` and `claude` instances use `fake`;
    `env`: more variables of the server's environment."""
    proc = ServerProcess(database_url, folder / "data", env={**cli_providers_env(folder, fake), **env}).wait_ready()
    client = Client(proc.url, proc.admin_token)
    try:
        yield client
    finally:
        await client.aclose()
        proc.stop()
        print(proc.report(80))


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


async def agent_thread(client: Client, root: Path, instance: str) -> str:
    """A thread of `instance` in a new project whose workspace is `root` (made here, named after it)."""
    await asyncio.to_thread(root.mkdir, exist_ok=True)
    project = (await client.gql(CREATE_PROJECT, {"name": root.name, "root": str(root)}))["createProject"]
    made = (await client.gql(AGENT_THREAD, {"p": project["project"]["id"], "i": instance}))["createThread"]
    assert made["userErrors"] == [], made
    return str(made["thread"]["id"])


async def until_held(client: Client, fake: FakeModel, run_id: str, path: str, since: int = 0) -> None:
    """Wait until the run `run_id` is RUNNING and the model holds its `HOLD` reply (a request at `path`, after
    the first `since` ones, carried it): a live turn that cannot end before the test releases the hold."""

    async def holding() -> bool:
        status = (await run(client, run_id))["status"]
        return status == "RUNNING" and any("HOLD" in str(b) for b in fake.bodies(path)[since:])

    await until(holding, within=60)

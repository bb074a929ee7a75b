"""The scripted agent's ACP face (`python -m threadloom.agent --acp`) as an ACP client sees it: a real process
driven over stdio by tests/support/acp_client.py (docs/scripted-agent.md, "The ACP face")."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.acp_client import AcpClient

Message = dict[str, Any]
Spawn = Callable[..., Any]


def agent_argv(state: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "threadloom.agent", "--acp", "--state-dir", str(state), *args]


@pytest.fixture
async def spawn(tmp_path: Path) -> AsyncIterator[Spawn]:
    """Starts agents on one state folder (so a respawn sees the same sessions); all closed at the end."""
    started: list[AcpClient] = []

    async def start(*args: str) -> AcpClient:
        client = await AcpClient.spawn(agent_argv(tmp_path / "state", *args), cwd=str(tmp_path))
        started.append(client)
        return client

    yield start
    for client in started:
        await client.close()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


async def session(spawn: Spawn, work: Path, *args: str) -> tuple[AcpClient, str]:
    agent = await spawn(*args)
    await agent.initialize()
    return agent, await agent.new_session(str(work))


async def test_a_prompt_streams_its_reply_as_message_chunks_of_one_message_and_ends_the_turn(
    spawn: Spawn, work: Path
) -> None:
    agent, sid = await session(spawn, work)
    result = await agent.prompt(sid, "@reply hello there world")
    assert result["stopReason"] == "end_turn"
    chunks = agent.updates(sid, "agent_message_chunk")
    assert [c["content"]["text"] for c in chunks] == ["hello ", "there ", "world"]
    assert len({c["messageId"] for c in chunks}) == 1
    assert agent.texts(sid) == "hello there world"
    info = agent.updates(sid, "session_info_update")
    assert info[-1]["title"] == "@reply hello there world"


async def test_cancel_ends_a_running_prompt_with_stop_reason_cancelled(spawn: Spawn, work: Path) -> None:
    agent, sid = await session(spawn, work)
    _, response = agent.start_prompt(sid, "@reply started\n@await gate\n@reply never")
    await agent.wait_update(sid, lambda u: u.get("content", {}).get("text") == "started")
    await agent.cancel(sid)
    result = (await asyncio.wait_for(response, 30))["result"]
    assert result["stopReason"] == "cancelled"
    assert "never" not in agent.texts(sid)
    # The twin: the session takes the next prompt and finishes it.
    assert (await agent.prompt(sid, "@reply again"))["stopReason"] == "end_turn"

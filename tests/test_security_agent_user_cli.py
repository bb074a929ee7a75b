"""The real Codex and Claude Code CLIs run as the agent user, and so do their `full_access` commands.

A server running as root starts every agent through `contained()`, which drops to the agent user
(`threadloom.unprivileged`). Here each driver is driven in-process with that setting on, after the same hand-over
the session manager makes before an agent starts (its state folder made the agent user's, the workspace granted
through an ACL). A `full_access` command -- no sandbox at all -- reports its uid and makes a file: both are the
agent user's, while a file the operator (root) put in the workspace stays root's and is still appended to.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import full_access_turn
from tests.support.fake_model import FakeModel
from threadloom import unprivileged
from threadloom.engine.sessions import _hand_over
from threadloom.providers import contract as ev
from threadloom.providers.claude import ClaudeDriver
from threadloom.providers.codex import CodexDriver
from threadloom.providers.contract import SessionScope
from threadloom.unprivileged import DEFAULT_UID, AgentUser

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="only a root server switches agents to another user")

AGENT = AgentUser(DEFAULT_UID, DEFAULT_UID)
COMMAND = "RUN: echo by-agent >> operator.txt && id -u > made.txt && id -u"


@pytest.fixture
def as_agent_user(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(unprivileged, "_current", AGENT)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    folder = tmp_path / "ws"
    folder.mkdir()
    (folder / "operator.txt").write_text("from the operator\n")  # root's, 0644
    return folder


async def one_turn(driver: Any, workspace: Path) -> list[ev.ItemCompleted]:
    """Open the project's runtime as the session manager would, run COMMAND in a full_access thread."""
    _hand_over(driver.state_dir, "p1", str(workspace), None)
    runtime = await driver.open_session(SessionScope("p1", str(workspace), driver.state_dir / "p1"))
    try:
        done, tools = await full_access_turn(runtime, workspace, COMMAND)
    finally:
        await runtime.close()
    assert done.status == "completed" and done.error is None, done
    return tools


def check_made_as_agent(workspace: Path) -> None:
    assert (workspace / "made.txt").read_text().split() == [str(AGENT.uid)]
    assert (workspace / "made.txt").stat().st_uid == AGENT.uid
    assert (workspace / "operator.txt").read_text() == "from the operator\nby-agent\n"
    assert (workspace / "operator.txt").stat().st_uid == 0  # still the operator's file
    assert os.getuid() == 0  # this process (the server here) is root: the drop is real


async def test_a_full_access_codex_command_runs_as_the_agent_user(
    as_agent_user: None, workspace: Path, tmp_path: Path, fake: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_OPENAI_API_KEY", "sk-fake-agent-user")
    options = {"base_url": fake.url + "/v1", "api_key_env": "FAKE_OPENAI_API_KEY", "allow_full_access": True}
    tools = await one_turn(CodexDriver("codex-au", tmp_path / "agents", options), workspace)
    assert len(tools) == 1 and tools[0].detail["exitCode"] == 0, tools
    assert tools[0].detail["aggregatedOutput"].split() == [str(AGENT.uid)]
    check_made_as_agent(workspace)


async def test_a_full_access_claude_command_runs_as_the_agent_user(
    as_agent_user: None, workspace: Path, tmp_path: Path, fake: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_ANTHROPIC_API_KEY", "x")
    options = {"base_url": fake.url, "api_key_env": "FAKE_ANTHROPIC_API_KEY", "allow_full_access": True}
    tools = await one_turn(ClaudeDriver("claude-au", tmp_path / "agents" / "claude-au", options), workspace)
    assert len(tools) == 1 and tools[0].detail["exitCode"] == 0, tools
    assert str(AGENT.uid) in tools[0].detail["output"].split()
    check_made_as_agent(workspace)

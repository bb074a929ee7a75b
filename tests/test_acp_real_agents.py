"""The real ACP agents (Claude and Codex through their ACP adapters, Qwen Code natively) driven by a bare ACP
client (tests/support/acp_client.py) against the fake model server: offline, no login, a fake key.

One agent process per agent for the whole module, with one session whose first turn the fixture runs; the tests
of one agent run on it in file order, and the last one kills it and starts another on the same state. Every
lifecycle in tests/support/acp_profiles.py is checked against the agent: `native` ones are carried out and their
effect seen at the fake model or in the workspace, `fallback` ones are shown to be missing (not advertised, and
the method answers -32601), so the profile cannot drift from what the pinned versions really do.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.support.acp_agents import AGENTS, AgentLaunch, launch
from tests.support.acp_client import AcpClient
from tests.support.acp_profiles import LIFECYCLES, METHODS, PROFILES
from tests.support.fake_model import FakeModel

Message = dict[str, Any]
METHOD_NOT_FOUND = -32601
WITHIN = 60  # one prompt on a loaded 2-core machine; the agents start their own children on the first one


@dataclass
class Live:
    """One running agent, its first session and what the tests learnt on the way."""

    name: str
    launch: AgentLaunch
    workspace: Path
    client: AcpClient
    init: Message
    session: str = ""
    extra: list[AcpClient] = field(default_factory=list)

    @property
    def profile(self) -> dict[str, Any]:
        return PROFILES[self.name]

    def native(self, lifecycle: str) -> bool:
        return bool(self.profile["lifecycles"][lifecycle] == "native")


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    model = FakeModel().start()
    yield model
    model.stop()


@pytest.fixture(scope="module", params=AGENTS)
async def live(
    request: pytest.FixtureRequest, fake: FakeModel, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Live]:
    name = str(request.param)
    folder = tmp_path_factory.mktemp(f"acp-{name}")
    workspace = folder / "workspace"
    workspace.mkdir()
    started = launch(name, fake, folder / "home")
    client = await AcpClient.spawn(started.argv, env=started.env, cwd=str(workspace))
    agent = Live(name, started, workspace, client, await client.initialize())
    agent.session = await client.new_session(str(workspace))
    first = await client.prompt(agent.session, f"{name} first words", within=WITHIN)  # what later tests look for
    assert first["stopReason"] == "end_turn"
    yield agent
    for each in [agent.client, *agent.extra]:
        await each.close()


async def wait_body_with(fake: FakeModel, text: str, within: float = WITHIN) -> Message:
    """The first main-loop model request (any API; one offering tools) mentioning `text`, waited for off the loop."""
    return await asyncio.to_thread(fake.wait_body, text, within, True)


async def prompt_held(agent: Live, fake: FakeModel, text: str) -> tuple[int, asyncio.Future[Message]]:
    """Starts a prompt the fake model holds mid-reply, and returns once its first part reached the client."""
    fake.reset_hold()
    before = len(agent.client.notifications)

    def streamed(_message: Message) -> bool:
        fresh = agent.client.notifications[before:]
        return any(
            "holding" in str(n["update"].get("content", {}).get("text", ""))
            for n in fresh
            if n.get("sessionId") == agent.session
        )

    request_id, reply = agent.client.start_prompt(agent.session, f"HOLD\n{text}")
    await agent.client.wait_for(streamed, WITHIN)
    return request_id, reply


async def assert_missing(agent: Live, lifecycle: str, params: Message) -> None:
    """A fallback lifecycle: the agent neither advertises nor serves the method it would use."""
    method = METHODS[lifecycle]
    capability = method.removeprefix("session/")
    assert capability not in agent.init["agentCapabilities"].get("sessionCapabilities", {})
    response = await agent.client.call(method, params)
    assert response.get("error", {}).get("code") == METHOD_NOT_FOUND, response


async def test_initialize_advertises_what_the_profile_records(live: Live) -> None:
    init, profile = live.init, live.profile
    assert init["protocolVersion"] == 1
    assert init["agentInfo"]["name"] == profile["agent_name"]
    assert init["agentInfo"]["version"] == profile["version"]
    capabilities = init["agentCapabilities"]
    assert capabilities["loadSession"] is profile["load_session"]
    assert sorted(capabilities.get("sessionCapabilities", {})) == profile["session_capabilities"]
    assert sorted(capabilities.get("_meta", {})) == profile["capability_meta"]
    steering = (init.get("_meta") or {}).get("steering", {}).get("supported", False)
    assert steering is profile["meta_steering"]
    assert set(profile["lifecycles"]) == set(LIFECYCLES)
    package = json.loads((Path(__file__).parents[1] / "package.json").read_text())["dependencies"]
    assert package[profile["package"]] == profile["version"]


async def test_a_new_session_offers_the_modes_the_profile_records(live: Live) -> None:
    made = await live.client.request("session/new", {"cwd": str(live.workspace), "mcpServers": []}, WITHIN)
    modes = [o for o in made.get("configOptions") or [] if o.get("category") == "mode"]
    assert [[v["value"] for v in o["options"]] for o in modes] == [live.profile["modes"]], modes


async def test_a_conversation_of_several_turns_keeps_its_history(live: Live, fake: FakeModel) -> None:
    assert f"echo: {live.name} first words" in live.client.texts(live.session)
    for words in (f"{live.name} second words", f"{live.name} third words"):
        result = await live.client.prompt(live.session, words, within=WITHIN)
        assert result["stopReason"] == "end_turn"
        assert f"echo: {words}" in live.client.texts(live.session)
    last = await wait_body_with(fake, f"{live.name} third words")
    assert f"{live.name} first words" in json.dumps(last)  # the agent sent the earlier turns along


async def test_a_steer_reaches_the_model_within_the_running_turn(live: Live, fake: FakeModel) -> None:
    steer = f"{live.name} steered words"
    if not live.native("steer"):
        assert not live.profile["meta_steering"]
        response = await live.client.call(METHODS["steer"], {"sessionId": live.session, "prompt": []})
        assert response.get("error", {}).get("code") == METHOD_NOT_FOUND, response
        return
    _, reply = await prompt_held(live, fake, f"{live.name} a turn to steer")
    answer = await live.client.steer(live.session, steer)
    assert answer == {"outcome": "injected"}
    fake.release()
    result = await asyncio.wait_for(reply, WITHIN)
    assert result["result"]["stopReason"] == "end_turn"
    await wait_body_with(fake, steer)  # a model request of the same turn carried it


async def test_a_cancel_mid_turn_ends_the_prompt_as_cancelled(live: Live, fake: FakeModel) -> None:
    assert live.native("interrupt")
    _, reply = await prompt_held(live, fake, f"{live.name} a turn to cancel")
    await live.client.cancel(live.session)
    result = await asyncio.wait_for(reply, WITHIN)
    fake.release()
    assert result["result"]["stopReason"] == "cancelled"
    after = await live.client.prompt(live.session, f"{live.name} after the cancel", within=WITHIN)
    assert after["stopReason"] == "end_turn"  # the session goes on


async def test_an_approved_permission_request_lets_the_tool_run(live: Live) -> None:
    assert live.native("approval")
    asked: list[Message] = []

    def approve(params: Message) -> str:
        asked.append(params)
        return next(o["optionId"] for o in params["options"] if o["kind"] == "allow_once")

    live.client.on_permission = approve
    await live.client.set_config(live.session, "mode", live.profile["approval_mode"])
    target = live.workspace / f"approved-{live.name}.txt"
    edit = live.profile["approval_asks_for"] == "edit"
    prompt = f"WRITE: {target.name} approved" if edit else f"RUN: echo approved > {target.name}"
    result = await live.client.prompt(live.session, prompt, within=WITHIN)
    assert result["stopReason"] == "end_turn"
    assert len(asked) == 1
    assert asked[0]["sessionId"] == live.session
    assert target.read_text().strip() == "approved"


async def test_a_fork_carries_the_conversation_into_a_new_session(live: Live, fake: FakeModel) -> None:
    params = {"sessionId": live.session, "cwd": str(live.workspace), "mcpServers": []}
    if not live.native("fork"):
        await assert_missing(live, "fork", params)
        return
    forked = await live.client.request("session/fork", params)
    fork = forked["sessionId"]
    assert fork != live.session
    words = f"{live.name} words in the fork"
    result = await live.client.prompt(fork, words, within=WITHIN)
    assert result["stopReason"] == "end_turn"
    assert f"{live.name} first words" in json.dumps(await wait_body_with(fake, words))


async def test_a_rewind_is_not_served_so_rollback_needs_the_fallback(live: Live) -> None:
    assert not live.native("rewind")
    await assert_missing(live, "rewind", {"sessionId": live.session, "numTurns": 1})


async def test_after_a_kill_the_session_resumes_and_loads_in_a_new_process(live: Live, fake: FakeModel) -> None:
    assert live.native("resume") and live.native("load")
    os.kill(live.client.proc.pid, signal.SIGKILL)
    await live.client.wait_exit(WITHIN)
    again = await AcpClient.spawn(live.launch.argv, env=live.launch.env, cwd=str(live.workspace))
    live.extra.append(again)
    await again.initialize()
    await again.resume(live.session, str(live.workspace))
    words = f"{live.name} words after the kill"
    result = await again.prompt(live.session, words, within=WITHIN)
    assert result["stopReason"] == "end_turn"
    assert f"{live.name} first words" in json.dumps(await wait_body_with(fake, words))
    await again.load(live.session, str(live.workspace))
    replayed = again.texts(live.session, "user_message_chunk")
    assert f"{live.name} first words" in replayed and words in replayed

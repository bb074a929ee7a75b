"""The scripted agent's ACP face (`python -m threadloom.agent --acp`) as an ACP client sees it: a real process
driven over stdio by tests/support/acp_client.py (docs/scripted-agent.md, "The ACP face")."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.acp_client import AcpClient
from threadloom.agent.directives import Approvals, Config, DirectiveError, Stop, Usage, parse

Message = dict[str, Any]


def agent_argv(state: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "threadloom.agent", "--acp", "--state-dir", str(state), *args]


class Spawner:
    """New agent processes on one state folder per test (a respawn sees the same sessions), and one agent the
    module's tests share (each in sessions of its own) where a process of their own would only cost time."""

    def __init__(self, state: Path, cwd: Path, shared: AcpClient) -> None:
        self.state = state
        self.cwd = cwd
        self.started: list[AcpClient] = []
        self._shared = shared

    async def __call__(self, *args: str) -> AcpClient:
        client = await AcpClient.spawn(agent_argv(self.state, *args), cwd=str(self.cwd))
        self.started.append(client)
        return client

    def shared(self) -> AcpClient:
        """The module's agent, its answers to the agent's requests back to the defaults."""
        agent = self._shared
        agent.on_permission = lambda params: "allow"
        agent.on_elicitation = lambda params: {"action": "decline"}
        agent.hold_requests = False
        agent.held.clear()
        agent.cancelled_requests.clear()
        return agent


@pytest.fixture(scope="module")
async def shared_agent(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[AcpClient]:
    home = tmp_path_factory.mktemp("acp-shared")
    async with await AcpClient.spawn(agent_argv(home / "state"), cwd=str(home)) as agent:
        await agent.initialize()
        yield agent


@pytest.fixture
async def spawn(tmp_path: Path, shared_agent: AcpClient) -> AsyncIterator[Spawner]:
    spawner = Spawner(tmp_path / "state", tmp_path, shared_agent)
    yield spawner
    for client in spawner.started:
        await client.close()


@pytest.fixture
def work(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    folder.mkdir()
    return folder


async def session(spawn: Spawner, work: Path, *args: str, own: bool = False) -> tuple[AcpClient, str]:
    """A new session: on the shared agent, or (with `args`, or `own` for a test that ends its process) on a
    process of its own."""
    if args or own:
        agent = await spawn(*args)
        await agent.initialize()
    else:
        agent = spawn.shared()
    return agent, await agent.new_session(str(work))


async def test_a_prompt_streams_its_reply_as_message_chunks_of_one_message_and_ends_the_turn(
    spawn: Spawner, work: Path
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


async def test_cancel_ends_a_running_prompt_with_stop_reason_cancelled(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    _, response = agent.start_prompt(sid, "@reply started\n@await gate\n@reply never")
    await agent.wait_update(sid, lambda u: u.get("content", {}).get("text") == "started")
    await agent.cancel(sid)
    result = (await asyncio.wait_for(response, 30))["result"]
    assert result["stopReason"] == "cancelled"
    assert "never" not in agent.texts(sid)
    # The twin: the session takes the next prompt and finishes it.
    assert (await agent.prompt(sid, "@reply again"))["stopReason"] == "end_turn"


def of_kind(kind: str) -> Callable[[Message], bool]:
    return lambda update: update.get("sessionUpdate") == kind


def text_is(text: str) -> Callable[[Message], bool]:
    return lambda update: update.get("content", {}).get("text") == text


async def recall(agent: AcpClient, sid: str) -> list[str]:
    """What the agent holds for the session (`@recall`), minus the `@recall` asking for it."""
    before = len(agent.updates(sid, "agent_message_chunk"))
    await agent.prompt(sid, "@recall")
    lines = "".join(u["content"]["text"] for u in agent.updates(sid, "agent_message_chunk")[before:]).split("\n")
    assert lines[-1] == "user: @recall", lines
    return lines[:-1]


# --- initialize ---


async def test_initialize_advertises_every_session_method_and_the_extensions_under_meta(spawn: Spawner) -> None:
    agent = await spawn()
    init = await agent.initialize()
    assert init["protocolVersion"] == 1
    capabilities = init["agentCapabilities"]
    assert capabilities["loadSession"] is True
    assert capabilities["promptCapabilities"] == {"image": False, "audio": False, "embeddedContext": True}
    assert capabilities["sessionCapabilities"] == {"list": {}, "resume": {}, "close": {}, "fork": {}}
    assert init["_meta"] == {
        "steering": {"supported": True},
        "sessionRewind": {"version": 1, "method": "_session/rewind"},
        "sessionRewindFiles": {"version": 1, "method": "_session/files/revert"},
    }
    assert init["agentInfo"]["name"] == "threadloom-scripted"


async def test_a_feature_turned_off_is_not_advertised_and_its_method_is_not_found(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work, "--acp-without", "steering,fork,rewind,resume,load,list,files-revert")
    init = await agent.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert init["agentCapabilities"]["loadSession"] is False
    assert init["agentCapabilities"]["sessionCapabilities"] == {"close": {}}
    assert init["_meta"] == {}
    for method, params in [
        ("_session/steering", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]}),
        ("session/fork", {"sessionId": sid, "cwd": str(work)}),
        ("_session/rewind", {"sessionId": sid, "numTurns": 1}),
        ("session/resume", {"sessionId": sid, "cwd": str(work)}),
        ("session/load", {"sessionId": sid, "cwd": str(work), "mcpServers": []}),
        ("session/list", {}),
        ("_session/files/revert", {"sessionId": sid, "numTurns": 1}),
    ]:
        assert (await agent.error(method, params))["code"] == -32601, method
    # The twin: what is left on still works.
    assert await agent.close_session(sid) == {}


async def test_a_lied_about_feature_is_advertised_yet_its_method_is_not_found(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work, "--acp-lie", "fork,steering")
    init = await agent.request("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
    assert init["agentCapabilities"]["sessionCapabilities"]["fork"] == {}
    assert init["_meta"]["steering"] == {"supported": True}
    assert (await agent.error("session/fork", {"sessionId": sid, "cwd": str(work)}))["code"] == -32601
    params = {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]}
    assert (await agent.error("_session/steering", params))["code"] == -32601
    # The twin: an honest agent forks.
    honest, source = await session(spawn, work)
    assert await honest.fork(source, str(work)) != source


async def test_bad_requests_get_clear_errors_and_change_nothing(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    assert (await agent.error("session/nothing", {}))["code"] == -32601
    assert (await agent.error("session/new", {"cwd": "relative", "mcpServers": []}))["code"] == -32602
    assert (await agent.error("session/prompt", {"sessionId": sid, "prompt": []}))["code"] == -32602
    missing = {"sessionId": "no-such-session", "prompt": [{"type": "text", "text": "hi"}]}
    assert (await agent.error("session/prompt", missing))["code"] == -32002
    bad = {"sessionId": sid, "configId": "mode", "value": "reckless"}
    assert (await agent.error("session/set_config_option", bad))["code"] == -32602
    await agent.send_line(b"{not json\n")
    assert (await agent.prompt(sid, "@reply still here"))["stopReason"] == "end_turn"
    assert await recall(agent, sid) == ["user: @reply still here"]


# --- what a prompt streams ---


async def test_a_command_is_a_tool_call_updated_with_its_output_and_exit_code(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    await agent.prompt(sid, "@tool echo out-$((40+2))")
    call = agent.updates(sid, "tool_call")[0]
    assert call["kind"] == "execute" and call["status"] == "in_progress"
    assert call["title"] == "echo out-$((40+2))"
    assert call["rawInput"] == {"command": "echo out-$((40+2))", "cwd": str(work)}
    updates = agent.updates(sid, "tool_call_update")
    assert {u["toolCallId"] for u in updates} == {call["toolCallId"]}
    assert updates[-1]["status"] == "completed"
    assert updates[-1]["rawOutput"]["exitCode"] == 0
    assert updates[-1]["content"][0]["content"]["text"] == "out-42\n"


async def test_a_failing_command_fails_its_tool_call_not_the_prompt(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    assert (await agent.prompt(sid, "@tool exit 3"))["stopReason"] == "end_turn"
    last = agent.updates(sid, "tool_call_update")[-1]
    assert last["status"] == "failed" and last["rawOutput"]["exitCode"] == 3


async def test_a_write_is_an_edit_tool_call_and_writes_the_file(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    await agent.prompt(sid, "@write notes.txt hello file")
    call = agent.updates(sid, "tool_call")[0]
    assert call["kind"] == "edit" and call["title"] == f"Write {work / 'notes.txt'}"
    assert agent.updates(sid, "tool_call_update")[-1]["status"] == "completed"
    assert (work / "notes.txt").read_text() == "hello file"


async def test_todo_sends_the_whole_plan_on_every_change(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    await agent.prompt(sid, "@todo read; write")
    plans = [[(e["content"], e["status"]) for e in u["entries"]] for u in agent.updates(sid, "plan")]
    assert plans[0] == [("read", "pending"), ("write", "pending")]
    assert plans[1] == [("read", "in_progress"), ("write", "pending")]
    assert plans[-1] == [("read", "completed"), ("write", "completed")]
    assert len(plans) == 5


async def test_a_plan_streams_as_thought_chunks_of_its_own_message(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    await agent.prompt(sid, "@plan first think\n@reply then answer")
    thoughts = agent.updates(sid, "agent_thought_chunk")
    assert "".join(t["content"]["text"] for t in thoughts) == "first think"
    replies = agent.updates(sid, "agent_message_chunk")
    assert {t["messageId"] for t in thoughts}.isdisjoint({r["messageId"] for r in replies})
    assert len({t["messageId"] for t in thoughts}) == 1


async def test_a_subagent_is_a_tool_call_and_its_messages_name_it_as_parent(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    await agent.prompt(sid, "@subagent look around\n@reply parent done")
    call = agent.updates(sid, "tool_call")[0]
    assert call["title"] == "Subagent: look around"
    child_session = call["_meta"]["threadloom"]["subagentSessionId"]
    child = [u for u in agent.updates(sid, "agent_message_chunk") if "_meta" in u]
    assert "".join(u["content"]["text"] for u in child) == "Subagent: look around"
    assert {u["_meta"]["threadloom"]["parentToolCallId"] for u in child} == {call["toolCallId"]}
    parent = [u for u in agent.updates(sid, "agent_message_chunk") if "_meta" not in u]
    assert "".join(u["content"]["text"] for u in parent) == "parent done"
    assert agent.updates(sid, "tool_call_update")[-1]["status"] == "completed"
    # The subagent's own session holds its turn: it can be loaded like any session.
    await agent.load(child_session, str(work))
    assert agent.texts(child_session) == "Subagent: look around"


# --- stop reasons ---


@pytest.mark.parametrize("reason", ["refusal", "max_tokens", "max_turn_requests"])
async def test_stop_ends_the_prompt_with_that_stop_reason(spawn: Spawner, work: Path, reason: str) -> None:
    agent, sid = await session(spawn, work)
    result = await agent.prompt(sid, f"@reply partial\n@stop {reason}\n@reply never")
    assert result["stopReason"] == reason
    assert agent.texts(sid) == "partial"


async def test_a_failed_turn_answers_the_prompt_with_an_internal_error(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    error = await agent.error("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "@fail boom"}]})
    assert error == {"code": -32603, "message": "boom"}
    error = await agent.error("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "@repy x"}]})
    assert error["code"] == -32603 and "unknown directive @repy" in error["message"]


async def test_a_second_prompt_while_one_runs_is_refused(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    _, first = agent.start_prompt(sid, "@reply one\n@await gate")
    await agent.wait_update(sid, text_is("one"))
    error = await agent.error("session/prompt", {"sessionId": sid, "prompt": [{"type": "text", "text": "two"}]})
    assert error["code"] == -32004
    (work / "gate").touch()
    assert (await asyncio.wait_for(first, 30))["result"]["stopReason"] == "end_turn"


# --- permissions and questions ---


async def test_an_approval_announces_a_pending_tool_call_asks_permission_and_runs_when_allowed(
    spawn: Spawner, work: Path
) -> None:
    agent, sid = await session(spawn, work)
    asked: list[Message] = []

    def allow(params: Message) -> str:
        asked.append(params)
        return "allow"

    agent.on_permission = allow
    await agent.prompt(sid, "@approval touch allowed.txt")
    assert (work / "allowed.txt").exists()
    call = agent.updates(sid, "tool_call")[0]
    assert call["status"] == "pending" and call["kind"] == "execute"
    (params,) = asked
    assert params["sessionId"] == sid
    assert params["toolCall"]["toolCallId"] == call["toolCallId"]
    assert params["toolCall"]["title"] == "touch allowed.txt"
    assert [(o["optionId"], o["kind"]) for o in params["options"]] == [
        ("allow", "allow_once"),
        ("allow-always", "allow_always"),
        ("reject", "reject_once"),
    ]
    assert agent.updates(sid, "tool_call_update")[-1]["status"] == "completed"


@pytest.mark.parametrize("answer", ["reject", None])
async def test_a_rejected_or_dismissed_approval_fails_the_tool_call_and_runs_nothing(
    spawn: Spawner, work: Path, answer: str | None
) -> None:
    agent, sid = await session(spawn, work)
    agent.on_permission = lambda params: answer
    assert (await agent.prompt(sid, "@approval touch refused.txt\n@reply went on"))["stopReason"] == "end_turn"
    assert not (work / "refused.txt").exists()
    assert agent.updates(sid, "tool_call_update")[-1]["status"] == "failed"
    assert agent.texts(sid) == "went on"


async def test_approvals_keeps_several_permission_requests_outstanding_at_once(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    agent.hold_requests = True
    _, response = agent.start_prompt(sid, "@approvals touch a.txt | touch b.txt | touch c.txt")
    held = await agent.wait_held(3)
    assert [h["params"]["toolCall"]["title"] for h in held] == ["touch a.txt", "touch b.txt", "touch c.txt"]
    # Answered last to first: each answer reaches its own request.
    for request, option in zip(reversed(held), ["allow", "reject", "allow"], strict=True):
        await agent.answer(request["id"], {"outcome": {"outcome": "selected", "optionId": option}})
    assert (await asyncio.wait_for(response, 30))["result"]["stopReason"] == "end_turn"
    assert sorted(os.listdir(work)) == ["a.txt", "c.txt"]


async def test_a_cancelled_prompt_withdraws_its_outstanding_permission_requests(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    agent.hold_requests = True
    _, response = agent.start_prompt(sid, "@approvals touch a.txt | touch b.txt")
    held = await agent.wait_held(2)
    await agent.cancel(sid)
    assert (await asyncio.wait_for(response, 30))["result"]["stopReason"] == "cancelled"
    assert sorted(agent.cancelled_requests) == sorted(h["id"] for h in held)
    assert os.listdir(work) == []


async def test_a_question_is_a_form_elicitation_and_the_reply_carries_the_answer(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    asked: list[Message] = []

    def pick(params: Message) -> Message:
        asked.append(params)
        return {"action": "accept", "content": {"answer": "blue"}}

    agent.on_elicitation = pick
    await agent.prompt(sid, "@ask Which colour? | red | blue")
    (params,) = asked
    assert params["sessionId"] == sid and params["mode"] == "form" and params["message"] == "Which colour?"
    field = params["requestedSchema"]["properties"]["answer"]
    assert field == {"type": "string", "title": "Which colour?", "enum": ["red", "blue"]}
    assert params["requestedSchema"]["required"] == ["answer"]
    assert agent.texts(sid) == "Answer: blue"


async def test_a_question_goes_unanswered_when_the_client_cannot_show_a_form(spawn: Spawner, work: Path) -> None:
    agent = await spawn()
    await agent.initialize(elicitation=False)
    sid = await agent.new_session(str(work))
    await agent.prompt(sid, "@ask Which colour? | red | blue")
    assert agent.texts(sid) == "Answer: "
    assert not [m for m in agent.messages if m.get("method") == "elicitation/create"]


async def test_a_declined_elicitation_is_no_answer(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    agent.on_elicitation = lambda params: {"action": "decline"}
    await agent.prompt(sid, "@ask Name?")
    assert agent.texts(sid) == "Answer: "


# --- cancel_request, steering ---


async def test_cancel_request_ends_the_prompt_with_request_cancelled(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    request_id, response = agent.start_prompt(sid, "@reply started\n@await gate\n@reply never")
    await agent.wait_update(sid, text_is("started"))
    await agent.cancel_request(request_id)
    assert (await asyncio.wait_for(response, 30))["error"]["code"] == -32800
    assert "never" not in agent.texts(sid)
    assert (await agent.prompt(sid, "@reply next"))["stopReason"] == "end_turn"


async def test_steering_injects_a_message_into_the_running_prompt(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    _, response = agent.start_prompt(sid, "@reply waiting\n@await-steer\n@reply after")
    await agent.wait_update(sid, text_is("waiting"))
    assert await agent.steer(sid, "also this") == {"outcome": "injected"}
    assert (await asyncio.wait_for(response, 30))["result"]["stopReason"] == "end_turn"
    assert agent.texts(sid) == "waitingSteered: also thisafter"
    assert await recall(agent, sid) == ["user: @reply waiting\\n@await-steer\\n@reply after", "user: also this"]


async def test_steering_an_idle_session_asks_for_a_prompt_instead(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    assert await agent.steer(sid, "too late") == {"outcome": "promptRequired", "reason": "noRunningTurn"}
    assert await recall(agent, sid) == []


# --- usage and config ---


async def test_usage_sends_a_usage_update_with_cumulative_tokens_and_cost(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    first = await agent.prompt(sid, "@usage 100 20 0.25")
    assert agent.updates(sid, "usage_update")[-1] == {
        "sessionUpdate": "usage_update",
        "used": 120,
        "size": 200000,
        "cost": {"amount": 0.25, "currency": "USD"},
    }
    assert first["usage"] == {"inputTokens": 100, "outputTokens": 20, "totalTokens": 120}
    second = await agent.prompt(sid, "@usage 50 5 0.5\n@usage 1 1")
    last = agent.updates(sid, "usage_update")[-1]
    assert (last["used"], last["cost"]["amount"]) == (177, 0.75)
    assert second["usage"] == {"inputTokens": 51, "outputTokens": 6, "totalTokens": 57}  # the prompt's own


async def test_trailing_usage_sends_the_usage_update_after_the_prompt_response(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work, "--acp-fault", "trailing-usage")
    request_id, response = agent.start_prompt(sid, "@usage 10 2 0.01")
    await asyncio.wait_for(response, 30)
    update = await agent.wait_update(sid, of_kind("usage_update"))
    assert update["used"] == 12
    answered = next(i for i, m in enumerate(agent.received) if m.get("id") == request_id and "result" in m)
    usage = [
        i for i, m in enumerate(agent.received) if of_kind("usage_update")((m.get("params") or {}).get("update", {}))
    ]
    assert usage == [answered + 1]  # one usage_update, right after the response


async def test_config_options_set_mode_and_model_and_keep_them_across_a_respawn(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work, own=True)
    options = {o["id"]: o for o in (await agent.set_config(sid, "mode", "read_only"))["configOptions"]}
    assert options["mode"]["currentValue"] == "read_only" and options["mode"]["category"] == "mode"
    options = {o["id"]: o for o in (await agent.set_config(sid, "model", "scripted-deep"))["configOptions"]}
    assert options["model"]["currentValue"] == "scripted-deep"
    await agent.prompt(sid, "@write blocked.txt no")
    assert not (work / "blocked.txt").exists()  # read_only writes nothing
    await agent.close()
    again = await spawn()
    await again.initialize()
    resumed = {o["id"]: o["currentValue"] for o in (await again.resume(sid, str(work)))["configOptions"]}
    assert resumed == {"mode": "read_only", "model": "scripted-deep"}


async def test_the_agent_changing_a_config_option_sends_config_option_update(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    await agent.prompt(sid, "@config mode approval_required")
    (update,) = agent.updates(sid, "config_option_update")
    assert {o["id"]: o["currentValue"] for o in update["configOptions"]}["mode"] == "approval_required"
    agent.on_permission = lambda params: "reject"
    await agent.prompt(sid, "@tool touch asked.txt")  # approval_required: every command asks first
    assert not (work / "asked.txt").exists()


# --- sessions: load, resume, list, close, fork, rewind, files ---


async def test_a_crashed_agent_respawned_replays_the_session_on_load_and_goes_on(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work, own=True)
    await agent.prompt(sid, "@reply one")
    _, response = agent.start_prompt(sid, "@reply about to\n@crash")
    assert await agent.wait_exit() == 17
    with pytest.raises(ConnectionError):  # the stream closed under the prompt
        await asyncio.wait_for(response, 30)
    again = await spawn()
    await again.initialize()
    # Until the session is loaded, the new process does not know it.
    missing = {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
    assert (await again.error("session/prompt", missing))["code"] == -32002
    await again.load(sid, str(work))
    replay = [(u["sessionUpdate"], u["content"]["text"]) for u in again.updates(sid)]
    assert replay == [
        ("user_message_chunk", "@reply one"),
        ("agent_message_chunk", "one"),
        ("user_message_chunk", "@reply about to\n@crash"),
    ]
    user_ids = [u["messageId"] for u in again.updates(sid, "user_message_chunk")]
    assert len(set(user_ids)) == 2
    assert await recall(again, sid) == ["user: @reply one", "user: @reply about to\\n@crash"]


async def test_resume_after_a_respawn_continues_without_replaying(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work, own=True)
    await agent.prompt(sid, "@reply one")
    await agent.close()
    again = await spawn()
    await again.initialize()
    await again.resume(sid, str(work))
    assert again.updates(sid) == []
    assert await recall(again, sid) == ["user: @reply one"]


async def test_list_shows_sessions_with_titles_filtered_by_cwd(spawn: Spawner, work: Path, tmp_path: Path) -> None:
    agent, first = await session(spawn, work, own=True)
    await agent.prompt(first, "@reply titled\nsecond line")
    other = tmp_path / "other"
    other.mkdir()
    elsewhere = await agent.new_session(str(other))
    listed = (await agent.list_sessions(cwd=str(work)))["sessions"]
    assert [(s["sessionId"], s["cwd"], s["title"]) for s in listed] == [(first, str(work), "@reply titled")]
    assert listed[0]["updatedAt"].endswith("Z")
    everything = {s["sessionId"] for s in (await agent.list_sessions())["sessions"]}
    assert everything == {first, elsewhere}


async def test_close_forgets_the_session_until_it_is_loaded_again(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    await agent.prompt(sid, "@reply one")
    assert await agent.close_session(sid) == {}
    missing = {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]}
    assert (await agent.error("session/prompt", missing))["code"] == -32002
    await agent.load(sid, str(work))
    assert (await agent.prompt(sid, "@reply two"))["stopReason"] == "end_turn"


async def test_fork_copies_the_conversation_into_a_new_session_and_leaves_the_source_alone(
    spawn: Spawner, work: Path
) -> None:
    agent, source = await session(spawn, work)
    await agent.prompt(source, "@reply one")
    forked = await agent.fork(source, str(work))
    await agent.prompt(forked, "@reply only in the fork")
    assert await recall(agent, forked) == ["user: @reply one", "user: @reply only in the fork"]
    assert await recall(agent, source) == ["user: @reply one"]


async def test_fork_of_a_running_session_leaves_the_running_turn_out(spawn: Spawner, work: Path) -> None:
    agent, source = await session(spawn, work)
    await agent.prompt(source, "@reply one")
    _, response = agent.start_prompt(source, "@reply two\n@await gate")
    await agent.wait_update(source, text_is("two"))
    forked = await agent.fork(source, str(work))
    (work / "gate").touch()
    await asyncio.wait_for(response, 30)
    assert await recall(agent, forked) == ["user: @reply one"]


async def test_rewind_drops_the_last_turns_from_the_conversation(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    for text in ("one", "two", "three"):
        await agent.prompt(sid, f"@reply {text}")
    assert await agent.rewind(sid, 2) == {"rewound": True, "sessionId": sid, "turns": 1}
    assert await recall(agent, sid) == ["user: @reply one"]
    error = await agent.error("_session/rewind", {"sessionId": sid, "numTurns": 9})
    assert error["code"] == -32602


async def test_rewind_before_a_message_drops_it_and_everything_after(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work)
    await agent.prompt(sid, "@reply one")
    second = (await agent.prompt(sid, "@reply two"))["_meta"]["threadloom"]["turnId"]
    await agent.prompt(sid, "@reply three")
    params = {"sessionId": sid, "beforeMessage": {"messageId": second}}
    assert (await agent.request("_session/rewind", params))["turns"] == 1
    assert await recall(agent, sid) == ["user: @reply one"]


async def test_files_revert_puts_back_what_the_last_turns_wrote_even_after_a_respawn(
    spawn: Spawner, work: Path
) -> None:
    agent, sid = await session(spawn, work, own=True)
    (work / "kept.txt").write_text("original")
    await agent.prompt(sid, "@write kept.txt first")
    await agent.prompt(sid, "@write kept.txt second\n@write new.txt fresh")
    await agent.close()
    again = await spawn()
    await again.initialize()
    await again.resume(sid, str(work))
    reverted = await again.revert_files(sid, 1)
    assert sorted(reverted["reverted"]) == [str(work / "kept.txt"), str(work / "new.txt")]
    assert (work / "kept.txt").read_text() == "first" and not (work / "new.txt").exists()
    await again.revert_files(sid, 2)
    assert (work / "kept.txt").read_text() == "original"
    assert len(await recall(again, sid)) == 2  # the conversation keeps its turns


# --- faults a client must survive ---


async def test_orphan_updates_sends_tool_call_updates_without_their_tool_call(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work, "--acp-fault", "orphan-updates")
    await agent.prompt(sid, "@tool true\n@approval true")
    assert agent.updates(sid, "tool_call") == []
    assert len({u["toolCallId"] for u in agent.updates(sid, "tool_call_update")}) == 2
    assert agent.updates(sid, "tool_call_update")[-1]["status"] == "completed"


async def test_huge_line_sends_one_oversized_update_and_the_stream_goes_on(spawn: Spawner, work: Path) -> None:
    agent, sid = await session(spawn, work, "--acp-fault", "huge-line", "--acp-huge-line-bytes", "3000000")
    assert (await agent.prompt(sid, "@reply after the big one"))["stopReason"] == "end_turn"
    (thought,) = agent.updates(sid, "agent_thought_chunk")
    assert len(thought["content"]["text"]) == 3000000
    assert agent.texts(sid) == "after the big one"
    # A reader with a smaller buffer drops that one line and reads on.
    small = await AcpClient.spawn(agent_argv(work.parent / "state", "--acp-fault", "huge-line"), limit=1 << 20)
    try:
        await small.initialize()
        other = await small.new_session(str(work))
        assert (await small.prompt(other, "@reply still read"))["stopReason"] == "end_turn"
        assert small.oversized and small.oversized[0] > 8 * 1024 * 1024
        assert small.texts(other) == "still read"
    finally:
        await small.close()


# --- the official SDK as the client: every message the face sends must validate against its schema models ---


class SdkEditor:
    """An ACP client built on the `agent-client-protocol` SDK: it parses every update and request into the
    schema's models, so a malformed message fails here instead of reaching a real editor."""

    def __init__(self) -> None:
        self.updates: list[Message] = []
        self.permissions: list[Message] = []
        self.forms: list[str] = []

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append(update.model_dump(by_alias=True, exclude_none=True))

    async def request_permission(self, session_id: str, tool_call: Any, options: list[Any], **_: Any) -> Any:
        from acp.schema import AllowedOutcome, RequestPermissionResponse

        self.permissions.append(tool_call.model_dump(by_alias=True, exclude_none=True))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=options[0].option_id))

    async def create_elicitation(self, message: str, mode: Any, **_: Any) -> Any:
        from acp.schema import AcceptElicitationResponse

        self.forms.append(message)
        return AcceptElicitationResponse(action="accept", content={"answer": "yes"})

    def on_connect(self, conn: Any) -> None:
        pass

    def kinds(self) -> set[str]:
        return {u["sessionUpdate"] for u in self.updates}


SDK_SCRIPT = """@plan think first
@todo one; two
@reply hello
@tool echo tool-output
@approval echo approved
@write sdk.txt written
@ask Proceed? | yes | no
@subagent helper
@usage 10 5 0.02
@config model scripted-deep"""


async def test_the_official_sdk_client_drives_every_method_and_validates_every_message(
    tmp_path: Path, work: Path
) -> None:
    from acp.schema import ClientCapabilities, ElicitationCapabilities, ElicitationFormCapabilities, TextContentBlock
    from acp.stdio import spawn_agent_process

    editor = SdkEditor()
    argv = agent_argv(tmp_path / "state")
    capabilities = ClientCapabilities(elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities()))
    async with spawn_agent_process(lambda _agent: editor, *argv, use_unstable_protocol=True) as (conn, process):
        init = await conn.initialize(protocol_version=1, client_capabilities=capabilities)
        assert init.agent_capabilities is not None and init.agent_capabilities.load_session is True
        caps = init.agent_capabilities.session_capabilities
        assert caps is not None and caps.fork is not None and caps.resume is not None and caps.list is not None
        new = await conn.new_session(cwd=str(work))
        sid = new.session_id
        assert new.config_options is not None and len(new.config_options) == 2
        done = await conn.prompt(session_id=sid, prompt=[TextContentBlock(type="text", text=SDK_SCRIPT)])
        assert done.stop_reason == "end_turn"
        # The turn's own `@usage 10 5` plus its subagent's default call (10 + 5, as a turn without `@usage`).
        assert done.usage is not None and done.usage.total_tokens == 30
        assert editor.kinds() == {
            "agent_thought_chunk",
            "plan",
            "agent_message_chunk",
            "tool_call",
            "tool_call_update",
            "usage_update",
            "config_option_update",
            "session_info_update",
        }
        assert [p["title"] for p in editor.permissions] == ["echo approved"]
        assert editor.forms == ["Proceed?"]
        assert (work / "sdk.txt").read_text() == "written"
        assert await conn.ext_method("session/steering", {"sessionId": sid, "prompt": []}) == {
            "outcome": "promptRequired",
            "reason": "noRunningTurn",
        }
        configured = await conn.set_config_option(config_id="mode", session_id=sid, value="read_only")
        assert {o.id: o.current_value for o in configured.config_options}["mode"] == "read_only"
        forked = await conn.fork_session(session_id=sid, cwd=str(work))
        listed = await conn.list_sessions(cwd=str(work))
        assert {s.session_id for s in listed.sessions} >= {sid, forked.session_id}
        await conn.resume_session(session_id=sid, cwd=str(work))
        before = len(editor.updates)
        await conn.load_session(cwd=str(work), session_id=forked.session_id)
        replay = [u["sessionUpdate"] for u in editor.updates[before:]]
        assert replay == ["user_message_chunk", "agent_message_chunk"]
        await conn.ext_method("session/rewind", {"sessionId": sid, "numTurns": 1})
        await conn.close_session(session_id=sid)
    assert process.returncode == 0


async def test_without_config_elicitation_and_cancel_request_the_face_does_without_them(
    spawn: Spawner, work: Path
) -> None:
    agent, sid = await session(spawn, work, "--acp-without", "config,elicitation,cancel-request")
    assert "configOptions" not in await agent.request("session/new", {"cwd": str(work), "mcpServers": []})
    bad = {"sessionId": sid, "configId": "mode", "value": "read_only"}
    assert (await agent.error("session/set_config_option", bad))["code"] == -32601
    await agent.prompt(sid, "@ask Which? | a | b")
    assert agent.texts(sid) == "Answer: "  # the client offered forms, the agent did not use them
    request_id, response = agent.start_prompt(sid, "@reply held\n@await gate")
    await agent.wait_update(sid, text_is("held"))
    await agent.cancel_request(request_id)  # ignored …
    await agent.cancel(sid)  # … while session/cancel still works
    assert (await asyncio.wait_for(response, 30))["result"]["stopReason"] == "cancelled"


# --- the directives this face brought, as parsed and in the Codex face ---


def test_the_new_directives_parse_and_their_typos_fail_before_anything_runs() -> None:
    assert parse("@approvals touch a | touch b |") == [Approvals(("touch a", "touch b"))]
    assert parse("@usage 10 2\n@usage 1 0 0.5") == [Usage(10, 2), Usage(1, 0, 0.5)]
    assert parse("@stop max_tokens") == [Stop("max_tokens")]
    assert parse("@config model scripted-deep") == [Config("model", "scripted-deep")]
    for typo in ["@approvals", "@usage 10", "@usage 1 2 -1", "@usage 1 2 nan", "@usage 1 2 inf", "@usage x 2"]:
        with pytest.raises(DirectiveError):
            parse(typo)
    for typo in ["@stop later", "@stop", "@config mode", "@config"]:
        with pytest.raises(DirectiveError):
            parse(typo)


async def test_the_codex_face_asks_all_approvals_at_once_reports_usage_and_stops(tmp_path: Path, work: Path) -> None:
    argv = [sys.executable, "-m", "threadloom.agent", "--state-dir", str(tmp_path / "codex-state")]
    async with await AcpClient.spawn(argv) as codex:  # the client reads plain JSON lines too
        codex.hold_requests = True
        thread = (await codex.request("thread/start", {"cwd": str(work)}))["thread"]["id"]
        script = "@approvals touch a.txt | touch b.txt\n@usage 7 3 0.125\n@stop refusal"
        await codex.request("turn/start", {"threadId": thread, "input": [{"type": "text", "text": script}]})
        held = await codex.wait_held(2)
        assert [h["params"]["command"] for h in held] == ["touch a.txt", "touch b.txt"]
        await codex.answer(held[1]["id"], {"decision": "accept"})
        await codex.answer(held[0]["id"], {"decision": "decline"})
        done = await codex.wait_for(lambda m: m.get("method") == "turn/completed")
        assert done["params"]["turn"]["status"] == "failed" and done["params"]["turn"]["stopReason"] == "refusal"
        usage = next(m["params"] for m in codex.messages if m.get("method") == "thread/tokenUsage/updated")
        assert usage["tokenUsage"]["last"]["totalTokens"] == 10 and usage["costUsd"] == 0.125
        assert os.listdir(work) == ["b.txt"]


async def test_a_session_outside_the_agents_workspace_is_refused(spawn: Spawner, work: Path, tmp_path: Path) -> None:
    agent, inside = await session(spawn, work, "--workspace", str(work))
    outside = tmp_path / "outside"
    outside.mkdir()
    error = await agent.error("session/new", {"cwd": str(outside), "mcpServers": []})
    assert error["code"] == -32602 and "outside this agent's workspace" in error["message"]
    assert (await agent.error("session/fork", {"sessionId": inside, "cwd": str(outside)}))["code"] == -32602
    # The twin: a folder inside the workspace is fine.
    (work / "sub").mkdir()
    assert await agent.new_session(str(work / "sub"))


async def test_files_revert_leaves_a_folder_swapped_for_a_link_out_of_the_workspace_alone(
    spawn: Spawner, work: Path, tmp_path: Path
) -> None:
    """A folder the turn wrote into, swapped for a link to outside since, is not followed: the file outside
    keeps its content. The twin in the same revert: a file still inside is put back."""
    agent, sid = await session(spawn, work, own=True)
    (work / "sub").mkdir()
    (work / "inside.txt").write_text("before")
    await agent.prompt(sid, "@write sub/a.txt written\n@write inside.txt changed")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "a.txt").write_text("not yours")
    (work / "sub" / "a.txt").unlink()
    (work / "sub").rmdir()
    (work / "sub").symlink_to(outside, target_is_directory=True)
    reverted = await agent.revert_files(sid, 1)
    assert reverted["reverted"] == [str(work / "inside.txt")]
    assert (outside / "a.txt").read_text() == "not yours" and (work / "inside.txt").read_text() == "before"

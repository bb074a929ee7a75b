"""The claude driver against the real Claude Code CLI (pinned npm dependency) and the fake model.

Each test gets its own fake model server, instance home and workspace, drives a
`ClaudeRuntime` directly and waits for its events (never for time).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support.fake_model import FakeModel
from threadloom.providers import agent_cli
from threadloom.providers.claude import ClaudeDriver, ClaudeRuntime
from threadloom.providers.claude import runtime as claude_runtime
from threadloom.providers.claude.process import ClaudeProcess
from threadloom.providers.contract import (
    ItemCompleted,
    ItemStarted,
    ProviderError,
    ProviderEvent,
    RequestOpened,
    SessionScope,
    TextDelta,
    ThreadSettings,
    TodoUpdated,
    TurnCompleted,
    TurnStarted,
    Warning,
)

WAIT = 90.0


class Events:
    """Everything a runtime emits, collected in the background; `wait` for the first match."""

    def __init__(self, runtime: ClaudeRuntime) -> None:
        self.seen: list[ProviderEvent] = []
        self._changed = asyncio.Condition()
        self._task = asyncio.create_task(self._pump(runtime))

    async def _pump(self, runtime: ClaudeRuntime) -> None:
        async for event in runtime.events():
            async with self._changed:
                self.seen.append(event)
                self._changed.notify_all()

    async def wait(self, match: Callable[[ProviderEvent], bool]) -> ProviderEvent:
        async with asyncio.timeout(WAIT), self._changed:
            while True:
                for event in self.seen:
                    if match(event):
                        return event
                await self._changed.wait()

    async def end_of(self, turn: str) -> TurnCompleted:
        event = await self.wait(lambda e: isinstance(e, TurnCompleted) and e.native_turn == turn)
        assert isinstance(event, TurnCompleted)
        return event

    async def request(self, turn: str) -> RequestOpened:
        event = await self.wait(lambda e: isinstance(e, RequestOpened) and e.native_turn == turn)
        assert isinstance(event, RequestOpened)
        return event

    def of(self, turn: str) -> list[ProviderEvent]:
        return [e for e in self.seen if getattr(e, "native_turn", None) == turn]

    def text(self, turn: str) -> str:
        return "".join(e.delta for e in self.of(turn) if isinstance(e, TextDelta))

    def messages(self, turn: str) -> list[str]:
        return [str(e.text) for e in self.of(turn) if isinstance(e, ItemCompleted) and e.kind == "assistant_message"]

    async def stop(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def main_loop(fake: FakeModel) -> list[dict[str, Any]]:
    """The CLI's conversation requests (side requests, e.g. titles, offer no tools)."""
    return [b for b in fake.bodies("/v1/messages") if b.get("tools")]


def carries(body: dict[str, Any], text: str) -> bool:
    return text in orjson.dumps(body.get("messages") or []).decode()


@pytest.fixture
def driver(fake: FakeModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> ClaudeDriver:
    monkeypatch.setenv("FAKE_ANTHROPIC_API_KEY", "x")
    # The fixture's threads default to full_access, which the instance must allow (an admin's setting).
    options = {"base_url": fake.url, "api_key_env": "FAKE_ANTHROPIC_API_KEY", "allow_full_access": True}
    return ClaudeDriver("claude-test", tmp_path / "agents" / "claude-test", options)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    path = tmp_path / "ws"
    path.mkdir()
    return path


def scope_of(driver: ClaudeDriver, workspace: Path) -> SessionScope:
    """The one project (its workspace) a test's runtime serves."""
    return SessionScope("p1", str(workspace), driver.state_dir / "p1")


@pytest.fixture
async def runtime(driver: ClaudeDriver, workspace: Path) -> AsyncIterator[ClaudeRuntime]:
    rt = await driver.open_session(scope_of(driver, workspace))
    yield rt
    await rt.close()


@pytest.fixture
async def events(runtime: ClaudeRuntime) -> AsyncIterator[Events]:
    collected = Events(runtime)
    yield collected
    await collected.stop()


def settings(workspace: Path, mode: str = "full_access") -> ThreadSettings:
    return ThreadSettings(cwd=str(workspace), runtime_mode=mode)


async def test_a_turn_streams_the_reply(runtime: ClaudeRuntime, events: Events, workspace: Path) -> None:
    thread = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(thread, "hello there")
    end = await events.end_of(turn)
    assert end.status == "completed"
    assert events.of(turn)[0] == TurnStarted(thread, turn)
    assert events.text(turn) == "echo: hello there"
    assert events.messages(turn) == ["echo: hello there"]


async def test_turns_on_one_thread_share_the_conversation(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel
) -> None:
    thread = await runtime.start_thread(settings(workspace))
    first = await runtime.start_turn(thread, "first words")
    await events.end_of(first)
    second = await runtime.start_turn(thread, "second words")
    assert (await events.end_of(second)).status == "completed"
    assert events.messages(second) == ["echo: second words"]
    last = main_loop(fake)[-1]
    assert carries(last, "first words") and carries(last, "echo: first words") and carries(last, "second words")


async def test_a_tool_call_really_runs(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel
) -> None:
    thread = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(thread, "RUN: echo hi > made.txt && echo made-it")
    assert (await events.end_of(turn)).status == "completed"
    assert (workspace / "made.txt").read_text() == "hi\n"
    started = [e for e in events.of(turn) if isinstance(e, ItemStarted) and e.kind == "tool_call"]
    assert [e.title for e in started] == ["echo hi > made.txt && echo made-it"]
    done = [e for e in events.of(turn) if isinstance(e, ItemCompleted) and e.item_id == started[0].item_id]
    assert done[0].status == "completed" and done[0].detail["exitCode"] == 0
    assert "made-it" in done[0].detail["output"]
    assert carries(main_loop(fake)[-1], "tool_result")
    assert events.messages(turn) == ["tool said: made-it"]
    assert not [e for e in events.seen if isinstance(e, RequestOpened)]


async def test_an_approved_command_runs(runtime: ClaudeRuntime, events: Events, workspace: Path) -> None:
    thread = await runtime.start_thread(settings(workspace, "approval_required"))
    turn = await runtime.start_turn(thread, "RUN: echo ok > approved.txt")
    request = await events.request(turn)
    assert request.kind == "command_approval"
    assert request.payload["command"] == "echo ok > approved.txt"
    assert not (workspace / "approved.txt").exists()
    await runtime.respond_to_request(request.request_ref, {"decision": "accept"})
    assert (await events.end_of(turn)).status == "completed"
    assert (workspace / "approved.txt").read_text() == "ok\n"
    tools = [e for e in events.of(turn) if isinstance(e, ItemCompleted) and e.kind == "tool_call"]
    assert [t.status for t in tools] == ["completed"]


async def test_a_declined_command_does_not_run(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel
) -> None:
    thread = await runtime.start_thread(settings(workspace, "approval_required"))
    turn = await runtime.start_turn(thread, "RUN: echo no > declined.txt")
    request = await events.request(turn)
    await runtime.respond_to_request(request.request_ref, {"decision": "decline"})
    assert (await events.end_of(turn)).status == "completed"
    assert not (workspace / "declined.txt").exists()
    tools = [e for e in events.of(turn) if isinstance(e, ItemCompleted) and e.kind == "tool_call"]
    assert [t.status for t in tools] == ["declined"]
    assert carries(main_loop(fake)[-1], "declined by the user")


async def test_a_file_write_asks_for_a_file_change(runtime: ClaudeRuntime, events: Events, workspace: Path) -> None:
    thread = await runtime.start_thread(settings(workspace, "approval_required"))
    target = workspace / "notes.txt"
    turn = await runtime.start_turn(thread, f"WRITE: {target} written-by-claude")
    request = await events.request(turn)
    assert request.kind == "file_change_approval" and request.payload["path"] == str(target)
    await runtime.respond_to_request(request.request_ref, {"decision": "accept"})
    assert (await events.end_of(turn)).status == "completed"
    assert target.read_text() == "written-by-claude"
    changes = [e for e in events.of(turn) if isinstance(e, ItemCompleted) and e.kind == "file_change"]
    assert [c.status for c in changes] == ["completed"]


async def test_read_only_threads_refuse_changes(runtime: ClaudeRuntime, events: Events, workspace: Path) -> None:
    """Its twins, a command writing the workspace in a workspace_write and in a full_access thread, are
    test_the_sandbox_shows_commands_only_the_workspace and test_a_tool_call_really_runs."""
    thread = await runtime.start_thread(settings(workspace, "read_only"))
    turn = await runtime.start_turn(thread, "RUN: echo x > refused.txt")
    assert (await events.end_of(turn)).status == "completed"
    assert not (workspace / "refused.txt").exists()
    assert [e for e in events.seen if isinstance(e, Warning) and e.native_thread == thread]
    assert not [e for e in events.seen if isinstance(e, RequestOpened)]


async def test_the_sandbox_shows_commands_only_the_workspace(
    driver: ClaudeDriver, runtime: ClaudeRuntime, events: Events, workspace: Path, tmp_path: Path
) -> None:
    """workspace_write (the default): a file beside the workspace and the agent's own state do not exist.
    The twins in the same command: a file of the workspace is read and one is made there."""
    (tmp_path / "other-project").mkdir()
    (tmp_path / "other-project" / "secret.txt").write_text("OTHER-PROJECT-SECRET")
    (workspace / "mine.txt").write_text("MY-WORKSPACE-FILE")
    state = driver.state_dir / "p1"
    thread = await runtime.start_thread(ThreadSettings(cwd=str(workspace)))  # the default mode
    command = f"cat {tmp_path}/other-project/secret.txt mine.txt; ls {state}; touch made.txt"
    turn = await runtime.start_turn(thread, f"RUN: {command} ../escaped.txt")
    assert (await events.end_of(turn)).status == "completed"
    [tool] = [e for e in events.of(turn) if isinstance(e, ItemCompleted) and e.kind == "tool_call"]
    output = tool.detail["output"]
    assert "MY-WORKSPACE-FILE" in output and (workspace / "made.txt").exists()
    assert "OTHER-PROJECT-SECRET" not in output and "claude-home" not in output
    assert (state / "claude-home").is_dir()  # though the folder listed is there, and holds it
    assert not (tmp_path / "escaped.txt").exists()
    assert not [e for e in events.seen if isinstance(e, RequestOpened)]  # and nothing was asked


async def test_a_question_is_answered(runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel) -> None:
    thread = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(thread, "ASK: Which color?")
    request = await events.request(turn)
    assert request.kind == "user_input"
    [question] = request.payload["questions"]
    assert question["question"] == "Which color?"
    assert [o["label"] for o in question["options"]] == ["Yes", "No"]
    await runtime.respond_to_request(request.request_ref, {"answers": {question["id"]: {"answers": ["No"]}}})
    assert (await events.end_of(turn)).status == "completed"
    assert carries(main_loop(fake)[-1], '\\"Which color?\\"=\\"No\\"')


def _reply_began(event: ProviderEvent, turn: str) -> bool:
    """The reply of `turn` has begun streaming (on "HOLD" the model then waits). Its first chunk is not shown
    yet: the driver keeps back the end of every stream until more follows (tests/test_redaction.py)."""
    return isinstance(event, ItemStarted) and event.kind == "assistant_message" and event.native_turn == turn


async def test_interrupt_ends_the_turn_and_the_thread_goes_on(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel
) -> None:
    thread = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(thread, "HOLD")
    await events.wait(lambda e: _reply_began(e, turn))
    await runtime.interrupt_turn(thread, turn)
    assert (await events.end_of(turn)).status == "interrupted"
    fake.release()
    again = await runtime.start_turn(thread, "after the interrupt")
    assert (await events.end_of(again)).status == "completed"
    assert events.messages(again) == ["echo: after the interrupt"]


async def test_steering_is_answered_within_the_turn(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel
) -> None:
    thread = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(thread, "HOLD")
    await events.wait(lambda e: _reply_began(e, turn))
    await runtime.steer_turn(thread, turn, "STEERED-XYZ")
    fake.release()
    assert (await events.end_of(turn)).status == "completed"
    assert "echo: STEERED-XYZ" in events.messages(turn)
    assert any(carries(b, "STEERED-XYZ") for b in main_loop(fake))
    after = await runtime.start_turn(thread, "next one")
    await events.end_of(after)
    assert len([e for e in events.seen if isinstance(e, TurnCompleted) and e.native_turn == turn]) == 1


async def test_steering_while_a_tool_waits_is_folded_in(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel
) -> None:
    thread = await runtime.start_thread(settings(workspace, "approval_required"))
    turn = await runtime.start_turn(thread, "RUN: echo t > steer.txt")
    request = await events.request(turn)
    await runtime.steer_turn(thread, turn, "STEER-DURING-TOOL")
    await runtime.respond_to_request(request.request_ref, {"decision": "accept"})
    assert (await events.end_of(turn)).status == "completed"
    assert any(carries(b, "STEER-DURING-TOOL") for b in main_loop(fake))
    after = await runtime.start_turn(thread, "next one")
    assert (await events.end_of(after)).status == "completed"
    assert len([e for e in events.seen if isinstance(e, TurnCompleted) and e.native_turn == turn]) == 1


async def test_a_killed_process_fails_its_turn_and_the_thread_resumes(
    driver: ClaudeDriver, runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel
) -> None:
    thread = await runtime.start_thread(settings(workspace))
    first = await runtime.start_turn(thread, "remember the pelican")
    await events.end_of(first)
    held = await runtime.start_turn(thread, "HOLD")
    await events.wait(lambda e: _reply_began(e, held))
    pid = runtime.process_id(thread)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    end = await events.end_of(held)
    assert end.status == "failed" and end.error is not None and "claude exited" in end.error
    fake.release()

    again = await runtime.start_turn(thread, "still there?")
    assert (await events.end_of(again)).status == "completed"
    assert runtime.process_id(thread) not in (None, pid)
    assert carries(main_loop(fake)[-1], "remember the pelican")

    other = await driver.open_session(scope_of(driver, workspace))  # a later runtime loads the same session
    other_events = Events(other)
    try:
        await other.resume_thread(thread, settings(workspace))
        turn = await other.start_turn(thread, "from another runtime")
        assert (await other_events.end_of(turn)).status == "completed"
        body = main_loop(fake)[-1]
        assert carries(body, "remember the pelican") and carries(body, "still there?")
    finally:
        await other.close()
        await other_events.stop()
    transcripts = list((driver.state_dir / "p1" / "claude-home" / ".claude" / "projects").glob(f"*/{thread}.jsonl"))
    assert len(transcripts) == 1 and "from another runtime" in transcripts[0].read_text()


async def test_resume_refuses_unknown_sessions(runtime: ClaudeRuntime, workspace: Path) -> None:
    with pytest.raises(ProviderError) as error:
        await runtime.resume_thread("8d3c4a64-4a4e-4a55-9f44-3f0e5d0e9d11", settings(workspace))
    assert error.value.code == "not_found"


async def test_fork_carries_the_history_and_leaves_the_parent_alone(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel
) -> None:
    parent = await runtime.start_thread(settings(workspace))
    alpha = await runtime.start_turn(parent, "alpha words")
    await events.end_of(alpha)
    beta = await runtime.start_turn(parent, "beta words")
    await events.end_of(beta)

    fork = await runtime.fork_thread(parent, None)
    assert fork != parent
    on_fork = await runtime.start_turn(fork, "on the fork")
    assert (await events.end_of(on_fork)).status == "completed"
    body = main_loop(fake)[-1]
    assert carries(body, "alpha words") and carries(body, "beta words") and carries(body, "on the fork")

    early = await runtime.fork_thread(parent, alpha)
    on_early = await runtime.start_turn(early, "on the early fork")
    assert (await events.end_of(on_early)).status == "completed"
    body = main_loop(fake)[-1]
    assert carries(body, "alpha words") and not carries(body, "beta words")

    on_parent = await runtime.start_turn(parent, "back on the parent")
    await events.end_of(on_parent)
    body = main_loop(fake)[-1]
    assert carries(body, "beta words") and not carries(body, "on the fork")


async def test_a_missing_cli_is_reported(fake: FakeModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FAKE_ANTHROPIC_API_KEY", "x")
    options = {"base_url": fake.url, "api_key_env": "FAKE_ANTHROPIC_API_KEY", "binary": "/nonexistent/claude"}
    with pytest.raises(ProviderError) as error:
        await ClaudeDriver("c", tmp_path / "a", options).open_session(SessionScope("p", str(tmp_path), tmp_path / "p"))
    assert error.value.code == "cli_missing"

    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setattr(agent_cli, "_node_bin_dirs", lambda: [])
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ProviderError) as error:
        await ClaudeDriver("c", tmp_path / "a", {"api_key_env": "FAKE_ANTHROPIC_API_KEY"}).open_session(
            SessionScope("p", str(tmp_path), tmp_path / "p")
        )
    assert error.value.code == "cli_missing" and "npm ci" in error.value.message


async def test_a_missing_api_key_is_reported_without_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_CLAUDE_KEY", raising=False)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-very-secret-value")
    with pytest.raises(ProviderError) as error:
        await ClaudeDriver("c", tmp_path / "a", {"api_key_env": "NO_SUCH_CLAUDE_KEY"}).open_session(
            SessionScope("p", str(tmp_path), tmp_path / "p")
        )
    assert error.value.code == "missing_api_key"
    assert "NO_SUCH_CLAUDE_KEY" in error.value.message
    assert "sk-ant-very-secret-value" not in str(error.value)


async def test_close_ends_the_event_stream(driver: ClaudeDriver, workspace: Path) -> None:
    runtime = await driver.open_session(scope_of(driver, workspace))
    collected = Events(runtime)
    thread = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(thread, "hello")
    await collected.end_of(turn)
    await runtime.close()
    await asyncio.wait_for(collected._task, WAIT)
    assert type(collected.seen[-1]).__name__ == "RuntimeExited"
    assert not runtime.alive


async def test_a_subagent_runs_as_a_child_turn(runtime: ClaudeRuntime, events: Events, workspace: Path) -> None:
    thread = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(thread, "AGENT: say sub-hello")
    assert (await events.end_of(turn)).status == "completed"
    [agent] = [e for e in events.of(turn) if isinstance(e, ItemStarted) and e.kind == "subagent"]
    child = agent.detail["childTurnId"]
    assert TurnStarted(thread, child, turn) in events.seen
    assert events.messages(child) == ["echo: say sub-hello"]
    [child_end] = [e for e in events.seen if isinstance(e, TurnCompleted) and e.native_turn == child]
    assert child_end.status == "completed" and child_end.parent_turn == turn
    done = [e for e in events.of(turn) if isinstance(e, ItemCompleted) and e.item_id == agent.item_id]
    assert [d.status for d in done] == ["completed"]


async def test_tasks_become_a_todo_list(runtime: ClaudeRuntime, events: Events, workspace: Path) -> None:
    thread = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(thread, "TODO: write the code; test the code")
    assert (await events.end_of(turn)).status == "completed"
    lists = [e.items for e in events.of(turn) if isinstance(e, TodoUpdated)]
    assert lists[-1] == [
        {"step": "write the code", "status": "completed"},
        {"step": "test the code", "status": "pending"},
    ]


async def test_cancelling_an_approval_interrupts_the_turn(
    runtime: ClaudeRuntime, events: Events, workspace: Path
) -> None:
    thread = await runtime.start_thread(settings(workspace, "approval_required"))
    turn = await runtime.start_turn(thread, "RUN: echo c > cancelled.txt")
    request = await events.request(turn)
    await runtime.respond_to_request(request.request_ref, {"decision": "cancel"})
    assert (await events.end_of(turn)).status == "interrupted"
    assert not (workspace / "cancelled.txt").exists()
    again = await runtime.start_turn(thread, "and now?")
    assert (await events.end_of(again)).status == "completed"


async def test_the_thread_model_is_used(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel
) -> None:
    thread = await runtime.start_thread(ThreadSettings(cwd=str(workspace), model="claude-sonnet-4-5"))
    turn = await runtime.start_turn(thread, "which model?")
    assert (await events.end_of(turn)).status == "completed"
    assert main_loop(fake)[-1]["model"] == "claude-sonnet-4-5"


async def test_secrets_in_tool_output_never_reach_the_events(
    driver: ClaudeDriver, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-test-RECOGNISABLE-4242-key"
    monkeypatch.setenv("FAKE_ANTHROPIC_API_KEY", secret)
    runtime = await driver.open_session(scope_of(driver, workspace))
    collected = Events(runtime)
    try:
        thread = await runtime.start_thread(settings(workspace))
        turn = await runtime.start_turn(thread, "RUN: echo key=$ANTHROPIC_API_KEY; env")
        assert (await collected.end_of(turn)).status == "completed"
        [tool] = [e for e in collected.of(turn) if isinstance(e, ItemCompleted) and e.kind == "tool_call"]
        assert tool.status == "completed" and "key=***" in tool.detail["output"]  # it ran, with the key
        assert not [e for e in collected.seen if secret in repr(e)]
    finally:
        await runtime.close()
        await collected.stop()


async def test_idle_processes_beyond_the_cap_are_stopped_and_resume(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(claude_runtime, "MAX_IDLE_CHILDREN", 1)
    first = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(first, "remember the heron")
    await events.end_of(turn)
    child = runtime._threads[first].child
    assert child is not None
    second = await runtime.start_thread(settings(workspace))
    turn = await runtime.start_turn(second, "another thread")
    await events.end_of(turn)
    assert runtime.process_id(first) is None and runtime.process_id(second) is not None
    await asyncio.wait_for(child.proc.wait(), WAIT)
    with pytest.raises(ProcessLookupError):
        os.kill(child.proc.pid, 0)

    again = await runtime.start_turn(first, "do you remember?")
    assert (await events.end_of(again)).status == "completed"
    assert events.messages(again) == ["echo: do you remember?"]
    body = main_loop(fake)[-1]
    assert carries(body, "remember the heron") and not carries(body, "another thread")
    assert runtime.process_id(first) not in (None, child.proc.pid)
    assert runtime.process_id(second) is None  # now the least recently used idle one


async def test_a_process_started_while_closing_is_stopped(
    runtime: ClaudeRuntime, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = await runtime.start_thread(settings(workspace))
    spawned: list[ClaudeProcess] = []
    spawn = runtime._spawn

    async def spawn_then_close(native: Any) -> ClaudeProcess:
        child = await spawn(native)
        spawned.append(child)
        await runtime.close()  # close() runs while the process starts
        return child

    monkeypatch.setattr(runtime, "_spawn", spawn_then_close)
    with pytest.raises(ProviderError) as error:
        await runtime.start_turn(thread, "hello")
    assert error.value.code == "exited"
    [child] = spawned
    assert child.proc.returncode is not None
    assert runtime.process_id(thread) is None


async def test_concurrent_turn_starts_spawn_once(
    runtime: ClaudeRuntime, events: Events, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    thread = await runtime.start_thread(settings(workspace))
    spawned: list[ClaudeProcess] = []
    spawn = runtime._spawn

    async def counting(native: Any) -> ClaudeProcess:
        spawned.append(await spawn(native))
        return spawned[-1]

    monkeypatch.setattr(runtime, "_spawn", counting)
    results = await asyncio.gather(
        runtime.start_turn(thread, "one"), runtime.start_turn(thread, "two"), return_exceptions=True
    )
    [turn] = [r for r in results if isinstance(r, str)]
    [refused] = [r for r in results if isinstance(r, ProviderError)]
    assert refused.code == "turn_active" and len(spawned) == 1
    assert (await events.end_of(turn)).status == "completed"


@pytest.mark.parametrize("where", ["streaming", "prompt"])
async def test_interrupt_with_a_queued_steer_ends_the_turn_once(
    runtime: ClaudeRuntime, events: Events, workspace: Path, fake: FakeModel, where: str
) -> None:
    if where == "streaming":  # the steer is queued behind the streamed text
        thread = await runtime.start_thread(settings(workspace))
        turn = await runtime.start_turn(thread, "HOLD")
        await events.wait(lambda e: _reply_began(e, turn))
    else:  # the steer arrives while a permission prompt waits
        thread = await runtime.start_thread(settings(workspace, "approval_required"))
        turn = await runtime.start_turn(thread, "RUN: echo s > steered.txt")
        await events.request(turn)
    await runtime.steer_turn(thread, turn, "QUEUED-STEER")
    await runtime.interrupt_turn(thread, turn)
    fake.release()
    assert (await events.end_of(turn)).status == "interrupted"

    after = await runtime.start_turn(thread, "the next message")
    assert (await events.end_of(after)).status == "completed"
    assert events.messages(after) == ["echo: the next message"]
    assert len([e for e in events.seen if isinstance(e, TurnCompleted) and e.native_turn == turn]) == 1
    assert not (workspace / "steered.txt").exists()


async def test_a_prompt_without_a_running_turn_is_denied(
    runtime: ClaudeRuntime, events: Events, workspace: Path, caplog: pytest.LogCaptureFixture
) -> None:
    written: list[bytes] = []

    class Stdin:
        def is_closing(self) -> bool:
            return False

        def write(self, data: bytes) -> None:
            written.append(data)

        async def drain(self) -> None:
            pass

    class Proc:
        stdin = Stdin()
        pid = 0

    sid = await runtime.start_thread(settings(workspace, "approval_required"))
    thread = runtime._threads[sid]
    child = ClaudeProcess(Proc())  # type: ignore[arg-type]
    thread.child = child
    request = {"subtype": "can_use_tool", "tool_name": "Bash", "input": {"command": "ls"}, "tool_use_id": "toolu_1"}
    with caplog.at_level("WARNING", "threadloom.providers.claude"):
        await runtime._on_message(thread, child, {"type": "control_request", "request_id": "r1", "request": request})
    thread.child = None
    [line] = written
    response = orjson.loads(line)["response"]
    assert response["request_id"] == "r1" and response["response"]["behavior"] == "deny"
    assert "no turn is running" in response["response"]["message"]
    assert "no turn is running" in caplog.text
    assert not [e for e in events.seen if isinstance(e, RequestOpened)]

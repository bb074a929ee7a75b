"""The codex driver against the real Codex CLI (`codex app-server`) and the local fake model.

Each test gets its own fake model server, CODEX_HOME and workspace, drives the runtime
directly and asserts what a user would see: streamed text, commands that really ran (or
did not), approvals, interrupts, steering, resume in a new process, fork and revert.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import signal
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.support import processes
from tests.support.fake_model import HOLD_SHOWN, FakeModel
from threadloom.providers import agent_cli
from threadloom.providers import contract as ev
from threadloom.providers.codex import CodexDriver, CodexRuntime
from threadloom.providers.codex_events import Translator
from threadloom.providers.contract import ProviderError, SessionScope, ThreadSettings

SECRET = "sk-fake-SECRET-4242"
WAIT_S = 60.0


def scope_of(driver: CodexDriver, cwd: Path) -> SessionScope:
    """The one project (workspace `cwd`) a test's runtime serves."""
    return SessionScope("p1", str(cwd), driver.state_dir / "p1")


@dataclasses.dataclass
class Session:
    """A runtime whose events are pumped into a queue, and everything seen so far."""

    runtime: CodexRuntime
    queue: asyncio.Queue[ev.ProviderEvent]
    seen: list[ev.ProviderEvent]
    pump: asyncio.Task[None]

    @classmethod
    async def open(cls, driver: CodexDriver, cwd: Path) -> Session:
        runtime = await driver.open_session(scope_of(driver, cwd))
        queue: asyncio.Queue[ev.ProviderEvent] = asyncio.Queue()
        seen: list[ev.ProviderEvent] = []

        async def pump() -> None:
            async for event in runtime.events():
                seen.append(event)
                await queue.put(event)

        return cls(runtime, queue, seen, asyncio.create_task(pump()))

    async def until(self, check: Callable[[ev.ProviderEvent], bool], within: float = WAIT_S) -> list[ev.ProviderEvent]:
        """Events up to and including the first one that satisfies `check`."""
        got: list[ev.ProviderEvent] = []

        async def collect() -> None:
            while True:
                event = await self.queue.get()
                got.append(event)
                if check(event):
                    return

        try:
            await asyncio.wait_for(collect(), within)
        except TimeoutError:
            raise AssertionError(f"no matching event in {within}s; got {got!r}") from None
        return got

    async def turn(self, thread: str, text: str) -> tuple[str, list[ev.ProviderEvent]]:
        """Start a turn and collect its events until it completes."""
        turn = await self.runtime.start_turn(thread, text)
        events = await self.until(lambda e: isinstance(e, ev.TurnCompleted) and e.native_turn == turn)
        return turn, events

    async def close(self) -> None:
        await self.runtime.close()
        await asyncio.wait_for(self.pump, WAIT_S)


@dataclasses.dataclass
class Codex:
    fake: FakeModel
    driver: CodexDriver
    cwd: Path
    session: Session

    def settings(self, mode: str = "full_access") -> ThreadSettings:
        return ThreadSettings(cwd=str(self.cwd), runtime_mode=mode)

    def requests(self) -> list[dict[str, Any]]:
        return self.fake.bodies("/v1/responses")

    def last_input(self) -> str:
        """The conversation the model was last sent, as text to search in."""
        return orjson.dumps(self.requests()[-1]["input"]).decode()


def texts(events: list[ev.ProviderEvent]) -> str:
    return "".join(e.delta for e in events if isinstance(e, ev.TextDelta))


def of_type(events: list[ev.ProviderEvent], kind: type[Any]) -> list[Any]:
    return [e for e in events if isinstance(e, kind)]


@pytest.fixture
async def codex(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Codex]:
    monkeypatch.setenv("FAKE_OPENAI_API_KEY", SECRET)
    fake = FakeModel().start()
    cwd = tmp_path / "work"
    cwd.mkdir()
    # The fixture's threads default to full_access, which the instance must allow (an admin's setting).
    options = {"base_url": fake.url + "/v1", "api_key_env": "FAKE_OPENAI_API_KEY", "allow_full_access": True}
    driver = CodexDriver("codex-test", tmp_path / "agent", options)
    session = await Session.open(driver, cwd)
    handle = Codex(fake, driver, cwd, session)
    yield handle
    fake.release()
    await handle.session.close()
    fake.stop()


async def test_a_simple_turn_streams_the_reply(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    turn, events = await s.turn(thread, "hello codex")

    assert of_type(events, ev.TurnStarted)[0].native_turn == turn
    assert texts(events) == "echo: hello codex"
    message = [e for e in of_type(events, ev.ItemCompleted) if e.kind == "assistant_message"]
    assert [m.text for m in message] == ["echo: hello codex"]
    done = events[-1]
    assert isinstance(done, ev.TurnCompleted) and done.status == "completed" and done.error is None
    # the key reached the model through the environment only: never the config, never an event
    config = (codex.driver.state_dir / "p1" / "codex-home" / "config.toml").read_text()
    assert SECRET not in config and 'env_key = "FAKE_OPENAI_API_KEY"' in config
    assert SECRET not in repr(s.seen)


def _process_view(pid: int) -> tuple[str, dict[str, str]]:
    """A running process's executable and environment, as /proc shows them."""
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    env = dict(item.decode().partition("=")[::2] for item in environ if item)
    return os.path.realpath(f"/proc/{pid}/exe"), env


def _npm_launcher() -> Path:
    """The file npm's `codex` command is (node_modules/.bin/codex resolved)."""
    return Path(os.path.realpath(agent_cli.find_cli("codex", None, "@openai/codex")))


async def test_the_npm_codex_starts_its_native_build_directly(codex: Codex, tmp_path: Path) -> None:
    """The default `codex` is npm's node launcher, which only execs the native build: the app-server is that
    build, started by us (no node process between), with the two variables the launcher sets. Twin: a
    configured binary that is not the launcher (here a shell wrapper) is started as it is."""
    started = codex.session.runtime.process.proc.pid  # full access: the network sandbox's `unshare` first
    views = [_process_view(pid) for pid in sorted({started} | processes.descendants(started))]
    assert not [exe for exe, _ in views if Path(exe).name == "node"], views
    launcher = _npm_launcher()
    assert launcher.suffix == ".js"
    (exe, env), *_ = [(exe, env) for exe, env in views if "/vendor/" in exe and Path(exe).name == "codex"]
    assert env["CODEX_MANAGED_BY_NPM"] == "1"
    assert env["CODEX_MANAGED_PACKAGE_ROOT"] == str(launcher.parent.parent)
    thread = await codex.session.runtime.start_thread(codex.settings())
    assert texts((await codex.session.turn(thread, "hello native"))[1]) == "echo: hello native"

    wrapper = tmp_path / "codex-wrapper"
    wrapper.write_text(f'#!/bin/sh\nexec {exe} "$@"\n')
    wrapper.chmod(0o755)
    options = {"base_url": codex.fake.url + "/v1", "api_key_env": "FAKE_OPENAI_API_KEY", "binary": str(wrapper)}
    driver = CodexDriver("codex-wrapped", tmp_path / "agent-wrapped", options)
    assert driver.launch() == ([str(wrapper), "app-server"], {})


async def test_turns_on_one_thread_share_the_conversation(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    await s.turn(thread, "first ALPHA")
    _, events = await s.turn(thread, "second BETA")

    assert texts(events) == "echo: second BETA"
    assert len(codex.requests()) == 2
    assert "first ALPHA" in codex.last_input() and "echo: first ALPHA" in codex.last_input()
    snapshot = await s.runtime.read_thread_snapshot(thread)
    assert snapshot["id"] == thread and len(snapshot["turns"]) == 2


async def test_a_turn_names_its_model_only_when_it_changes(codex: Codex, monkeypatch: pytest.MonkeyPatch) -> None:
    """turn/start's model holds for the next turns too, and naming it costs Codex time on every turn: it is
    sent when the thread's model changes, and each turn still reaches the model it asked for."""
    s = codex.session
    runtime = s.runtime
    named: list[object] = []
    request = runtime.process.request

    async def recorded(method: str, params: dict[str, Any], wait_s: float = 60.0) -> Any:
        if method == "turn/start":
            named.append(params.get("model"))
        return await request(method, params, wait_s)

    monkeypatch.setattr(runtime.process, "request", recorded)
    thread = await runtime.start_thread(codex.settings())
    default = codex.settings()
    other = dataclasses.replace(default, model="gpt-5.4")
    for settings in (default, default, other, other, default):
        turn = await runtime.start_turn(thread, "hello", settings)
        await s.until(lambda e, turn=turn: isinstance(e, ev.TurnCompleted) and e.native_turn == turn)
    assert named == [None, None, "gpt-5.4", None, runtime.model]
    assert [body["model"] for body in codex.requests()] == [runtime.model] * 2 + ["gpt-5.4"] * 2 + [runtime.model]


async def test_a_tool_call_really_runs_and_its_output_goes_back(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    _, events = await s.turn(thread, "RUN: echo hi > made.txt && echo wrote-it")

    assert (codex.cwd / "made.txt").read_text() == "hi\n"
    tool = [e for e in of_type(events, ev.ItemCompleted) if e.kind == "tool_call"]
    assert len(tool) == 1 and tool[0].status == "completed"
    assert tool[0].detail["exitCode"] == 0 and "wrote-it" in tool[0].detail["aggregatedOutput"]
    started = [e for e in of_type(events, ev.ItemStarted) if e.kind == "tool_call"]
    assert started[0].title == "echo hi > made.txt && echo wrote-it"
    follow_up = codex.requests()[-1]["input"][-1]
    assert follow_up["type"] == "function_call_output" and "wrote-it" in str(follow_up["output"])
    assert "tool said:" in texts(events) and "wrote-it" in texts(events)


async def test_secrets_the_agent_prints_are_redacted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tool printing its environment: the instance's secret env values never leave the driver."""
    monkeypatch.setenv("FAKE_OPENAI_API_KEY", SECRET)
    fake = FakeModel().start()
    cwd = tmp_path / "work"
    cwd.mkdir()
    options = {
        "base_url": fake.url + "/v1",
        "api_key_env": "FAKE_OPENAI_API_KEY",
        "env": {"DEPLOY_PASS": "pw-4711-do-not-show"},
    }
    s = await Session.open(CodexDriver("codex-test", tmp_path / "agent", options), cwd)
    try:
        thread = await s.runtime.start_thread(ThreadSettings(cwd=str(cwd)))
        _, events = await s.turn(thread, "RUN: env | sort")
    finally:
        fake.release()
        await s.close()
        fake.stop()
    tool = [e for e in of_type(events, ev.ItemCompleted) if e.kind == "tool_call"]
    assert tool and "DEPLOY_PASS=***" in tool[0].detail["aggregatedOutput"]  # printed, then redacted
    assert not any("pw-4711-do-not-show" in repr(e) or SECRET in repr(e) for e in s.seen)


def test_a_malformed_turn_error_still_ends_the_turn() -> None:
    translator = Translator(lambda text: text)
    message = {
        "method": "turn/completed",
        "params": {"threadId": "t", "turn": {"id": "u", "status": "failed", "error": "plain text"}},
    }
    assert translator.translate(message) == [ev.TurnCompleted("t", "u", "failed", "plain text")]


async def test_a_patch_edits_a_file(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    _, events = await s.turn(thread, "WRITE: notes.txt hello from the patch")

    assert (codex.cwd / "notes.txt").read_text() == "hello from the patch\n"
    change = [e for e in of_type(events, ev.ItemCompleted) if e.kind == "file_change"]
    assert change and change[0].status == "completed"
    assert "notes.txt" in str([e.title for e in of_type(events, ev.ItemStarted) if e.kind == "file_change"])


async def test_approval_accepted_runs_the_command(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings("approval_required"))
    turn = await s.runtime.start_turn(thread, "RUN: touch approved.txt")
    asked = (await s.until(lambda e: isinstance(e, ev.RequestOpened)))[-1]

    assert isinstance(asked, ev.RequestOpened)
    assert asked.kind == "command_approval" and asked.payload["command"] == "touch approved.txt"
    assert (asked.native_thread, asked.native_turn) == (thread, turn)
    assert not (codex.cwd / "approved.txt").exists()
    await s.runtime.respond_to_request(asked.request_ref, {"decision": "accept"})
    events = await s.until(lambda e: isinstance(e, ev.TurnCompleted))

    assert (codex.cwd / "approved.txt").exists()
    tool = [e for e in of_type(events, ev.ItemCompleted) if e.kind == "tool_call"]
    assert tool[0].status == "completed" and tool[0].detail["exitCode"] == 0
    assert events[-1] == ev.TurnCompleted(thread, turn, "completed")
    with pytest.raises(ProviderError) as answered_twice:
        await s.runtime.respond_to_request(asked.request_ref, {"decision": "accept"})
    assert answered_twice.value.code == "unknown_request"


async def test_approval_declined_does_not_run_the_command(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings("approval_required"))
    await s.runtime.start_turn(thread, "RUN: touch declined.txt")
    asked = (await s.until(lambda e: isinstance(e, ev.RequestOpened)))[-1]
    assert isinstance(asked, ev.RequestOpened)
    await s.runtime.respond_to_request(asked.request_ref, {"decision": "decline"})
    events = await s.until(lambda e: isinstance(e, ev.TurnCompleted))

    assert not (codex.cwd / "declined.txt").exists()
    tool = [e for e in of_type(events, ev.ItemCompleted) if e.kind == "tool_call"]
    assert tool[0].status == "declined"
    assert isinstance(events[-1], ev.TurnCompleted) and events[-1].status == "completed"


async def test_a_file_change_needs_approval_in_approval_required_mode(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings("approval_required"))
    await s.runtime.start_turn(thread, "WRITE: plan.txt approved text")
    asked = (await s.until(lambda e: isinstance(e, ev.RequestOpened)))[-1]

    assert isinstance(asked, ev.RequestOpened) and asked.kind == "file_change_approval"
    assert asked.payload["paths"] == [str(codex.cwd / "plan.txt")]
    assert not (codex.cwd / "plan.txt").exists()
    await s.runtime.respond_to_request(asked.request_ref, {"decision": "accept"})
    events = await s.until(lambda e: isinstance(e, ev.TurnCompleted))

    assert (codex.cwd / "plan.txt").read_text() == "approved text\n"
    assert [e.status for e in of_type(events, ev.ItemCompleted) if e.kind == "file_change"] == ["completed"]


def test_permission_requests_are_answered_in_their_own_shape() -> None:
    translator = Translator(lambda text: text)
    wanted = {"network": {"enabled": True}}
    params = {"threadId": "t", "turnId": "u", "itemId": "i", "cwd": "/w", "permissions": wanted, "startedAtMs": 1}
    message = {"id": 7, "method": "item/permissions/requestApproval", "params": params}
    [opened] = translator.translate(message)
    assert opened == ev.RequestOpened("t", "u", "7", "permission", params)
    assert translator.answer("7", {"decision": "acceptForSession"}) == (7, {"permissions": wanted, "scope": "session"})
    translator.translate(message)
    assert translator.answer("7", {"decision": "decline"}) == (7, {"permissions": {}})
    with pytest.raises(ProviderError):
        translator.answer("7", {"decision": "accept"})  # answered already


async def test_a_structured_question_is_answered(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    turn = await s.runtime.start_turn(thread, "ASK: which colour?")
    asked = (await s.until(lambda e: isinstance(e, ev.RequestOpened)))[-1]

    assert isinstance(asked, ev.RequestOpened) and asked.kind == "user_input"
    assert (asked.native_thread, asked.native_turn) == (thread, turn)
    [question] = asked.payload["questions"]
    assert question["id"] == "q1" and question["question"] == "which colour?"
    assert [o["label"] for o in question["options"]] == ["Yes", "No"]
    await s.runtime.respond_to_request(asked.request_ref, {"answers": {"q1": {"answers": ["Yes"]}}})
    events = await s.until(lambda e: isinstance(e, ev.TurnCompleted))

    assert isinstance(events[-1], ev.TurnCompleted) and events[-1].status == "completed"
    answer = codex.requests()[-1]["input"][-1]
    assert answer["type"] == "function_call_output" and "Yes" in str(answer["output"])
    assert not [e for e in s.seen if isinstance(e, ev.Warning)]  # no "unstable feature" noise


async def test_read_only_mode_cannot_write(codex: Codex) -> None:
    """Its twin, the same `touch` in a workspace_write thread making the file, is in
    test_the_sandbox_shows_commands_only_the_workspace."""
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings("read_only"))
    _, events = await s.turn(thread, "RUN: touch nope.txt")

    assert not (codex.cwd / "nope.txt").exists()
    assert not of_type(events, ev.RequestOpened)
    # Quirk of 0.171: a command the sandbox refused gets no commandExecution item at all; the
    # refusal reaches the model as the tool's output, and the user sees the model's reply.
    assert "Read-only file system" in str(codex.requests()[-1]["input"][-1]["output"])
    assert "Read-only file system" in texts(events)


async def test_the_sandbox_shows_commands_only_the_workspace(codex: Codex, tmp_path: Path) -> None:
    """workspace_write (the default): a file beside the workspace and the agent's own state do not exist.
    The twins in the same command: a file of the workspace is read and one is made there."""
    (tmp_path / "other-project").mkdir()
    (tmp_path / "other-project" / "secret.txt").write_text("OTHER-PROJECT-SECRET")
    (codex.cwd / "mine.txt").write_text("MY-WORKSPACE-FILE")
    config = codex.driver.state_dir / "p1" / "codex-home" / "config.toml"
    s = codex.session
    thread = await s.runtime.start_thread(ThreadSettings(cwd=str(codex.cwd)))  # the default mode
    command = f"cat {tmp_path}/other-project/secret.txt {config} mine.txt; touch made.txt ../escaped.txt"
    _, events = await s.turn(thread, f"RUN: {command}")

    output = str(codex.requests()[-1]["input"][-1]["output"])
    assert "MY-WORKSPACE-FILE" in output and (codex.cwd / "made.txt").exists()
    assert "OTHER-PROJECT-SECRET" not in output and "No such file or directory" in output
    assert "model_provider" not in output  # the agent's own config.toml is not visible either
    assert "model_provider" in config.read_text()  # though it is there, and holds what was looked for
    assert not (tmp_path / "escaped.txt").exists()
    assert not of_type(events, ev.RequestOpened)  # and nothing was asked


async def test_interrupt_ends_the_turn_and_closes_its_items(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    prompt = "HOLD\nthe first seventy-two characters of this reply are streamed before the model holds"
    turn = await s.runtime.start_turn(thread, prompt)
    # The model streams HOLD_SHOWN characters and holds. The driver keeps back the last 64 of every stream (a
    # secret's guard: tests/test_redaction.py); only the last held chunk pushes text past that, so the first
    # shown delta proves the whole held part reached the driver before the interrupt.
    before = await s.until(lambda e: isinstance(e, ev.TextDelta))
    message = next(e for e in before if isinstance(e, ev.ItemStarted) and e.kind == "assistant_message")
    await s.runtime.interrupt_turn(thread, turn)
    events = await s.until(lambda e: isinstance(e, ev.TurnCompleted))

    done = events[-1]
    assert isinstance(done, ev.TurnCompleted) and (done.native_turn, done.status) == (turn, "interrupted")
    closed = [e for e in of_type(events, ev.ItemCompleted) if e.item_id == message.item_id]
    assert [c.status for c in closed] == ["interrupted"]
    shown = texts(before + events)
    # What was kept back is released when the item closes: every streamed character, none twice.
    assert shown == f"holding: {prompt}"[:HOLD_SHOWN], shown
    # the thread is usable again
    codex.fake.release()
    _, after = await s.turn(thread, "after the interrupt")
    assert texts(after) == "echo: after the interrupt"


async def test_interrupt_stops_a_running_command(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    turn = await s.runtime.start_turn(thread, "RUN: sleep 30")
    started = await s.until(lambda e: isinstance(e, ev.ItemStarted) and e.kind == "tool_call")
    await s.runtime.interrupt_turn(thread, turn)
    events = await s.until(lambda e: isinstance(e, ev.TurnCompleted), within=15)

    assert isinstance(events[-1], ev.TurnCompleted) and events[-1].status == "interrupted"
    closed = [e for e in of_type(events, ev.ItemCompleted) if e.item_id == started[-1].item_id]
    assert [c.status for c in closed] == ["interrupted"]  # Codex never completes it; the driver closes it


async def test_steering_reaches_the_model_within_the_same_turn(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    turn = await s.runtime.start_turn(thread, "HOLD")
    await s.until(lambda e: isinstance(e, ev.ItemStarted) and e.kind == "assistant_message")  # the model holds
    await s.runtime.steer_turn(thread, turn, "STEERED-XYZ")
    codex.fake.release()
    events = await s.until(lambda e: isinstance(e, ev.TurnCompleted))

    assert events[-1] == ev.TurnCompleted(thread, turn, "completed")
    with pytest.raises(ProviderError):  # the turn is over: the engine then makes the message a new run
        await s.runtime.steer_turn(thread, turn, "too late")
    assert len(codex.requests()) == 2 and "STEERED-XYZ" not in orjson.dumps(codex.requests()[0]).decode()
    assert "STEERED-XYZ" in codex.last_input()
    assert "echo: STEERED-XYZ" in texts(events)
    snapshot = await s.runtime.read_thread_snapshot(thread)
    assert [t["id"] for t in snapshot["turns"]] == [turn]  # one turn, completed once
    assert not of_type(s.seen, ev.TurnStarted)[1:]


async def test_a_thread_resumes_in_a_new_process_after_a_kill(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    await s.turn(thread, "remember GAMMA")
    os.killpg(s.runtime.process.proc.pid, signal.SIGKILL)
    exited = (await s.until(lambda e: isinstance(e, ev.RuntimeExited)))[-1]
    assert isinstance(exited, ev.RuntimeExited) and exited.exit_code == -signal.SIGKILL
    assert not s.runtime.alive
    await asyncio.wait_for(s.pump, WAIT_S)  # events() ended

    codex.session = s2 = await Session.open(codex.driver, codex.cwd)
    await s2.runtime.resume_thread(thread, codex.settings())
    _, events = await s2.turn(thread, "what did I say")

    assert texts(events) == "echo: what did I say"
    assert "remember GAMMA" in codex.last_input() and "echo: remember GAMMA" in codex.last_input()
    with pytest.raises(ProviderError):
        await s2.runtime.resume_thread("01a22c86-0000-7000-8000-000000000000", codex.settings())


async def test_native_fork_from_a_turn_and_from_the_end(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    first, _ = await s.turn(thread, "first ONE")
    await s.turn(thread, "second TWO")

    early = await s.runtime.fork_thread(thread, first)
    assert early != thread
    await s.runtime.resume_thread(early, codex.settings())  # what the engine does with a thread it did not load
    await s.turn(early, "on EARLY-FORK")
    assert "first ONE" in codex.last_input() and "second TWO" not in codex.last_input()

    whole = await s.runtime.fork_thread(thread, None)
    assert whole not in (thread, early)
    await s.turn(whole, "on WHOLE-FORK")
    assert "first ONE" in codex.last_input() and "second TWO" in codex.last_input()
    assert "EARLY-FORK" not in codex.last_input()

    await s.turn(thread, "back on the parent")
    parent = codex.last_input()
    assert "second TWO" in parent and "EARLY-FORK" not in parent and "WHOLE-FORK" not in parent


async def test_revert_drops_the_turn_and_what_followed(codex: Codex) -> None:
    s = codex.session
    thread = await s.runtime.start_thread(codex.settings())
    await s.turn(thread, "first ONE")
    second, _ = await s.turn(thread, "second TWO")
    await s.turn(thread, "third THREE")

    await s.runtime.rollback_thread(thread, second)
    await s.turn(thread, "after the revert")
    sent = codex.last_input()
    assert "first ONE" in sent and "second TWO" not in sent and "third THREE" not in sent


async def test_missing_cli_names_the_path_or_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FAKE_OPENAI_API_KEY", SECRET)
    options: dict[str, Any] = {"api_key_env": "FAKE_OPENAI_API_KEY", "binary": "/nonexistent/codex"}
    with pytest.raises(ProviderError) as configured:
        await CodexDriver("c", tmp_path, options).open_session(SessionScope("p", str(tmp_path), tmp_path / "p"))
    assert configured.value.code == "cli_missing" and "/nonexistent/codex" in configured.value.message

    empty = tmp_path / "empty-bin"
    empty.mkdir()
    monkeypatch.setattr(agent_cli, "_node_bin_dirs", lambda: [])
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(ProviderError) as default:
        await CodexDriver("c", tmp_path, {"api_key_env": "FAKE_OPENAI_API_KEY"}).open_session(
            SessionScope("p", str(tmp_path), tmp_path / "p")
        )
    assert default.value.code == "cli_missing" and "npm ci" in default.value.message
    assert "@openai/codex" in default.value.message


async def test_missing_api_key_is_reported_without_secrets(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FAKE_OPENAI_API_KEY", raising=False)
    monkeypatch.setenv("OPENAI_API_KEY", SECRET)  # some other secret of the server
    monkeypatch.setenv("THREADLOOM_DATABASE_URL", "postgresql://user:pw-SECRET@db/x")
    with pytest.raises(ProviderError) as missing:
        await CodexDriver("c", tmp_path, {"api_key_env": "FAKE_OPENAI_API_KEY"}).open_session(
            SessionScope("p", str(tmp_path), tmp_path / "p")
        )
    assert missing.value.code == "missing_api_key" and "FAKE_OPENAI_API_KEY" in missing.value.message
    assert SECRET not in str(missing.value) and "SECRET" not in missing.value.message


def test_config_names_the_key_variable_and_defaults_to_the_openai_endpoint(tmp_path: Path) -> None:
    config = CodexDriver("c", tmp_path, {"api_key_env": "MY_KEY", "model": "gpt-x"}).config_toml()
    assert 'model = "gpt-x"' in config and 'model_provider = "threadloom"' in config
    assert 'base_url = "https://api.openai.com/v1"' in config and 'env_key = "MY_KEY"' in config
    assert "check_for_update_on_startup = false" in config and "request_max_retries = 0" in config

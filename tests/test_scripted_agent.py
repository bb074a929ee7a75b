"""The scripted agent as a client sees it: a real process spoken to over stdio (docs/scripted-agent.md)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.waiting import until
from threadloom.agent import recall
from threadloom.agent.directives import (
    Approval,
    Ask,
    Await,
    AwaitSteer,
    Crash,
    Delay,
    DirectiveError,
    Fail,
    Plan,
    Recall,
    Reply,
    Subagent,
    Todo,
    Tool,
    Write,
    chunks,
    parse,
    parse_steer,
)
from threadloom.agent.state import ContextEntry, TurnRecord
from threadloom.providers import contract as ev
from threadloom.providers.contract import ProviderError, SessionScope, ThreadSettings
from threadloom.providers.scripted import ScriptedDriver, ScriptedRuntime

Message = dict[str, Any]
Predicate = Callable[[Message], bool]

LINE_LIMIT = 16 * 1024 * 1024


class AgentProcess:
    """One agent process: requests get their responses by id; everything else is kept in arrival order."""

    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.messages: list[Message] = []
        self.cursor = 0
        self.closed = False
        self.failure: BaseException | None = None
        self._ids = itertools.count(1)
        self._responses: dict[int, asyncio.Future[Message]] = {}
        self._changed = asyncio.Event()
        self._reader = asyncio.create_task(self._read())

    @classmethod
    async def start(cls, state_dir: Path, *args: str) -> AgentProcess:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "threadloom.agent",
            "--state-dir",
            str(state_dir),
            *args,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=LINE_LIMIT,
        )
        return cls(proc)

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                message = json.loads(line)  # the agent never writes anything but JSON lines
                assert isinstance(message, dict), line
                future = self._responses.pop(message["id"], None) if "method" not in message else None
                if future is not None:
                    future.set_result(message)
                else:
                    self.messages.append(message)
                self._changed.set()
        except BaseException as exc:
            self.failure = exc
            raise
        finally:
            self.closed = True
            self._changed.set()
            for future in self._responses.values():
                future.cancel()

    async def send(self, message: Message) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(message).encode() + b"\n")
        await self.proc.stdin.drain()

    async def call(self, method: str, params: Message, within: float = 5.0) -> Message:
        """The whole response (`result` or `error`)."""
        request_id = next(self._ids)
        future: asyncio.Future[Message] = asyncio.get_running_loop().create_future()
        self._responses[request_id] = future
        await self.send({"id": request_id, "method": method, "params": params})
        return await asyncio.wait_for(future, within)

    async def request(self, method: str, params: Message) -> Message:
        response = await self.call(method, params)
        assert "error" not in response, response
        result: Message = response["result"]
        return result

    async def error(self, method: str, params: Message) -> Message:
        response = await self.call(method, params)
        assert "result" not in response, response
        error: Message = response["error"]
        return error

    async def until(self, predicate: Predicate, within: float = 5.0) -> list[Message]:
        """The messages after the cursor up to and including the first match; the cursor moves past it."""
        deadline = time.monotonic() + within
        while True:
            for index in range(self.cursor, len(self.messages)):
                if predicate(self.messages[index]):
                    seen = self.messages[self.cursor : index + 1]
                    self.cursor = index + 1
                    return seen
            if self.closed:
                raise AssertionError(f"agent output ended ({self.failure!r}); seen: {self.messages[self.cursor :]}")
            self._changed.clear()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no matching message; seen: {self.messages[self.cursor :]}")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait(), remaining)

    async def next_message(self, predicate: Predicate, within: float = 5.0) -> Message:
        return (await self.until(predicate, within))[-1]

    async def close_stdin(self) -> int:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        return await asyncio.wait_for(self.proc.wait(), 30)

    async def stop(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()
        await asyncio.gather(self._reader, return_exceptions=True)

    # --- conversation helpers ---

    async def new_thread(self, cwd: Path) -> str:
        result = await self.request("thread/start", {"cwd": str(cwd)})
        thread_id: str = result["thread"]["id"]
        await self.next_message(is_method("thread/started", threadId=thread_id))
        return thread_id

    async def start_turn(self, thread_id: str, text: str) -> str:
        result = await self.request("turn/start", {"threadId": thread_id, "input": [{"type": "text", "text": text}]})
        assert result["turn"]["status"] == "inProgress"
        turn_id: str = result["turn"]["id"]
        return turn_id

    async def finish_turn(self, turn_id: str, within: float = 5.0) -> list[Message]:
        """Everything up to this turn's `turn/completed`."""
        return await self.until(
            lambda m: m.get("method") == "turn/completed" and m["params"]["turn"]["id"] == turn_id, within
        )

    async def run_turn(self, thread_id: str, text: str) -> tuple[str, list[Message]]:
        turn_id = await self.start_turn(thread_id, text)
        return turn_id, await self.finish_turn(turn_id)


def is_method(method: str, **params: Any) -> Predicate:
    return lambda m: m.get("method") == method and all(m["params"].get(k) == v for k, v in params.items())


def methods(messages: list[Message]) -> list[str]:
    return [m["method"] for m in messages]


def completion(messages: list[Message]) -> Message:
    turn: Message = messages[-1]["params"]["turn"]
    return turn


def completed_items(messages: list[Message], item_type: str) -> list[Message]:
    return [
        m["params"]["item"]
        for m in messages
        if m.get("method") == "item/completed" and m["params"]["item"]["type"] == item_type
    ]


def message_texts(messages: list[Message], turn_id: str) -> list[str]:
    """The agentMessage texts of one turn, rebuilt from their deltas."""
    texts: dict[str, str] = {}
    for m in messages:
        params = m.get("params", {})
        if m.get("method") == "item/agentMessage/delta" and params["turnId"] == turn_id:
            texts[params["itemId"]] = texts.get(params["itemId"], "") + params["delta"]
    return list(texts.values())


def processes_running(argv: list[str]) -> list[int]:
    """Host pids of live processes whose command line is exactly `argv`."""
    wanted = "\0".join(argv).encode() + b"\0"
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if (entry / "cmdline").read_bytes() == wanted and not process_gone(int(entry.name)):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def process_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z"
    except (OSError, IndexError):
        return False


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "work"
    path.mkdir()
    return path


@pytest.fixture
async def agent(tmp_path: Path) -> AsyncIterator[AgentProcess]:
    process = await AgentProcess.start(tmp_path / "state")
    yield process
    await process.stop()


# --- the directive parser ---


def test_parse_reads_every_directive_kind() -> None:
    script = "\n".join(
        [
            "Please do things.",
            "@reply Hello  there",
            "@delay 20",
            "@await gates/go",
            "@await-steer",
            "@tool echo hi | tr a-z A-Z",
            "@write notes/a.txt some text here",
            "@approval rm -rf build",
            "@ask Which color? | red | blue ",
            "@todo read; write ;test",
            "@plan First this, then that",
            "@subagent look around",
            "@fail boom now",
            "@crash",
        ]
    )
    assert parse(script) == [
        Reply("Hello  there"),
        Delay(20),
        Await("gates/go"),
        AwaitSteer(),
        Tool("echo hi | tr a-z A-Z"),
        Write("notes/a.txt", "some text here"),
        Approval("rm -rf build"),
        Ask("Which color?", ("red", "blue")),
        Todo(("read", "write", "test")),
        Plan("First this, then that"),
        Subagent("look around"),
        Fail("boom now"),
        Crash(),
    ]


def test_directives_are_frozen_values_equal_only_to_their_own_kind() -> None:
    """They are records (agent/records.py), not dataclasses: the parser's tests compare them, so equality must
    tell kinds apart, and a parsed script must not change under the turn that runs it."""
    assert Reply("x") == Reply(text="x") and hash(Reply("x")) == hash(Reply(text="x"))
    assert Reply("x") != Tool("x") and Reply("x") != Reply("y") and Reply("x") != ("x",)
    assert Crash() == Crash(once=False) != Crash(once=True)
    assert repr(Ask("Which?", ("a", "b"))) == "Ask(question='Which?', options=('a', 'b'))"
    with pytest.raises(AttributeError):
        Reply("x").text = "y"  # frozen
    for bad in (lambda: Reply(), lambda: Reply("x", "y"), lambda: Reply(txt="x"), lambda: Reply("x", text="y")):
        with pytest.raises(TypeError):
            bad()
    match Ask("Which?", ("a",)):
        case Ask(question, options):
            assert (question, options) == ("Which?", ("a",))


def test_parse_without_directive_is_an_echo() -> None:
    assert parse("hello") == [Reply("You said: hello")]
    assert parse("  line one\nline two \n") == [Reply("You said: line one\nline two")]
    assert parse_steer("go left") == [Reply("Steered: go left")]
    assert parse_steer("@reply ok") == [Reply("ok")]


def test_parse_fills_in_directive_defaults() -> None:
    assert parse("@fail") == [Fail("failed")]
    assert parse("@reply") == [Reply("")]
    assert parse("@write empty.txt") == [Write("empty.txt", "")]
    assert parse("@ask Free text?") == [Ask("Free text?", ())]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("@repy hi", "line 1: unknown directive @repy"),
        ("ok\n@delay soon", "line 2: @delay needs a whole number"),
        ("@delay -5", "@delay needs a whole number"),
        ("@tool", "@tool needs a command"),
        ("@await", "@await needs a path"),
        ("@await-steer now", "@await-steer takes no argument"),
        ("@write", "@write needs a path"),
        ("@todo ; ;", "@todo needs at least one step"),
        ("@ask | a | b", "@ask needs a question"),
        ("@", "unknown directive @"),
    ],
)
def test_parse_errors_name_the_bad_directive(text: str, message: str) -> None:
    with pytest.raises(DirectiveError, match=message):
        parse(text)


@pytest.mark.parametrize("text", ["You said: hello", "  lead and trail  ", "a\tb\nc", "word", "", "   "])
def test_chunks_join_back_exactly(text: str) -> None:
    assert "".join(chunks(text)) == text
    assert len(chunks("one two three")) == 3


# --- the process ---


async def test_initialize_echoes_default_and_given_capabilities(agent: AgentProcess, tmp_path: Path) -> None:
    result = await agent.request("initialize", {"clientInfo": {"name": "test"}})
    assert result["serverInfo"]["name"] == "threadloom-scripted"
    assert result["serverInfo"]["version"]
    defaults = {
        "supportsActiveSteering": True,
        "supportsInterrupt": True,
        "supportsFork": True,
        "supportsRollback": True,
    }
    assert result["capabilities"] == defaults

    flags = '{"supportsInterrupt": false, "experimental": 3}'
    other = await AgentProcess.start(tmp_path / "other", "--capabilities", flags)
    try:
        result = await other.request("initialize", {"clientInfo": {"name": "test"}})
        assert result["capabilities"] == {**defaults, "supportsInterrupt": False, "experimental": 3}
    finally:
        await other.stop()


async def test_plain_input_streams_an_echo_reply(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    turn_id = await agent.start_turn(thread_id, "hello")
    messages = await agent.finish_turn(turn_id)
    assert methods(messages) == [
        "turn/started",
        "item/started",
        "item/agentMessage/delta",
        "item/agentMessage/delta",
        "item/agentMessage/delta",
        "item/completed",
        "thread/tokenUsage/updated",  # a turn without `@usage` reports the default call
        "turn/completed",
    ]
    assert messages[0]["params"] == {"threadId": thread_id, "turn": {"id": turn_id}}
    item_id = messages[1]["params"]["item"]["id"]
    for m in messages[1:-1]:
        assert m["params"]["threadId"] == thread_id
        assert m["params"]["turnId"] == turn_id
    assert all(m["params"]["itemId"] == item_id for m in messages[2:5])
    assert "".join(m["params"]["delta"] for m in messages[2:5]) == "You said: hello"
    assert messages[5]["params"]["item"] == {"type": "agentMessage", "id": item_id, "text": "You said: hello"}
    default = messages[6]["params"]
    assert default["tokenUsage"]["last"]["inputTokens"] == 10 and default["tokenUsage"]["last"]["outputTokens"] == 5
    assert "costUsd" not in default  # its cost is unknown
    assert completion(messages) == {"id": turn_id, "status": "completed", "error": None}


async def test_reply_tool_and_write(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    script = "\n".join(
        [
            "Do it.",
            "@reply Working on  it",
            "@tool echo hi; echo oops >&2; pwd",
            "@write a/b.txt hello",
            "@write a/b.txt again",
        ]
    )
    turn_id, messages = await agent.run_turn(thread_id, script)
    assert message_texts(messages, turn_id) == ["Working on  it"]

    [command] = completed_items(messages, "commandExecution")
    deltas = "".join(m["params"]["delta"] for m in messages if m["method"] == "item/commandExecution/outputDelta")
    assert "hi" in deltas
    assert command["exitCode"] == 0
    assert command["status"] == "completed"
    assert command["cwd"] == str(cwd)
    assert command["aggregatedOutput"] == deltas == f"hi\noops\n{cwd}\n"

    add, update = completed_items(messages, "fileChange")
    assert add["changes"] == [{"path": str(cwd / "a" / "b.txt"), "kind": "add"}]
    assert add["status"] == "completed"
    assert update["changes"][0]["kind"] == "update"
    assert (cwd / "a" / "b.txt").read_text() == "again"
    assert completion(messages)["status"] == "completed"


async def test_failing_command_fails_the_item_not_the_turn(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    _, messages = await agent.run_turn(thread_id, "@tool exit 3")
    [command] = completed_items(messages, "commandExecution")
    assert (command["status"], command["exitCode"]) == ("failed", 3)
    assert completion(messages)["status"] == "completed"


async def test_fail_directive_fails_the_turn_with_its_message(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    turn_id, messages = await agent.run_turn(thread_id, "@reply before\n@fail boom\n@reply after")
    assert message_texts(messages, turn_id) == ["before"]
    assert completion(messages) == {"id": turn_id, "status": "failed", "error": {"message": "boom"}}


async def test_malformed_directive_fails_the_turn(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    _, messages = await agent.run_turn(thread_id, "@reply fine\n@repy typo")
    assert methods(messages) == ["turn/started", "turn/completed"]
    assert completion(messages)["error"] == {"message": "line 2: unknown directive @repy"}


async def test_crash_directive_kills_the_agent_process(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    await agent.start_turn(thread_id, "@reply going down\n@crash\n@reply never")
    assert await asyncio.wait_for(agent.proc.wait(), 5) == 17


async def test_interrupt_during_a_delay_ends_the_turn_at_once(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    # The delay outlasts the wait below: the turn can only end within it if the interrupt cut the delay short.
    turn_id = await agent.start_turn(thread_id, "@reply waiting\n@delay 600000\n@reply never")
    await agent.next_message(is_method("item/completed", turnId=turn_id))
    assert await agent.request("turn/interrupt", {"threadId": thread_id, "turnId": turn_id}) == {}
    messages = await agent.finish_turn(turn_id, within=30)
    assert completion(messages) == {"id": turn_id, "status": "interrupted", "error": None}
    assert message_texts(messages, turn_id) == []
    # The thread takes a new turn at once, and interrupting a finished turn is refused.
    _, messages = await agent.run_turn(thread_id, "again")
    assert completion(messages)["status"] == "completed"
    error = await agent.error("turn/interrupt", {"threadId": thread_id, "turnId": turn_id})
    assert error["code"] == -32002


async def test_interrupt_mid_reply_leaves_message_open(tmp_path: Path, cwd: Path) -> None:
    agent = await AgentProcess.start(tmp_path / "state", "--chunk-delay-ms", "600000")  # no 2nd chunk in the test
    try:
        thread_id = await agent.new_thread(cwd)
        turn_id = await agent.start_turn(thread_id, "@reply one two three")
        await agent.next_message(is_method("item/agentMessage/delta", turnId=turn_id))
        await agent.request("turn/interrupt", {"threadId": thread_id, "turnId": turn_id})
        messages = await agent.finish_turn(turn_id, within=30)
        assert completion(messages)["status"] == "interrupted"
        assert "item/completed" not in methods(messages)
    finally:
        await agent.stop()


async def test_interrupt_ends_a_running_subagent_first(tmp_path: Path, cwd: Path) -> None:
    agent = await AgentProcess.start(tmp_path / "state", "--chunk-delay-ms", "600000")  # no 2nd chunk in the test
    try:
        thread_id = await agent.new_thread(cwd)
        turn_id = await agent.start_turn(thread_id, "@subagent look around")
        child = await agent.next_message(
            lambda m: m.get("method") == "turn/started" and m["params"]["turn"]["id"] != turn_id
        )
        child_id = child["params"]["turn"]["id"]
        assert child["params"]["turn"]["parentTurnId"] == turn_id
        await agent.next_message(is_method("item/agentMessage/delta", turnId=child_id))
        await agent.request("turn/interrupt", {"threadId": thread_id, "turnId": turn_id})
        messages = await agent.finish_turn(turn_id, within=30)
        assert [m["params"]["turn"] for m in messages if m["method"] == "turn/completed"] == [
            {"id": child_id, "parentTurnId": turn_id, "status": "interrupted", "error": None},
            {"id": turn_id, "status": "interrupted", "error": None},
        ]
    finally:
        await agent.stop()


async def test_interrupt_kills_the_running_command(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    # A unique duration names the background job on the host (inside the sandbox its pid is another).
    # It sleeps far longer than the bounded waits below, so it can only be gone because the interrupt killed it.
    duration = f"600.{os.getpid()}"
    turn_id = await agent.start_turn(thread_id, f"@tool sleep {duration} & echo started; wait")
    delta = await agent.next_message(is_method("item/commandExecution/outputDelta", turnId=turn_id))
    assert delta["params"]["delta"] == "started\n"

    async def started() -> list[int]:  # `&` may not have exec'd sleep yet
        return processes_running(["sleep", duration])

    [sleeper] = await until(started, within=30, interval=0.02)
    await agent.request("turn/interrupt", {"threadId": thread_id, "turnId": turn_id})
    messages = await agent.finish_turn(turn_id, within=30)
    assert completion(messages)["status"] == "interrupted"

    async def gone() -> bool:
        return process_gone(sleeper)

    await until(gone, within=30, interval=0.02)  # else: the command's background job survived the interrupt


async def test_interrupt_and_steer_refused_when_off(tmp_path: Path, cwd: Path) -> None:
    flags = '{"supportsActiveSteering": false, "supportsInterrupt": false}'
    agent = await AgentProcess.start(tmp_path / "state", "--capabilities", flags)
    try:
        thread_id = await agent.new_thread(cwd)
        turn_id = await agent.start_turn(thread_id, "@approval true")
        await agent.next_message(is_method("item/commandExecution/requestApproval"))
        error = await agent.error("turn/interrupt", {"threadId": thread_id, "turnId": turn_id})
        assert error["code"] == -32003
        steer = {"threadId": thread_id, "expectedTurnId": turn_id, "input": [{"type": "text", "text": "x"}]}
        assert (await agent.error("turn/steer", steer))["code"] == -32003
    finally:
        await agent.stop()


async def test_steer_appends_to_the_running_turn(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    turn_id = await agent.start_turn(thread_id, "@approval echo approved\n@reply planned")
    request = await agent.next_message(is_method("item/commandExecution/requestApproval"))

    steer = {"threadId": thread_id, "expectedTurnId": turn_id, "input": [{"type": "text", "text": "also this"}]}
    assert await agent.request("turn/steer", steer) == {}
    wrong = {**steer, "expectedTurnId": "not-the-turn"}
    assert (await agent.error("turn/steer", wrong))["code"] == -32002

    await agent.send({"id": request["id"], "result": {"decision": "accept"}})
    messages = await agent.finish_turn(turn_id)
    # The steering runs right after the directive it interrupted, before the rest of the script.
    assert message_texts(messages, turn_id) == ["Steered: also this", "planned"]
    assert completion(messages)["status"] == "completed"
    read = await agent.request("thread/read", {"threadId": thread_id})
    [turn] = read["thread"]["turns"]
    assert turn["input"] == "@approval echo approved\n@reply planned\nalso this"
    assert turn["output"] == "Steered: also this\nplanned"
    # No turn is running any more.
    assert (await agent.error("turn/steer", steer))["code"] == -32002


async def test_await_holds_the_turn_until_the_file_appears(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    turn_id = await agent.start_turn(thread_id, "@reply before\n@await gate/go\n@reply after")
    await agent.next_message(is_method("item/completed", turnId=turn_id))
    (cwd / "gate").mkdir()  # a folder first: only the file itself opens the gate
    steer = {"threadId": thread_id, "expectedTurnId": turn_id, "input": [{"type": "text", "text": "@reply in"}]}
    assert await agent.request("turn/steer", steer) == {}  # answered while the turn is held: the agent is not stuck
    held = agent.messages[agent.cursor :]
    assert "turn/completed" not in methods(held) and message_texts(held, turn_id) == []
    (cwd / "gate" / "go").touch()
    messages = await agent.finish_turn(turn_id)
    assert completion(messages)["status"] == "completed"
    assert message_texts(messages, turn_id) == ["in", "after"]  # the steer ran once the gate let the turn on


async def test_await_is_interruptible_and_confined_to_the_cwd(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    turn_id = await agent.start_turn(thread_id, "@await never\n@reply never")
    await agent.next_message(is_method("turn/started", threadId=thread_id))
    assert await agent.request("turn/interrupt", {"threadId": thread_id, "turnId": turn_id}) == {}
    assert completion(await agent.finish_turn(turn_id, within=30))["status"] == "interrupted"  # gate: 60 s
    (cwd.parent / "outside").touch()
    refused, messages = await agent.run_turn(thread_id, "@await ../outside\n@reply never")
    assert completion(messages)["status"] == "failed"
    assert completion(messages)["error"]["message"].startswith("@await ../outside: ../outside is outside")
    assert message_texts(messages, refused) == []


async def test_await_steer_holds_the_turn_until_it_is_steered(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    turn_id = await agent.start_turn(thread_id, "@await-steer\n@reply planned")
    await agent.next_message(is_method("turn/started", threadId=thread_id))
    assert "turn/completed" not in methods(agent.messages)
    steer = {"threadId": thread_id, "expectedTurnId": turn_id, "input": [{"type": "text", "text": "also this"}]}
    assert await agent.request("turn/steer", steer) == {}
    messages = await agent.finish_turn(turn_id)
    assert completion(messages)["status"] == "completed"
    assert message_texts(messages, turn_id) == ["Steered: also this", "planned"]
    # Steered before it gets there (while held at a file gate), `@await-steer` goes on at once.
    turn_id = await agent.start_turn(thread_id, "@await go\n@await-steer\n@reply planned")
    await agent.next_message(is_method("turn/started", threadId=thread_id))
    assert await agent.request("turn/steer", {**steer, "expectedTurnId": turn_id}) == {}
    (cwd / "go").touch()
    messages = await agent.finish_turn(turn_id)
    assert message_texts(messages, turn_id) == ["Steered: also this", "planned"]


async def test_a_restarted_turn_carrying_its_steer_does_not_wait_at_await_steer(agent: AgentProcess, cwd: Path) -> None:
    """A provider that cannot steer in place gets a new turn: the interrupted turn's input, a blank line, the
    steering message (domain/dispatch.py). That turn was steered; it waited the whole bound (60 s) and failed."""
    thread_id = await agent.new_thread(cwd)
    turn_id = await agent.start_turn(thread_id, "@await-steer\n@reply planned")
    await agent.next_message(is_method("turn/started", threadId=thread_id))
    assert await agent.request("turn/interrupt", {"threadId": thread_id, "turnId": turn_id}) == {}
    assert completion(await agent.finish_turn(turn_id))["status"] == "interrupted"
    turn_id = await agent.start_turn(thread_id, "@await-steer\n@reply planned\n\n@reply steered")
    messages = await agent.finish_turn(turn_id, within=10)
    assert completion(messages)["status"] == "completed"
    assert message_texts(messages, turn_id) == ["planned", "steered"]
    # The same text after a turn that completed is a new message, not a restart: it waits for a steer.
    turn_id = await agent.start_turn(thread_id, "@await-steer\n@reply planned\n\n@reply steered\n\n@reply more")
    await agent.next_message(is_method("turn/started", threadId=thread_id))
    steer = {"threadId": thread_id, "expectedTurnId": turn_id, "input": [{"type": "text", "text": "now"}]}
    assert await agent.request("turn/steer", steer) == {}
    messages = await agent.finish_turn(turn_id)
    assert message_texts(messages, turn_id) == ["Steered: now", "planned", "steered", "more"]


async def test_approval_accept_runs_and_decline_does_not(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    for decision, runs in [("accept", True), ("decline", False), ("cancel", False)]:
        marker = cwd / f"{decision}.txt"
        turn_id = await agent.start_turn(thread_id, f"@approval touch {marker.name}\n@reply done")
        request = await agent.next_message(is_method("item/commandExecution/requestApproval"))
        assert isinstance(request["id"], str)
        params = request["params"]
        assert params["threadId"] == thread_id
        assert params["turnId"] == turn_id
        assert params["command"] == f"touch {marker.name}"
        assert params["cwd"] == str(cwd)
        await agent.send({"id": request["id"], "result": {"decision": decision}})
        messages = await agent.finish_turn(turn_id)
        [item] = completed_items(messages, "commandExecution")
        assert item["id"] == params["itemId"]
        assert item["status"] == ("completed" if runs else "declined")
        assert marker.exists() == runs
        assert message_texts(messages, turn_id) == ["done"]
        assert completion(messages)["status"] == "completed"


async def test_ask_waits_for_the_answer_and_replies_with_it(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    turn_id = await agent.start_turn(thread_id, "@ask Which color? | red | blue")
    request = await agent.next_message(is_method("item/tool/requestUserInput"))
    assert request["params"]["questions"] == [
        {"id": "q1", "question": "Which color?", "options": [{"label": "red"}, {"label": "blue"}], "isOther": False}
    ]
    await agent.send({"id": request["id"], "result": {"answers": {"q1": {"answers": ["blue"]}}}})
    messages = await agent.finish_turn(turn_id)
    assert message_texts(messages, turn_id) == ["Answer: blue"]


async def test_todo_and_plan_stream_their_updates(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    _, messages = await agent.run_turn(thread_id, "@todo read; write; test\n@plan Step one, then two")
    plans = [m["params"]["plan"] for m in messages if m["method"] == "turn/plan/updated"]
    assert [[step["status"] for step in plan] for plan in plans] == [
        ["pending", "pending", "pending"],
        ["inProgress", "pending", "pending"],
        ["completed", "pending", "pending"],
        ["completed", "inProgress", "pending"],
        ["completed", "completed", "pending"],
        ["completed", "completed", "inProgress"],
        ["completed", "completed", "completed"],
    ]
    assert [step["step"] for step in plans[-1]] == ["read", "write", "test"]
    deltas = "".join(m["params"]["delta"] for m in messages if m["method"] == "item/plan/delta")
    assert deltas == "Step one, then two"
    [plan] = completed_items(messages, "plan")
    assert plan["text"] == deltas


async def test_subagent_runs_a_child_turn_inside_the_turn(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    turn_id, messages = await agent.run_turn(thread_id, "@subagent look around\n@reply back")
    [call] = completed_items(messages, "collabAgentToolCall")
    child_id = call["childTurnId"]
    assert (call["prompt"], call["status"]) == ("look around", "completed")
    names = [(m["method"], m["params"].get("turn", {}).get("id")) for m in messages]
    assert names.index(("turn/started", child_id)) < names.index(("turn/completed", child_id)) < len(names) - 1
    child_done = messages[names.index(("turn/completed", child_id))]["params"]["turn"]
    assert child_done == {"id": child_id, "parentTurnId": turn_id, "status": "completed", "error": None}
    assert message_texts(messages, child_id) == ["Subagent: look around"]
    assert message_texts(messages, turn_id) == ["back"]
    assert completion(messages) == {"id": turn_id, "status": "completed", "error": None}


async def test_a_thread_resumes_in_a_new_process_after_a_kill(tmp_path: Path, cwd: Path) -> None:
    first = await AgentProcess.start(tmp_path / "state")
    try:
        thread_id = await first.new_thread(cwd)
        turn_id, _ = await first.run_turn(thread_id, "hello")
    finally:
        await first.stop()  # kill -9
    assert first.proc.returncode == -9

    second = await AgentProcess.start(tmp_path / "state")
    try:
        assert (await second.error("turn/start", {"threadId": thread_id, "input": []}))["code"] == -32001
        resumed = await second.request("thread/resume", {"threadId": thread_id})
        assert resumed == {"thread": {"id": thread_id, "cwd": str(cwd), "turns": 1}}
        read = await second.request("thread/read", {"threadId": thread_id})
        assert read["thread"]["turns"] == [
            {
                "id": turn_id,
                "input": "hello",
                "output": "You said: hello",
                "status": "completed",
                "context": [{"kind": "user", "text": "hello"}],
            }
        ]
        _, messages = await second.run_turn(thread_id, "again")
        assert completion(messages)["status"] == "completed"
        assert (await second.request("thread/resume", {"threadId": thread_id}))["thread"]["turns"] == 2
        missing = await second.error("thread/resume", {"threadId": "no-such-thread"})
        assert missing == {"code": -32001, "message": "no thread no-such-thread"}
    finally:
        await second.stop()


async def test_resume_after_crash_marks_the_turn_interrupted(tmp_path: Path, cwd: Path) -> None:
    first = await AgentProcess.start(tmp_path / "state")
    try:
        thread_id = await first.new_thread(cwd)
        await first.start_turn(thread_id, "@crash")
        assert await asyncio.wait_for(first.proc.wait(), 5) == 17
    finally:
        await first.stop()
    second = await AgentProcess.start(tmp_path / "state")
    try:
        await second.request("thread/resume", {"threadId": thread_id})
        read = await second.request("thread/read", {"threadId": thread_id})
        assert [turn["status"] for turn in read["thread"]["turns"]] == ["interrupted"]
    finally:
        await second.stop()


async def test_write_outside_cwd_is_refused(agent: AgentProcess, cwd: Path, tmp_path: Path) -> None:
    """`..`, an absolute path and a link out of the cwd are refused; the twins: an absolute path and a link
    that stay inside it are written."""
    outside = tmp_path / "outside"
    outside.mkdir()
    (cwd / "link").symlink_to(outside)
    (cwd / "sub").mkdir()
    (cwd / "inlink").symlink_to("sub")
    thread_id = await agent.new_thread(cwd)
    script = "\n".join(
        [
            "@write ../escape.txt nope",
            f"@write {tmp_path / 'absolute.txt'} nope",
            "@write link/through.txt nope",
            f"@write {cwd / 'inside.txt'} yes",
            "@write inlink/through.txt yes",
            "@reply still here",
        ]
    )
    turn_id, messages = await agent.run_turn(thread_id, script)
    statuses = [item["status"] for item in completed_items(messages, "fileChange")]
    assert statuses == ["failed", "failed", "failed", "completed", "completed"]
    for item in completed_items(messages, "fileChange")[:3]:
        assert "outside" in _output(messages, item["id"])
    assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "absolute.txt").exists()
    assert not (outside / "through.txt").exists()
    assert (cwd / "inside.txt").read_text() == "yes"
    assert (cwd / "sub" / "through.txt").read_text() == "yes"
    assert message_texts(messages, turn_id) == ["still here"]
    assert completion(messages)["status"] == "completed"


async def test_one_turn_per_thread_and_threads_run_concurrently(agent: AgentProcess, cwd: Path) -> None:
    held = await agent.new_thread(cwd)
    held_turn = await agent.start_turn(held, "@approval true")
    request = await agent.next_message(is_method("item/commandExecution/requestApproval"))
    error = await agent.error("turn/start", {"threadId": held, "input": [{"type": "text", "text": "again"}]})
    assert error == {"code": -32004, "message": "turn already running"}

    other = await agent.new_thread(cwd)
    _, messages = await agent.run_turn(other, "meanwhile")
    assert completion(messages)["status"] == "completed"

    await agent.send({"id": request["id"], "result": {"decision": "accept"}})
    assert completion(await agent.finish_turn(held_turn))["status"] == "completed"


async def test_concurrent_turns_keep_lines_whole(agent: AgentProcess, cwd: Path) -> None:
    threads = [await agent.new_thread(cwd) for _ in range(6)]
    script = "@tool seq 1 20000\n@reply " + " ".join(["word"] * 200)
    turns = [await agent.start_turn(thread_id, script) for thread_id in threads]
    completed: set[str] = set()

    def all_completed(m: Message) -> bool:
        if m.get("method") == "turn/completed":
            assert m["params"]["turn"]["status"] == "completed"
            completed.add(m["params"]["turn"]["id"])
        return completed == set(turns)

    await agent.next_message(all_completed, within=10)
    # Every line parsed as JSON (the reader asserts it); each command's output arrived whole and in order.
    expected = "".join(f"{n}\n" for n in range(1, 20001))
    for turn_id in turns:
        output = "".join(
            m["params"]["delta"]
            for m in agent.messages
            if m.get("method") == "item/commandExecution/outputDelta" and m["params"]["turnId"] == turn_id
        )
        assert output == expected


async def test_bad_requests_get_json_rpc_errors(agent: AgentProcess) -> None:
    assert (await agent.error("thread/archive", {}))["code"] == -32601
    assert (await agent.error("thread/fork", {}))["code"] == -32602
    assert (await agent.error("turn/start", {"threadId": "nope", "input": []}))["code"] == -32001
    assert (await agent.error("thread/read", {}))["code"] == -32602
    await agent.send({"method": "initialized"})  # client notifications are ignored
    assert agent.proc.stdin is not None
    agent.proc.stdin.write(b"not json\n")
    parse_error = await agent.next_message(lambda m: m.get("error", {}).get("code") == -32700)
    assert parse_error["id"] is None
    assert "result" in await agent.call("initialize", {})


async def test_closing_stdin_cancels_and_exits_0(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    turn_id = await agent.start_turn(thread_id, "@tool echo started; sleep 600")  # outlasts close_stdin's wait
    await agent.next_message(is_method("item/commandExecution/outputDelta", turnId=turn_id))
    assert await agent.close_stdin() == 0  # within its bound: the running command was cancelled


# --- the sandbox and runtime modes ---


async def _thread_in_mode(agent: AgentProcess, cwd: Path, mode: str) -> str:
    result = await agent.request("thread/start", {"cwd": str(cwd), "runtimeMode": mode})
    thread_id: str = result["thread"]["id"]
    await agent.next_message(is_method("thread/started", threadId=thread_id))
    return thread_id


def _output(messages: list[Message], item_id: str) -> str:
    return "".join(
        m["params"]["delta"]
        for m in messages
        if m.get("method", "").endswith("/outputDelta") and m["params"]["itemId"] == item_id
    )


async def test_the_workspace_bounds_threads_and_commands(tmp_path: Path, cwd: Path) -> None:
    (tmp_path / "outside.txt").write_text("not yours")
    hidden = cwd / "data"
    hidden.mkdir()
    (hidden / "secret").write_text("hidden")
    (cwd / "shown").mkdir()
    (cwd / "shown" / "file").write_text("shown")
    (cwd / "inside.txt").write_text("yours")
    agent = await AgentProcess.start(tmp_path / "state", "--workspace", str(cwd), "--hide", str(hidden))
    try:
        refused = await agent.error("thread/start", {"cwd": str(tmp_path)})
        assert refused["code"] == -32602 and "outside" in refused["message"]
        unknown = await agent.error("thread/start", {"cwd": str(cwd), "runtimeMode": "root"})
        assert unknown["code"] == -32602
        thread_id = await agent.new_thread(cwd)
        script = (
            f"@tool cat {tmp_path / 'outside.txt'}\n@tool cat {cwd / 'inside.txt'}\n"
            "@tool ls -A data shown\n@tool env\n@tool echo made > made.txt"
        )
        _, messages = await agent.run_turn(thread_id, script)
        outside, inside, listing, env, made = completed_items(messages, "commandExecution")
        assert outside["status"] == "failed" and "not yours" not in outside["aggregatedOutput"]
        assert "No such file" in outside["aggregatedOutput"]
        assert inside["status"] == "completed" and inside["aggregatedOutput"] == "yours"  # the twin, inside
        # The hidden folder is empty; the twin beside it, not hidden, shows its file to the same `ls`.
        assert listing["status"] == "completed" and listing["aggregatedOutput"] == "data:\n\nshown:\nfile\n"
        assert sorted(line.split("=")[0] for line in env["aggregatedOutput"].split()) == [
            "HOME",
            "LANG",
            "PATH",
            "PWD",
            "SHLVL",
            "_",
        ]
        assert made["status"] == "completed" and (cwd / "made.txt").read_text() == "made\n"
    finally:
        await agent.stop()


async def test_read_only_threads_write_nothing_that_workspace_write_threads_write(
    agent: AgentProcess, cwd: Path
) -> None:
    script = "@write a.txt x\n@tool touch b.txt\n@tool echo reading\n@reply ok"
    thread_id = await _thread_in_mode(agent, cwd, "read_only")
    _, messages = await agent.run_turn(thread_id, script)
    [write] = completed_items(messages, "fileChange")
    assert write["status"] == "failed" and "read-only" in _output(messages, write["id"])
    touch, reading = completed_items(messages, "commandExecution")
    assert touch["status"] == "failed" and "Read-only file system" in touch["aggregatedOutput"]
    assert reading["status"] == "completed"
    assert os.listdir(cwd) == []
    assert completion(messages)["status"] == "completed"
    # The twin: the same script in a workspace_write thread of the same agent writes both files.
    writer = await _thread_in_mode(agent, cwd, "workspace_write")
    _, messages = await agent.run_turn(writer, script)
    items = completed_items(messages, "fileChange") + completed_items(messages, "commandExecution")
    assert [item["status"] for item in items] == ["completed"] * 3
    assert sorted(os.listdir(cwd)) == ["a.txt", "b.txt"]


async def test_approval_required_asks_before_commands_and_writes(agent: AgentProcess, cwd: Path) -> None:
    thread_id = await _thread_in_mode(agent, cwd, "approval_required")
    turn_id = await agent.start_turn(thread_id, "@tool echo no > no.txt\n@write yes.txt yes\n@reply done")
    command = await agent.next_message(is_method("item/commandExecution/requestApproval", turnId=turn_id))
    assert command["params"]["command"] == "echo no > no.txt"
    await agent.send({"id": command["id"], "result": {"decision": "decline"}})
    change = await agent.next_message(is_method("item/fileChange/requestApproval", turnId=turn_id))
    assert not (cwd / "yes.txt").exists()
    await agent.send({"id": change["id"], "result": {"decision": "accept"}})
    await agent.finish_turn(turn_id)
    assert [i["status"] for i in completed_items(agent.messages, "commandExecution")] == ["declined"]
    assert [i["status"] for i in completed_items(agent.messages, "fileChange")] == ["completed"]
    assert not (cwd / "no.txt").exists() and (cwd / "yes.txt").read_text() == "yes"


def test_no_bwrap_means_no_commands(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from threadloom.agent import sandbox

    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    monkeypatch.setattr(sandbox.os, "access", lambda path, mode: False)
    with pytest.raises(sandbox.SandboxUnavailable, match="apt-get install bubblewrap"):
        sandbox.Sandbox(tmp_path).argv(["true"], str(tmp_path))
    monkeypatch.undo()  # the twin: with bwrap found, the same sandbox builds its command line
    assert Path(sandbox.Sandbox(tmp_path).argv(["true"], str(tmp_path))[0]).name == "bwrap"


# --- recall, native fork and rollback, through the `scripted` driver ---


@dataclasses.dataclass
class Driven:
    """A `scripted` runtime for one project whose events are pumped into a queue."""

    runtime: ScriptedRuntime
    queue: asyncio.Queue[ev.ProviderEvent]
    pump: asyncio.Task[None]

    @classmethod
    async def open(cls, driver: ScriptedDriver, cwd: Path) -> Driven:
        runtime = await driver.open_session(SessionScope("p1", str(cwd), driver.state_dir / "p1"))
        queue: asyncio.Queue[ev.ProviderEvent] = asyncio.Queue()

        async def pump() -> None:
            async for event in runtime.events():
                await queue.put(event)

        return cls(runtime, queue, asyncio.create_task(pump()))

    async def until(self, check: Callable[[ev.ProviderEvent], bool]) -> list[ev.ProviderEvent]:
        got: list[ev.ProviderEvent] = []

        async def collect() -> None:
            while not got or not check(got[-1]):
                got.append(await self.queue.get())

        await asyncio.wait_for(collect(), 10)
        return got

    async def turn(self, thread: str, text: str, handoff: str | None = None) -> tuple[str, list[ev.ProviderEvent]]:
        turn = await self.runtime.start_turn(thread, text, handoff=handoff)
        events = await self.until(lambda e: isinstance(e, ev.TurnCompleted) and e.native_turn == turn)
        return turn, events

    async def recall(self, thread: str) -> list[str]:
        """The lines `@recall` streams on `thread` (that turn's own `user: @recall` is the last)."""
        _, events = await self.turn(thread, "@recall")
        return "".join(e.delta for e in events if isinstance(e, ev.TextDelta)).split("\n")

    async def close(self) -> None:
        await self.runtime.close()
        await asyncio.wait_for(self.pump, 10)


@pytest.fixture
async def driven(tmp_path: Path, cwd: Path) -> AsyncIterator[Driven]:
    session = await Driven.open(ScriptedDriver("scripted", tmp_path / "agents", {}), cwd)
    yield session
    await session.close()


def test_parse_recall_takes_no_argument() -> None:
    assert parse("@recall") == [Recall()]
    with pytest.raises(DirectiveError, match="@recall takes no argument"):
        parse("@recall everything")


def test_recall_lines_escape_multi_line_texts() -> None:
    turn = TurnRecord("t", "x", context=[ContextEntry("handoff", "a\\b\nc\r"), ContextEntry("user", "x")])
    assert recall.render([turn]) == "handoff: a\\\\b\\nc\\r\nuser: x"


async def test_recall_after_two_turns_lists_messages_and_handoffs(driven: Driven, cwd: Path) -> None:
    thread = await driven.runtime.start_thread(ThreadSettings(str(cwd)))
    await driven.turn(thread, "first\n@reply one")
    # The handoff quotes old directives: remembered, never run (the turn only echoes).
    _, events = await driven.turn(thread, "second", handoff="Summary:\n@fail never")
    assert [e.status for e in events if isinstance(e, ev.TurnCompleted)] == ["completed"]
    assert await driven.recall(thread) == [
        "user: first\\n@reply one",
        "handoff: Summary:\\n@fail never",
        "user: second",
        "user: @recall",
    ]


async def test_recall_survives_a_crash_and_resume(tmp_path: Path, cwd: Path) -> None:
    driver = ScriptedDriver("scripted", tmp_path / "agents", {})
    first = await Driven.open(driver, cwd)
    try:
        thread = await first.runtime.start_thread(ThreadSettings(str(cwd)))
        await first.turn(thread, "remember ALPHA", handoff="earlier on another provider")
        await first.runtime.start_turn(thread, "@crash")
        await first.until(lambda e: isinstance(e, ev.RuntimeExited))
    finally:
        await first.close()
    second = await Driven.open(driver, cwd)
    try:
        await second.runtime.resume_thread(thread, ThreadSettings(str(cwd)))
        assert await second.recall(thread) == [
            "handoff: earlier on another provider",
            "user: remember ALPHA",
            "user: @crash",  # received before the crash, so part of the conversation
            "user: @recall",
        ]
    finally:
        await second.close()


async def test_native_fork_from_turn_one_of_two(driven: Driven, cwd: Path) -> None:
    thread = await driven.runtime.start_thread(ThreadSettings(str(cwd)))
    one, _ = await driven.turn(thread, "one")
    await driven.turn(thread, "two")

    early = await driven.runtime.fork_thread(thread, one)
    whole = await driven.runtime.fork_thread(thread, None)
    assert len({thread, early, whole}) == 3
    assert await driven.recall(early) == ["user: one", "user: @recall"]
    assert await driven.recall(whole) == ["user: one", "user: two", "user: @recall"]
    assert await driven.recall(thread) == ["user: one", "user: two", "user: @recall"]  # the source is untouched


async def test_native_rollback_drops_the_last_turn(driven: Driven, cwd: Path) -> None:
    thread = await driven.runtime.start_thread(ThreadSettings(str(cwd)))
    await driven.turn(thread, "one")
    two, _ = await driven.turn(thread, "two")

    await driven.runtime.rollback_thread(thread, two)
    assert await driven.recall(thread) == ["user: one", "user: @recall"]
    snapshot = await driven.runtime.read_thread_snapshot(thread)
    assert [turn["input"] for turn in snapshot["turns"]] == ["one", "@recall"]


async def test_fork_and_rollback_off_by_instance_option(tmp_path: Path, cwd: Path) -> None:
    options = {"supports_native_fork": False, "supports_native_rollback": False}
    driver = ScriptedDriver("scripted", tmp_path / "agents", options)
    caps = driver.capabilities()
    assert (caps.can_fork_thread, caps.can_fork_from_turn, caps.can_rollback_thread) == (False, False, False)
    on = ScriptedDriver("scripted", tmp_path / "agents", {}).capabilities()
    assert (on.can_fork_thread, on.can_fork_from_turn, on.can_rollback_thread) == (True, True, True)
    session = await Driven.open(driver, cwd)
    try:
        thread = await session.runtime.start_thread(ThreadSettings(str(cwd)))
        one, _ = await session.turn(thread, "one")
        with pytest.raises(ProviderError) as fork:
            await session.runtime.fork_thread(thread, None)
        assert fork.value.code == "unsupported"
        with pytest.raises(ProviderError) as rollback:
            await session.runtime.rollback_thread(thread, one)
        assert rollback.value.code == "unsupported"
        assert await session.recall(thread) == ["user: one", "user: @recall"]
    finally:
        await session.close()


async def test_fork_and_rollback_refusals(tmp_path: Path, agent: AgentProcess, cwd: Path) -> None:
    thread_id = await agent.new_thread(cwd)
    one, _ = await agent.run_turn(thread_id, "one")
    running = await agent.start_turn(thread_id, "@delay 10000")
    await agent.next_message(is_method("turn/started", threadId=thread_id))
    # The running turn can be neither forked at nor rolled back; an earlier turn can be forked at.
    assert (await agent.error("thread/fork", {"threadId": thread_id}))["code"] == -32004
    assert (await agent.error("thread/revert", {"threadId": thread_id, "beforeTurnId": one}))["code"] == -32004
    fork = await agent.request("thread/fork", {"threadId": thread_id, "lastTurnId": one})
    assert fork["thread"]["turns"] == 1
    await agent.request("turn/interrupt", {"threadId": thread_id, "turnId": running})
    await agent.finish_turn(running)

    unknown = await agent.error("thread/fork", {"threadId": thread_id, "lastTurnId": "nope"})
    assert unknown == {"code": -32602, "message": f"no turn nope in thread {thread_id}"}
    assert (await agent.error("thread/fork", {"threadId": "no-such-thread"}))["code"] == -32001
    for count in (0, 3, True, "1"):
        bad = await agent.error("thread/rollback", {"threadId": thread_id, "numTurns": count})
        assert bad == {"code": -32602, "message": "numTurns must be a whole number from 1 to 2"}
    assert (await agent.request("thread/rollback", {"threadId": thread_id, "numTurns": 1}))["thread"]["turns"] == 1
    read = await agent.request("thread/read", {"threadId": thread_id})
    assert [turn["id"] for turn in read["thread"]["turns"]] == [one]

    off = await AgentProcess.start(
        tmp_path / "off", "--capabilities", '{"supportsFork": false, "supportsRollback": false}'
    )
    try:
        other = await off.new_thread(cwd)
        assert (await off.error("thread/fork", {"threadId": other}))["code"] == -32003
        assert (await off.error("thread/rollback", {"threadId": other, "numTurns": 1}))["code"] == -32003
    finally:
        await off.stop()

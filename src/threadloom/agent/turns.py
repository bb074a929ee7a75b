"""One turn: runs the message's directives in order and streams what a Codex turn would stream.

The directives run in their own task so an interrupt is a plain cancellation: it lands at whatever the turn is
awaiting (a chunk pause, a `@delay`, a command's output, a client's answer), the running command's process group
is killed on the way out, and the turn then reports `interrupted`.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import uuid
from collections import deque
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from threadloom.agent import shell, workspace
from threadloom.agent.directives import (
    Approval,
    Approvals,
    Ask,
    Await,
    AwaitSteer,
    Config,
    Crash,
    Delay,
    Directive,
    DirectiveError,
    Fail,
    Plan,
    Recall,
    Reply,
    Stop,
    Subagent,
    Todo,
    Tool,
    Usage,
    UsageAgain,
    Write,
    chunks,
    parse,
    parse_steer,
    usage,
)
from threadloom.agent.sandbox import Sandbox
from threadloom.agent.wire import Message, PeerError, Sink

log = logging.getLogger("threadloom.agent")

CRASH_EXIT_CODE = 17

APPROVED = {"accept", "acceptForSession"}

# How long `@await` and `@await-steer` hold a turn before failing it: a gate nobody opens must not hang a test.
AWAIT_BOUND_S = 60.0
AWAIT_POLL_S = 0.02

# What a turn that said no `@usage` reports: one model call of this many tokens, its cost unknown.
DEFAULT_USAGE = Usage(input=10, output=5)


class TurnFailed(Exception):
    """`@fail` (or a malformed script): the turn ends with status `failed` and this message."""


class TurnStopped(TurnFailed):
    """`@stop REASON`: the turn ends `failed` with `stopReason` REASON, as a model that stops on its own."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"stopped: {reason}")
        self.reason = reason


@dataclasses.dataclass(frozen=True, slots=True)
class TurnResult:
    status: str
    error: str | None
    output: str
    stop_reason: str | None = None  # `@stop REASON`


class Asker(Protocol):
    """Who a turn asks (approvals, questions): `request` returns the answer or raises `PeerError`."""

    async def request(self, method: str, params: Message) -> Message: ...


@dataclasses.dataclass(frozen=True, slots=True)
class Io:
    """What every turn of the process shares: the output stream, the client as a callee, and item ids."""

    writer: Sink
    peer: Asker
    new_item_id: Callable[[], str]


@dataclasses.dataclass(frozen=True, slots=True)
class Hooks:
    """What only one face does with a directive: `@config` (the ACP face); None ignores it."""

    config: Callable[[str, str], Awaitable[None]] | None = None


class Turn:
    """A running turn; the server holds it until it ends so steering and interrupts can reach it."""

    def __init__(
        self,
        io: Io,
        *,
        thread_id: str,
        cwd: str,
        turn_id: str,
        text: str,
        delay_ms: int,
        on_finish: Callable[[Turn, TurnResult], None],
        mode: str = "workspace_write",
        sandbox: Sandbox | None = None,
        recall: Callable[[], str] = lambda: "",
        spawn: Callable[[str, str], Spawned] | None = None,
        hooks: Hooks | None = None,
        steered: bool = False,
    ) -> None:
        """`steered`: the input already carries a steering message (a restarted turn's)."""
        self.io = io
        self._hooks = hooks or Hooks()
        self._spawn = spawn  # `@subagent`: a native thread of its own for the subagent (server.py)
        self._recall = recall  # the thread's conversation as `@recall` shows it, read when the directive runs
        self.mode = mode  # the thread's runtime mode: read_only writes nothing, approval_required asks first
        self.sandbox = sandbox or Sandbox(Path(cwd), writable=mode != "read_only")
        self.thread_id = thread_id
        self.cwd = cwd
        self.id = turn_id
        self.task: asyncio.Task[None] | None = None
        # True once no directive can run any more; steering and interrupts are then refused.
        self.closed = False
        self._delay_ms = delay_ms
        self._on_finish = on_finish
        self._planned: deque[Directive] = deque()
        self._steered: deque[Directive] = deque()
        self._was_steered = asyncio.Event()  # set by the first steering message; `@await-steer` waits on it
        if steered:
            self._was_steered.set()
        self._parse_error: str | None = None
        self._messages: list[str] = []
        self._work: asyncio.Task[None] | None = None
        self._interrupted = False
        self._calls: dict[str, int] = {}  # model calls reported, by turn id (the subagents' own turns too)
        self._totals: dict[str, tuple[int, int]] = {}  # their input and output token sums, by turn id
        self._last_usage: Message | None = None  # the last report's params, for `@usage-again`
        try:
            self._planned.extend(parse(text))
        except DirectiveError as exc:
            self._parse_error = str(exc)

    async def begin(self) -> None:
        """Announces the turn and starts it; called once the `turn/start` response is out."""
        await self._send("turn/started", {"threadId": self.thread_id, "turn": {"id": self.id}})
        self._work = asyncio.create_task(self._execute(), name=f"turn-{self.id}-work")
        self.task = asyncio.create_task(self._conclude(), name=f"turn-{self.id}")

    def steer(self, text: str) -> None:
        """Queues the steering message's directives to run after the current directive."""
        try:
            directives = parse_steer(text)
        except DirectiveError as exc:
            directives = [Fail(str(exc))]
        self._steered.extend(directives)
        self._was_steered.set()

    def interrupt(self) -> None:
        if self._work is not None and not self._interrupted:
            self._interrupted = True
            self._work.cancel()

    async def _conclude(self) -> None:
        assert self._work is not None
        try:
            await asyncio.wait([self._work])
        except asyncio.CancelledError:
            self._work.cancel()
            raise
        self.closed = True
        result = self._result(self._work)
        if not self._calls.get(self.id) and self._parse_error is None:  # a malformed script ran nothing
            await self._usage(self.id, DEFAULT_USAGE)
        self._on_finish(self, result)
        error = None if result.error is None else {"message": result.error}
        turn: Message = {"id": self.id, "status": result.status, "error": error}
        if result.stop_reason is not None:
            turn["stopReason"] = result.stop_reason
        await self._send("turn/completed", {"threadId": self.thread_id, "turn": turn})

    def _result(self, work: asyncio.Task[None]) -> TurnResult:
        output = "\n".join(self._messages)
        if work.cancelled():
            return TurnResult("interrupted", None, output)
        exc = work.exception()
        if exc is None:
            return TurnResult("completed", None, output)
        if not isinstance(exc, TurnFailed):
            log.error("turn %s broke", self.id, exc_info=exc)
        reason = exc.reason if isinstance(exc, TurnStopped) else None
        return TurnResult("failed", str(exc) or type(exc).__name__, output, reason)

    async def _execute(self) -> None:
        try:
            if self._parse_error is not None:
                raise TurnFailed(self._parse_error)
            previous: Directive | None = None
            while (directive := self._next()) is not None:
                # `@delay` has just waited; the pause it sets starts between the directives after it.
                if previous is not None and not isinstance(previous, Delay):
                    await self._pause()
                await self._perform(directive)
                previous = directive
        finally:
            self.closed = True

    def _next(self) -> Directive | None:
        if self._steered:
            return self._steered.popleft()
        if self._planned:
            return self._planned.popleft()
        return None

    async def _perform(self, directive: Directive) -> None:
        match directive:
            case Reply(text):
                await self._reply(self.id, text)
            case Delay(ms):
                self._delay_ms = ms
                await asyncio.sleep(ms / 1000)
            case Await(path):
                await self._await_file(path)
            case AwaitSteer():
                await self._await_steer()
            case Tool(command) if self.mode == "approval_required":
                await self._approval(command)  # every command asks first
            case Tool(command):
                await self._tool(command, self.io.new_item_id())
            case Write(path, text):
                await self._write(path, text)
            case Approval(command):
                await self._approval(command)
            case Approvals(commands):
                await self._approvals(commands)
            case Usage():
                await self._usage(self.id, directive)
            case Config(option, value) if self._hooks.config is not None:
                await self._hooks.config(option, value)
            case Stop(reason):
                raise TurnStopped(reason)
            case Ask(question, options):
                await self._ask(question, options)
            case Todo(steps):
                await self._todo(steps)
            case Plan(text):
                await self._plan(text)
            case Subagent(prompt):
                await self._subagent(prompt)
            case Recall():
                await self._reply(self.id, self._recall())
            case Usage():
                await self._usage(self.id, directive)
            case UsageAgain():
                if self._last_usage is None:
                    raise TurnFailed("@usage-again: no usage reported yet in this turn")
                await self._send("thread/tokenUsage/updated", self._last_usage)
            case Fail(message):
                raise TurnFailed(message)
            case Crash(once):
                if once and not await asyncio.to_thread(_first_crash, self.thread_id):
                    return
                os._exit(CRASH_EXIT_CODE)

    async def _usage(self, turn_id: str, call: Usage) -> None:
        """One model call's usage, as Codex reports it (`thread/tokenUsage/updated`: this call's figures in
        `last`, the turn's running sum in `total`), plus what Codex never sends: `callId`, the call's stable
        name, and `costUsd` when the directive gave one."""
        number = self._calls[turn_id] = self._calls.get(turn_id, 0) + 1
        last = _breakdown(call.input, call.output)
        sums = self._totals.get(turn_id, (0, 0))
        sums = self._totals[turn_id] = (sums[0] + call.input, sums[1] + call.output)
        params: Message = {"tokenUsage": {"last": last, "total": _breakdown(*sums), "modelContextWindow": None}}
        params["callId"] = f"{turn_id}/{number}"
        if call.cost_usd is not None:
            params["costUsd"] = call.cost_usd
        self._last_usage = {"threadId": self.thread_id, "turnId": turn_id, **params}
        await self._send("thread/tokenUsage/updated", self._last_usage)

    async def _await_file(self, path: str) -> None:
        """Holds the turn until `path` exists inside the cwd (a test's gate), failing it after AWAIT_BOUND_S.

        Polled rather than watched: the gate is for tests, and a stat every 20 ms costs nothing there."""
        deadline = asyncio.get_running_loop().time() + AWAIT_BOUND_S
        while True:
            try:
                target = workspace.resolve(self.cwd, path)  # again each time: a symlink may appear meanwhile
            except workspace.EscapeError as exc:
                raise TurnFailed(f"@await {path}: {exc}") from None
            if target.exists():
                return
            if asyncio.get_running_loop().time() > deadline:
                raise TurnFailed(f"@await {path}: still not there after {AWAIT_BOUND_S:g} s")
            await asyncio.sleep(AWAIT_POLL_S)

    async def _await_steer(self) -> None:
        """Holds the turn until it has been steered (at once if it already was), failing it after AWAIT_BOUND_S;
        the steering message's directives then run next, as after any directive."""
        try:
            await asyncio.wait_for(self._was_steered.wait(), AWAIT_BOUND_S)
        except TimeoutError:
            raise TurnFailed(f"@await-steer: no steering message after {AWAIT_BOUND_S:g} s") from None

    async def _pause(self) -> None:
        # Even a zero pause yields, so requests (an interrupt) are read between chunks.
        await asyncio.sleep(self._delay_ms / 1000)

    async def _reply(self, turn_id: str, text: str) -> None:
        item_id = self.io.new_item_id()
        item = {"type": "agentMessage", "id": item_id, "text": ""}
        await self._notify("item/started", turn_id, item=item)
        for index, chunk in enumerate(chunks(text)):
            if index:
                await self._pause()
            await self._notify("item/agentMessage/delta", turn_id, itemId=item_id, delta=chunk)
        await self._notify("item/completed", turn_id, item={**item, "text": text})
        if turn_id == self.id:
            self._messages.append(text)

    async def _tool(self, command: str, item_id: str, turn_id: str | None = None) -> None:
        turn_id = turn_id or self.id
        item: Message = {
            "type": "commandExecution",
            "id": item_id,
            "command": command,
            "cwd": self.cwd,
            "status": "inProgress",
            "exitCode": None,
            "aggregatedOutput": None,
        }
        await self._notify("item/started", turn_id, item=item)
        output: list[str] = []

        async def on_output(text: str) -> None:
            output.append(text)
            await self._notify("item/commandExecution/outputDelta", self.id, itemId=item_id, delta=text)

        exit_code: int | None
        try:
            exit_code = await shell.run(command, self.cwd, on_output, self.sandbox)
        except OSError as exc:
            exit_code = None
            output.append(f"cannot run command: {exc}\n")
        status = "completed" if exit_code == 0 else "failed"
        done = {**item, "status": status, "exitCode": exit_code, "aggregatedOutput": "".join(output)}
        await self._notify("item/completed", self.id, item=done)

    async def _write(self, path: str, text: str, turn_id: str | None = None) -> None:
        turn_id = turn_id or self.id
        item_id = self.io.new_item_id()
        refusal: str | None = None
        try:
            target = workspace.resolve(self.cwd, path)
        except workspace.EscapeError as exc:
            refusal = str(exc)
            target = None
        if refusal is None and self.mode == "read_only":
            refusal = "this thread is read-only: files cannot be written"
        kind = "update" if target is not None and target.exists() else "add"
        item = {
            "type": "fileChange",
            "id": item_id,
            "changes": [{"path": workspace.display_path(self.cwd, path), "kind": kind}],
            "status": "inProgress",
        }
        await self._notify("item/started", turn_id, item=item)
        if refusal is None and self.mode == "approval_required" and not await self._approved_change(item_id):
            await self._notify("item/completed", turn_id, item={**item, "status": "declined"})
            return
        status = "failed"
        if target is not None and refusal is None:
            try:
                # Written from inside the sandbox: a symlink swapped in meanwhile still cannot lead outside.
                await shell.write_file(self.sandbox, self.cwd, target, text)
                status = "completed"
            except OSError as exc:
                refusal = f"cannot write {path}: {exc}"
        if refusal is not None:
            log.warning("@write %s refused: %s", path, refusal)
            await self._notify("item/fileChange/outputDelta", turn_id, itemId=item_id, delta=refusal + "\n")
        await self._notify("item/completed", turn_id, item={**item, "status": status})

    async def _approved_change(self, item_id: str) -> bool:
        """Asks `item/fileChange/requestApproval` for the started fileChange item; True if accepted."""
        params = {"threadId": self.thread_id, "turnId": self.id, "itemId": item_id, "reason": "write a file"}
        try:
            answer = await self.io.peer.request("item/fileChange/requestApproval", params)
        except PeerError as exc:
            log.warning("approval request failed (%s); treated as declined", exc)
            return False
        return answer.get("decision") in APPROVED

    async def _approval(self, command: str, turn_id: str | None = None) -> None:
        turn_id = turn_id or self.id
        item_id = self.io.new_item_id()
        decision = await self._ask_approval(command, item_id, turn_id)
        await self._act_on(command, item_id, turn_id, decision)

    async def _approvals(self, commands: tuple[str, ...]) -> None:
        """All the requests go out before any answer is awaited; the accepted commands then run in order."""
        item_ids = [self.io.new_item_id() for _ in commands]
        pairs = list(zip(commands, item_ids, strict=True))
        decisions = await asyncio.gather(*(self._ask_approval(command, item_id, self.id) for command, item_id in pairs))
        for command, item_id, decision in zip(commands, item_ids, decisions, strict=True):
            await self._act_on(command, item_id, self.id, decision)

    async def _ask_approval(self, command: str, item_id: str, turn_id: str) -> object:
        params = {"threadId": self.thread_id, "turnId": turn_id, "itemId": item_id, "command": command, "cwd": self.cwd}
        try:
            answer = await self.io.peer.request("item/commandExecution/requestApproval", params)
        except PeerError as exc:
            log.warning("approval request failed (%s); treated as declined", exc)
            return "decline"
        return answer.get("decision")

    async def _act_on(self, command: str, item_id: str, turn_id: str, decision: object) -> None:
        if decision in APPROVED:
            await self._tool(command, item_id, turn_id)
            return
        item = {
            "type": "commandExecution",
            "id": item_id,
            "command": command,
            "cwd": self.cwd,
            "status": "declined",
            "exitCode": None,
            "aggregatedOutput": None,
        }
        await self._notify("item/completed", turn_id, item=item)

    async def _ask(self, question: str, options: tuple[str, ...]) -> None:
        questions = [
            {"id": "q1", "question": question, "options": [{"label": o} for o in options], "isOther": not options}
        ]
        params = {
            "threadId": self.thread_id,
            "turnId": self.id,
            "itemId": self.io.new_item_id(),
            "questions": questions,
        }
        try:
            answer = await self.io.peer.request("item/tool/requestUserInput", params)
            labels = _answer_labels(answer)
        except PeerError as exc:
            log.warning("question request failed (%s); treated as unanswered", exc)
            labels = []
        await self._reply(self.id, f"Answer: {', '.join(labels)}")

    async def _todo(self, steps: tuple[str, ...], turn_id: str | None = None) -> None:
        statuses = ["pending"] * len(steps)

        async def update() -> None:
            plan = [{"step": step, "status": status} for step, status in zip(steps, statuses, strict=True)]
            await self._notify("turn/plan/updated", turn_id or self.id, plan=plan)

        await update()
        for index in range(len(steps)):
            for status in ("inProgress", "completed"):
                await self._pause()
                statuses[index] = status
                await update()

    async def _plan(self, text: str) -> None:
        item_id = self.io.new_item_id()
        item = {"type": "plan", "id": item_id, "text": ""}
        await self._notify("item/started", self.id, item=item)
        for index, chunk in enumerate(chunks(text)):
            if index:
                await self._pause()
            await self._notify("item/plan/delta", self.id, itemId=item_id, delta=chunk)
        await self._notify("item/completed", self.id, item={**item, "text": text})

    async def _subagent(self, prompt: str) -> None:
        """A subagent with a native thread of its own (as a Codex `spawnAgent`): the item names it in
        `receiverThreadIds`; its one turn runs the prompt (its events carry the parent's `threadId` and the
        child turn's `parentTurnId`) and is kept in the subagent's thread, which can then be read, reverted,
        forked or resumed like any other. `turn/interrupt` of that thread's turn ends the subagent alone
        (`interrupted`) and the parent turn goes on; an interrupt of the parent ends both, the child first."""
        item_id = self.io.new_item_id()
        child_id = str(uuid.uuid4())
        spawned = self._spawn(prompt, child_id) if self._spawn is not None else None
        item: Message = {"type": "collabAgentToolCall", "id": item_id, "prompt": prompt, "childTurnId": child_id}
        item |= {"tool": "spawnAgent", "senderThreadId": self.thread_id}
        item["receiverThreadIds"] = [spawned.thread_id] if spawned is not None else []
        await self._notify("item/started", self.id, item={**item, "status": "inProgress"})
        child = {"id": child_id, "parentTurnId": self.id}
        await self._send("turn/started", {"threadId": self.thread_id, "turn": child})
        replies: list[str] = []
        work = asyncio.create_task(self._child_work(prompt, child_id, replies), name=f"turn-{child_id}-child")
        if spawned is not None:
            spawned.running(ChildTurn(child_id, work))
        try:
            await asyncio.wait([work])
        except asyncio.CancelledError:  # the parent is interrupted: the child ends first
            work.cancel()
            await asyncio.wait([work])
            await self._end_child(child, item, spawned, "interrupted", None, replies)
            raise
        status, error = _child_outcome(work)
        await self._end_child(child, item, spawned, status, error, replies)

    async def _child_work(self, prompt: str, child_id: str, replies: list[str]) -> None:
        """The subagent's turn: one directive (`@approval`, `@todo`, `@write`, `@await`) first, then its reply."""
        if prompt.startswith("@approval "):  # the child turn asks for approval itself
            await self._approval(prompt.removeprefix("@approval ").strip(), child_id)
        elif prompt.startswith("@todo "):  # the child turn keeps its own todo list
            steps = prompt.removeprefix("@todo ").split(";")
            await self._todo(tuple(step.strip() for step in steps if step.strip()), child_id)
        elif prompt.startswith("@write "):  # the child turn writes a file (a change of its own scope)
            path, _, text = prompt.removeprefix("@write ").strip().partition(" ")
            await self._write(path, text.strip(), child_id)
        elif prompt.startswith("@await "):  # a gate: the subagent is provably running until it opens
            await self._await_file(prompt.removeprefix("@await ").strip())
        elif prompt.startswith("@usage "):  # the subagent's own model call
            try:
                call = usage(prompt.removeprefix("@usage ").strip())
            except DirectiveError as exc:
                raise TurnFailed(str(exc)) from None
            await self._usage(child_id, call)
        reply = f"Subagent: {prompt}"
        await self._reply(child_id, reply)
        replies.append(reply)
        if not self._calls.get(child_id):
            await self._usage(child_id, DEFAULT_USAGE)

    async def _end_child(
        self,
        child: Message,
        item: Message,
        spawned: Spawned | None,
        status: str,
        error: str | None,
        replies: list[str],
    ) -> None:
        if spawned is not None:
            spawned.finish(status, "\n".join(replies))
        turn = {**child, "status": status, "error": None if error is None else {"message": error}}
        await self._send("turn/completed", {"threadId": self.thread_id, "turn": turn})
        await self._notify("item/completed", self.id, item={**item, "status": status})

    async def _notify(self, method: str, turn_id: str, **fields: Any) -> None:
        await self._send(method, {"threadId": self.thread_id, "turnId": turn_id, **fields})

    async def _send(self, method: str, params: Message) -> None:
        await self.io.writer.send({"method": method, "params": params})


def _breakdown(input_tokens: int, output_tokens: int) -> Message:
    """Codex's TokenUsageBreakdown of a call of these figures (nothing cached, no reasoning)."""
    return {
        "inputTokens": input_tokens,
        "cachedInputTokens": 0,
        "cacheWriteInputTokens": 0,
        "outputTokens": output_tokens,
        "reasoningOutputTokens": 0,
        "totalTokens": input_tokens + output_tokens,
    }


def _answer_labels(answer: Message) -> list[str]:
    """The labels answered to `q1`, tolerating a malformed answer (it counts as none)."""
    answers = answer.get("answers")
    entry = answers.get("q1") if isinstance(answers, dict) else None
    labels = entry.get("answers") if isinstance(entry, dict) else None
    return [str(label) for label in labels] if isinstance(labels, list) else []


def _first_crash(thread_id: str) -> bool:
    """Whether this thread has not crashed at `@crash once` before; remembers that it now has (a marker in
    the state folder, the process's working directory)."""
    marker = Path(f"crashed-once-{thread_id}")
    if marker.exists():
        return False
    marker.touch()
    return True


class ChildTurn:
    """A subagent's running turn, as its own thread's session sees it: `turn/interrupt` on the subagent's
    thread cancels this turn alone."""

    def __init__(self, turn_id: str, work: asyncio.Task[None]) -> None:
        self.id = turn_id
        self.task: asyncio.Task[None] | None = work

    @property
    def closed(self) -> bool:
        return self.task is None or self.task.done()

    def interrupt(self) -> None:
        if self.task is not None:
            self.task.cancel()


class Spawned(Protocol):
    """The subagent's own thread (kept by the server): its id, its running turn, and the turn's end."""

    @property
    def thread_id(self) -> str: ...

    def running(self, turn: ChildTurn) -> None: ...

    def finish(self, status: str, output: str) -> None: ...


def _child_outcome(work: asyncio.Task[None]) -> tuple[str, str | None]:
    """(status, error) of a subagent's turn: interrupted if cancelled, failed if it raised."""
    if work.cancelled():
        return "interrupted", None
    exc = work.exception()
    if exc is None:
        return "completed", None
    if not isinstance(exc, TurnFailed):
        log.error("subagent turn broke", exc_info=exc)
    return "failed", str(exc) or type(exc).__name__

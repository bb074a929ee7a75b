"""Claude Code stream-json output → normalized provider events (one native thread).

`ThreadTranslator` keeps the little state the translation needs: which assistant text
blocks and tool calls are open, which tool calls are subagents (their messages carry
`parent_tool_use_id` and become a child turn), the task list, and which tool calls the
user declined. The process and turn bookkeeping live in the rest of this package.

Item ids: a text block is `<message id>:t<n>` (the n-th text block of that API message;
the CLI sends each block of a message as its own `assistant` line, and the partial
`stream_event`s count blocks the same way); a tool call is its `tool_use` id.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Literal

from threadloom.providers.claude.usage import Meter
from threadloom.providers.contract import (
    ItemCompleted,
    ItemKind,
    ItemStarted,
    ProviderEvent,
    TextDelta,
    TodoUpdated,
    TurnCompleted,
    TurnStarted,
    Warning,
)

FILE_TOOLS = frozenset({"Edit", "Write", "MultiEdit", "NotebookEdit"})
SUBAGENT_TOOLS = frozenset({"Task", "Agent"})
TASK_LIST_TOOLS = frozenset({"TodoWrite", "TaskCreate", "TaskUpdate", "TaskGet", "TaskList"})
ItemStatus = Literal["completed", "failed", "declined", "interrupted"]
_EXIT_CODE = re.compile(r"^(?:Error: )?Exit code (\d+)")


def tool_title(name: str, tool_input: dict[str, Any]) -> str:
    """What a tool call is shown as: the command, the file, or the tool and its main argument."""
    if name == "Bash":
        return str(tool_input.get("command", "Bash"))
    if name in FILE_TOOLS:
        return f"{name} {tool_input.get('file_path') or tool_input.get('notebook_path') or ''}".strip()
    if name in SUBAGENT_TOOLS:
        return str(tool_input.get("description") or tool_input.get("prompt") or name)
    for key in ("file_path", "path", "pattern", "url", "query"):
        if tool_input.get(key):
            return f"{name} {tool_input[key]}"
    return name


def tool_kind(name: str) -> ItemKind:
    if name in FILE_TOOLS:
        return "file_change"
    if name in SUBAGENT_TOOLS:
        return "subagent"
    return "tool_call"


def result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    parts = [str(c.get("text", "")) for c in content or [] if isinstance(c, dict) and c.get("type") == "text"]
    return "\n".join(parts)


@dataclasses.dataclass(slots=True)
class _Tool:
    name: str
    input: dict[str, Any]
    turn: str
    child_turn: str | None = None  # a subagent's own turn


class ThreadTranslator:
    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.turn: str | None = None  # the running app turn (set by the runtime)
        self.declined: set[str] = set()  # tool_use ids the user declined
        self.last_assistant_uuid: str | None = None  # of the main conversation, for --resume-session-at
        self._tools: dict[str, _Tool] = {}  # open tool calls by tool_use id
        self._texts: dict[str, str] = {}  # open text items -> turn
        self._text_count: dict[str, int] = {}  # message id -> text blocks seen in assistant lines
        self._stream_msg: dict[str | None, str] = {}  # parent_tool_use_id -> streaming message id
        self._stream_blocks: dict[tuple[str, int], str] = {}  # (message id, block index) -> item id
        self._stream_count: dict[str, int] = {}
        self._tasks: dict[str, dict[str, str]] = {}
        self._spoke: set[str] = set()  # child turns whose own assistant messages were seen
        self._broke_off: set[str] = set()  # turns a streamed reply of which broke off (see `_abandoned`)
        self.meter = Meter(thread)  # the process's usage (made anew with each process: claude/usage.py)

    # ---- helpers ---------------------------------------------------------------------

    def turn_of(self, parent_tool_use_id: str | None) -> str:
        """The native turn of a message: the app turn, or a subagent's child turn."""
        if parent_tool_use_id:
            tool = self._tools.get(parent_tool_use_id)
            if tool is not None and tool.child_turn:
                return tool.child_turn
        return self.turn or ""

    def turn_of_tool(self, tool_use_id: str | None) -> str:
        tool = self._tools.get(tool_use_id or "")
        return tool.turn if tool is not None else self.turn or ""

    def _start_text(self, item_id: str, turn: str) -> list[ProviderEvent]:
        if item_id in self._texts:
            return []
        self._texts[item_id] = turn
        return [ItemStarted(self.thread, turn, item_id, "assistant_message")]

    # ---- stdout message kinds --------------------------------------------------------

    def on_stream(self, message: dict[str, Any]) -> list[ProviderEvent]:
        """A partial (`stream_event`): text blocks start and stream; the rest waits for `assistant`."""
        event = message.get("event") or {}
        parent = message.get("parent_tool_use_id")
        turn = self.turn_of(parent)
        kind = event.get("type")
        if kind == "message_start":
            self._stream_msg[parent] = str((event.get("message") or {}).get("id"))
            self.meter.started(parent, event.get("message") or {})
            return []
        if kind == "message_delta":
            return self.meter.ended(parent, turn, event.get("usage"))
        msg_id = self._stream_msg.get(parent)
        if msg_id is None:
            return []
        index = int(event.get("index", -1))
        if kind == "content_block_start" and (event.get("content_block") or {}).get("type") == "text":
            n = self._stream_count.get(msg_id, 0)
            self._stream_count[msg_id] = n + 1
            item_id = f"{msg_id}:t{n}"
            self._stream_blocks[(msg_id, index)] = item_id
            return self._start_text(item_id, turn)
        if kind == "content_block_delta":
            delta = event.get("delta") or {}
            block_item = self._stream_blocks.get((msg_id, index))
            if block_item is not None and delta.get("type") == "text_delta" and block_item in self._texts:
                return [TextDelta(self.thread, turn, block_item, str(delta.get("text", "")))]
        return []

    def on_assistant(self, message: dict[str, Any]) -> list[ProviderEvent]:
        body = message.get("message") or {}
        parent = message.get("parent_tool_use_id")
        turn = self.turn_of(parent)
        if parent is None and message.get("uuid"):
            self.last_assistant_uuid = str(message["uuid"])
        elif parent is not None:
            self._spoke.add(turn)
        msg_id = str(body.get("id"))
        out: list[ProviderEvent] = self._abandoned(msg_id, turn)
        for block in body.get("content") or []:
            kind = block.get("type")
            if kind == "text":
                n = self._text_count.get(msg_id, 0)
                self._text_count[msg_id] = n + 1
                item_id = f"{msg_id}:t{n}"
                text = str(block.get("text", ""))
                out += self._start_text(item_id, turn)
                self._texts.pop(item_id, None)
                out.append(ItemCompleted(self.thread, turn, item_id, "assistant_message", "completed", text))
            elif kind == "thinking" and block.get("thinking"):
                r = self._text_count.get(msg_id + ":r", 0)
                self._text_count[msg_id + ":r"] = r + 1
                item_id = f"{msg_id}:r{r}"
                out.append(ItemStarted(self.thread, turn, item_id, "reasoning"))
                out.append(ItemCompleted(self.thread, turn, item_id, "reasoning", "completed", str(block["thinking"])))
            elif kind == "tool_use":
                out += self._tool_use(block, turn)
        return out

    def _abandoned(self, msg_id: str, turn: str) -> list[ProviderEvent]:
        """Text that streamed for another message of this turn and was never confirmed by its `assistant` line:
        the stream broke off and the CLI asked again (the new message is this one). The partial text stays,
        its item failed, and a warning says why."""
        gone = [item for item, t in self._texts.items() if t == turn and not item.startswith(f"{msg_id}:")]
        out: list[ProviderEvent] = []
        for item in gone:
            del self._texts[item]
            out.append(ItemCompleted(self.thread, turn, item, "assistant_message", "failed"))
        if gone:
            self._broke_off.add(turn)
            out.append(Warning(self.thread, "the model's reply broke off mid-stream; Claude Code asked again"))
        return out

    def broke_off(self, turn: str) -> bool:
        """Whether a streamed reply of `turn` broke off: abandoned for another message, or still open (no
        message confirmed it) when the turn's result came."""
        return turn in self._broke_off or turn in self._texts.values()

    def _tool_use(self, block: dict[str, Any], turn: str) -> list[ProviderEvent]:
        tool_id, name = str(block.get("id")), str(block.get("name"))
        tool_input = dict(block.get("input") or {})
        if tool_id in self._tools:
            return []
        tool = _Tool(name, tool_input, turn)
        self._tools[tool_id] = tool
        if name in TASK_LIST_TOOLS:
            if name == "TodoWrite":
                self._tasks = {
                    str(i): {"step": str(t.get("content")), "status": str(t.get("status"))}
                    for i, t in enumerate(tool_input.get("todos") or [])
                }
                return [self._todo(turn)]
            return []
        kind = tool_kind(name)
        detail: dict[str, Any] = {"tool": name, "input": tool_input}
        if name == "Bash":
            detail["command"] = str(tool_input.get("command", ""))
        elif kind == "file_change":
            path = str(tool_input.get("file_path") or tool_input.get("notebook_path") or "")
            detail["changes"] = [{"path": path, "kind": "add" if name == "Write" else "update"}]
        out: list[ProviderEvent] = []
        if kind == "subagent":
            tool.child_turn = f"{turn}/{tool_id}"
            detail["childTurnId"] = tool.child_turn
        out.append(ItemStarted(self.thread, turn, tool_id, kind, tool_title(name, tool_input), detail))
        if tool.child_turn:
            out.append(TurnStarted(self.thread, tool.child_turn, turn))
        return out

    def on_user(self, message: dict[str, Any]) -> list[ProviderEvent]:
        """Tool results (the CLI's own `user` lines; replays of our input are handled by the runtime)."""
        content = (message.get("message") or {}).get("content")
        if not isinstance(content, list):
            return []
        extra = message.get("tool_use_result")
        out: list[ProviderEvent] = []
        for block in content:
            if isinstance(block, dict) and block.get("type") == "tool_result":
                out += self._tool_result(block, extra if isinstance(extra, dict) else {})
        return out

    def _tool_result(self, block: dict[str, Any], extra: dict[str, Any]) -> list[ProviderEvent]:
        tool_id = str(block.get("tool_use_id"))
        tool = self._tools.pop(tool_id, None)
        if tool is None:
            return []
        text = result_text(block)
        is_error = bool(block.get("is_error"))
        if tool.name in TASK_LIST_TOOLS:
            return self._task_result(tool, extra, is_error)
        status: ItemStatus = "failed" if is_error else "completed"
        if tool_id in self.declined:
            status = "declined"
        elif extra.get("interrupted"):
            status = "interrupted"
        detail: dict[str, Any] = {"output": text, "isError": is_error}
        if tool.name == "Bash" and status != "declined":
            m = _EXIT_CODE.match(text)
            detail["exitCode"] = int(m.group(1)) if m else (1 if is_error else 0)
        out: list[ProviderEvent] = []
        if tool.child_turn and tool.child_turn not in self._spoke:
            # Claude Code -p does not print a subagent's messages: its final answer is the tool result.
            answer = "\n".join(
                str(c.get("text", "")) for c in extra.get("content") or [] if isinstance(c, dict) and c.get("text")
            )
            if answer:
                item_id = f"{tool_id}:answer"
                out.append(ItemStarted(self.thread, tool.child_turn, item_id, "assistant_message"))
                out.append(
                    ItemCompleted(self.thread, tool.child_turn, item_id, "assistant_message", "completed", answer)
                )
        if tool.child_turn:
            out += self.meter.subagent(tool.child_turn, tool_id, extra)
        out.append(ItemCompleted(self.thread, tool.turn, tool_id, tool_kind(tool.name), status, None, detail))
        if tool.child_turn:
            child_status: Literal["completed", "failed", "interrupted"] = (
                "interrupted" if status == "interrupted" else "failed" if status != "completed" else "completed"
            )
            error = text if child_status == "failed" else None
            out.append(TurnCompleted(self.thread, tool.child_turn, child_status, error, tool.turn))
        return out

    def _task_result(self, tool: _Tool, extra: dict[str, Any], is_error: bool) -> list[ProviderEvent]:
        if is_error:
            return []
        if tool.name == "TaskCreate":
            task = extra.get("task") or {}
            task_id = str(task.get("id") or len(self._tasks) + 1)
            self._tasks[task_id] = {"step": str(task.get("subject") or tool.input.get("subject")), "status": "pending"}
        elif tool.name == "TaskUpdate":
            task_id = str(tool.input.get("taskId"))
            if task_id not in self._tasks:
                return []
            if tool.input.get("status") == "deleted":
                del self._tasks[task_id]
            else:
                if tool.input.get("status"):
                    self._tasks[task_id]["status"] = str(tool.input["status"])
                if tool.input.get("subject"):
                    self._tasks[task_id]["step"] = str(tool.input["subject"])
        else:
            return []
        return [self._todo(tool.turn)]

    def _todo(self, turn: str) -> TodoUpdated:
        return TodoUpdated(self.thread, turn, [dict(t) for t in self._tasks.values()])

    def close_open(self, status: ItemStatus) -> list[ProviderEvent]:
        """At the end of a turn: every item still open ends with `status`; open subagent turns too."""
        out: list[ProviderEvent] = []
        for item_id, turn in self._texts.items():
            out.append(ItemCompleted(self.thread, turn, item_id, "assistant_message", status))
        for tool_id, tool in self._tools.items():
            if tool.name in TASK_LIST_TOOLS:
                continue
            out.append(ItemCompleted(self.thread, tool.turn, tool_id, tool_kind(tool.name), status))
            if tool.child_turn:
                child: Literal["failed", "interrupted"] = "interrupted" if status == "interrupted" else "failed"
                out.append(TurnCompleted(self.thread, tool.child_turn, child, None, tool.turn))
        self._texts.clear()
        self._tools.clear()
        self._stream_msg.clear()
        self._broke_off.clear()
        self._stream_blocks.clear()
        self._stream_count.clear()
        self._text_count.clear()
        self.declined.clear()
        self._spoke.clear()
        return out

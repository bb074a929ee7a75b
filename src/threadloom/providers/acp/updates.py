"""ACP `session/update` notifications of one session → normalized provider events.

ACP has no turn or item ids of its own beyond tool calls: a turn is one `session/prompt` (the runtime
names it), an assistant message is the run of `agent_message_chunk`s sharing a `messageId` (or, without
one, the chunks between two other updates), and a tool call is its `toolCallId`. So this keeps, per
session, the open message or thought and the open tool calls, and closes them when the turn ends.

Known traps handled here: a `tool_call_update` for a tool call never announced opens it first (agents
send them, e.g. after a reconnect); a tool call whose `_meta` names a parent tool call belongs to that
subagent's child turn; a `usage_update` is parsed into `AcpUsage` whatever the turn state (a trailing one
follows the prompt's response).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Literal

from threadloom.providers.contract import (
    ItemCompleted,
    ItemKind,
    ItemStarted,
    OutputDelta,
    ProviderEvent,
    TextDelta,
    TodoUpdated,
    TurnCompleted,
    TurnStarted,
    TurnStatus,
)

FILE_KINDS = frozenset({"edit", "delete", "move"})
SUBAGENT_TOOLS = frozenset({"Task", "Agent"})
PLAN_STATUS = {"pending": "pending", "in_progress": "inProgress", "completed": "completed"}
ItemStatus = Literal["completed", "failed", "declined", "interrupted"]
TOOL_DONE: dict[str, ItemStatus] = {"completed": "completed", "failed": "failed"}


@dataclasses.dataclass(frozen=True, slots=True)
class AcpUsage:
    """What an ACP agent reported about its usage, typed (for the usage ledger).

    `context_used`/`context_size` and `cost_*` come from `usage_update` (tokens in the context window now,
    the window's size, the session's cumulative cost); the token counts come from a `session/prompt`
    answer's `usage` (that turn's tokens). A field the agent did not report is None."""

    context_used: int | None = None
    context_size: int | None = None
    cost_amount: float | None = None
    cost_currency: str | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    total_tokens: int | None = None
    thought_tokens: int | None = None
    cached_read_tokens: int | None = None
    cached_write_tokens: int | None = None

    def merged(self, other: AcpUsage) -> AcpUsage:
        """This usage with every field `other` reported replacing its own."""
        given = {f.name: getattr(other, f.name) for f in dataclasses.fields(other)}
        return dataclasses.replace(self, **{k: v for k, v in given.items() if v is not None})


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def usage_of_update(update: Mapping[str, Any]) -> AcpUsage:
    raw = update.get("cost")
    cost: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    amount = cost.get("amount")
    return AcpUsage(
        context_used=_count(update.get("used")),
        context_size=_count(update.get("size")),
        cost_amount=float(amount) if isinstance(amount, int | float) and not isinstance(amount, bool) else None,
        cost_currency=str(cost["currency"]) if isinstance(cost.get("currency"), str) else None,
    )


def usage_of_prompt(result: Mapping[str, Any]) -> AcpUsage | None:
    usage = result.get("usage")
    if not isinstance(usage, Mapping):
        return None
    return AcpUsage(
        input_tokens=_count(usage.get("inputTokens")),
        output_tokens=_count(usage.get("outputTokens")),
        total_tokens=_count(usage.get("totalTokens")),
        thought_tokens=_count(usage.get("thoughtTokens")),
        cached_read_tokens=_count(usage.get("cachedReadTokens")),
        cached_write_tokens=_count(usage.get("cachedWriteTokens")),
    )


def content_text(content: Any) -> str:
    """The text of a content block, or of a tool call's content list."""
    if isinstance(content, Mapping):
        if content.get("type") == "text":
            return str(content.get("text") or "")
        if content.get("type") == "content":
            return content_text(content.get("content"))
        if content.get("type") == "diff":
            return f"{content.get('path')}: edited"
        return ""
    if isinstance(content, list):
        return "\n".join(t for t in (content_text(c) for c in content) if t)
    return ""


def _meta_parent(meta: Any) -> str | None:
    """The tool call a subagent's update belongs to, as agents announce it in `_meta`."""
    if not isinstance(meta, Mapping):
        return None
    for key in ("parentToolCallId", "parentToolUseId"):
        if isinstance(meta.get(key), str):
            return str(meta[key])
    for nested in meta.values():
        if isinstance(nested, Mapping):
            for key in ("parentToolCallId", "parentToolUseId", "parent_tool_use_id"):
                if isinstance(nested.get(key), str):
                    return str(nested[key])
    return None


def _is_subagent(update: Mapping[str, Any]) -> bool:
    meta = update.get("_meta")
    if isinstance(meta, Mapping):
        if meta.get("subagent") is True:
            return True
        for nested in meta.values():
            if not isinstance(nested, Mapping):
                continue
            if nested.get("subagent") is True or nested.get("toolName") in SUBAGENT_TOOLS:
                return True
            if isinstance(nested.get("subagentSessionId"), str) or isinstance(nested.get("childTurnId"), str):
                return True
    return False


@dataclasses.dataclass(slots=True)
class _Tool:
    turn: str
    kind: ItemKind
    title: str
    child_turn: str | None = None
    shown: str = ""  # the content text of its last update


class SessionUpdates:
    """The translation state of one session (one native thread)."""

    def __init__(self, thread: str) -> None:
        self.thread = thread
        self.turn: str | None = None
        self._text: tuple[str, str, ItemKind] | None = None  # (item id, messageId key, kind) of the open text
        self._texts: dict[str, list[str]] = {}  # open text item -> its chunks
        self._tools: dict[str, _Tool] = {}
        self._seen: dict[str, int] = {}  # message key -> times opened (a reopened message gets a new item id)
        self._count = 0

    def begin(self, turn: str) -> list[ProviderEvent]:
        self.turn = turn
        return [TurnStarted(self.thread, turn)]

    def end(self, status: TurnStatus, error: str | None = None, failure: Any = None) -> list[ProviderEvent]:
        """Close what is open and end the turn (`status`: completed, failed or interrupted)."""
        if self.turn is None:
            return []
        out = self.close_items(status)
        out.append(TurnCompleted(self.thread, self.turn, status, error, None, failure))
        self.turn = None
        return out

    def close_items(self, status: TurnStatus) -> list[ProviderEvent]:
        """Every open item (and subagent turn) closed with `status`; the turn itself stays open (when the
        process is gone, its `RuntimeExited` ends the turn)."""
        out = self._close_text()
        for tool_id, tool in list(self._tools.items()):
            out.append(ItemCompleted(self.thread, tool.turn, tool_id, tool.kind, status))
            if tool.child_turn:
                out.append(TurnCompleted(self.thread, tool.child_turn, status, None, tool.turn))
        self._tools.clear()
        return out

    def translate(self, update: Mapping[str, Any]) -> list[ProviderEvent]:
        """One `session/update`'s `update` → events (none outside a turn: a `session/load` replays history)."""
        if self.turn is None:
            return []
        kind = update.get("sessionUpdate")
        if kind in ("agent_message_chunk", "agent_thought_chunk"):
            item_kind: ItemKind = "assistant_message" if kind == "agent_message_chunk" else "reasoning"
            return self._chunk(update, item_kind)
        if kind == "tool_call":
            return [*self._close_text(), *self._tool_call(update)]
        if kind == "tool_call_update":
            return [*self._close_text(), *self._tool_update(update)]
        if kind == "plan":
            entries = update.get("entries") or []
            steps = [
                {"step": str(e.get("content")), "status": PLAN_STATUS.get(str(e.get("status")), "pending")}
                for e in entries
                if isinstance(e, Mapping)
            ]
            return [TodoUpdated(self.thread, self.turn, steps)]
        return []  # user_message_chunk (a replay), commands, modes, config options, session info

    # ---- text --------------------------------------------------------------------------

    def _chunk(self, update: Mapping[str, Any], kind: ItemKind) -> list[ProviderEvent]:
        text = content_text(update.get("content"))
        key = f"{kind}:{update.get('messageId') or ''}"
        out: list[ProviderEvent] = []
        if self._text is not None and self._text[1] != key:
            out += self._close_text()
        if self._text is None:
            self._count += 1
            times = self._seen.get(key, 0) + 1
            self._seen[key] = times
            base = str(update.get("messageId") or f"{self.turn}:m{self._count}")
            item_id = base if times == 1 else f"{base}#{times}"
            self._text = (item_id, key, kind)
            self._texts[item_id] = []
            out.append(ItemStarted(self.thread, self._turn_of(update), item_id, kind))
        item_id = self._text[0]
        if text:
            self._texts[item_id].append(text)
            out.append(TextDelta(self.thread, self._turn_of(update), item_id, text))
        return out

    def _close_text(self) -> list[ProviderEvent]:
        if self._text is None:
            return []
        item_id, _, kind = self._text
        self._text = None
        text = "".join(self._texts.pop(item_id, []))
        return [ItemCompleted(self.thread, self.turn or "", item_id, kind, "completed", text)]

    def _turn_of(self, update: Mapping[str, Any]) -> str:
        parent = _meta_parent(update.get("_meta"))
        tool = self._tools.get(parent or "")
        return tool.child_turn if tool is not None and tool.child_turn else self.turn or ""

    # ---- tool calls --------------------------------------------------------------------

    def _tool_call(self, update: Mapping[str, Any]) -> list[ProviderEvent]:
        tool_id = str(update.get("toolCallId"))
        if tool_id in self._tools:
            return self._tool_update(update)
        out = self._open_tool(tool_id, update)
        return out + self._tool_progress(tool_id, update)

    def _open_tool(self, tool_id: str, update: Mapping[str, Any]) -> list[ProviderEvent]:
        acp_kind = str(update.get("kind") or "other")
        subagent = _is_subagent(update)
        kind: ItemKind = "subagent" if subagent else "file_change" if acp_kind in FILE_KINDS else "tool_call"
        title = str(update.get("title") or acp_kind)
        turn = self._turn_of(update)
        detail: dict[str, Any] = {"acpKind": acp_kind}
        raw = update.get("rawInput")
        if isinstance(raw, Mapping) and isinstance(raw.get("command"), str):
            detail["command"] = raw["command"]
        if update.get("locations"):
            paths = [str(loc.get("path")) for loc in update["locations"] if isinstance(loc, Mapping)]
            detail["paths"] = paths
            if kind == "file_change":
                detail["changes"] = [{"path": p, "kind": "update"} for p in paths]
        tool = _Tool(turn, kind, title)
        out: list[ProviderEvent] = []
        if subagent:
            tool.child_turn = f"{turn}/{tool_id}"
            detail["childTurnId"] = tool.child_turn
        self._tools[tool_id] = tool
        out.append(ItemStarted(self.thread, turn, tool_id, kind, title, detail))
        if tool.child_turn:
            out.append(TurnStarted(self.thread, tool.child_turn, turn))
        return out

    def _tool_update(self, update: Mapping[str, Any]) -> list[ProviderEvent]:
        tool_id = str(update.get("toolCallId"))
        out: list[ProviderEvent] = []
        if tool_id not in self._tools:  # an orphan update: the tool call is opened from what it says
            out += self._open_tool(tool_id, update)
        return out + self._tool_progress(tool_id, update)

    def _tool_progress(self, tool_id: str, update: Mapping[str, Any]) -> list[ProviderEvent]:
        tool = self._tools[tool_id]
        text = content_text(update.get("content"))
        status = TOOL_DONE.get(str(update.get("status")))
        out: list[ProviderEvent] = []
        if text and status is None:
            # ACP's `content` replaces the previous one (agents send all output so far): only what it adds is
            # a delta. Content that does not extend the last one (an agent sending pieces) is sent whole.
            added = text[len(tool.shown) :] if text.startswith(tool.shown) else text
            tool.shown = text
            if added:
                out.append(OutputDelta(self.thread, tool.turn, tool_id, added))
        if status is not None:
            del self._tools[tool_id]
            detail: dict[str, Any] = {"status": status}
            raw = update.get("rawOutput")
            if isinstance(raw, Mapping) and isinstance(raw.get("exitCode"), int):
                detail["exitCode"] = raw["exitCode"]
            if tool.child_turn:
                child: TurnStatus = "completed" if status == "completed" else "failed"
                out.append(TurnCompleted(self.thread, tool.child_turn, child, None, tool.turn))
            out.append(ItemCompleted(self.thread, tool.turn, tool_id, tool.kind, status, text or None, detail))
        return out

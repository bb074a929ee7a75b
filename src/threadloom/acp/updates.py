"""What a run's thread events become in ACP: session updates, permission requests, a stop reason.

Pure: a `Turn` is fed the thread's events in order and says what the editor must be told. Assistant
messages arrive as whole texts that grow (each `message.updated` carries the text so far); the editor gets
only the new part, so a replayed or repeated event never shows a word twice.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

Update = dict[str, Any]

# The thread events the bridge reads; aliases keep same-named fields of different types apart.
EVENTS = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
  sequence type runId
  entity { __typename
    ... on ConversationMessage { id role text }
    ... on ExecutionNode { id nodeKind: kind nodeStatus: status title detail }
    ... on RuntimeRequest { id requestKind: kind requestStatus: status payload node { id } }
    ... on Run { id runStatus: status statusReason }
    ... on PlanArtifact { id planKind: kind items } } } }"""

TERMINAL = frozenset({"COMPLETED", "FAILED", "INTERRUPTED", "CANCELLED", "ROLLED_BACK"})
APPROVALS = {"COMMAND_APPROVAL": "execute", "FILE_CHANGE_APPROVAL": "edit", "PERMISSION": "other"}
TOOL_NODES = frozenset({"TOOL_CALL", "SUBAGENT"})
_TOOL_STATUS = {
    "PENDING": "pending",
    "WAITING": "pending",
    "RUNNING": "in_progress",
    "COMPLETED": "completed",
    "FAILED": "failed",
    "CANCELLED": "failed",
    "INTERRUPTED": "failed",
}
_PLAN_STATUS = {
    "pending": "pending",
    "inProgress": "in_progress",
    "in_progress": "in_progress",
    "completed": "completed",
}
# The editor's choices for an approval, and the decision each one sends (`respondToApproval`).
PERMISSION_OPTIONS = (
    {"optionId": "ACCEPT", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "ACCEPT_FOR_SESSION", "name": "Allow for this session", "kind": "allow_always"},
    {"optionId": "DECLINE", "name": "Decline", "kind": "reject_once"},
)
OUTPUT_LIMIT = 64 * 1024  # the end of a command's output shown in the editor


@dataclasses.dataclass(frozen=True, slots=True)
class PermissionAsk:
    """An approval the run waits for: the editor is asked, its choice answers the request."""

    request_id: str
    tool_call: Update


@dataclasses.dataclass(frozen=True, slots=True)
class QuestionAsk:
    """Questions the run waits for: asked in the editor as a form (elicitation) when it takes them."""

    request_id: str
    questions: list[dict[str, Any]]


def text_chunk(kind: str, text: str) -> Update:
    return {"sessionUpdate": kind, "content": {"type": "text", "text": text}}


def stop_reason(run_status: str, cancel_requested: bool) -> str | None:
    """ACP's stop reason for a run that ended; None for a failure (the prompt answers with an error)."""
    if cancel_requested or run_status in {"INTERRUPTED", "CANCELLED", "ROLLED_BACK"}:
        return "cancelled"  # after session/cancel the prompt must end as cancelled, whatever the run did
    return "end_turn" if run_status == "COMPLETED" else None


def prompt_usage(usage: Mapping[str, Any]) -> dict[str, int]:
    """A run's token usage (docs/usage.md) as an ACP prompt answer's `usage`. Threadloom's input includes cached
    input and its output includes reasoning, as ACP's totals do; the parts are told beside them."""
    input_tokens, output_tokens = int(usage["inputTokens"]), int(usage["outputTokens"])
    return {
        "inputTokens": input_tokens,
        "outputTokens": output_tokens,
        "totalTokens": input_tokens + output_tokens,
        "cachedReadTokens": int(usage["cachedInputTokens"]),
        "thoughtTokens": int(usage["reasoningTokens"]),
    }


def history(messages: Iterable[Mapping[str, Any]]) -> list[Update]:
    """A loaded session's conversation, as the updates that would have shown it live."""
    kinds = {"USER": "user_message_chunk", "ASSISTANT": "agent_message_chunk"}
    return [text_chunk(kinds[m["role"]], m["text"]) for m in messages if m["role"] in kinds and m["text"]]


def prompt_text(blocks: Iterable[Mapping[str, Any]]) -> str:
    """The user message of a prompt: its text, embedded text resources and links; ValueError for the rest."""
    parts: list[str] = []
    for block in blocks:
        kind = block.get("type")
        if kind == "text":
            parts.append(str(block.get("text", "")))
        elif kind == "resource_link":
            parts.append(str(block.get("uri", "")))
        elif kind == "resource" and "text" in (resource := block.get("resource") or {}):
            parts.append(f"{resource.get('uri', '')}\n```\n{resource['text']}\n```")
        else:
            raise ValueError(f"a prompt can hold text, resource links and text resources, not {kind!r}")
    text = "\n".join(parts)
    if not text.strip():
        raise ValueError("the prompt is empty")
    return text


class Turn:
    """The editor's view of one run: feed it every event of the thread after the run was sent."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        self.status: str | None = None  # the run's terminal status, once it ended
        self.reason: str | None = None
        self._shown: dict[str, str] = {}  # message id → the text the editor has
        self._tools: dict[str, tuple[str, str | None]] = {}  # node id → (status, title) the editor has
        self._asked: set[str] = set()

    def updates(self, event: Mapping[str, Any]) -> list[Update]:
        entity = event.get("entity") or {}
        kind = entity.get("__typename")
        if kind == "Run" and entity.get("id") == self.run_id and entity.get("runStatus") in TERMINAL:
            self.status, self.reason = entity["runStatus"], entity.get("statusReason")
            return []
        if event.get("runId") != self.run_id:
            return []
        if kind == "ConversationMessage" and entity.get("role") == "ASSISTANT":
            return self._message(entity)
        if kind == "ExecutionNode" and entity.get("nodeKind") in TOOL_NODES:
            return self._tool(entity)
        if kind == "PlanArtifact" and entity.get("planKind") == "TODO_LIST":
            return [_plan(entity.get("items") or [])]
        return []

    def permission(self, event: Mapping[str, Any]) -> PermissionAsk | None:
        """A pending approval of this run not asked yet (another client's run's approvals are not the editor's)."""
        entity = self._pending_request(event)
        tool_kind = APPROVALS.get(str((entity or {}).get("requestKind")))
        if entity is None or tool_kind is None:
            return None
        self._asked.add(entity["id"])
        payload = entity.get("payload") or {}
        title = payload.get("command") or payload.get("reason") or payload.get("path") or entity["requestKind"]
        node = entity.get("node") or {}
        tool_call = {
            "toolCallId": node.get("id") or entity["id"],
            "title": str(title),
            "kind": tool_kind,
            "status": "pending",
            "rawInput": payload,
        }
        return PermissionAsk(entity["id"], tool_call)

    def question(self, event: Mapping[str, Any]) -> QuestionAsk | None:
        """A pending question (`USER_INPUT`) of this run not asked yet."""
        entity = self._pending_request(event)
        if entity is None or entity.get("requestKind") != "USER_INPUT":
            return None
        self._asked.add(entity["id"])
        return QuestionAsk(entity["id"], list((entity.get("payload") or {}).get("questions") or []))

    def settled(self, event: Mapping[str, Any]) -> str | None:
        """The id of a request the editor was asked that is no longer pending (answered elsewhere, expired)."""
        entity = event.get("entity") or {}
        if entity.get("__typename") != "RuntimeRequest" or entity.get("requestStatus") == "PENDING":
            return None
        return entity["id"] if entity.get("id") in self._asked else None

    def _pending_request(self, event: Mapping[str, Any]) -> Mapping[str, Any] | None:
        entity = event.get("entity") or {}
        if entity.get("__typename") != "RuntimeRequest" or entity.get("requestStatus") != "PENDING":
            return None
        if event.get("runId") != self.run_id or entity["id"] in self._asked:
            return None
        return entity

    def _message(self, entity: Mapping[str, Any]) -> list[Update]:
        text, shown = str(entity.get("text") or ""), self._shown.get(entity["id"], "")
        if len(text) <= len(shown) or not text.startswith(shown):
            return []  # nothing new (a text the agent rewrote is not unsaid: the editor keeps what it showed)
        self._shown[entity["id"]] = text
        return [text_chunk("agent_message_chunk", text[len(shown) :])]

    def _tool(self, entity: Mapping[str, Any]) -> list[Update]:
        node_id, title = entity["id"], entity.get("title")
        status = _TOOL_STATUS.get(str(entity.get("nodeStatus")), "in_progress")
        detail = entity.get("detail") or {}
        known = self._tools.get(node_id)
        self._tools[node_id] = (status, title)
        if known is None:
            tool_kind = "edit" if "changes" in detail else ("other" if entity["nodeKind"] == "SUBAGENT" else "execute")
            start: Update = {
                "sessionUpdate": "tool_call",
                "toolCallId": node_id,
                "title": str(title or entity["nodeKind"].lower()),
                "kind": tool_kind,
                "status": status,
                "rawInput": {k: detail[k] for k in ("command", "cwd", "changes") if k in detail} or None,
            }
            return [start]
        if known == (status, title):
            return []  # output growing while it runs: the editor gets it whole when the call ends
        update: Update = {"sessionUpdate": "tool_call_update", "toolCallId": node_id, "status": status}
        output = detail.get("output")
        if status in {"completed", "failed"} and output:
            text = str(output)[-OUTPUT_LIMIT:]
            update["content"] = [{"type": "content", "content": {"type": "text", "text": text}}]
        if "exitCode" in detail:
            update["rawOutput"] = {"exitCode": detail["exitCode"]}
        return [update]


def _plan(items: Iterable[Mapping[str, Any]]) -> Update:
    entries = [
        {
            "content": str(item.get("step", "")),
            "priority": "medium",
            "status": _PLAN_STATUS.get(str(item.get("status")), "pending"),
        }
        for item in items
    ]
    return {"sessionUpdate": "plan", "entries": entries}

"""Codex app-server messages → normalized provider events (the translation half of the codex driver).

The scripted agent speaks the same protocol (plus `parentTurnId` on the turns of its
subagents), so its driver uses this translation too.

A `Translator` is stateful because Codex needs it: it remembers which items of a turn are
still open (after an interrupt Codex never completes them, so they are closed when the turn
ends) and which server requests wait for an answer (to answer with their original JSON id,
shaped as the request's method wants).
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import PurePosixPath
from typing import Any, Literal

from threadloom.domain.failures import ModelFailure, RunFailureCode, model_failure, of_http_status
from threadloom.domain.usage import Figures
from threadloom.providers.codex_collab import Collab
from threadloom.providers.contract import (
    ItemCompleted,
    ItemKind,
    ItemStarted,
    OutputDelta,
    ProviderError,
    ProviderEvent,
    RequestOpened,
    TextDelta,
    TodoUpdated,
    TurnCompleted,
    TurnStarted,
    TurnStatus,
    UsageReported,
    Warning,
)

ItemStatus = Literal["completed", "failed", "declined", "interrupted"]

# Notifications translated into events (everything else — rate limits, diffs, thread status,
# thread/started — is noise for the engine).
SERVER_NOTIFICATIONS = (
    "thread/tokenUsage/updated",
    "turn/started",
    "turn/completed",
    "item/started",
    "item/completed",
    "item/agentMessage/delta",
    "item/plan/delta",
    "item/commandExecution/outputDelta",
    "item/fileChange/outputDelta",
    "turn/plan/updated",
    "serverRequest/resolved",
    "warning",
    "error",
)

# Server requests answered: the first four through the engine, the elicitation automatically.
REQUEST_KINDS = {
    "item/commandExecution/requestApproval": "command_approval",
    "item/fileChange/requestApproval": "file_change_approval",
    "item/permissions/requestApproval": "permission",
    "item/tool/requestUserInput": "user_input",
}
ELICITATION = "mcpServer/elicitation/request"
SERVER_REQUESTS = (*REQUEST_KINDS, ELICITATION)

ITEM_KINDS: dict[str, ItemKind] = {
    "agentMessage": "assistant_message",
    "commandExecution": "tool_call",
    "mcpToolCall": "tool_call",
    "dynamicToolCall": "tool_call",
    "webSearch": "tool_call",
    "imageView": "tool_call",
    "fileChange": "file_change",
    "plan": "plan",
    "reasoning": "reasoning",
    "collabAgentToolCall": "subagent",
}
# A collab call on an agent spawned earlier (wait, send_message, ...) is a tool call of its own; only a spawn is
# the subagent (multi_agent_v2 spawns show as `subAgentActivity` items instead, `codex_collab`).
COLLAB_SPAWN = "spawnAgent"
SKIPPED_ITEMS = ("userMessage", "hookPrompt")  # the user's own words: the engine already has them
ITEM_STATUSES: dict[str, ItemStatus] = {
    "completed": "completed",
    "failed": "failed",
    "declined": "declined",
    "interrupted": "interrupted",
}
TURN_STATUSES: dict[str, TurnStatus] = {"completed": "completed", "failed": "failed", "interrupted": "interrupted"}
DECISIONS = ("accept", "acceptForSession", "decline", "cancel")


# Codex's `codexErrorInfo` names → failure codes (domain.failures); the object forms carry an HTTP status.
ERROR_CODES = {
    "unauthorized": RunFailureCode.MODEL_AUTH_FAILED,
    "usageLimitExceeded": RunFailureCode.MODEL_RATE_LIMITED,
    "rateLimitExceeded": RunFailureCode.MODEL_RATE_LIMITED,
    "serverOverloaded": RunFailureCode.MODEL_OVERLOADED,
    "internalServerError": RunFailureCode.MODEL_SERVER_ERROR,
    "badRequest": RunFailureCode.MODEL_REQUEST_FAILED,
    "modelNotFound": RunFailureCode.MODEL_REQUEST_FAILED,
}
STATUS_ERRORS = ("httpConnectionFailed", "responseStreamConnectionFailed", "responseTooManyFailedAttempts")
# Codex 0.171 reports a reply stream that broke off as `other` with this message (and, with its stream retries
# on, as `responseStreamDisconnected` once they are used up).
STREAM_CUT_MESSAGE = "stream disconnected before completion"


def turn_failure(error: Any) -> ModelFailure | None:
    """A failed turn's `error` (Codex's TurnError) → the model failure it reports, if it is one.

    Observed with Codex 0.171 against the fake model: 401/503/529 → `httpConnectionFailed` with the status;
    429 → `responseTooManyFailedAttempts` with 429 (a 429 counts as retried even with retries off); 500 →
    `internalServerError` without a status; a cut stream → `other` and STREAM_CUT_MESSAGE."""
    if not isinstance(error, dict):
        return None
    info = error.get("codexErrorInfo")
    if isinstance(info, str):
        if info in ERROR_CODES:
            return ModelFailure(ERROR_CODES[info])
        if STREAM_CUT_MESSAGE in str(error.get("message") or ""):
            return ModelFailure(RunFailureCode.MODEL_STREAM_CUT)
        return None
    if not isinstance(info, dict) or len(info) != 1:
        return None
    ((kind, detail),) = info.items()
    status = detail.get("httpStatusCode") if isinstance(detail, dict) else None
    status = status if isinstance(status, int) else None
    if kind == "responseStreamDisconnected":
        return ModelFailure(RunFailureCode.MODEL_STREAM_CUT, status)
    if kind in STATUS_ERRORS and of_http_status(status) is not None:
        return model_failure(status)
    return None


def usage_event(thread: str, turn: str, params: dict[str, Any]) -> list[ProviderEvent]:
    """`thread/tokenUsage/updated` → the one model call it reports.

    Codex 0.171 sends it after each model response of a turn: `last` is that response's usage, `total` the
    thread's running sum (every turn, restored when the thread is resumed). Only `last` is recorded; `total`
    names the call (`<turn>/<total tokens>`), so the same report sent again (a resumed thread) is the same
    call, and is recorded once. Codex's `inputTokens` already holds `cachedInputTokens`, and `outputTokens`
    holds `reasoningOutputTokens`, as the ledger counts them. Codex sends no cost and no model (the run's is
    used). The scripted agent speaks the same notification, adding `callId` and, when given, `costUsd`."""
    usage = params.get("tokenUsage")
    if not isinstance(usage, dict) or not isinstance(usage.get("last"), dict):
        return []
    last: dict[str, Any] = usage["last"]
    total: dict[str, Any] = usage["total"] if isinstance(usage.get("total"), dict) else {}

    def count(part: dict[str, Any], key: str) -> int:
        value = part.get(key)
        return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else 0

    figures = Figures(
        input=count(last, "inputTokens"),
        cached_input=count(last, "cachedInputTokens"),
        cache_write=count(last, "cacheWriteInputTokens"),
        output=count(last, "outputTokens"),
        reasoning=count(last, "reasoningOutputTokens"),
    )
    call_ref = params.get("callId") or f"{turn}/{count(total, 'totalTokens')}"
    cost = params.get("costUsd")
    cost_usd = float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) and cost >= 0 else None
    return [UsageReported(thread, turn, str(call_ref), figures, None, cost_usd)]


def display_command(command: str) -> str:
    """`/bin/bash -lc 'echo hi'` → `echo hi`: the script Codex wraps in a login shell."""
    try:
        argv = shlex.split(command)
    except ValueError:
        return command
    if len(argv) == 3 and PurePosixPath(argv[0]).name in ("bash", "sh", "zsh") and argv[1] in ("-c", "-lc"):
        return argv[2]
    return command


def item_kind(item: dict[str, Any]) -> ItemKind:
    kind = ITEM_KINDS.get(str(item.get("type")), "other")
    if kind == "subagent" and item.get("tool") not in (None, COLLAB_SPAWN):
        return "tool_call"
    return kind


def item_title(item: dict[str, Any]) -> str | None:
    kind = item.get("type")
    if kind == "commandExecution":
        return display_command(str(item.get("command", "")))
    if kind == "fileChange":
        return ", ".join(str(c.get("path")) for c in item.get("changes") or [])
    if kind == "mcpToolCall":
        return f"{item.get('server')}.{item.get('tool')}"
    if kind in ("dynamicToolCall", "collabAgentToolCall"):
        return str(item.get("prompt") or item.get("tool"))
    if kind == "webSearch":
        return str(item.get("query"))
    return None


def item_text(item: dict[str, Any]) -> str | None:
    if item.get("type") == "reasoning":
        parts = [str(p) for p in item.get("summary") or []] or [str(p) for p in item.get("content") or []]
        return "\n".join(parts) or None
    text = item.get("text")
    return None if text is None else str(text)


def item_detail(item: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in item.items() if k not in ("id", "type", "text")}


class Translator:
    """Stateful Codex → normalized events; see the module docstring."""

    def __init__(self, redact: Callable[[str], str]) -> None:
        self.redact = redact
        self.open_items: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
        self.requests: dict[str, tuple[Any, str, str, dict[str, Any]]] = {}  # ref → (id, method, turn, params)
        self.collab = Collab()

    # ---- server → client -------------------------------------------------------------

    def translate(self, message: dict[str, Any]) -> list[ProviderEvent]:
        """One notification or server request → its events (often none); a collab agent's own events become
        its parent's (`codex_collab`)."""
        method = str(message.get("method"))
        params: dict[str, Any] = message.get("params") or {}
        thread = str(params.get("threadId", ""))
        item = params.get("item") or {}
        if method in ("item/started", "item/completed") and Collab.is_activity(item):
            self.collab.activity(thread, str(params.get("turnId", "")), item, method == "item/started")
            return []
        agent = self.collab.live(thread)
        if agent is None:
            if method == "turn/started":
                self.collab.started_too_late(thread, str((params.get("turn") or {}).get("id")))
            events = self._translate(message)
            if method == "turn/completed":  # the parent's agents end with its turn, before it
                ended = self.collab.parent_ended(thread, str((params.get("turn") or {}).get("id")))
                events = [*ended, *events] if ended else events
            return events
        if method == "turn/started":
            shown = self.collab.turn_started(agent, str((params.get("turn") or {}).get("id")))
            return shown if shown is not None else self._translate(message)
        turn = str(params.get("turnId") or (params.get("turn") or {}).get("id") or "")
        if turn != agent.turn:
            return self._translate(message)  # a later turn of the agent: not shown (its thread has no binding)
        events = self._translate(message)
        if method != "turn/completed":
            return [agent.adopt(e) for e in events]
        done = params.get("turn") or {}
        closed = [agent.adopt(e) for e in events if not isinstance(e, TurnCompleted)]
        end = next((e for e in events if isinstance(e, TurnCompleted)), None)
        return [*closed, *agent.completed(str(done.get("status")), end.error if end else None)]

    def _translate(self, message: dict[str, Any]) -> list[ProviderEvent]:
        method = str(message.get("method"))
        params: dict[str, Any] = message.get("params") or {}
        thread = str(params.get("threadId", ""))
        turn = str(params.get("turnId", ""))
        if "id" in message and method in REQUEST_KINDS:
            return [self._request(message["id"], method, thread, turn, params)]
        if method == "turn/started":
            started = params.get("turn") or {}
            return [TurnStarted(thread, str(started.get("id")), started.get("parentTurnId"))]
        if method == "turn/completed":
            return self._turn_completed(thread, params.get("turn") or {})
        if method == "item/started":
            item = params.get("item") or {}
            if item.get("type") in SKIPPED_ITEMS:
                return []
            self.open_items.setdefault((thread, turn), {})[str(item.get("id"))] = item
            kind = item_kind(item)
            return [ItemStarted(thread, turn, str(item.get("id")), kind, item_title(item), item_detail(item))]
        if method == "item/completed":
            item = params.get("item") or {}
            if item.get("type") in SKIPPED_ITEMS:
                return []
            self.open_items.get((thread, turn), {}).pop(str(item.get("id")), None)
            status = ITEM_STATUSES.get(str(item.get("status") or "completed"), "completed")
            kind = item_kind(item)
            return [ItemCompleted(thread, turn, str(item.get("id")), kind, status, item_text(item), item_detail(item))]
        if method in ("item/agentMessage/delta", "item/plan/delta"):
            return [TextDelta(thread, turn, str(params.get("itemId")), str(params.get("delta", "")))]
        if method in ("item/commandExecution/outputDelta", "item/fileChange/outputDelta"):
            return [OutputDelta(thread, turn, str(params.get("itemId")), str(params.get("delta", "")))]
        if method == "turn/plan/updated":
            steps = [{"step": str(s.get("step")), "status": str(s.get("status"))} for s in params.get("plan") or []]
            return [TodoUpdated(thread, turn, steps)]
        if method == "thread/tokenUsage/updated":
            return usage_event(thread, turn, params)
        if method == "serverRequest/resolved":
            self.requests.pop(str(params.get("requestId")), None)
            return []
        if method == "warning":
            return [Warning(thread or None, self.redact(str(params.get("message", "warning"))))]
        if method == "error":
            error = params.get("error") or {}
            text = str(error.get("message") or "error") + (" (retrying)" if params.get("willRetry") else "")
            return [Warning(thread or None, self.redact(text))]
        return []

    def _turn_completed(self, thread: str, turn: dict[str, Any]) -> list[ProviderEvent]:
        turn_id = str(turn.get("id"))
        status = TURN_STATUSES.get(str(turn.get("status")), "failed")
        events: list[ProviderEvent] = self._close_items(thread, turn_id, status)
        for ref in [r for r, (_, _, t, p) in self.requests.items() if t == turn_id and p.get("threadId") == thread]:
            del self.requests[ref]  # Codex resolved them with the turn; a late answer is refused
        failure = turn.get("error")
        message = failure.get("message") if isinstance(failure, dict) else failure
        error = self.redact(str(message)) if message else None
        model = turn_failure(failure) if status == "failed" else None
        events.append(TurnCompleted(thread, turn_id, status, error, turn.get("parentTurnId"), model))
        return events

    def _close_items(self, thread: str, turn: str, status: ItemStatus) -> list[ProviderEvent]:
        """ItemCompleted for the items Codex started but will never complete (after an interrupt)."""
        events: list[ProviderEvent] = []
        for item_id, item in (self.open_items.pop((thread, turn), None) or {}).items():
            kind = item_kind(item)
            events.append(ItemCompleted(thread, turn, item_id, kind, status, None, item_detail(item)))
        return events

    def close_all(self, status: ItemStatus) -> list[ProviderEvent]:
        """Every still-open item closed (the process is gone), a running collab agent's as its parent's."""
        events: list[ProviderEvent] = []
        for child, agent in self.collab.agents.items():
            if agent.ended:
                continue
            if agent.turn is not None:
                events += [agent.adopt(e) for e in self._close_items(child, agent.turn, status)]
            events += agent.completed("interrupted")
        for thread, turn in list(self.open_items):
            events += self._close_items(thread, turn, status)
        self.requests.clear()
        return events

    def _request(self, request_id: Any, method: str, thread: str, turn: str, params: dict[str, Any]) -> ProviderEvent:
        ref = str(request_id)
        self.requests[ref] = (request_id, method, turn, params)
        payload = dict(params)
        if "command" in params and params["command"] is not None:
            payload["command"] = display_command(str(params["command"]))
            payload["rawCommand"] = params["command"]
        if method == "item/fileChange/requestApproval":
            item = self.open_items.get((thread, turn), {}).get(str(params.get("itemId"))) or {}
            payload["changes"] = item.get("changes") or []
            payload["paths"] = [str(c.get("path")) for c in payload["changes"]]
        if method == "item/tool/requestUserInput":
            payload["questions"] = [
                {**q, "options": [dict(o) for o in q.get("options") or []]} for q in params.get("questions") or []
            ]
        return RequestOpened(thread, turn, ref, REQUEST_KINDS[method], payload)

    def auto_answer(self, message: dict[str, Any]) -> dict[str, Any] | None:
        """The answer to a server request nobody is asked about (MCP elicitations: declined)."""
        if "id" in message and message.get("method") == ELICITATION:
            return {"action": "decline", "content": None}
        return None

    # ---- client → server -------------------------------------------------------------

    def answer(self, request_ref: str, response: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        """(original JSON id, result shaped for the request's method) for the engine's answer."""
        entry = self.requests.pop(request_ref, None)
        if entry is None:
            raise ProviderError("unknown_request", f"no pending codex request {request_ref}")
        request_id, method, _, params = entry
        if method == "item/tool/requestUserInput":
            return request_id, {"answers": dict(response.get("answers") or {})}
        decision = str(response.get("decision", "decline"))
        if decision not in DECISIONS:
            self.requests[request_ref] = entry
            raise ProviderError("bad_response", f"unknown decision {decision!r}")
        if method == "item/permissions/requestApproval":
            if "permissions" in response:
                return request_id, {"permissions": response["permissions"], "scope": response.get("scope", "turn")}
            if decision in ("accept", "acceptForSession"):
                scope = "session" if decision == "acceptForSession" else "turn"
                return request_id, {"permissions": dict(params.get("permissions") or {}), "scope": scope}
            return request_id, {"permissions": {}}
        return request_id, {"decision": decision}

"""The ACP face's view of a turn: what the shared turn code sends and asks, Codex-shaped, becomes ACP.

The directives run exactly as in the Codex face (agent/turns.py); only their wire form changes here:
items become `session/update`s (`agent_message_chunk`, `tool_call`, `tool_call_update`, `plan`, …), approvals
become `session/request_permission`, questions become a form `elicitation/create`. A subagent's events go to the
parent's session with `_meta.threadloom.parentToolCallId`, the subagent's tool call.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

from threadloom.agent.acp_wire import Rpc
from threadloom.agent.wire import Message, PeerError

log = logging.getLogger("threadloom.agent")

# Permission options: ids the client picks, and the Codex decision each stands for.
PERMISSION_OPTIONS = [
    {"optionId": "allow", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "allow-always", "name": "Allow for this session", "kind": "allow_always"},
    {"optionId": "reject", "name": "Reject", "kind": "reject_once"},
]
DECISIONS = {"allow": "accept", "allow-always": "acceptForSession", "reject": "decline"}
PLAN_STATUS = {"pending": "pending", "inProgress": "in_progress", "completed": "completed"}
ANSWER_FIELD = "answer"  # the one field of an `@ask` form


@dataclasses.dataclass(frozen=True, slots=True)
class Ending:
    """How a turn ended, from its `turn/completed`."""

    status: str
    error: str | None
    stop_reason: str | None


@dataclasses.dataclass(slots=True)
class Faults:
    """Deliberate protocol traps a client must survive (docs/scripted-agent.md, "The ACP face")."""

    orphan_updates: bool = False  # never send `tool_call`, only its `tool_call_update`s
    elicitation: bool = True  # ask `@ask` questions with a form elicitation (if the client can show one)


class Translator:
    """The turns' `Io.writer` and `Io.peer` in the ACP face; one per process, keyed by session (thread) id."""

    def __init__(
        self, rpc: Rpc, faults: Faults, can_elicit: Callable[[], bool], on_file: Callable[[str, str, str], None]
    ) -> None:
        self.rpc = rpc
        self.faults = faults
        self._can_elicit = can_elicit
        self._on_file = on_file  # (session, turn, path) before a `@write` changes the file
        self._announced: set[str] = set()  # tool call ids the client has had a `tool_call` (or would have) for
        self._outputs: dict[str, list[str]] = {}
        self._parents: dict[str, str] = {}  # a subagent's turn id -> its tool call id
        self._endings: dict[str, asyncio.Future[Ending]] = {}

    def expect_end(self, session_id: str) -> asyncio.Future[Ending]:
        """The future the session's next `turn/completed` (of its own turn, not a subagent's) resolves."""
        future: asyncio.Future[Ending] = asyncio.get_running_loop().create_future()
        self._endings[session_id] = future
        return future

    async def update(self, session_id: str, update: Message) -> None:
        await self.rpc.notify("session/update", {"sessionId": session_id, "update": update})

    # --- Sink: what turns send ---

    async def send(self, message: Message) -> None:
        method = message.get("method")
        params = message.get("params") or {}
        session = params.get("threadId")
        if not isinstance(session, str):
            return
        turn = params.get("turnId")
        meta = self._meta(turn)
        match method:
            case "item/started":
                await self._started(session, turn, params["item"], meta)
            case "item/completed":
                await self._completed(session, params["item"], meta)
            case "item/agentMessage/delta":
                await self._chunk(session, "agent_message_chunk", params, meta)
            case "item/plan/delta":
                await self._chunk(session, "agent_thought_chunk", params, meta)
            case "item/commandExecution/outputDelta" | "item/fileChange/outputDelta":
                item_id = str(params["itemId"])
                self._outputs.setdefault(item_id, []).append(str(params["delta"]))
                await self._tool_update(session, item_id, meta, content=self._content(item_id))
            case "turn/plan/updated":
                entries = [
                    {"content": s["step"], "priority": "medium", "status": PLAN_STATUS.get(s["status"], "pending")}
                    for s in params["plan"]
                ]
                await self.update(session, {"sessionUpdate": "plan", "entries": entries, **meta})
            case "turn/completed":
                self._ended(session, params["turn"])
            case _:  # turn/started, thread/started: ACP has no such update
                pass

    def _meta(self, turn: Any) -> Message:
        parent = self._parents.get(turn) if isinstance(turn, str) else None
        return {} if parent is None else {"_meta": {"threadloom": {"parentToolCallId": parent}}}

    async def _chunk(self, session: str, kind: str, params: Message, meta: Message) -> None:
        content = {"type": "text", "text": params["delta"]}
        await self.update(session, {"sessionUpdate": kind, "content": content, "messageId": params["itemId"], **meta})

    async def _started(self, session: str, turn: Any, item: Message, meta: Message) -> None:
        kind = item.get("type")
        item_id = str(item["id"])
        if kind == "commandExecution":
            raw = {"command": item["command"], "cwd": item["cwd"]}
            await self._tool_call(session, item_id, meta, title=item["command"], kind="execute", rawInput=raw)
        elif kind == "fileChange":
            change = item["changes"][0]
            if isinstance(turn, str):
                self._on_file(session, turn, change["path"])
            raw = {"path": change["path"], "kind": change["kind"]}
            title = f"Write {change['path']}"
            await self._tool_call(session, item_id, meta, title=title, kind="edit", rawInput=raw)
        elif kind == "collabAgentToolCall":
            self._parents[str(item["childTurnId"])] = item_id
            receivers = item.get("receiverThreadIds") or [None]
            sub = {"threadloom": {"subagentSessionId": receivers[0], "childTurnId": item["childTurnId"]}}
            raw = {"prompt": item["prompt"]}
            title = f"Subagent: {item['prompt']}"
            await self._tool_call(session, item_id, {"_meta": sub}, title=title, kind="other", rawInput=raw)

    async def _tool_call(self, session: str, item_id: str, meta: Message, **fields: Any) -> None:
        """A `tool_call` the first time the client hears of the item, a `tool_call_update` after (approvals
        announce the call before it starts)."""
        if item_id in self._announced:
            await self._tool_update(session, item_id, meta, status="in_progress")
            return
        self._announced.add(item_id)
        if self.faults.orphan_updates:
            return
        call = {"sessionUpdate": "tool_call", "toolCallId": item_id, "status": "in_progress", **fields, **meta}
        await self.update(session, call)

    async def _tool_update(self, session: str, item_id: str, meta: Message, **fields: Any) -> None:
        await self.update(session, {"sessionUpdate": "tool_call_update", "toolCallId": item_id, **fields, **meta})

    def _content(self, item_id: str) -> list[Message]:
        text = "".join(self._outputs.get(item_id, []))
        return [{"type": "content", "content": {"type": "text", "text": text}}] if text else []

    async def _completed(self, session: str, item: Message, meta: Message) -> None:
        kind = item.get("type")
        if kind not in ("commandExecution", "fileChange", "collabAgentToolCall"):
            return
        item_id = str(item["id"])
        status = "completed" if item.get("status") == "completed" else "failed"
        raw: Message = {"status": item.get("status")}
        if kind == "commandExecution":
            raw |= {"exitCode": item.get("exitCode"), "output": item.get("aggregatedOutput")}
        if kind == "collabAgentToolCall":
            meta = {}  # the subagent's call belongs to the parent turn
        if item_id not in self._announced:  # a declined command: the client heard of it with the permission request
            await self._tool_call(session, item_id, meta, title=str(item.get("command")), kind="execute")
        content = self._content(item_id)
        self._outputs.pop(item_id, None)
        extra = {"content": content} if content else {}
        await self._tool_update(session, item_id, meta, status=status, rawOutput=raw, **extra)

    def _ended(self, session: str, turn: Message) -> None:
        if turn.get("parentTurnId") is not None:  # a subagent's turn: its tool call says how it went
            return
        future = self._endings.pop(session, None)
        if future is not None and not future.done():
            error = turn.get("error")
            message = error.get("message") if isinstance(error, dict) else None
            future.set_result(Ending(str(turn.get("status")), message, turn.get("stopReason")))

    # --- Asker: what turns ask ---

    async def request(self, method: str, params: Message) -> Message:
        session = str(params["threadId"])
        item_id = str(params.get("itemId"))
        meta = self._meta(params.get("turnId"))
        if method == "item/commandExecution/requestApproval":
            raw = {"command": params["command"], "cwd": params["cwd"]}
            call = {"toolCallId": item_id, "title": params["command"], "kind": "execute", "status": "pending"}
            if item_id not in self._announced:
                self._announced.add(item_id)
                if not self.faults.orphan_updates:
                    await self.update(session, {"sessionUpdate": "tool_call", **call, "rawInput": raw, **meta})
            return await self._permission(session, {**call, "rawInput": raw})
        if method == "item/fileChange/requestApproval":
            return await self._permission(session, {"toolCallId": item_id, "status": "pending"})
        if method == "item/tool/requestUserInput":
            return await self._elicit(session, params["questions"][0])
        raise PeerError(f"the ACP face cannot ask {method}")

    async def _permission(self, session: str, tool_call: Message) -> Message:
        params = {"sessionId": session, "toolCall": tool_call, "options": PERMISSION_OPTIONS}
        answer = await self.rpc.request("session/request_permission", params)
        outcome = answer.get("outcome")
        if not isinstance(outcome, dict) or outcome.get("outcome") != "selected":
            return {"decision": "cancel"}
        return {"decision": DECISIONS.get(str(outcome.get("optionId")), "decline")}

    async def _elicit(self, session: str, question: Message) -> Message:
        if not (self.faults.elicitation and self._can_elicit()):
            raise PeerError("the client cannot show a form")
        field: Message = {"type": "string", "title": question["question"]}
        options = [option["label"] for option in question.get("options", [])]
        if options:
            field["enum"] = options
        schema = {"type": "object", "properties": {ANSWER_FIELD: field}, "required": [ANSWER_FIELD]}
        params = {"sessionId": session, "mode": "form", "message": question["question"], "requestedSchema": schema}
        answer = await self.rpc.request("elicitation/create", params)
        content = answer.get("content")
        value = content.get(ANSWER_FIELD) if answer.get("action") == "accept" and isinstance(content, dict) else None
        labels = [str(value)] if value is not None else []
        return {"answers": {question["id"]: {"answers": labels}}}

"""The ACP face: `python -m threadloom.agent --acp` speaks Agent Client Protocol v1 (JSON-RPC 2.0 lines).

A session is a thread of the Codex face's core (agent/server.py), kept in the same state folder, so
`session/load` and `session/resume` work after a crash and respawn, and every directive means the same thing.
Each client request runs as a task of its own: `session/cancel`, `_session/steering` and permission answers are
read while a `session/prompt` streams. The contract is docs/scripted-agent.md, "The ACP face".
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadloom.agent import VERSION, workspace
from threadloom.agent.acp_files import FileHistory
from threadloom.agent.acp_options import CONTEXT_WINDOW, AcpOptions
from threadloom.agent.acp_updates import Ending, Faults, Translator
from threadloom.agent.acp_wire import REQUEST_CANCELLED, RESOURCE_NOT_FOUND, Rpc
from threadloom.agent.directives import Usage
from threadloom.agent.server import RUNTIME_MODES, SERVER_NAME, Options, Server, Session
from threadloom.agent.state import IN_PROGRESS, StateError, ThreadRecord
from threadloom.agent.turns import Hooks, Io, Turn, TurnFailed
from threadloom.agent.wire import (
    INTERNAL_ERROR,
    INVALID_PARAMS,
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    NO_THREAD,
    PARSE_ERROR,
    LineReader,
    LineWriter,
    Message,
    RpcError,
)

log = logging.getLogger("threadloom.agent")

PROTOCOL_VERSION = 1
PAGE_SIZE = 50  # sessions per `session/list` page
STOP_REASONS = {"completed": "end_turn", "interrupted": "cancelled"}
Handler = Callable[[Message], Awaitable[Message]]


class Cancelled(Exception):
    """A prompt ended by `$/cancel_request`: it is answered with error -32800."""


class AcpServer:
    def __init__(self, options: Options, acp: AcpOptions, writer: LineWriter) -> None:
        self.acp = acp
        self.rpc = Rpc(writer)
        self.client_capabilities: Message = {}
        self.files = FileHistory(options.state_dir)
        faults = Faults(orphan_updates="orphan-updates" in acp.faults, elicitation=acp.serves("elicitation"))
        self.updates = Translator(self.rpc, faults, self._can_elicit, self._before_write)
        io = Io(self.updates, self.updates, lambda: f"item-{uuid.uuid4()}")
        self.core = Server(options, self.updates, io)
        self.core.hooks = self._hooks
        self.usage: dict[str, tuple[int, int, float | None]] = {}  # session -> tokens in, out, cost (this process)
        self.prompts: dict[Any, asyncio.Task[None]] = {}  # request id -> its prompt's task
        self.cancelled: set[Any] = set()  # prompt request ids ended by `$/cancel_request`
        self.tasks: set[asyncio.Task[None]] = set()
        self.handlers: dict[str, Handler] = {
            "initialize": self._initialize,
            "session/new": self._new,
            "session/load": self._load,
            "session/resume": self._resume,
            "session/list": self._list,
            "session/close": self._close,
            "session/fork": self._fork,
            "session/set_config_option": self._set_config_option,
            "session/prompt": self._prompt,
            "_session/steering": self._steer,
            "_session/rewind": self._rewind,
            "_session/files/revert": self._files_revert,
        }

    # --- the loop ---

    async def serve(self, reader: LineReader) -> None:
        while True:
            try:
                line = await reader.readline()
            except ValueError as exc:
                await self.rpc.fail(None, PARSE_ERROR, f"unreadable line: {exc}")
                continue
            if line is None:
                break
            await self._handle_line(line)
        for session in self.core.sessions.values():
            if session.active is not None:
                session.active.interrupt()
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=5.0)

    async def _handle_line(self, line: bytes) -> None:
        if not line.strip():
            return
        try:
            message = json.loads(line)
        except ValueError as exc:
            await self.rpc.fail(None, PARSE_ERROR, f"invalid JSON: {exc}")
            return
        if not isinstance(message, dict):
            await self.rpc.fail(None, INVALID_REQUEST, "a message must be a JSON object")
            return
        method = message.get("method")
        if method is None:
            self.rpc.resolve(message)  # an answer to a permission request or an elicitation
        elif "id" not in message:
            self._notification(str(method), message.get("params"))
        else:
            task = asyncio.create_task(self._request(message), name=f"acp-{method}-{message['id']}")
            self.tasks.add(task)
            task.add_done_callback(self.tasks.discard)

    def _notification(self, method: str, params: Any) -> None:
        params = params if isinstance(params, dict) else {}
        if method == "session/cancel":
            session = self.core.sessions.get(str(params.get("sessionId")))
            if session is not None and session.active is not None:
                session.active.interrupt()
        elif method == "$/cancel_request" and self.acp.serves("cancel-request"):
            request_id = params.get("requestId")
            if request_id in self.prompts:
                self.cancelled.add(request_id)
                self.prompts[request_id].cancel()
        else:
            log.info("client notification %r ignored", method)

    async def _request(self, message: Message) -> None:
        request_id, method = message["id"], message["method"]
        params = message.get("params")
        handler = self.handlers.get(method) if isinstance(method, str) else None
        try:
            if handler is None or not self.acp.served_method(method):
                raise RpcError(METHOD_NOT_FOUND, f"Method not found: {method}")
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise RpcError(INVALID_PARAMS, "params must be an object")
            result = await (self._prompt_task(request_id, params) if method == "session/prompt" else handler(params))
        except RpcError as exc:
            await self.rpc.fail(request_id, RESOURCE_NOT_FOUND if exc.code == NO_THREAD else exc.code, exc.message)
            return
        except Cancelled:
            await self.rpc.fail(request_id, REQUEST_CANCELLED, "request cancelled")
            return
        except Exception as exc:
            log.exception("%s failed", method)
            await self.rpc.fail(request_id, INTERNAL_ERROR, f"{type(exc).__name__}: {exc}")
            return
        await self.rpc.respond(request_id, result)
        if method == "session/prompt" and "trailing-usage" in self.acp.faults:
            await self._usage_update(str(params["sessionId"]))

    # --- initialize and sessions ---

    async def _initialize(self, params: Message) -> Message:
        capabilities = params.get("clientCapabilities")
        self.client_capabilities = capabilities if isinstance(capabilities, dict) else {}
        session_caps: Message = {name: {} for name in ("list", "resume", "close", "fork") if self.acp.advertised(name)}
        meta: Message = {}
        if self.acp.advertised("steering"):
            meta["steering"] = {"supported": True}
        if self.acp.advertised("rewind"):
            meta["sessionRewind"] = {"version": 1, "method": "_session/rewind"}
        if self.acp.advertised("files-revert"):
            meta["sessionRewindFiles"] = {"version": 1, "method": "_session/files/revert"}
        agent = {
            "loadSession": self.acp.advertised("load"),
            "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
            "mcpCapabilities": {"http": False, "sse": False},
            "sessionCapabilities": session_caps,
        }
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": agent,
            "agentInfo": {"name": SERVER_NAME, "title": "Threadloom scripted agent", "version": VERSION},
            "authMethods": [],
            "_meta": meta,
        }

    async def _new(self, params: Message) -> Message:
        answer = self.core._thread_start({"cwd": _cwd(params)})
        session_id = answer.result["thread"]["id"]
        return {"sessionId": session_id, **self._config(self.core.sessions[session_id].record)}

    async def _resume(self, params: Message) -> Message:
        session = self._reopen(params)
        return self._config(session.record)

    async def _load(self, params: Message) -> Message:
        """Replays the conversation as `session/update`s (each turn: its message, then its reply), then answers."""
        session = self._reopen(params)
        for turn in session.record.turns:
            user = {"type": "text", "text": turn.input}
            await self.updates.update(
                session.record.id, {"sessionUpdate": "user_message_chunk", "content": user, "messageId": turn.id}
            )
            if turn.output:
                reply = {"type": "text", "text": turn.output}
                update = {"sessionUpdate": "agent_message_chunk", "content": reply, "messageId": f"{turn.id}-reply"}
                await self.updates.update(session.record.id, update)
        return self._config(session.record)

    def _reopen(self, params: Message) -> Session:
        _cwd(params)
        session_id = _str(params, "sessionId")
        return self.core._open(session_id)

    async def _list(self, params: Message) -> Message:
        cwd = params.get("cwd")
        cursor = params.get("cursor")
        start = int(cursor) if isinstance(cursor, str) and cursor.isdigit() else 0
        files = sorted(self.core.store.threads_dir.glob("*.json"), key=lambda p: (-p.stat().st_mtime, p.name))
        infos: list[Message] = []
        for path in files:
            try:
                record = self.core.store.load(path.stem)
            except StateError:
                continue
            if record is None or (isinstance(cwd, str) and record.cwd != cwd):
                continue
            infos.append({"sessionId": record.id, "cwd": record.cwd, "updatedAt": _iso(path.stat().st_mtime)})
            if record.turns:
                infos[-1]["title"] = _title(record.turns[0].input)
        page = infos[start : start + PAGE_SIZE]
        result: Message = {"sessions": page}
        if start + PAGE_SIZE < len(infos):
            result["nextCursor"] = str(start + PAGE_SIZE)
        return result

    async def _close(self, params: Message) -> Message:
        session = self.core.sessions.pop(_str(params, "sessionId"), None)
        if session is not None and session.active is not None:
            session.active.interrupt()
        return {}

    async def _fork(self, params: Message) -> Message:
        """A new session holding copies of the source's finished turns (a running turn is left out)."""
        source = self.core._current(_str(params, "sessionId"))
        turns = [turn.copy() for turn in source.turns if turn.status != IN_PROGRESS]
        cwd = self.core._cwd_param({"cwd": _cwd(params)}, source.cwd)
        record = ThreadRecord(str(uuid.uuid4()), cwd, turns, source.runtime_mode, source.model)
        self.core.store.save(record)
        self.core.sessions[record.id] = Session(record)
        return {"sessionId": record.id, **self._config(record)}

    # --- config options ---

    def _config(self, record: ThreadRecord) -> Message:
        if not self.acp.advertised("config"):
            return {}
        modes = [{"value": mode, "name": mode.replace("_", " ")} for mode in RUNTIME_MODES]
        models = [{"value": model, "name": model} for model in self.acp.models]
        options = [
            {"id": "mode", "name": "Mode", "category": "mode", "type": "select"}
            | {"currentValue": record.runtime_mode, "options": modes},
            {"id": "model", "name": "Model", "category": "model", "type": "select"}
            | {"currentValue": record.model or self.acp.models[0], "options": models},
        ]
        return {"configOptions": options}

    def _set(self, record: ThreadRecord, option: str, value: str) -> None:
        if option == "mode" and value in RUNTIME_MODES:
            record.runtime_mode = value
        elif option == "model" and value in self.acp.models:
            record.model = value
        else:
            raise RpcError(INVALID_PARAMS, f"no config option {option!r} with value {value!r}")
        self.core.store.save(record)

    async def _set_config_option(self, params: Message) -> Message:
        session = self.core._session({"threadId": _str(params, "sessionId")})
        self._set(session.record, _str(params, "configId"), _str(params, "value"))
        return self._config(session.record)

    def _hooks(self, record: ThreadRecord) -> Hooks:
        async def usage(directive: Usage) -> None:
            before = self.usage.get(record.id, (0, 0, None))
            cost = before[2] if directive.cost is None else (before[2] or 0.0) + directive.cost
            self.usage[record.id] = (before[0] + directive.input_tokens, before[1] + directive.output_tokens, cost)
            if "trailing-usage" not in self.acp.faults:
                await self._usage_update(record.id)

        async def config(option: str, value: str) -> None:
            try:
                self._set(record, option, value)
            except RpcError as exc:
                raise TurnFailed(f"@config: {exc.message}") from None
            if self.acp.advertised("config"):
                update = {"sessionUpdate": "config_option_update", **self._config(record)}
                await self.updates.update(record.id, update)

        return Hooks(usage=usage, config=config)

    async def _usage_update(self, session_id: str) -> None:
        tokens_in, tokens_out, cost = self.usage.get(session_id, (0, 0, None))
        update: Message = {"sessionUpdate": "usage_update", "used": tokens_in + tokens_out, "size": CONTEXT_WINDOW}
        if cost is not None:
            update["cost"] = {"amount": cost, "currency": "USD"}
        await self.updates.update(session_id, update)

    # --- prompts ---

    async def _prompt_task(self, request_id: Any, params: Message) -> Message:
        """The prompt runs as its own task so `$/cancel_request` can cancel it by request id."""
        task = asyncio.ensure_future(self._prompt(params))
        self.prompts[request_id] = task  # type: ignore[assignment]
        try:
            return await task
        except asyncio.CancelledError:
            if request_id in self.cancelled:
                raise Cancelled() from None
            raise
        finally:
            self.prompts.pop(request_id, None)
            self.cancelled.discard(request_id)

    async def _prompt(self, params: Message) -> Message:
        session_id = _str(params, "sessionId")
        session = self.core._session({"threadId": session_id})
        items = _prompt_input(params.get("prompt"))
        answer = self.core._turn_start({"threadId": session_id, "input": items})
        ending = self.updates.expect_end(session_id)
        turn = session.active
        assert isinstance(turn, Turn)
        if "huge-line" in self.acp.faults:
            text = {"type": "text", "text": "x" * self.acp.huge_line_bytes}
            await self.updates.update(session_id, {"sessionUpdate": "agent_thought_chunk", "content": text})
        if answer.then is not None:
            await answer.then()
        try:
            end: Ending = await asyncio.shield(ending)
        except asyncio.CancelledError:  # `$/cancel_request`: the turn ends first, then the request
            turn.interrupt()
            await ending
            raise
        record = session.record
        info = {"sessionUpdate": "session_info_update", "updatedAt": _iso(None)}
        await self.updates.update(session_id, info | {"title": _title(record.turns[0].input)})
        if end.status == "failed" and end.stop_reason is None:
            raise RpcError(INTERNAL_ERROR, end.error or "turn failed")
        result: Message = {"stopReason": end.stop_reason or STOP_REASONS.get(end.status, "end_turn")}
        result["_meta"] = {"threadloom": {"turnId": turn.id}}
        tokens = self.usage.get(session_id)
        if tokens is not None:
            total = tokens[0] + tokens[1]
            result["usage"] = {"inputTokens": tokens[0], "outputTokens": tokens[1], "totalTokens": total}
        return result

    async def _steer(self, params: Message) -> Message:
        session = self.core._session({"threadId": _str(params, "sessionId")})
        turn = session.active
        if not isinstance(turn, Turn) or turn.closed:
            return {"outcome": "promptRequired", "reason": "noRunningTurn"}
        items = _prompt_input(params.get("prompt"))
        self.core._turn_steer({"threadId": session.record.id, "input": items, "expectedTurnId": turn.id})
        return {"outcome": "injected"}

    async def _rewind(self, params: Message) -> Message:
        """Drops the last `numTurns` turns, or `beforeMessage.messageId` (a turn id) and every later one."""
        session_id = _str(params, "sessionId")
        before = params.get("beforeMessage")
        if isinstance(before, dict):
            answer = self.core._thread_revert({"threadId": session_id, "beforeTurnId": _str(before, "messageId")})
        else:
            answer = self.core._thread_rollback({"threadId": session_id, "numTurns": params.get("numTurns")})
        return {"rewound": True, "sessionId": session_id, "turns": answer.result["thread"]["turns"]}

    async def _files_revert(self, params: Message) -> Message:
        """Puts back the files the last `numTurns` turns wrote (`@write`), latest first; the turns stay."""
        session_id = _str(params, "sessionId")
        record = self.core._current(session_id)
        count = params.get("numTurns")
        if isinstance(count, bool) or not isinstance(count, int) or not 1 <= count <= len(record.turns):
            raise RpcError(INVALID_PARAMS, f"numTurns must be a whole number from 1 to {len(record.turns)}")
        session = self.core.sessions.get(session_id)
        if session is not None and session.active is not None:
            raise RpcError(INVALID_REQUEST, "cannot revert files while a turn is running")
        turns = [turn.id for turn in record.turns[-count:]]
        return {"reverted": self.files.revert(session_id, turns, record.cwd)}

    # --- helpers ---

    def _can_elicit(self) -> bool:
        elicitation = self.client_capabilities.get("elicitation")
        return isinstance(elicitation, dict) and isinstance(elicitation.get("form"), dict)

    def _before_write(self, session_id: str, turn_id: str, path: str) -> None:
        """Keeps what a `@write` is about to replace, under the session's running turn (a subagent's write
        counts for the parent's turn); a path outside the cwd is refused by the write itself, and kept by nobody."""
        session = self.core.sessions.get(session_id)
        if session is None:
            return
        try:
            target = workspace.resolve(session.record.cwd, path)
        except workspace.EscapeError:
            return
        active = session.active
        self.files.record(session_id, active.id if active is not None else turn_id, target)


def _str(params: Message, name: str) -> str:
    value = params.get(name)
    if not isinstance(value, str):
        raise RpcError(INVALID_PARAMS, f"{name} must be a string")
    return value


def _cwd(params: Message) -> str:
    cwd = _str(params, "cwd")
    if not os.path.isabs(cwd):
        raise RpcError(INVALID_PARAMS, "cwd must be an absolute path")
    return cwd


def _prompt_input(blocks: Any) -> list[Message]:
    """ACP content blocks as the core's input items: text is the message (its directives run); an embedded
    text resource is context, remembered but never read for directives; anything else is left out."""
    if not isinstance(blocks, list) or not blocks:
        raise RpcError(INVALID_PARAMS, "prompt must be a non-empty list of content blocks")
    items: list[Message] = []
    for block in blocks:
        if not isinstance(block, dict):
            raise RpcError(INVALID_PARAMS, "content blocks must be objects")
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            items.append({"type": "text", "text": block["text"]})
        elif block.get("type") == "resource" and isinstance(block.get("resource"), dict):
            text = block["resource"].get("text")
            if isinstance(text, str):
                items.append({"type": "context", "text": text})
    return items


def _title(text: str) -> str:
    first = text.strip().splitlines()[0] if text.strip() else ""
    return first[:80]


def _iso(timestamp: float | None) -> str:
    moment = (
        datetime.datetime.now(datetime.UTC)
        if timestamp is None
        else datetime.datetime.fromtimestamp(timestamp, datetime.UTC)
    )
    return moment.isoformat().replace("+00:00", "Z")


async def serve(options: Options, acp: AcpOptions) -> None:
    reader = await LineReader.stdin()
    writer = await LineWriter.stdout()
    await AcpServer(options, acp, writer).serve(reader)
    await writer.flush(within=5.0)

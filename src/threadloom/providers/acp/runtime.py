"""One live ACP agent process serving the threads (ACP sessions) of one project.

A native thread is an opaque alias, never the ACP session id: session ids let whoever holds one
`session/load` the conversation (a bearer token), so they stay in the driver's own record
(`sessions.SessionRecords`, in the project's agent state folder) and out of the database, the API, events
and logs (every text this runtime emits or raises has the live session ids redacted). A native turn is one
`session/prompt`, named by the runtime.

How each lifecycle maps (docs/providers.md, "ACP"): a turn is `session/prompt` (its answer ends it);
steering is `_session/steering` while the profile says it works; interrupt is `session/cancel` plus
`$/cancel_request` for the prompt, pending permission requests answered `cancelled`, and the turn ended
as interrupted by the agent's answer or, after `cancel_drain_s`, by the driver; fork is `session/fork`
(and `_session/rewind` on the copy to fork at a turn); rollback is `_session/rewind`; resume is
`session/resume`, else `session/load` (its replay is not re-ingested), else ProviderError (the engine then
starts a replacement thread with a handoff). A method answering -32601 is dropped from the profile
(`on_learned`) and the engine falls back the next time.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

from threadloom.providers.acp import profile as methods
from threadloom.providers.acp.profile import AcpProfile
from threadloom.providers.acp.requests import (
    ELICITATION,
    PERMISSION,
    Pending,
    elicitation_answer,
    elicitation_questions,
    permission_answer,
    permission_payload,
)
from threadloom.providers.acp.rpc import METHOD_NOT_FOUND, AcpProcess, Oversized, PromptDone, RpcError
from threadloom.providers.acp.sessions import SessionRecord, SessionRecords
from threadloom.providers.acp.updates import AcpUsage, SessionUpdates, usage_of_prompt, usage_of_update
from threadloom.providers.acp.usage import CostMeter, prompt_report
from threadloom.providers.agent_cli import StreamRedactor, redact_event
from threadloom.providers.contract import (
    Capabilities,
    ProviderError,
    ProviderEvent,
    RequestOpened,
    RuntimeExited,
    ThreadSettings,
    Warning,
)

log = logging.getLogger("threadloom.providers.acp")
HIDDEN_SESSION = "<acp session>"
STOPPED_SHORT = frozenset({"refusal", "max_tokens", "max_turn_requests"})  # stop reasons that fail the turn
REQUEST_CANCELLED = -32800  # the error a request cancelled by `$/cancel_request` answers with
CANCEL_REQUEST_AFTER_S = 1.0  # how long `session/cancel` alone may take before the request itself is cancelled
# A runtime mode → the values of an agent's `mode` config option that stand for it, best first: its own name,
# then those of claude-agent-acp (`acceptEdits`, `default`, `plan`, `bypassPermissions`), codex-acp 2.x
# (`workspace-write`, `read-only`, `agent-full-access`; the Rust 0.x: `auto`, `full-access`) and Qwen Code
# (`auto-edit`, `default`, `plan`, `yolo`). codex-acp has no mode that asks before every command: an
# approval_required thread keeps its default mode (`agent`: asks for what it finds unsafe).
MODE_VALUES = {
    "workspace_write": ["workspace_write", "workspace-write", "acceptEdits", "auto-edit", "auto", "default"],
    "approval_required": ["approval_required", "default", "read-only-ask", "ask"],
    "read_only": ["read_only", "plan", "read-only"],
    "full_access": ["full_access", "bypassPermissions", "agent-full-access", "full-access", "yolo"],
}


def mode_value(runtime_mode: str, offered: set[str]) -> str | None:
    """The value of an agent's `mode` option standing for `runtime_mode` among those it `offered` (any of
    ours when it lists none), or None: the agent keeps its own."""
    return next((v for v in MODE_VALUES.get(runtime_mode, []) if v in offered or not offered), None)


class Scrubber:
    """Redacts the instance's secrets and every live ACP session id (bearer tokens for `session/load`)."""

    def __init__(self, secrets: tuple[str, ...]) -> None:
        self.stream = StreamRedactor(secrets)
        self.session_ids: set[str] = set()

    def __call__(self, text: str) -> str:
        text = self.stream.text(text)
        for sid in self.session_ids:
            if sid and sid in text:
                text = text.replace(sid, HIDDEN_SESSION)
        return text

    def events(self, event: ProviderEvent) -> list[ProviderEvent]:
        return [redact_event(e, self) for e in self.stream.events(event)]


@dataclasses.dataclass(slots=True)
class _Live:
    """A loaded session: its record, its translation state and its running prompt."""

    record: SessionRecord
    updates: SessionUpdates
    settings: ThreadSettings
    prompt_id: int | None = None
    turn: str | None = None
    drain: asyncio.Task[None] | None = None
    cancelling: bool = False
    abandoned: dict[int, asyncio.Future[None]] = dataclasses.field(default_factory=dict)  # ended by the driver


@dataclasses.dataclass(frozen=True, slots=True)
class _Local:
    """Events the runtime makes itself, queued in order with the agent's messages."""

    events: tuple[ProviderEvent, ...]


UsageSink = Callable[[str, str | None, AcpUsage], None]


class AcpRuntime:
    def __init__(
        self,
        process: AcpProcess,
        scrubber: Scrubber,
        profile: AcpProfile,
        records: SessionRecords,
        *,
        model: str | None = None,
        embedded_context: bool = False,
        cancel_drain_s: float = 5.0,
        on_learned: Callable[[AcpProfile], None] | None = None,
    ) -> None:
        self.process = process
        self.profile = profile
        self.capabilities: Capabilities = profile.capabilities()  # what the engine reads, kept with the profile
        self.model = model
        self.embedded_context = embedded_context  # the agent takes `resource` blocks: handoffs go as one
        self.cancel_drain_s = cancel_drain_s
        self.usage: dict[str, AcpUsage] = {}  # native thread -> the latest usage its agent reported
        self.usage_sink: UsageSink | None = None  # (native thread, native turn or None, usage) for a ledger
        self._scrub = scrubber
        self._records = records
        self._on_learned = on_learned
        self._live: dict[str, _Live] = {}  # native thread -> loaded session
        self._by_session: dict[str, str] = {}  # ACP session id -> native thread
        self._prompts: dict[int, str] = {}  # prompt request id -> native thread
        self._requests: dict[str, Pending] = {}
        self._last_turn: dict[str, str] = {}  # native thread -> its last turn (for a trailing usage_update)
        self._costs = CostMeter()  # each session's last cumulative cost (usage_update), for the ledger

    @property
    def alive(self) -> bool:
        return self.process.alive

    # ---- the event stream ------------------------------------------------------------

    async def events(self) -> AsyncIterator[ProviderEvent]:
        async for message in self.process.messages():
            try:
                produced = await self._translate(message)
            except Exception:  # one malformed message must not end the stream of every thread
                log.exception("acp: could not translate a message")
                produced = [Warning(self._running_thread(), "unreadable message from the ACP agent")]
            for event in produced:
                for cleaned in self._scrub.events(event):
                    yield cleaned
        for live in self._live.values():
            if live.turn is not None:  # the items end here; the turn ends with RuntimeExited (a crash)
                for event in live.updates.close_items("interrupted"):
                    for cleaned in self._scrub.events(event):
                        yield cleaned
        for held in self._scrub.stream.flush():
            yield held
        tail = "; ".join(self.process.stderr_tail)
        yield RuntimeExited(self._scrub("the ACP agent exited" + (f": {tail}" if tail else "")), self.process.exit_code)

    async def _translate(self, message: Any) -> list[ProviderEvent]:
        if isinstance(message, _Local):
            return list(message.events)
        if isinstance(message, PromptDone):
            return self._prompt_done(message)
        if isinstance(message, Oversized):
            text = f"the ACP agent sent a message of {message.size} bytes, over the {message.limit}-byte limit; skipped"
            return [Warning(self._running_thread(), text)]
        method = str(message.get("method"))
        params = message.get("params") if isinstance(message.get("params"), dict) else {}
        thread = self._by_session.get(str(params.get("sessionId")))
        if "id" in message:
            return await self._agent_request(message["id"], method, params, thread)
        if method == "session/update" and thread is not None:
            update = params.get("update") or {}
            if update.get("sessionUpdate") == "usage_update":
                turn = self._live[thread].turn or self._last_turn.get(thread)  # a trailing one: the last turn's
                reported = usage_of_update(update)
                self._record_usage(thread, turn, reported)
                grew = self._costs.grew(thread, turn, reported) if turn is not None else None
                return [grew] if grew is not None else []
            return self._live[thread].updates.translate(update)
        return []

    def _running_thread(self) -> str | None:
        running = [thread for thread, live in self._live.items() if live.turn is not None]
        return running[0] if len(running) == 1 else None

    def _prompt_done(self, done: PromptDone) -> list[ProviderEvent]:
        thread = self._prompts.pop(done.request_id, None)
        live = self._live.get(thread) if thread is not None else None
        if live is None or live.prompt_id != done.request_id:
            gone = live.abandoned.pop(done.request_id, None) if live is not None else None
            if gone is not None and not gone.done():
                gone.set_result(None)  # the agent is done with it: the session takes a prompt again
            return []  # a prompt the driver already ended (its cancel drained out)
        spent: list[ProviderEvent] = []
        if done.result is not None:
            usage = usage_of_prompt(done.result)
            if usage is not None:
                self._record_usage(live.record.alias, live.turn, usage)
                alias = live.record.alias
                call = prompt_report(alias, live.turn, usage, self._costs.reports_cost(alias)) if live.turn else None
                spent += [call] if call is not None else []
            self._note_message_id(live, done.result)
        if live.drain is not None:
            live.drain.cancel()
        live.prompt_id = live.turn = live.drain = None
        cancelling, live.cancelling = live.cancelling, False
        if done.error is not None:
            if cancelling or done.error.rpc_code == REQUEST_CANCELLED:  # `$/cancel_request` ends it this way
                return spent + live.updates.end("interrupted")
            return spent + live.updates.end("failed", self._scrub(done.error.message))
        reason = str((done.result or {}).get("stopReason") or "end_turn")
        if reason == "cancelled":
            return spent + live.updates.end("interrupted")
        if reason in STOPPED_SHORT:  # the agent gave up before the work was done: the run says why
            return spent + live.updates.end("failed", f"the agent stopped: {reason}")
        return spent + live.updates.end("completed")

    def _note_message_id(self, live: _Live, result: dict[str, Any]) -> None:
        """The agent's id for the turn's user message, when its answer names one (`userMessageId`, or under
        `_meta` as `turnId`/`userMessageId`): how `_session/rewind` names the message most exactly."""
        found = result.get("userMessageId")
        meta = result.get("_meta")
        if not isinstance(found, str) and isinstance(meta, dict):
            for nested in meta.values():
                if isinstance(nested, dict):
                    found = nested.get("userMessageId") or nested.get("turnId")
                    if isinstance(found, str):
                        break
        if isinstance(found, str) and live.record.turns and live.record.turns[-1].get("turn") == live.turn:
            live.record.turns[-1]["messageId"] = found  # written with the next change of the record (or close)

    def _record_usage(self, thread: str, turn: str | None, usage: AcpUsage) -> None:
        self.usage[thread] = self.usage.get(thread, AcpUsage()).merged(usage)
        if self.usage_sink is not None:
            try:
                self.usage_sink(thread, turn, usage)
            except Exception:
                log.exception("acp: the usage sink failed")

    async def _agent_request(
        self, request_id: Any, method: str, params: dict[str, Any], thread: str | None
    ) -> list[ProviderEvent]:
        live = self._live.get(thread) if thread is not None else None
        if method not in (PERMISSION, ELICITATION):
            with contextlib.suppress(ProviderError):
                await self.process.respond_error(request_id, METHOD_NOT_FOUND, f"threadloom does not serve {method}")
            return []
        questions = elicitation_questions(params) if method == ELICITATION else None
        if live is None or live.turn is None or (method == ELICITATION and questions is None):
            # Nobody can answer it (no turn running, or a form this client cannot ask): refused at once.
            answer = {"outcome": {"outcome": "cancelled"}} if method == PERMISSION else {"action": "decline"}
            with contextlib.suppress(ProviderError):
                await self.process.respond(request_id, answer)
            return []
        ref = f"acp-{request_id}"
        self._requests[ref] = Pending(request_id, method, str(params.get("sessionId")), params)
        if method == PERMISSION:
            kind, payload = permission_payload(params)
        else:
            kind, payload = "user_input", {"message": str(params.get("message") or ""), "questions": questions}
        return [RequestOpened(live.record.alias, live.turn, ref, kind, payload)]

    # ---- threads -----------------------------------------------------------------------

    async def _call(self, method: str, params: dict[str, Any], wait_s: float | None = 60.0) -> Any:
        """A request to the agent; -32601 drops the method from the profile (it was advertised, not real)."""
        try:
            return await self.process.request(method, params, wait_s)
        except RpcError as error:
            if error.rpc_code == METHOD_NOT_FOUND and method in methods.METHODS:
                self._learned(method, error.message)
            raise ProviderError(error.code, self._scrub(f"acp {method}: {error.message}")) from error
        except ProviderError as error:
            raise ProviderError(error.code, self._scrub(f"acp {method}: {error.message}")) from error

    def _learned(self, method: str, note: str) -> None:
        self.profile = self.profile.without(method, self._scrub(note))
        self.capabilities = self.profile.capabilities()
        if self._on_learned is not None:
            self._on_learned(self.profile)

    def _need(self, method: str) -> None:
        if not self.profile.works(method):
            raise ProviderError("unsupported", f"this ACP agent does not support {method}")

    def _adopt(self, record: SessionRecord, settings: ThreadSettings) -> _Live:
        live = _Live(record, SessionUpdates(record.alias), settings)
        self._live[record.alias] = live
        self._by_session[record.session_id] = record.alias
        self._scrub.session_ids.add(record.session_id)
        return live

    def _session_params(self, settings: ThreadSettings) -> dict[str, Any]:
        return {"cwd": settings.cwd, "mcpServers": []}

    async def _configure(self, live: _Live, options: Any) -> None:
        """The thread's model and runtime mode through the session's config options, where the agent offers
        them (`category` model / mode): the model by name, the mode by the value naming it or its nearest kin
        (`MODE_VALUES`). An agent without them keeps its own defaults."""
        if not isinstance(options, list):
            return
        settings = live.settings
        wanted = {"model": [settings.model or self.model or ""], "mode": []}
        for option in options:
            if not isinstance(option, dict):
                continue
            category = option.get("category") or option.get("id")
            if category not in wanted or option.get("type", "select") != "select":
                continue
            offered = {str(o.get("value")) for o in option.get("options") or [] if isinstance(o, dict)}
            if category == "mode":
                value = mode_value(settings.runtime_mode, offered)
            else:
                value = next((v for v in wanted["model"] if v and (v in offered or not offered)), None)
            if value is None or option.get("currentValue") == value:
                continue
            params = {"sessionId": live.record.session_id, "configId": option.get("id"), "value": value}
            await self._call(methods.SET_CONFIG_OPTION, params)

    async def start_thread(self, settings: ThreadSettings) -> str:
        result = await self._call(methods.SESSION_NEW, self._session_params(settings))
        record = SessionRecord(f"acp-{uuid.uuid4().hex}", str(result["sessionId"]), settings.cwd)
        self._records.save(record)
        live = self._adopt(record, settings)
        await self._configure(live, result.get("configOptions"))
        return record.alias

    async def resume_thread(self, native_thread: str, settings: ThreadSettings) -> None:
        if native_thread in self._live:
            return
        record = self._records.load(native_thread)
        if record is None:
            raise ProviderError("not_resumable", f"no record of ACP thread {native_thread} in this agent state folder")
        params = {"sessionId": record.session_id, **self._session_params(settings)}
        self._scrub.session_ids.add(record.session_id)
        errors = []
        for method in (methods.SESSION_RESUME, methods.SESSION_LOAD):
            if not self.profile.works(method):
                continue
            live = self._adopt(record, settings)  # a load's replay arrives with no turn open: not re-ingested
            try:
                result = await self._call(method, params)
            except ProviderError as error:
                self._forget(native_thread)
                if error.code == "exited":
                    raise
                errors.append(error.message)
                continue
            await self._configure(live, (result or {}).get("configOptions"))
            return
        why = "; ".join(errors) or "the agent offers neither session/resume nor session/load"
        raise ProviderError("not_resumable", self._scrub(why))

    def _forget(self, native_thread: str) -> None:
        live = self._live.pop(native_thread, None)
        if live is not None:
            self._by_session.pop(live.record.session_id, None)

    def _loaded(self, native_thread: str) -> _Live:
        live = self._live.get(native_thread)
        if live is None:
            raise ProviderError("unknown_thread", f"ACP thread {native_thread} is not loaded in this runtime")
        return live

    # ---- turns ---------------------------------------------------------------------------

    async def start_turn(
        self, native_thread: str, text: str, settings: ThreadSettings | None = None, handoff: str | None = None
    ) -> str:
        live = self._loaded(native_thread)
        if live.turn is not None:
            raise ProviderError("busy", "a prompt of this ACP session is still running")
        for late in list(live.abandoned.values()):  # a prompt the driver ended may still be winding down
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(late), self.cancel_drain_s)
        blocks = [*self._handoff_blocks(handoff), {"type": "text", "text": text}]
        turn = f"turn-{uuid.uuid4().hex[:16]}"
        live.record.turns.append({"turn": turn, "fingerprint": fingerprint(text)})
        live.turn = turn
        self._last_turn[native_thread] = turn
        self.process.incoming.put_nowait(_Local(tuple(live.updates.begin(turn))))
        try:
            live.prompt_id = await self.process.prompt({"sessionId": live.record.session_id, "prompt": blocks})
        except ProviderError as error:
            live.turn = None
            live.updates.turn = None
            live.record.turns.pop()
            raise ProviderError(error.code, self._scrub(error.message)) from error
        self._prompts[live.prompt_id] = native_thread
        self._records.save(live.record)  # after the prompt is sent: written while the agent works
        return turn

    def _handoff_blocks(self, handoff: str | None) -> list[dict[str, Any]]:
        """A handoff's own block before the user's words (docs/providers.md, handoffs): an embedded resource
        (context, not instructions) when the agent takes them, else a text block of its own."""
        if handoff is None:
            return []
        if self.embedded_context:
            resource = {"uri": "threadloom://handoff", "mimeType": "text/markdown", "text": handoff}
            return [{"type": "resource", "resource": resource}]
        return [{"type": "text", "text": handoff}]

    async def steer_turn(self, native_thread: str, native_turn: str, text: str) -> None:
        self._need(methods.STEERING)
        live = self._loaded(native_thread)
        if live.turn != native_turn:
            raise ProviderError("not_running", "the steered turn has ended")
        params = {"sessionId": live.record.session_id, "prompt": [{"type": "text", "text": text}]}
        result = await self._call(methods.STEERING, params)
        outcome = (result or {}).get("outcome", "injected") if isinstance(result, dict) else "injected"
        if outcome != "injected":
            raise ProviderError("not_running", f"the agent did not take the steer ({outcome})")

    async def interrupt_turn(self, native_thread: str, native_turn: str) -> None:
        live = self._loaded(native_thread)
        if live.turn != native_turn or live.prompt_id is None:
            return
        sid = live.record.session_id
        for ref, pending in list(self._requests.items()):  # ACP: a cancelled prompt's questions end cancelled
            if pending.session_id == sid:
                del self._requests[ref]
                answer = {"outcome": {"outcome": "cancelled"}} if pending.method == PERMISSION else {"action": "cancel"}
                with contextlib.suppress(ProviderError):
                    await self.process.respond(pending.request_id, answer)
        live.cancelling = True
        await self.process.notify("session/cancel", {"sessionId": sid})
        if live.drain is None:
            live.drain = asyncio.create_task(self._drain(live, live.prompt_id), name="acp-cancel-drain")

    async def _drain(self, live: _Live, prompt_id: int) -> None:
        """A cancelled prompt's way out: `session/cancel` asks the agent to end it (`stopReason: cancelled`);
        if it has not after a grace, `$/cancel_request` cancels the request itself; if it still has not
        after `cancel_drain_s`, the driver ends the turn as interrupted (a late answer is then ignored)."""
        grace = min(CANCEL_REQUEST_AFTER_S, self.cancel_drain_s / 2)
        await asyncio.sleep(grace)
        if live.prompt_id == prompt_id:
            with contextlib.suppress(ProviderError):
                await self.process.notify("$/cancel_request", {"requestId": prompt_id})
        await asyncio.sleep(self.cancel_drain_s - grace)
        if live.prompt_id == prompt_id:
            log.warning("acp: a cancelled prompt did not end within %.1fs; ending its turn", self.cancel_drain_s)
            live.prompt_id = live.turn = live.drain = None
            live.cancelling = False
            live.abandoned[prompt_id] = asyncio.get_running_loop().create_future()  # its late answer
            self.process.incoming.put_nowait(_Local(tuple(live.updates.end("interrupted"))))

    async def respond_to_request(self, request_ref: str, response: dict[str, Any]) -> None:
        pending = self._requests.pop(request_ref, None)
        if pending is None:
            raise ProviderError("unknown_request", f"no pending ACP request {request_ref}")
        try:
            if pending.method == PERMISSION:
                answer = permission_answer(pending.params, response)
            else:
                answer = elicitation_answer(pending.params, response)
        except ProviderError:
            self._requests[request_ref] = pending
            raise
        await self.process.respond(pending.request_id, answer)

    # ---- fork, rollback ------------------------------------------------------------------

    async def fork_thread(self, native_thread: str, native_turn: str | None) -> str:
        self._need(methods.SESSION_FORK)
        live = self._live.get(native_thread)
        record = live.record if live is not None else self._records.load(native_thread)
        if record is None:
            raise ProviderError("unknown_thread", f"no record of ACP thread {native_thread}")
        self._scrub.session_ids.add(record.session_id)
        settings = live.settings if live is not None else ThreadSettings(cwd=record.cwd)
        turns = list(record.turns)
        cut = None
        if native_turn is not None:
            at = next((i for i, t in enumerate(turns) if t["turn"] == native_turn), None)
            if at is None:
                raise ProviderError("unknown_turn", f"no turn {native_turn} in this ACP thread")
            if at + 1 < len(turns):
                self._need(methods.REWIND)
                cut = at + 1
        params = {"sessionId": record.session_id, **self._session_params(settings)}
        result = await self._call(methods.SESSION_FORK, params)
        copy = SessionRecord(f"acp-{uuid.uuid4().hex}", str(result["sessionId"]), settings.cwd, turns)
        self._records.save(copy)
        forked = self._adopt(copy, settings)
        if cut is not None:
            await self._rewind(forked, cut)
        return copy.alias

    async def rollback_thread(self, native_thread: str, before_turn: str) -> None:
        self._need(methods.REWIND)
        live = self._loaded(native_thread)
        at = next((i for i, t in enumerate(live.record.turns) if t["turn"] == before_turn), None)
        if at is None:
            raise ProviderError("unknown_turn", f"no turn {before_turn} in this ACP thread")
        await self._rewind(live, at)

    async def _rewind(self, live: _Live, at: int) -> None:
        """`_session/rewind` before the user message of turn number `at`, then the record forgets the turns
        from there. The message is named as the extension names it (the agent's message id, its text's
        fingerprint and occurrence) when the agent gave its id; else by the number of turns to drop."""
        turns = live.record.turns
        target = turns[at]
        params: dict[str, Any] = {"sessionId": live.record.session_id, "numTurns": len(turns) - at}
        if isinstance(target.get("messageId"), str):
            occurrence = sum(1 for t in turns[: at + 1] if t["fingerprint"] == target["fingerprint"])
            params["beforeMessage"] = {
                "messageId": target["messageId"],
                "messageFingerprint": target["fingerprint"],
                "messageOccurrence": occurrence,
            }
        await self._call(methods.REWIND, params)
        live.record.turns = turns[:at]
        self._records.save(live.record)

    async def read_thread_snapshot(self, native_thread: str) -> dict[str, Any]:
        raise ProviderError("unsupported", "ACP has no conversation snapshot")

    async def close(self) -> None:
        for live in self._live.values():
            if live.drain is not None:
                live.drain.cancel()
            with contextlib.suppress(OSError, ValueError):
                self._records.save(live.record)
        await self.process.close()


def fingerprint(text: str) -> str:
    """How `_session/rewind` names a user message: the sha256 of its text."""
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()

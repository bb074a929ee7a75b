"""Driving `threadloom acp` as an editor does: the official ACP SDK's client over the process's real stdio
(`Editor`, `agent`), or raw JSON lines for what the SDK will not send (`RawEditor`)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    DeniedOutcome,
    ElicitationCapabilities,
    ElicitationFormCapabilities,
    PermissionOption,
    RequestPermissionResponse,
    ToolCallUpdate,
)
from acp.stdio import spawn_agent_process


class Editor:
    """What an editor does with the agent's messages: shows the updates, answers permission requests and
    (when it says it takes them) form elicitations."""

    def __init__(self, choice: str | None = "ACCEPT", form: dict[str, Any] | None = None) -> None:
        self.choice = choice  # the option id picked; None: the user dismissed the request
        self.form = form  # the content an elicitation is accepted with; None: declined
        self.updates: list[tuple[str, dict[str, Any]]] = []
        self.asked: list[tuple[dict[str, Any], list[str]]] = []
        self.elicited: list[tuple[str, dict[str, Any]]] = []  # (message, the form's mode with its schema)
        self.hold: asyncio.Event | None = None  # set: permission requests wait for it before they are answered
        self.started: Any = None  # the initialize response

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates.append((session_id, update.model_dump(by_alias=True, exclude_none=True)))

    async def request_permission(
        self, session_id: str, tool_call: ToolCallUpdate, options: list[PermissionOption], **_: Any
    ) -> RequestPermissionResponse:
        self.asked.append((tool_call.model_dump(by_alias=True, exclude_none=True), [o.kind for o in options]))
        if self.hold is not None:
            await self.hold.wait()
        if self.choice is None:
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=self.choice))

    async def create_elicitation(self, message: str, mode: Any, **_: Any) -> dict[str, Any]:
        self.elicited.append((message, mode.model_dump(by_alias=True, exclude_none=True)))
        if self.form is None:
            return {"action": "decline"}
        return {"action": "accept", "content": self.form}

    def on_connect(self, conn: Any) -> None:
        pass

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [u for _, u in self.updates if u["sessionUpdate"] == kind]

    def text(self, kind: str = "agent_message_chunk") -> str:
        return "".join(u["content"]["text"] for u in self.of_kind(kind))


def bridge_command(url: str, *args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "threadloom", "acp", "--url", url, *args)


@asynccontextmanager
async def agent(
    url: str, token: str, editor: Editor, *args: str, elicitation: bool = False, device: str | None = None
) -> AsyncIterator[Any]:
    """`threadloom acp` as an editor starts it, for the server at `url`, initialized (with `elicitation`, the
    editor says it takes form elicitations; `device`: its THREADLOOM_DEVICE, the writer lease's device)."""
    env = {"PATH": os.environ["PATH"], "THREADLOOM_TOKEN": token, **({"THREADLOOM_DEVICE": device} if device else {})}
    capabilities = ClientCapabilities(
        elicitation=ElicitationCapabilities(form=ElicitationFormCapabilities()) if elicitation else None
    )
    spawned = spawn_agent_process(
        lambda _agent: editor, *bridge_command(url, *args), env=env, use_unstable_protocol=True
    )
    async with spawned as (conn, process):
        editor.started = await conn.initialize(protocol_version=1, client_capabilities=capabilities)
        assert editor.started.protocol_version == 1 and editor.started.agent_capabilities.load_session is True
        yield conn
    assert process.returncode is not None  # the bridge ends with the editor's stdin


class RawEditor:
    """JSON-RPC lines written to and read from the bridge by hand: ids, notifications and lines the SDK would
    never send (`$/cancel_request`, an unknown method, a line over the limit)."""

    def __init__(self, process: asyncio.subprocess.Process) -> None:
        self.process = process
        self.seen: list[dict[str, Any]] = []  # every message from the bridge, in order

    async def send(self, message: dict[str, Any]) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
        await self.process.stdin.drain()

    async def write(self, data: bytes) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(data)
        await self.process.stdin.drain()

    async def wait_for(self, match: Any, within: float = 60.0) -> dict[str, Any]:
        """The first message from the bridge (seen before or read now) for which `match(message)` holds."""
        for message in self.seen:
            if match(message):
                return message
        assert self.process.stdout is not None
        while True:
            try:
                line = await asyncio.wait_for(self.process.stdout.readline(), within)
            except TimeoutError:
                raise AssertionError(f"not seen in {within} s; seen: {self.seen[-5:]}") from None
            assert line, "the bridge closed its stdout"
            message = json.loads(line)
            self.seen.append(message)
            if match(message):
                return message

    async def answer(self, request_id: Any, within: float = 60.0) -> dict[str, Any]:
        return await self.wait_for(lambda m: m.get("id") == request_id and "method" not in m, within)

    async def call(self, request_id: Any, method: str, params: dict[str, Any]) -> dict[str, Any]:
        await self.send({"id": request_id, "method": method, "params": params})
        return await self.answer(request_id)


@asynccontextmanager
async def raw_agent(url: str, token: str, device: str | None = None) -> AsyncIterator[RawEditor]:
    env = {"PATH": os.environ["PATH"], "THREADLOOM_TOKEN": token, **({"THREADLOOM_DEVICE": device} if device else {})}
    process = await asyncio.create_subprocess_exec(
        *bridge_command(url),
        env=env,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        limit=16 * 1024 * 1024,
    )
    editor = RawEditor(process)
    try:
        started = await editor.call(0, "initialize", {"protocolVersion": 1})
        assert started["result"]["protocolVersion"] == 1
        yield editor
    finally:
        assert process.stdin is not None
        process.stdin.close()
        try:
            await asyncio.wait_for(process.wait(), 30)
        except TimeoutError:
            process.kill()
            await process.wait()
            raise

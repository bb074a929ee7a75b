"""The ACP agent's methods, each done with the public GraphQL API of a running Threadloom server.

A session is a thread (its id is the thread's global id, so `session/load` works from any bridge with a
token that sees the thread); a prompt is a run sent with `queueAfterActive`, followed on the thread's event
stream from the sequence before it was sent, so nothing it does is missed. If the server goes away
mid-prompt, the bridge reconnects and follows on from the last sequence it saw.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import AsyncIterator
from pathlib import PurePosixPath
from typing import Any

from threadloom.acp.graphql_socket import GraphQLError, GraphQLSocket
from threadloom.acp.rpc import AUTH_REQUIRED, RESOURCE_NOT_FOUND, AcpError, Connection, Params, PeerGone
from threadloom.acp.updates import EVENTS, PERMISSION_OPTIONS, PermissionAsk, Turn, history, prompt_text, stop_reason
from threadloom.agent.wire import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST

log = logging.getLogger("threadloom.acp")

PROTOCOL_VERSION = 1
RECONNECT_WITHIN_S = 30.0  # how long a prompt waits for the server to come back before it fails
# Stream ends a prompt follows on from: the socket dropped, the server stopped, the bridge fell behind.
RESUMABLE = frozenset({"DISCONNECTED", "SERVER_GOING_AWAY", "SUBSCRIBER_TOO_SLOW"})

PROJECTS = """query($after: String) { projects(first: 100, after: $after) {
  nodes { id workspaceRoot } pageInfo { hasNextPage endCursor } } }"""
PROJECT = "query($p: ID!) { project(id: $p) { id workspaceRoot } }"
CREATE = """mutation($p: ID!, $i: String) { createThread(input: {projectId: $p, providerInstanceId: $i}) {
  thread { id } userErrors { code message } } }"""
THREAD = "query($t: ID!) { thread(id: $t) { id latestSequence } }"
MESSAGES = """query($t: ID!, $after: String) { thread(id: $t) { messages(first: 100, after: $after) {
  nodes { role text } pageInfo { hasNextPage endCursor } } } }"""
SEND = """mutation($t: ID!, $text: String!) {
  sendMessage(input: {threadId: $t, text: $text, dispatch: {queueAfterActive: true}}) {
    run { id } userErrors { code message } } }"""
RESYNC = """query($r: ID!, $t: ID!) {
  run(id: $r) { id runStatus: status statusReason
    executionGraph { nodes { id nodeKind: kind nodeStatus: status title detail } }
    plans { id planKind: kind items } }
  thread(id: $t) { latestSequence messages(last: 50) { nodes { id role text run { id } } } } }"""
INTERRUPT = "mutation($r: ID!) { interruptRun(input: {runId: $r}) { userErrors { code message } } }"
CANCEL_QUEUED = "mutation($r: ID!) { cancelQueuedRun(input: {runId: $r}) { userErrors { code message } } }"
RESPOND = """mutation($r: ID!, $d: Decision!) { respondToApproval(input: {requestId: $r, decision: $d}) {
  userErrors { code message } } }"""


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    url: str
    token: str
    project_id: str | None = None  # sessions go to this project; None: the project whose workspace holds cwd
    provider: str | None = None  # the provider instance of new threads; None: the server's default


@dataclasses.dataclass(slots=True)
class Session:
    thread_id: str
    run_id: str | None = None  # the running prompt's run
    prompting: bool = False
    cancel_requested: bool = False


class Bridge:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.conn: Connection | None = None
        self._socket: GraphQLSocket | None = None
        self._connecting = asyncio.Lock()
        self._sessions: dict[str, Session] = {}

    def handlers(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """The editor's requests and notifications this agent answers."""
        requests = {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.new_session,
            "session/load": self.load_session,
            "session/prompt": self.prompt,
        }
        return requests, {"session/cancel": self.cancel}

    async def close(self) -> None:
        if self._socket is not None:
            await self._socket.close()

    # ---- methods -----------------------------------------------------------------------------------
    async def initialize(self, params: Params) -> dict[str, Any]:
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": False, "sse": False},
            },
            "authMethods": [],  # the token comes with the process (THREADLOOM_TOKEN)
            "agentInfo": {"name": "threadloom", "title": "Threadloom", "version": _version()},
        }

    async def authenticate(self, params: Params) -> dict[str, Any]:
        raise AcpError(INVALID_PARAMS, "no authentication methods: start the agent with THREADLOOM_TOKEN")

    async def new_session(self, params: Params) -> dict[str, Any]:
        cwd = _absolute(params.get("cwd"))
        project = await self._project_for(cwd)
        data = await self._execute(CREATE, {"p": project, "i": self.options.provider})
        thread = _payload(data["createThread"])["thread"]
        self._sessions[thread["id"]] = Session(thread["id"])
        return {"sessionId": thread["id"]}

    async def load_session(self, params: Params) -> dict[str, Any]:
        _absolute(params.get("cwd"))
        session_id = str(params.get("sessionId") or "")
        if (await self._execute(THREAD, {"t": session_id}))["thread"] is None:
            raise AcpError(RESOURCE_NOT_FOUND, "no such session for this token", "NOT_FOUND")
        session = self._sessions.setdefault(session_id, Session(session_id))
        async for messages in self._pages(session.thread_id):
            for update in history(messages):
                await self._update(session_id, update)
        return {}

    async def prompt(self, params: Params) -> dict[str, Any]:
        session_id = str(params.get("sessionId") or "")
        session = self._session(session_id)
        try:
            text = prompt_text(params.get("prompt") or [])
        except ValueError as exc:
            raise AcpError(INVALID_PARAMS, str(exc), "INVALID_PROMPT") from exc
        if session.prompting:
            raise AcpError(INVALID_REQUEST, "a prompt is already running in this session", "PROMPT_RUNNING")
        session.prompting, session.cancel_requested = True, False
        try:
            thread = (await self._execute(THREAD, {"t": session.thread_id}))["thread"]
            if thread is None:
                raise AcpError(RESOURCE_NOT_FOUND, "the session's thread is gone", "NOT_FOUND")
            sent = _payload((await self._execute(SEND, {"t": session.thread_id, "text": text}))["sendMessage"])
            session.run_id = sent["run"]["id"]
            if session.cancel_requested:
                await self._stop(session.run_id)
            turn = await self._follow(session_id, session, thread["latestSequence"])
        finally:
            session.prompting, session.run_id = False, None
        assert turn.status is not None
        reason = stop_reason(turn.status, session.cancel_requested)
        if reason is None:
            raise AcpError(INTERNAL_ERROR, f"the run failed: {turn.reason or turn.status}", "RUN_FAILED")
        return {"stopReason": reason}

    async def cancel(self, params: Params) -> None:
        session = self._sessions.get(str(params.get("sessionId") or ""))
        if session is None or not session.prompting:
            return
        session.cancel_requested = True
        if session.run_id is not None:
            await self._stop(session.run_id)

    # ---- a prompt's run ----------------------------------------------------------------------------
    async def _follow(self, session_id: str, session: Session, after: int) -> Turn:
        """Streams the run's events to the editor until it ends; asks the editor for each approval."""
        assert session.run_id is not None
        turn = Turn(session.run_id)
        asks: set[asyncio.Task[None]] = set()
        try:
            while turn.status is None:
                socket = await self._connected(within=RECONNECT_WITHIN_S)
                try:
                    async for data in socket.subscribe(EVENTS, {"t": session.thread_id, "after": after}):
                        event = data["threadEvents"]
                        if event["type"] == "reload_required":
                            after = await self._resync(session_id, turn, session.thread_id)
                            break
                        after = max(after, int(event.get("sequence") or 0))
                        for update in turn.updates(event):
                            await self._update(session_id, update)
                        if (ask := turn.permission(event)) is not None:
                            task = asyncio.create_task(self._ask(session_id, ask))
                            asks.add(task)
                            task.add_done_callback(asks.discard)
                        if turn.status is not None:
                            break
                    else:  # the server completed the stream: it will not tell how the run ends
                        raise AcpError(INTERNAL_ERROR, "the thread's event stream ended before the run", "STREAM_ENDED")
                except GraphQLError as exc:
                    if exc.code not in RESUMABLE:
                        raise AcpError(INTERNAL_ERROR, str(exc), exc.code) from exc
                    log.warning("the event stream ended (%s); following on from sequence %s", exc.code, after)
        finally:
            for task in asks:
                task.cancel()
        return turn

    async def _resync(self, session_id: str, turn: Turn, thread_id: str) -> int:
        """Too much happened while away to replay: read the run as it is now, tell the editor what it has not
        seen (messages are whole texts, nodes and plans whole states), and go on from the thread's newest
        sequence. Returns that sequence."""
        data = await self._execute(RESYNC, {"r": turn.run_id, "t": thread_id})
        run = data["run"] or {}
        entities = [
            *(m for m in data["thread"]["messages"]["nodes"] if (m.pop("run") or {}).get("id") == turn.run_id),
            *(run.get("executionGraph") or {}).get("nodes", []),
            *run.get("plans", []),
        ]
        kinds = {"role": "ConversationMessage", "nodeKind": "ExecutionNode", "planKind": "PlanArtifact"}
        for entity in entities:
            typename = next(name for key, name in kinds.items() if key in entity)
            for update in turn.updates({"runId": turn.run_id, "entity": {"__typename": typename, **entity}}):
                await self._update(session_id, update)
        turn.updates({"runId": turn.run_id, "entity": {"__typename": "Run", **run}})
        return int(data["thread"]["latestSequence"])

    async def _ask(self, session_id: str, ask: PermissionAsk) -> None:
        options = list(PERMISSION_OPTIONS)
        try:
            answer = await self._require_conn().request(
                "session/request_permission", {"sessionId": session_id, "toolCall": ask.tool_call, "options": options}
            )
        except (AcpError, PeerGone) as exc:
            log.warning("the editor did not answer a permission request: %s", exc)
            answer = None
        outcome = (answer or {}).get("outcome") or {}
        chosen = outcome.get("optionId") if outcome.get("outcome") == "selected" else None
        decision = chosen if chosen in {o["optionId"] for o in options} else "CANCEL"
        try:
            # Answered elsewhere meanwhile (the dashboard): the userError says so and changes nothing.
            await self._execute(RESPOND, {"r": ask.request_id, "d": decision})
        except AcpError as exc:
            log.warning("could not answer request %s (%s): it waits for another client", ask.request_id, exc)

    async def _stop(self, run_id: str) -> None:
        stopped = (await self._execute(INTERRUPT, {"r": run_id}))["interruptRun"]["userErrors"]
        if stopped and stopped[0]["code"] == "RUN_NOT_ACTIVE":
            await self._execute(CANCEL_QUEUED, {"r": run_id})  # still queued behind another client's run

    # ---- helpers -----------------------------------------------------------------------------------
    async def _project_for(self, cwd: str) -> str:
        if self.options.project_id is not None:
            project = (await self._execute(PROJECT, {"p": self.options.project_id}))["project"]
            if project is None:
                raise AcpError(RESOURCE_NOT_FOUND, "the configured project is not visible to this token", "NOT_FOUND")
            return str(project["id"])
        best: tuple[int, str] | None = None
        cursor: str | None = None
        while True:
            page = (await self._execute(PROJECTS, {"after": cursor}))["projects"]
            for project in page["nodes"]:
                root = PurePosixPath(project["workspaceRoot"])
                if PurePosixPath(cwd).is_relative_to(root) and (best is None or len(root.parts) > best[0]):
                    best = (len(root.parts), project["id"])  # the innermost workspace holding cwd
            if not page["pageInfo"]["hasNextPage"]:
                break
            cursor = page["pageInfo"]["endCursor"]
        if best is None:
            raise AcpError(INVALID_PARAMS, f"no project of this token has its workspace at {cwd}", "NO_PROJECT")
        return best[1]

    async def _pages(self, thread_id: str) -> AsyncIterator[list[dict[str, Any]]]:
        cursor: str | None = None
        while True:
            thread = (await self._execute(MESSAGES, {"t": thread_id, "after": cursor}))["thread"]
            if thread is None:
                return
            yield thread["messages"]["nodes"]
            if not thread["messages"]["pageInfo"]["hasNextPage"]:
                return
            cursor = thread["messages"]["pageInfo"]["endCursor"]

    def _session(self, session_id: str) -> Session:
        session = self._sessions.get(session_id)
        if session is None:
            raise AcpError(RESOURCE_NOT_FOUND, "unknown session: create or load it first", "NOT_FOUND")
        return session

    async def _update(self, session_id: str, update: dict[str, Any]) -> None:
        await self._require_conn().notify("session/update", {"sessionId": session_id, "update": update})

    def _require_conn(self) -> Connection:
        assert self.conn is not None, "attach the connection first"
        return self.conn

    async def _execute(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        socket = await self._connected()
        try:
            return await socket.execute(query, variables)
        except GraphQLError as exc:
            raise AcpError(INTERNAL_ERROR, str(exc), exc.code) from exc

    async def _connected(self, within: float = 0.0) -> GraphQLSocket:
        """The socket to the server, opened again if it closed (retrying up to `within` seconds)."""
        async with self._connecting:
            if self._socket is not None and not self._socket.closed:
                return self._socket
            loop = asyncio.get_running_loop()
            deadline, pause = loop.time() + within, 0.1
            while True:
                try:
                    self._socket = await GraphQLSocket.connect(self.options.url, self.options.token)
                    return self._socket
                except GraphQLError as exc:
                    if exc.code == "UNAUTHENTICATED":
                        raise AcpError(AUTH_REQUIRED, str(exc), exc.code) from exc
                    if loop.time() + pause > deadline:
                        raise AcpError(INTERNAL_ERROR, str(exc), exc.code) from exc
                await asyncio.sleep(pause)  # backoff between reconnection attempts
                pause = min(pause * 2, 2.0)


def _payload(payload: dict[str, Any]) -> dict[str, Any]:
    """A mutation's payload; its first userError becomes the request's error, with its code."""
    if payload["userErrors"]:
        error = payload["userErrors"][0]
        raise AcpError(INVALID_PARAMS, str(error["message"]), str(error["code"]))
    return payload


def _absolute(cwd: Any) -> str:
    if not isinstance(cwd, str) or not os.path.isabs(cwd):
        raise AcpError(INVALID_PARAMS, "cwd must be an absolute path", "INVALID_CWD")
    return os.path.normpath(cwd)


def _version() -> str:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version("threadloom")
    return "0"


async def serve_stdio(options: Options) -> None:
    """Speaks ACP on this process's stdin/stdout until the editor closes stdin."""
    from threadloom.agent.wire import LineReader, LineWriter

    bridge = Bridge(options)
    requests, notifications = bridge.handlers()
    reader, writer = await LineReader.stdin(), await LineWriter.stdout()
    bridge.conn = Connection(reader, writer, requests, notifications)
    try:
        await bridge.conn.serve()
    finally:
        await bridge.close()
        await writer.flush(within=5.0)

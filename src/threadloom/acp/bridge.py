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
import socket
from pathlib import PurePosixPath
from typing import Any

from threadloom.acp import documents as q
from threadloom.acp import listing, questions
from threadloom.acp.api import Api, payload
from threadloom.acp.graphql_socket import GraphQLError
from threadloom.acp.rpc import RESOURCE_NOT_FOUND, AcpError, Connection, Params, PeerGone
from threadloom.acp.sessions import Session, absolute, text_of
from threadloom.acp.settings import config_options, mode_value, modes_state
from threadloom.acp.updates import (
    EVENTS,
    PERMISSION_OPTIONS,
    PermissionAsk,
    QuestionAsk,
    Turn,
    history,
    prompt_usage,
    stop_reason,
)
from threadloom.acp.verbs import Verbs
from threadloom.agent.wire import INTERNAL_ERROR, INVALID_PARAMS, INVALID_REQUEST

log = logging.getLogger("threadloom.acp")

PROTOCOL_VERSION = 1
LEASE_TTL_S = 60  # the writer lease a driving session holds, renewed every third of it
RECONNECT_WITHIN_S = 30.0  # how long a prompt waits for the server to come back before it fails
# Stream ends a prompt follows on from: the socket dropped, the server stopped, the bridge fell behind.
RESUMABLE = frozenset({"DISCONNECTED", "SERVER_GOING_AWAY", "SUBSCRIBER_TOO_SLOW"})
# The extensions the bridge serves, announced in `initialize` (its `_meta` and `agentCapabilities._meta`).
EXTENSIONS = {
    "steering": {"supported": True},  # `_session/steering`, as claude-code-acp and codex-acp announce it
    "threadloom": {"version": 1, "methods": ["_threadloom/queue", "_threadloom/fork", "_threadloom/rollback"]},
}


@dataclasses.dataclass(frozen=True, slots=True)
class Options:
    url: str
    token: str
    project_id: str | None = None  # sessions go to this project; None: the project whose workspace holds cwd
    provider: str | None = None  # the provider instance of new threads; None: the server's default
    models: tuple[str, ...] = ()  # models offered in the model option, beside the instance's default
    device: str | None = None  # the writer lease's device (THREADLOOM_DEVICE); None: acp-<host>-<pid>


class Bridge:
    def __init__(self, options: Options) -> None:
        self.options = options
        self.device = options.device or f"acp-{socket.gethostname()}-{os.getpid()}"
        self.api = Api(options.url, options.token, self.device)
        self.conn: Connection | None = None
        self.elicits = False  # the editor takes form elicitations (its clientCapabilities say so)
        self.sessions: dict[str, Session] = {}

    def handlers(self) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """The editor's requests and notifications this agent answers, and how a prompt is cancelled."""
        verbs = Verbs(self)
        requests = {
            "initialize": self.initialize,
            "authenticate": self.authenticate,
            "session/new": self.new_session,
            "session/load": self.load_session,
            "session/resume": self.resume_session,
            "session/list": self.list_sessions,
            "session/close": self.close_session,
            "session/prompt": self.prompt,
            "session/set_config_option": verbs.set_config_option,
            "session/set_mode": verbs.set_mode,
            "session/fork": verbs.fork_session,
            "_session/steering": verbs.steer,
            "_threadloom/queue": verbs.queue,
            "_threadloom/fork": verbs.fork,
            "_threadloom/rollback": verbs.rollback,
        }
        return requests, {"session/cancel": self.cancel}, {"session/prompt": self.cancel}

    async def close(self) -> None:
        for session in self.sessions.values():
            await self.let_go(session)
        await self.api.close()

    # ---- methods -----------------------------------------------------------------------------------
    async def initialize(self, params: Params) -> dict[str, Any]:
        elicitation = ((params.get("clientCapabilities") or {}).get("elicitation")) or {}
        self.elicits = isinstance(elicitation, dict) and elicitation.get("form") is not None
        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": {"image": False, "audio": False, "embeddedContext": True},
                "mcpCapabilities": {"http": False, "sse": False},
                "sessionCapabilities": {"list": {}, "resume": {}, "close": {}, "fork": {}},
                "_meta": EXTENSIONS,
            },
            "authMethods": [],  # the token comes with the process (THREADLOOM_TOKEN)
            "agentInfo": {"name": "threadloom", "title": "Threadloom", "version": _version()},
            "_meta": EXTENSIONS,
        }

    async def authenticate(self, params: Params) -> dict[str, Any]:
        raise AcpError(INVALID_PARAMS, "no authentication methods: start the agent with THREADLOOM_TOKEN")

    async def new_session(self, params: Params) -> dict[str, Any]:
        cwd = absolute(params.get("cwd"))
        project = await self.project_for(cwd)
        data = await self.api.execute(q.CREATE, {"p": project, "i": self.options.provider})
        thread = payload(data["createThread"])["thread"]
        session = self.sessions[thread["id"]] = Session(thread["id"])
        return {"sessionId": thread["id"], **self.settings(session, thread)}

    async def load_session(self, params: Params) -> dict[str, Any]:
        """The session, its conversation replayed as the updates that showed it."""
        session_id, settings = await self._open(params)
        async for messages in self.api.messages(session_id):
            for update in history(messages):
                await self.update(session_id, update)
        return settings

    async def resume_session(self, params: Params) -> dict[str, Any]:
        """The session, without its history (the editor has it)."""
        return (await self._open(params))[1]

    async def list_sessions(self, params: Params) -> dict[str, Any]:
        return await listing.list_sessions(self, params)

    async def close_session(self, params: Params) -> dict[str, Any]:
        """The bridge lets the session go (a running prompt is cancelled first); the thread stays on the server."""
        session_id = str(params.get("sessionId") or "")
        self.session(session_id)
        await self.cancel(params)
        session = self.sessions.pop(session_id, None)
        if session is not None:
            await self.let_go(session)
        return {}

    async def prompt(self, params: Params) -> dict[str, Any]:
        session_id = str(params.get("sessionId") or "")
        session = self.session(session_id)
        text = text_of(params)
        if session.prompting:
            raise AcpError(INVALID_REQUEST, "a prompt is already running in this session", "PROMPT_RUNNING")
        session.prompting, session.cancel_requested = True, False
        try:
            ended = await self.send_and_follow(session_id, session, text, {"queueAfterActive": True}, prompt=True)
        finally:
            session.prompting = False
        answer: dict[str, Any] = {"stopReason": ended["stopReason"]}
        used = (await self.api.execute(q.RUN_USAGE, {"r": ended["runId"]}))["run"]
        if used is not None:
            answer["usage"] = prompt_usage(used["usage"])
        return answer

    async def cancel(self, params: Params) -> None:
        """Stops what the session runs for the editor: the prompt's run, and queued runs it waits for."""
        session = self.sessions.get(str(params.get("sessionId") or ""))
        if session is None:
            return
        if session.prompting:
            session.cancel_requested = True
        for run_id in list(session.followed):
            session.followed[run_id] = True
            await self.stop(run_id)

    # ---- a run followed to its end -----------------------------------------------------------------
    async def send_and_follow(
        self, session_id: str, session: Session, text: str, dispatch: dict[str, Any], *, prompt: bool
    ) -> dict[str, Any]:
        """Sends the message and streams its run to the editor until it ends: `{runId, stopReason}`."""
        thread = await self.api.thread(session.thread_id)
        await self.show_settings(session_id, session, thread)
        await self.drive(session)
        variables = {"t": session.thread_id, "text": text, "d": dispatch}
        run_id = payload((await self.api.execute(q.SEND, variables))["sendMessage"])["run"]["id"]
        session.followed[run_id] = prompt and session.cancel_requested
        if prompt:
            session.run_id = run_id
        try:
            if session.followed[run_id]:
                await self.stop(run_id)
            turn = await self.follow(session_id, session.thread_id, run_id, thread["latestSequence"])
        finally:
            cancelled = session.followed.pop(run_id, False)
            if prompt:
                session.run_id = None
        assert turn.status is not None
        reason = stop_reason(turn.status, cancelled)
        if reason is None:
            raise AcpError(INTERNAL_ERROR, f"the run failed: {turn.reason or turn.status}", "RUN_FAILED")
        return {"runId": run_id, "stopReason": reason}

    async def follow(self, session_id: str, thread_id: str, run_id: str, after: int) -> Turn:
        """Streams the run's events to the editor until it ends; asks the editor its approvals and questions."""
        turn = Turn(run_id)
        asks: dict[str, asyncio.Task[None]] = {}
        try:
            while turn.status is None:
                socket = await self.api.connected(within=RECONNECT_WITHIN_S)
                try:
                    async for data in socket.subscribe(EVENTS, {"t": thread_id, "after": after}):
                        event = data["threadEvents"]
                        if event["type"] == "reload_required":
                            after = await self._resync(session_id, turn, thread_id)
                            break
                        after = max(after, int(event.get("sequence") or 0))
                        for update in turn.updates(event):
                            await self.update(session_id, update)
                        self._ask_for(session_id, turn, event, asks)
                        if turn.status is not None:
                            break
                    else:  # the server completed the stream: it will not tell how the run ends
                        raise AcpError(INTERNAL_ERROR, "the thread's event stream ended before the run", "STREAM_ENDED")
                except GraphQLError as exc:
                    if exc.code not in RESUMABLE:
                        raise AcpError(INTERNAL_ERROR, str(exc), exc.code) from exc
                    log.warning("the event stream ended (%s); following on from sequence %s", exc.code, after)
        finally:
            for task in asks.values():
                task.cancel()
        return turn

    def _ask_for(self, session_id: str, turn: Turn, event: dict[str, Any], asks: dict[str, asyncio.Task[None]]) -> None:
        """Asks the editor a new approval or question of the run; withdraws an ask answered elsewhere."""
        if (ask := turn.permission(event)) is not None:
            asks[ask.request_id] = asyncio.create_task(self._ask(session_id, ask))
        elif self.elicits and (question := turn.question(event)) is not None:
            asks[question.request_id] = asyncio.create_task(self._ask_question(session_id, question))
        elif (settled := turn.settled(event)) is not None and (task := asks.pop(settled, None)) is not None:
            task.cancel()  # the editor's dialog is withdrawn with `$/cancel_request`

    async def _resync(self, session_id: str, turn: Turn, thread_id: str) -> int:
        """Too much happened while away to replay: read the run as it is now, tell the editor what it has not
        seen (messages are whole texts, nodes and plans whole states), and go on from the thread's newest
        sequence. Returns that sequence."""
        data = await self.api.execute(q.RESYNC, {"r": turn.run_id, "t": thread_id})
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
                await self.update(session_id, update)
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
            await self.api.execute(q.RESPOND, {"r": ask.request_id, "d": decision})
        except AcpError as exc:
            log.warning("could not answer request %s (%s): it waits for another client", ask.request_id, exc)

    async def _ask_question(self, session_id: str, ask: QuestionAsk) -> None:
        """Asks the run's questions as a form; an accepted form answers them. Declined, dismissed or not
        understood, they wait in the thread for another client (the dashboard) to answer."""
        message, schema = questions.form(ask.questions)
        elicitation = {"sessionId": session_id, "mode": "form", "message": message, "requestedSchema": schema}
        try:
            answer = await self._require_conn().request("elicitation/create", elicitation) or {}
            if answer.get("action") != "accept":
                return
            given = questions.answers(ask.questions, answer.get("content") or {})
            payload((await self.api.execute(q.ANSWER, {"r": ask.request_id, "a": given}))["respondToUserInput"])
        except (AcpError, PeerGone, ValueError) as exc:
            log.warning("question %s not answered in the editor (%s): it waits for another client", ask.request_id, exc)

    async def stop(self, run_id: str) -> None:
        """Interrupts the run, or cancels it while it is still queued."""
        stopped = (await self.api.execute(q.INTERRUPT, {"r": run_id}))["interruptRun"]["userErrors"]
        if stopped and stopped[0]["code"] == "RUN_NOT_ACTIVE":
            await self.api.execute(q.CANCEL_QUEUED, {"r": run_id})

    # ---- the writer lease ----------------------------------------------------------------------------
    async def drive(self, session: Session) -> None:
        """Takes the thread's lease at the session's first message (another device's live lease refuses it
        with WRITER_LEASE_HELD, naming that device) and renews it until the session is closed."""
        if session.lease is not None and not session.lease.done():
            return
        payload((await self.api.execute(q.ACQUIRE, {"t": session.thread_id, "ttl": LEASE_TTL_S}))["acquireThreadLease"])
        session.lease = asyncio.create_task(self._renew(session), name=f"acp-lease-{session.thread_id}")

    async def _renew(self, session: Session) -> None:
        while True:
            await asyncio.sleep(LEASE_TTL_S / 3)  # a timer of the bridge's own: renew well before it runs out
            try:
                renewed = await self.api.execute(q.RENEW, {"t": session.thread_id, "ttl": LEASE_TTL_S})
            except AcpError:
                continue  # the server is away: try again; the lease runs out if it stays away
            if renewed["renewThreadLease"]["userErrors"]:
                return  # taken over or run out: the next message acquires it again (or is refused)

    async def let_go(self, session: Session) -> None:
        """Stops renewing and releases the lease (when the session held it)."""
        task, session.lease = session.lease, None
        if task is None:
            return
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        with contextlib.suppress(AcpError):
            await self.api.execute(q.RELEASE, {"t": session.thread_id})

    # ---- helpers -----------------------------------------------------------------------------------
    async def _open(self, params: Params) -> tuple[str, dict[str, Any]]:
        """`session/load` and `session/resume`: a thread this token sees becomes a session of the bridge."""
        absolute(params.get("cwd"))
        session_id = str(params.get("sessionId") or "")
        thread = await self.api.thread(session_id)
        session = self.sessions.setdefault(session_id, Session(session_id))
        return session_id, self.settings(session, thread)

    def settings(self, session: Session, thread: dict[str, Any]) -> dict[str, Any]:
        """The session's config options and modes, as the editor is now shown them."""
        session.shown = (thread["mode"], thread.get("model"))
        return {
            "configOptions": config_options(thread["mode"], thread.get("model"), self.options.models),
            "modes": modes_state(thread["mode"]),
        }

    async def show_settings(self, session_id: str, session: Session, thread: dict[str, Any]) -> None:
        """Tells the editor of a mode or model another client changed since it was last shown."""
        before = session.shown
        after = self.settings(session, thread)
        if before is None or before == session.shown:
            return
        options = after["configOptions"]
        await self.update(session_id, {"sessionUpdate": "config_option_update", "configOptions": options})
        if before[0] != thread["mode"]:
            mode = mode_value(thread["mode"])
            await self.update(session_id, {"sessionUpdate": "current_mode_update", "currentModeId": mode})

    async def project_for(self, cwd: str) -> str:
        """The project of a session at `cwd`: --project, else the innermost workspace holding `cwd`."""
        if self.options.project_id is not None:
            project = (await self.api.execute(q.PROJECT, {"p": self.options.project_id}))["project"]
            if project is None:
                raise AcpError(RESOURCE_NOT_FOUND, "the configured project is not visible to this token", "NOT_FOUND")
            return str(project["id"])
        best: tuple[int, str] | None = None
        async for project in self.api.projects():
            root = PurePosixPath(project["workspaceRoot"])
            if PurePosixPath(cwd).is_relative_to(root) and (best is None or len(root.parts) > best[0]):
                best = (len(root.parts), project["id"])  # the innermost workspace holding cwd
        if best is None:
            raise AcpError(INVALID_PARAMS, f"no project of this token has its workspace at {cwd}", "NO_PROJECT")
        return best[1]

    def session(self, session_id: str) -> Session:
        session = self.sessions.get(session_id)
        if session is None:
            raise AcpError(RESOURCE_NOT_FOUND, "unknown session: create or load it first", "NOT_FOUND")
        return session

    async def update(self, session_id: str, update: dict[str, Any]) -> None:
        await self._require_conn().notify("session/update", {"sessionId": session_id, "update": update})

    def _require_conn(self) -> Connection:
        assert self.conn is not None, "attach the connection first"
        return self.conn


def _version() -> str:
    with contextlib.suppress(Exception):
        from importlib.metadata import version

        return version("threadloom")
    return "0"


async def serve_stdio(options: Options) -> None:
    """Speaks ACP on this process's stdin/stdout until the editor closes stdin."""
    from threadloom.agent.wire import LineReader, LineWriter

    bridge = Bridge(options)
    requests, notifications, cancellers = bridge.handlers()
    reader, writer = await LineReader.stdin(), await LineWriter.stdout()
    bridge.conn = Connection(reader, writer, requests, notifications, cancellers)
    try:
        await bridge.conn.serve()
    finally:
        await bridge.close()
        await writer.flush(within=5.0)

"""What the bridge serves beyond a plain ACP agent: steering, session settings, and Threadloom's own verbs.

- `_session/steering` (the extension claude-code-acp and codex-acp announce): a message sent into the run
  that is going, as `sendMessage(dispatch: {steerActive})` does;
- `session/set_config_option` and the older `session/set_mode`: the thread's runtime mode and model;
- `_threadloom/queue`, `_threadloom/fork` (and ACP's draft `session/fork`), `_threadloom/rollback`.

Each is one or two GraphQL operations with the bridge's token; the server's userErrors come back with their
stable code in the error's `data.code` (docs/acp.md lists them).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadloom.acp import documents as q
from threadloom.acp.api import payload
from threadloom.acp.rpc import AcpError, Params
from threadloom.acp.sessions import Session, absolute, text_of
from threadloom.acp.settings import MODE_OPTION, MODEL_OPTION, UnknownSetting, model_value, runtime_mode
from threadloom.agent.wire import INVALID_PARAMS

if TYPE_CHECKING:
    from threadloom.acp.bridge import Bridge

IN_PLACE = frozenset({"STEER_ACTIVE", "RESTART_ACTIVE"})  # the message joined the run that was going
RAN = frozenset({"COMPLETED", "INTERRUPTED", "FAILED"})  # runs a rollback undoes


class Verbs:
    def __init__(self, bridge: Bridge) -> None:
        self.bridge = bridge

    # ---- steering and the queue --------------------------------------------------------------------
    async def steer(self, params: Params) -> dict[str, Any]:
        """`_session/steering {sessionId, prompt, _meta.steering.idleBehavior?}`: `injected` when the message
        joined the running run (steered, or restarted with it where the agent cannot steer); with nothing
        running, `promptRequired` if the caller asked so (nothing sent), else `startedNewTurn` (a new run)."""
        _, session = self._session(params)
        text = text_of(params)
        steering = ((params.get("_meta") or {}).get("steering") or {}) if isinstance(params.get("_meta"), dict) else {}
        target = session.run_id or ((await self.bridge.api.thread(session.thread_id))["activeRun"] or {}).get("id")
        if target is None:
            if steering.get("idleBehavior") == "promptRequired":
                return {"outcome": "promptRequired", "reason": "noRunningTurn"}
            sent = await self._send(session, text, {"auto": True})
        else:
            sent = await self._send(session, text, {"steerActive": {"targetRunId": target}})
        # A target that ended meanwhile makes the message a new run (never lost): that is a new turn.
        outcome = "injected" if sent["appliedDispatch"] in IN_PLACE else "startedNewTurn"
        return {"outcome": outcome, "_meta": {"threadloom": _sent(sent)}}

    async def queue(self, params: Params) -> dict[str, Any]:
        """`_threadloom/queue {sessionId, prompt, wait?}`: the message as the thread's last queued run (it starts
        at once when nothing runs). Answered at once with the run, or with `wait`, when the run has ended,
        its updates streamed to the editor meanwhile, as a prompt's are."""
        session_id, session = self._session(params)
        text = text_of(params)
        dispatch = {"queueAfterActive": True}
        if params.get("wait"):
            return await self.bridge.send_and_follow(session_id, session, text, dispatch, prompt=False)
        return _sent(await self._send(session, text, dispatch))

    # ---- settings ----------------------------------------------------------------------------------
    async def set_config_option(self, params: Params) -> dict[str, Any]:
        """`session/set_config_option {sessionId, configId: mode|model, value}`: the thread's next runs use it."""
        session_id, session = self._session(params)
        config_id, value = params.get("configId"), str(params.get("value") or "")
        try:
            if config_id == MODE_OPTION:
                await self._set_mode(session, value)
            elif config_id == MODEL_OPTION:
                thread = await self.bridge.api.thread(session.thread_id)
                variables = {"t": session.thread_id, "i": thread["providerInstanceId"], "m": model_value(value)}
                payload((await self.bridge.api.execute(q.SET_MODEL, variables))["switchProvider"])
            else:
                unknown = f"no config option {config_id!r}: mode or model"
                raise AcpError(INVALID_PARAMS, unknown, "UNKNOWN_CONFIG_OPTION")
        except UnknownSetting as exc:
            raise AcpError(INVALID_PARAMS, str(exc), "INVALID_CONFIG_VALUE") from exc
        thread = await self.bridge.api.thread(session.thread_id)
        settings = self.bridge.settings(session, thread)
        if config_id == MODE_OPTION:  # an editor that shows the older modes API sees it too
            await self.bridge.update(session_id, {"sessionUpdate": "current_mode_update", "currentModeId": value})
        return {"configOptions": settings["configOptions"]}

    async def set_mode(self, params: Params) -> dict[str, Any]:
        """`session/set_mode {sessionId, modeId}`: the runtime mode, through ACP's older modes API."""
        session_id, session = self._session(params)
        try:
            await self._set_mode(session, str(params.get("modeId") or ""))
        except UnknownSetting as exc:
            raise AcpError(INVALID_PARAMS, str(exc), "INVALID_CONFIG_VALUE") from exc
        thread = await self.bridge.api.thread(session.thread_id)
        options = self.bridge.settings(session, thread)["configOptions"]
        await self.bridge.update(session_id, {"sessionUpdate": "config_option_update", "configOptions": options})
        return {}

    async def _set_mode(self, session: Session, value: str) -> None:
        variables = {"t": session.thread_id, "m": runtime_mode(value)}
        payload((await self.bridge.api.execute(q.SET_MODE, variables))["setRuntimeMode"])

    # ---- fork and rollback -------------------------------------------------------------------------
    async def fork(self, params: Params) -> dict[str, Any]:
        """`_threadloom/fork {sessionId, runId?, workspace?: OWN|SHARED, title?}`: a fork of the thread at the
        run (default: its latest completed run), as a new session of this bridge."""
        _, session = self._session(params)
        run_id = params.get("runId") or await self._latest_completed(session.thread_id)
        workspace = str(params.get("workspace") or "OWN").upper()
        variables = {"r": run_id, "w": workspace, "title": params.get("title")}
        if workspace not in {"OWN", "SHARED"}:
            raise AcpError(INVALID_PARAMS, "workspace is OWN or SHARED", "INVALID_INPUT")
        thread = payload((await self.bridge.api.execute(q.FORK, variables))["forkThread"])["thread"]
        fork = self.bridge.sessions[thread["id"]] = Session(thread["id"])
        return {"sessionId": thread["id"], **self.bridge.settings(fork, thread)}

    async def fork_session(self, params: Params) -> dict[str, Any]:
        """ACP's draft `session/fork {sessionId, cwd}`: `_threadloom/fork` at the latest completed run."""
        absolute(params.get("cwd"))
        return await self.fork({"sessionId": params.get("sessionId")})

    async def rollback(self, params: Params) -> dict[str, Any]:
        """`_threadloom/rollback {sessionId, runs | runOrdinal, dryRun?, previewToken?, restoreFiles?,
        overwrite?}`: the thread back to before its last `runs` runs that ran, or to right after run
        `runOrdinal` (0: before the first). A dry run answers the plan and its `previewToken`, changing nothing."""
        _, session = self._session(params)
        target = await self._target(session.thread_id, params.get("runs"), params.get("runOrdinal"))
        variables = {
            "t": session.thread_id,
            "o": target,
            "dry": bool(params.get("dryRun")),
            "token": params.get("previewToken"),
            "files": params.get("restoreFiles", True) is not False,
            "conflict": "OVERWRITE" if params.get("overwrite") else "REFUSE",
        }
        done = payload((await self.bridge.api.execute(q.ROLLBACK, variables))["rollbackToRun"])
        if variables["dry"]:
            return {"runOrdinal": target, "preview": done["preview"]}
        return {"runOrdinal": target, "rolledBackRunOrdinals": sorted(r["ordinal"] for r in done["rolledBackRuns"])}

    async def _target(self, thread_id: str, runs: Any, ordinal: Any) -> int:
        if (runs is None) == (ordinal is None):
            raise AcpError(INVALID_PARAMS, "give either runs (how many to undo) or runOrdinal", "INVALID_INPUT")
        if ordinal is not None:
            if not isinstance(ordinal, int) or isinstance(ordinal, bool) or ordinal < 0:
                raise AcpError(INVALID_PARAMS, "runOrdinal is a run's ordinal, or 0", "INVALID_INPUT")
            return ordinal
        if not isinstance(runs, int) or isinstance(runs, bool) or runs < 1:
            raise AcpError(INVALID_PARAMS, "runs is how many runs to undo, at least 1", "INVALID_INPUT")
        seen = 0
        async for run in self.bridge.api.runs_newest_first(thread_id):
            if run["status"] in RAN:
                seen += 1
                if seen == runs:
                    return int(run["ordinal"]) - 1
        raise AcpError(INVALID_PARAMS, f"the session has {seen} runs to undo, not {runs}", "NOTHING_TO_ROLL_BACK")

    async def _latest_completed(self, thread_id: str) -> str:
        async for run in self.bridge.api.runs_newest_first(thread_id):
            if run["status"] == "COMPLETED":
                return str(run["id"])
        raise AcpError(INVALID_PARAMS, "the session has no completed run to fork from", "NOTHING_TO_FORK")

    # ---- helpers -----------------------------------------------------------------------------------
    def _session(self, params: Params) -> tuple[str, Session]:
        session_id = str(params.get("sessionId") or "")
        return session_id, self.bridge.session(session_id)

    async def _send(self, session: Session, text: str, dispatch: dict[str, Any]) -> dict[str, Any]:
        variables = {"t": session.thread_id, "text": text, "d": dispatch}
        return payload((await self.bridge.api.execute(q.SEND, variables))["sendMessage"])


def _sent(sent: dict[str, Any]) -> dict[str, Any]:
    """What a message sent by a verb became: its run, how it was dispatched, its place in the queue."""
    run = sent["run"] or {}
    return {"runId": run.get("id"), "appliedDispatch": sent["appliedDispatch"], "queuePosition": run["queuePosition"]}

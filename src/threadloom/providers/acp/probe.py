"""`threadloom providers probe INSTANCE`: start the agent and try each method it advertised, harmlessly.

Agents advertise methods they do not implement, so the profile the engine plans with is checked here: in a
scratch workspace (a new session, nothing prompted), each advertised method is called on targets that
cannot lose anything (the probe's own sessions, a config option set to its current value, a steer or a
rewind of a session with no turn). A result counts as `works`; -32601 as `unsupported`; any other error as
`failed` for the methods that should have succeeded, and as `works` for the ones an agent may refuse the
probe's own idle, turnless session (steering, rewind: nothing to steer or rewind; fork, load, resume:
claude-agent-acp has no transcript to fork before a turn, Qwen Code will not load a session its own process
holds open): any answer but -32601 shows the method is there, and the note says what the agent answered.
The profile is stored under the agent's name and version, where the instance's runtimes (on every replica)
read it.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from threadloom import unprivileged
from threadloom.config import Settings
from threadloom.providers.acp import profile as m
from threadloom.providers.acp.driver import AcpDriver
from threadloom.providers.acp.profile import AcpProfile, MethodStatus, now_text
from threadloom.providers.acp.rpc import METHOD_NOT_FOUND, AcpProcess, RpcError
from threadloom.providers.contract import ProviderError, SessionScope
from threadloom.providers.registry import InstanceConfig, build_driver

PROBE_WAIT_S = 30.0
# Methods an agent may refuse the probe's idle session: any answer but -32601 shows the method is there.
REFUSALS_EXPECTED = frozenset({m.STEERING, m.REWIND, m.SESSION_FORK, m.SESSION_LOAD, m.SESSION_RESUME})


@dataclasses.dataclass(frozen=True, slots=True)
class ProbeReport:
    profile: AcpProfile

    def lines(self) -> list[str]:
        """What the CLI prints: the agent, then one line per tracked method."""
        p = self.profile
        out = [f"agent {p.agent_name} {p.agent_version} (ACP v{p.protocol_version}), probed {p.probed_at}"]
        for method in m.METHODS:
            note = p.notes.get(method)
            out.append(f"  {method:<28} {p.status(method)}" + (f"  ({note})" if note else ""))
        caps = p.capabilities()
        plan = {
            "steer": "native" if caps.supports_active_steering else "restart (interrupt, then the turn again)",
            "fork": _fork_plan(caps.can_fork_thread, caps.can_fork_from_turn),
            "rollback": "native" if caps.can_rollback_thread else "new session from context (files: checkpoints)",
            "resume": ", then ".join(
                [x for x in (m.SESSION_RESUME, m.SESSION_LOAD) if p.works(x)] + ["a new session with a handoff"]
            ),
        }
        out += [f"  plan: {name} = {how}" for name, how in plan.items()]
        return out


def _fork_plan(can_fork: bool, at_a_turn: bool) -> str:
    """A fork is native only at a turn (`domain.forks.resolve`): `session/fork`, then the copy rewound."""
    if at_a_turn:
        return "native (session/fork, then _session/rewind to the run)"
    if can_fork:
        return "new session with a handoff (session/fork works, but without _session/rewind not at a run)"
    return "new session with a handoff"


async def probe_instance(config: InstanceConfig, settings: Settings) -> ProbeReport:
    """Probe the instance `config` in a scratch project (a temporary workspace and state folder, removed
    after), as the agent user when the server would run agents as one; the profile goes to the instance's
    folder in the agents' state folder."""
    unprivileged.configure(settings.agent_uid, settings.agent_gid)
    driver = build_driver(config, settings.data_dir, settings.agents_dir)
    assert isinstance(driver, AcpDriver)
    with tempfile.TemporaryDirectory(prefix="threadloom-probe-") as tmp:
        root = Path(tmp)
        os.chmod(root, 0o711)
        workspace = root / "workspace"
        workspace.mkdir()
        unprivileged.own_state_dir(root, "state")
        unprivileged.grant_workspace(workspace)
        return await probe(driver, SessionScope("probe", str(workspace), root / "state"))


async def probe(driver: AcpDriver, scope: SessionScope) -> ProbeReport:
    """Start the agent for `scope` (a scratch project), probe it, store and return its profile."""
    process, scrub = await driver.spawn(scope)
    try:
        profile, _ = await driver.initialize(process)
        statuses, notes = await _try_all(process, profile, scope.workspace_root)
    finally:
        await process.close()
    cleaned = {k: scrub(v) for k, v in notes.items()}
    probed = dataclasses.replace(profile, probed=statuses, probed_at=now_text(), notes=cleaned)
    driver.learned(probed)
    return ProbeReport(probed)


async def _try_all(
    process: AcpProcess, profile: AcpProfile, cwd: str
) -> tuple[dict[str, MethodStatus], dict[str, str]]:
    statuses: dict[str, MethodStatus] = {}
    notes: dict[str, str] = {}

    async def attempt(method: str, call: Callable[[], Awaitable[Any]]) -> Any:
        if not profile.advertised.get(method):
            return None
        try:
            result = await call()
        except RpcError as error:
            if error.rpc_code == METHOD_NOT_FOUND:
                statuses[method], notes[method] = "unsupported", "advertised, but answered -32601"
            elif method in REFUSALS_EXPECTED:
                statuses[method], notes[method] = "works", f"refused an idle session: {error.rpc_code} {error.message}"
            else:
                statuses[method], notes[method] = "failed", f"error {error.rpc_code}: {error.message}"
            return None
        except ProviderError as error:
            if error.code == "exited":
                raise
            statuses[method], notes[method] = "failed", error.message
            return None
        statuses[method] = "works"
        return result

    def call(method: str, params: dict[str, Any]) -> Callable[[], Awaitable[Any]]:
        return lambda: process.request(method, params, PROBE_WAIT_S)

    where = {"cwd": cwd, "mcpServers": []}
    created = await attempt(m.SESSION_NEW, call(m.SESSION_NEW, where))
    if not isinstance(created, dict) or not isinstance(created.get("sessionId"), str):
        statuses.setdefault(m.SESSION_NEW, "failed")
        return statuses, notes
    sid = created["sessionId"]
    await attempt(m.SESSION_LIST, call(m.SESSION_LIST, {"cwd": cwd}))
    option = next((o for o in created.get("configOptions") or [] if isinstance(o, dict) and "currentValue" in o), None)
    if option is not None:
        same = {"sessionId": sid, "configId": option.get("id"), "value": option.get("currentValue")}
        await attempt(m.SET_CONFIG_OPTION, call(m.SET_CONFIG_OPTION, same))
    else:  # nothing to set: only whether the method exists can be seen (-32602 for the unknown option)
        statuses[m.SET_CONFIG_OPTION], notes[m.SET_CONFIG_OPTION] = "not_probed", "the session offers no option"
    idle = [{"type": "text", "text": "threadloom probe"}]
    await attempt(m.STEERING, call(m.STEERING, {"sessionId": sid, "prompt": idle}))
    await attempt(m.REWIND, call(m.REWIND, {"sessionId": sid, "numTurns": 0}))
    forked = await attempt(m.SESSION_FORK, call(m.SESSION_FORK, {"sessionId": sid, **where}))
    await attempt(m.SESSION_RESUME, call(m.SESSION_RESUME, {"sessionId": sid, **where}))
    await attempt(m.SESSION_LOAD, call(m.SESSION_LOAD, {"sessionId": sid, **where}))
    target = forked.get("sessionId") if isinstance(forked, dict) and isinstance(forked.get("sessionId"), str) else sid
    await attempt(m.SESSION_CLOSE, call(m.SESSION_CLOSE, {"sessionId": target}))
    return statuses, notes

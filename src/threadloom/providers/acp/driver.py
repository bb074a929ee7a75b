"""The `acp` driver: any Agent Client Protocol (v1) agent as a provider instance.

```toml
[instances.gemini]
driver = "acp"
command = ["gemini", "--experimental-acp"]   # argv; {workspace}, {state_dir} and {own_workspaces} are filled in
env = { GEMINI_MODEL_HOST = "..." }           # extra variables (redacted from everything the agent emits)
base_url = "http://127.0.0.1:8099"            # a model endpoint on loopback: its port alone is forwarded
api_key_env = "GEMINI_API_KEY"                # the NAME of the server variable holding the key (optional)
model = "gemini-2.5-pro"                      # picked through the session's `model` config option, if offered
max_line_bytes = 16777216                     # a longer message is skipped with a warning (default 16 MiB)
cancel_drain_s = 5.0                          # how long a cancelled prompt may take to end before the driver ends it
```

One runtime = one agent process serving one project, started like every agent: `spawn_process` (its own
PID namespace, the agent user when the server is root), the minimal environment of `agent_cli.child_env`
(plus a private HOME and TMPDIR in the project's agent state folder), and always a network namespace of its
own (`providers.netns`, only a loopback `base_url`'s port forwarded): an ACP agent may run its commands itself
without a sandbox, so the host's loopback -- the metrics and main ports -- is never in its reach. Otherwise
the agent's commands are confined by the agent's own sandbox, as with the other real agents. When the
process dies its runtime ends with `RuntimeExited`; the next work on the instance starts a new process and
resumes the threads (the engine's session manager).

The instance plans with its capability profile (`profile.AcpProfile`): what `initialize` advertised,
checked by `threadloom providers probe`; see docs/providers.md, "ACP".
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from threadloom import unprivileged
from threadloom.domain.settings_compat import InPlace
from threadloom.providers.acp.profile import UNKNOWN, AcpProfile, ProfileStore
from threadloom.providers.acp.rpc import DEFAULT_MAX_LINE, AcpProcess
from threadloom.providers.acp.runtime import AcpRuntime, Scrubber
from threadloom.providers.acp.sessions import SessionRecords
from threadloom.providers.agent_cli import child_env, driver_secrets
from threadloom.providers.child_process import spawn_process
from threadloom.providers.contract import Capabilities, ProviderError, ProviderRuntime, SessionScope
from threadloom.providers.netns import NetworkSandboxUnavailable, isolated, loopback_ports

log = logging.getLogger("threadloom.providers.acp")

OPTIONS = frozenset({"command", "env", "api_key_env", "model", "base_url", "max_line_bytes", "cancel_drain_s"})
PROTOCOL_VERSION = 1
CLIENT_INFO = {"name": "threadloom", "title": "Threadloom", "version": "0.1.0"}
# What this client serves the agent: no file system or terminal of its own (the agent works in the
# workspace itself), form elicitations (questions) yes.
CLIENT_CAPABILITIES = {"fs": {"readTextFile": False, "writeTextFile": False}, "terminal": False,
                       "elicitation": {"form": {}}}  # fmt: skip


def check_options(name: str, options: Mapping[str, Any]) -> str | None:
    """What is wrong with an `acp` instance's options, or None (read when the providers file is)."""
    command = options.get("command")
    if not isinstance(command, list) or not command or not all(isinstance(a, str) and a for a in command):
        return f"provider instance {name!r}: `command` must be a non-empty list of strings (the agent's argv)"
    size = options.get("max_line_bytes", DEFAULT_MAX_LINE)
    if isinstance(size, bool) or not isinstance(size, int) or not 1024 <= size <= 1 << 30:
        return f"provider instance {name!r}: `max_line_bytes` must be a whole number from 1024 to 1073741824"
    drain = options.get("cancel_drain_s", 5.0)
    if isinstance(drain, bool) or not isinstance(drain, int | float) or not 0 < drain <= 300:
        return f"provider instance {name!r}: `cancel_drain_s` must be more than 0 and at most 300 seconds"
    return None


def embedded_context(initialize: Mapping[str, Any]) -> bool:
    caps = (initialize.get("agentCapabilities") or {}).get("promptCapabilities") or {}
    return bool(caps.get("embeddedContext"))


def fill(text: str, scope: SessionScope) -> str:
    """`{workspace}`, `{state_dir}` and `{own_workspaces}` in a command argument or env value."""
    return (
        text.replace("{workspace}", scope.workspace_root)
        .replace("{state_dir}", str(scope.state_dir))
        .replace("{own_workspaces}", scope.own_workspaces or "")
    )


class AcpDriver:
    """One configured `acp` instance."""

    def __init__(self, instance_id: str, state_dir: Path, options: Mapping[str, Any]) -> None:
        self.instance_id = instance_id
        self.state_dir = state_dir
        self.command: list[str] = [str(a) for a in options["command"]]
        self.extra_env = {str(k): str(v) for k, v in (options.get("env") or {}).items()}
        self.api_key_env = str(options["api_key_env"]) if options.get("api_key_env") else None
        self.model = str(options["model"]) if options.get("model") else None
        self.base_url = str(options["base_url"]) if options.get("base_url") else None
        self.max_line = int(options.get("max_line_bytes", DEFAULT_MAX_LINE))
        self.cancel_drain_s = float(options.get("cancel_drain_s", 5.0))
        self.store = ProfileStore(state_dir)
        self._profile = self.store.latest() or UNKNOWN

    def profile(self) -> AcpProfile:
        """The profile the instance plans with: the latest stored (probed or seen), else UNKNOWN."""
        self._profile = self.store.latest() or self._profile
        return self._profile

    def capabilities(self) -> Capabilities:
        return self._profile.capabilities()

    def settings_in_place(self) -> InPlace:
        """Neither: a session's model and permission mode are chosen when it is made or loaded (config options
        differ per agent), so a change starts a new session with a summary."""
        return InPlace(model=False, runtime_mode=False)

    def learned(self, profile: AcpProfile) -> None:
        """A runtime found an advertised method missing: the instance plans without it from now on."""
        self._profile = profile
        try:
            self.store.save(profile)
        except OSError:
            log.exception("acp: could not store the profile of %s", self.instance_id)

    def argv(self, scope: SessionScope) -> list[str]:
        """The command with its placeholders filled; an argument left empty (no `{own_workspaces}`) is
        dropped, with the option flag right before it."""
        out: list[str] = []
        for arg in self.command:
            value = fill(arg, scope)
            if value or not arg:
                out.append(value)
            elif out and out[-1].startswith("-") and len(out) > 1:
                out.pop()
        return out

    async def spawn(self, scope: SessionScope) -> tuple[AcpProcess, Scrubber]:
        """The agent process for `scope`, contained and with its minimal environment (not yet initialized)."""
        state = scope.state_dir
        state.mkdir(parents=True, exist_ok=True)
        unprivileged.agent_folders(state, ("home", "tmp"))
        extra = {"HOME": str(state / "home"), "TMPDIR": str(state / "tmp")}
        extra.update({k: fill(v, scope) for k, v in self.extra_env.items()})
        env = child_env(self.api_key_env, extra, require_key=self.api_key_env is not None)
        names = tuple(n for n in (self.api_key_env, *self.extra_env) if n and n not in ("HOME", "TMPDIR"))
        scrubber = Scrubber(driver_secrets(env, names))
        # Every ACP agent, full_access or not, gets a network namespace of its own: unlike Codex and Claude
        # Code, whose own sandboxes keep the commands of other modes off the network, an ACP agent may run
        # its commands itself, unsandboxed, so the host's loopback (metrics port, main port) must not be there.
        try:
            argv: Sequence[str] = isolated(self.argv(scope), loopback_ports(self.base_url))
        except NetworkSandboxUnavailable as error:
            raise ProviderError("network_sandbox_unavailable", str(error)) from error
        try:
            proc = await spawn_process(argv, env=env, cwd=str(state))
        except OSError as error:
            raise ProviderError("cli_missing", f"cannot start {self.command[0]}: {error.strerror}") from error
        name = f"acp:{self.instance_id}:{scope.project_id}"
        return AcpProcess(proc, name, max_line=self.max_line, scrub=scrubber), scrubber

    async def initialize(self, process: AcpProcess) -> tuple[AcpProfile, dict[str, Any]]:
        """The handshake; the profile of the agent that answered (stored, probed or not, if it is new)."""
        params = {
            "protocolVersion": PROTOCOL_VERSION,
            "clientCapabilities": CLIENT_CAPABILITIES,
            "clientInfo": CLIENT_INFO,
        }
        result = await process.request("initialize", params, 120.0)
        seen = AcpProfile.from_initialize(result if isinstance(result, dict) else {})
        if seen.protocol_version != PROTOCOL_VERSION:
            raise ProviderError("unsupported_protocol", f"the agent speaks ACP version {seen.protocol_version}, not 1")
        stored = self.store.get(seen.key)
        # A new agent or version, or one advertising otherwise than when probed: its own word until probed.
        profile = stored if stored is not None and stored.advertised == seen.advertised else seen
        if self.store.read()[1] != profile.key or stored is None:
            try:
                self.store.save(profile)
            except OSError:
                log.exception("acp: could not store the profile of %s", self.instance_id)
        self._profile = profile
        return profile, result if isinstance(result, dict) else {}

    async def open_session(self, scope: SessionScope) -> ProviderRuntime:
        process, scrubber = await self.spawn(scope)
        try:
            profile, answer = await self.initialize(process)
        except ProviderError:
            await process.close()
            raise
        records = SessionRecords(scope.state_dir)
        return AcpRuntime(
            process, scrubber, profile, records, model=self.model, cancel_drain_s=self.cancel_drain_s,
            on_learned=self.learned, embedded_context=embedded_context(answer),
        )  # fmt: skip

"""The `acp` driver's runtime driven directly over the scripted agent's ACP face (a real agent process, no
server): what the GraphQL API does not show — the typed usage a usage ledger will read, the line limit at
the reader, and that an ACP session id never leaves the driver in an error.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tests.support.acp_scripted import acp_command
from tests.support.waiting import until
from threadloom.providers import contract as ev
from threadloom.providers.acp.driver import AcpDriver
from threadloom.providers.acp.runtime import AcpRuntime
from threadloom.providers.acp.sessions import SessionRecords
from threadloom.providers.acp.updates import AcpUsage
from threadloom.providers.contract import SessionScope, ThreadSettings


class Agent:
    """An open runtime and every event it emitted so far."""

    def __init__(self, runtime: AcpRuntime, scope: SessionScope) -> None:
        self.runtime = runtime
        self.scope = scope
        self.events: list[ev.ProviderEvent] = []
        self.sink: list[tuple[str, str | None, AcpUsage]] = []
        runtime.usage_sink = lambda thread, turn, usage: self.sink.append((thread, turn, usage))
        self._task = asyncio.create_task(self._pump())

    async def _pump(self) -> None:
        async for event in self.runtime.events():
            self.events.append(event)

    async def turn(self, thread: str, text: str) -> ev.TurnCompleted:
        turn = await self.runtime.start_turn(thread, text)

        async def ended() -> ev.TurnCompleted | None:
            done = [e for e in self.events if isinstance(e, ev.TurnCompleted) and e.native_turn == turn]
            return done[0] if done else None

        return await until(ended, interval=0.01)

    async def close(self) -> None:
        await self.runtime.close()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


@contextlib.asynccontextmanager
async def agent(tmp_path: Path, *args: str, **options: object) -> AsyncIterator[Agent]:
    workspace = tmp_path / "ws"
    workspace.mkdir(exist_ok=True)
    driver = AcpDriver("acp-test", tmp_path / "agents", {"command": acp_command(*args), **options})
    scope = SessionScope("p", str(workspace), tmp_path / "agents" / "p")
    runtime = await driver.open_session(scope)
    assert isinstance(runtime, AcpRuntime)
    opened = Agent(runtime, scope)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.mark.parametrize("fault", [(), ("--acp-fault", "trailing-usage")])
async def test_usage_is_parsed_typed_and_a_trailing_update_counts_for_the_turn_just_ended(
    tmp_path: Path, fault: tuple[str, ...]
) -> None:
    async with agent(tmp_path, *fault) as a:
        thread = await a.runtime.start_thread(ThreadSettings(cwd=a.scope.workspace_root))
        done = await a.turn(thread, "@usage 120 30 0.25\n@reply counted")
        assert done.status == "completed"

        async def reported() -> AcpUsage | None:
            found = a.runtime.usage.get(thread)
            return found if found is not None and found.context_used is not None else None

        usage = await until(reported)
        assert (usage.context_used, usage.context_size) == (150, 200_000)
        assert (usage.cost_amount, usage.cost_currency) == (0.25, "USD")
        assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (120, 30, 150)
        assert {turn for _, turn, _ in a.sink} == {done.native_turn}  # the trailing one too


async def test_a_line_over_the_limit_is_skipped_and_the_next_ones_are_read(tmp_path: Path) -> None:
    async with agent(
        tmp_path, "--acp-fault", "huge-line", "--acp-huge-line-bytes", "300000", max_line_bytes=65536
    ) as a:
        thread = await a.runtime.start_thread(ThreadSettings(cwd=a.scope.workspace_root))
        done = await a.turn(thread, "@reply still read")
        assert done.status == "completed"
        warnings = [e.message for e in a.events if isinstance(e, ev.Warning)]
        assert len(warnings) == 1 and "over the 65536-byte limit; skipped" in warnings[0]
        texts = [e.text for e in a.events if isinstance(e, ev.ItemCompleted) and e.kind == "assistant_message"]
        assert texts == ["still read"]
        assert a.runtime.alive


async def test_the_twin_a_line_under_the_limit_is_read_whole(tmp_path: Path) -> None:
    async with agent(tmp_path, "--acp-fault", "huge-line", "--acp-huge-line-bytes", "30000", max_line_bytes=65536) as a:
        thread = await a.runtime.start_thread(ThreadSettings(cwd=a.scope.workspace_root))
        await a.turn(thread, "@reply read")
        assert not [e for e in a.events if isinstance(e, ev.Warning)]
        thoughts = [e.text for e in a.events if isinstance(e, ev.ItemCompleted) and e.kind == "reasoning"]
        assert thoughts == ["x" * 30000]


async def test_an_acp_session_id_never_leaves_the_driver(tmp_path: Path) -> None:
    async with agent(tmp_path) as a:
        thread = await a.runtime.start_thread(ThreadSettings(cwd=a.scope.workspace_root))
        records = SessionRecords(a.scope.state_dir)
        record = records.load(thread)
        assert record is not None and record.session_id not in thread
        assert (records.folder / f"{thread}.json").stat().st_mode & 0o077 == 0
        sid = record.session_id
        said = await a.turn(thread, f"@reply mine is {sid} ok")  # the agent prints it: the stream hides it
        texts = [e.text for e in a.events if isinstance(e, ev.ItemCompleted) and e.kind == "assistant_message"]
        assert said.status == "completed" and texts == ["mine is <acp session> ok"]
        failed = await a.turn(thread, f"@fail lost {sid}")  # and so does a turn's error
        assert failed.status == "failed" and failed.error == "lost <acp session>"
        assert sid not in " ".join(repr(e) for e in a.events)


async def test_the_twin_text_without_a_session_id_is_left_as_it_is(tmp_path: Path) -> None:
    async with agent(tmp_path) as a:
        thread = await a.runtime.start_thread(ThreadSettings(cwd=a.scope.workspace_root))
        failed = await a.turn(thread, "@fail lost 0d5b2d018-8908-4c1f-b92c-90df414dbc51")
        assert failed.error == "lost 0d5b2d018-8908-4c1f-b92c-90df414dbc51"


@pytest.mark.parametrize(
    ("instance", "code"), [("nope", "UNKNOWN_PROVIDER_INSTANCE"), ("scripted", "NOT_ACP"), ("broken", "PROBE_FAILED")]
)
def test_the_probe_cli_refuses_what_it_cannot_probe_with_a_coded_line(tmp_path: Path, instance: str, code: str) -> None:
    config = tmp_path / "providers.toml"
    config.write_text('[instances.broken]\ndriver = "acp"\ncommand = ["/nonexistent/agent"]\n')
    env = {**os.environ, "THREADLOOM_PROVIDERS": str(config)}
    argv = [sys.executable, "-m", "threadloom", "providers", "probe", instance, "--data-dir", str(tmp_path / "d")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.startswith(f"threadloom: {code}: "), done.stderr
    assert not (tmp_path / "d" / "agents" / instance / "acp-profiles.json").exists()  # nothing stored


def test_the_twin_the_probe_cli_stores_and_prints_a_working_agents_profile(tmp_path: Path) -> None:
    config = tmp_path / "providers.toml"
    config.write_text(f'[instances.ok]\ndriver = "acp"\ncommand = {json.dumps(acp_command("--acp-without", "fork"))}\n')
    env = {**os.environ, "THREADLOOM_PROVIDERS": str(config)}
    argv = [sys.executable, "-m", "threadloom", "providers", "probe", "ok", "--data-dir", str(tmp_path / "d")]
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "session/fork                 not_advertised" in done.stdout
    assert "_session/steering            works" in done.stdout
    stored = json.loads((tmp_path / "d" / "agents" / "ok" / "acp-profiles.json").read_text())
    assert stored["latest"] == "threadloom-scripted@0.1.0"
    assert stored["profiles"][stored["latest"]]["probed"]["_session/rewind"] == "works"


async def test_a_cancel_the_agent_never_answers_ends_the_turn_at_the_drain_timeout(tmp_path: Path) -> None:
    """The agent is stopped (SIGSTOP on its process group) while its prompt runs: neither `session/cancel` nor
    `$/cancel_request` is answered, so the driver ends the turn as interrupted after `cancel_drain_s`; the
    agent's late answer, once it goes on, is ignored and the session takes the next prompt."""
    async with agent(tmp_path, cancel_drain_s=0.5) as a:
        thread = await a.runtime.start_thread(ThreadSettings(cwd=a.scope.workspace_root))
        turn = await a.runtime.start_turn(thread, "@await gate\n@reply late")

        async def started() -> bool | None:
            return any(isinstance(e, ev.TurnStarted) for e in a.events) or None

        await until(started)
        group = a.runtime.process.proc.pid
        os.killpg(group, signal.SIGSTOP)
        try:
            await a.runtime.interrupt_turn(thread, turn)

            async def ended() -> ev.TurnCompleted | None:
                done = [e for e in a.events if isinstance(e, ev.TurnCompleted) and e.native_turn == turn]
                return done[0] if done else None

            assert (await until(ended)).status == "interrupted"
        finally:
            os.killpg(group, signal.SIGCONT)
        nxt = await a.turn(thread, "@reply next")
        assert nxt.status == "completed"
        assert [e.status for e in a.events if isinstance(e, ev.TurnCompleted)] == ["interrupted", "completed"]

"""The JSON-lines peer under a misbehaving child: nothing may look alive while nothing moves."""

from __future__ import annotations

import os
import select
import signal
import sys
from pathlib import Path

import pytest

from tests.support.waiting import until
from threadloom.providers import child_process
from threadloom.providers.contract import ProviderError
from threadloom.providers.jsonlines import JsonLinesProcess

# Answers the first request with a line longer than the reader takes, then waits for ever.
BAD_PEER = """
import sys, time
sys.stdin.readline()
print('{"id": 1, "result": "' + 'x' * 10000 + '"}', flush=True)
time.sleep(3600)
"""


async def test_unreadable_output_stops_the_child_and_fails_its_requests(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(child_process, "LINE_LIMIT", 1024)
    peer = await JsonLinesProcess.spawn([sys.executable, "-c", BAD_PEER], env={}, name="bad-peer")
    with pytest.raises(ProviderError) as raised:
        await peer.request("initialize", {}, wait_s=30)
    assert raised.value.code == "exited"
    assert await peer.incoming.get() is None  # the end of the stream is announced
    assert not peer.alive and peer.exit_code is not None
    await peer.close()


# A response nobody asked for (an id that cannot be ours), then an error that is a plain string.
ODD_PEER = """
import sys
sys.stdin.readline()
print('{"id": [1], "result": {}}', flush=True)
print('{"id": 1, "error": "nope"}', flush=True)
sys.stdin.read()
"""


async def test_odd_responses_are_ignored_or_read_as_errors() -> None:
    peer = await JsonLinesProcess.spawn([sys.executable, "-c", ODD_PEER], env={}, name="odd-peer")
    with pytest.raises(ProviderError, match="nope"):
        await peer.request("initialize", {}, wait_s=30)
    assert peer.alive
    await peer.close()
    assert not peer.alive


async def test_a_stopped_agent_takes_what_it_started_in_its_own_session_with_it(tmp_path: Path) -> None:
    """An agent's helper in a session of its own (as Codex's sandboxed file helper is) is not in the agent's
    process group; stopping the agent still ends it, instead of leaving it to init."""
    pidfile = tmp_path / "helper.pid"
    script = f"setsid sleep 600 & echo $! > {pidfile}; cat >/dev/null"  # cat: the agent ends on stdin's EOF
    proc = await child_process.spawn_process(["sh", "-c", script], env={"PATH": os.environ["PATH"]})

    async def helper_started() -> bool:
        return pidfile.exists() and pidfile.read_text().strip().isdigit()

    await until(helper_started, within=10)
    helper = int(pidfile.read_text())
    assert child_process._stat(helper) is not None
    await child_process.stop_child(proc)
    assert proc.returncode == 0  # the agent ended on its own (EOF), as a real CLI does

    async def helper_gone() -> bool:
        fields = child_process._stat(helper)
        return fields is None or fields[0] == b"Z"  # gone, or dead and waiting for init to reap it

    await until(helper_gone, within=10)


async def test_a_killed_child_is_not_alive_before_the_event_loop_reaps_it() -> None:
    """Between a child's death and the event loop noticing it, a turn sent to it would be lost with it: a
    killed agent must read as dead at once, so the next turn starts a new process instead."""
    proc = await child_process.spawn_process(["sleep", "60"], env={"PATH": os.environ["PATH"]})
    child = child_process.ChildProcess(proc, "sleeper")
    child.start()
    assert child.alive
    os.kill(proc.pid, signal.SIGKILL)
    # Blocking on purpose: the event loop must not run (and hand over the exit) before the checks below.
    exited = os.pidfd_open(proc.pid)
    try:
        assert select.select([exited], [], [], 10)[0], "the killed child did not exit"
    finally:
        os.close(exited)
    assert proc.returncode is None  # the event loop has not seen it yet…
    assert not child.alive and child.dead  # …and still it reads as dead
    await child.wait_closed()
    assert proc.returncode == -signal.SIGKILL

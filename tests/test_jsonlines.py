"""The JSON-lines peer under a misbehaving child: nothing may look alive while nothing moves."""

from __future__ import annotations

import asyncio
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


async def test_a_child_its_owner_forgot_does_not_hold_up_the_exit() -> None:
    """A start cancelled mid-way (by a shutdown) leaves a child nobody closes; at the process's exit asyncio
    cancels its reader, which must stop the child rather than wait for it: the server hung until SIGKILL."""
    child = await JsonLinesProcess.spawn([sys.executable, "-c", "import time; time.sleep(3600)"], env={}, name="left")
    reader = child._tasks[0]
    await asyncio.sleep(0)  # one step of the loop: the reader is now reading (a task cancelled unstarted never runs)
    reader.cancel()
    done, _ = await asyncio.wait([reader], timeout=10)  # a bound for a broken build, not a timing claim
    assert done == {reader} and reader.cancelled()
    assert child.proc.returncode is not None and not child.alive


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


def _helper_of(root: int, marker: str) -> int | None:
    """The host pid of the process below `root` whose command line holds `marker` (an agent in its own PID
    namespace knows its helpers by other numbers)."""
    for pid, _ in child_process.descendants(root):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as file:
                if marker.encode() in file.read():
                    return pid
        except OSError:
            continue
    return None


async def _gone(pid: int) -> None:
    async def dead() -> bool:
        fields = child_process._stat(pid)
        return fields is None or fields[0] == b"Z"  # gone, or dead and waiting to be reaped

    await until(dead, within=10)


# An agent that starts a helper in a session of its own (as Codex's sandboxed file helper is) and ends
# on stdin's EOF, as the real CLIs do.
HELPER_AGENT = "setsid sleep 600.{n} & cat >/dev/null"


async def test_a_stopped_agent_takes_what_it_started_in_its_own_session_with_it() -> None:
    """An agent's helper in a session of its own is not in the agent's process group; stopping the agent
    still ends it, instead of leaving it to init."""
    script = HELPER_AGENT.format(n=os.getpid())
    proc = await child_process.spawn_process(["sh", "-c", script], env={"PATH": os.environ["PATH"]})

    async def helper_started() -> int | None:
        return _helper_of(proc.pid, f"600.{os.getpid()}")

    helper = await until(helper_started, within=10)
    await child_process.stop_child(proc)
    assert proc.returncode == 0  # the agent ended on its own (EOF), as a real CLI does
    await _gone(helper)


# Threadloom's stand-in: starts the agent, prints the agent's pid, then waits to be killed.
STARTER = """
import asyncio, os, sys
from threadloom.providers import child_process

async def main():
    proc = await child_process.spawn_process(["sh", "-c", sys.argv[1]], env={"PATH": os.environ["PATH"]})
    print(proc.pid, flush=True)
    await asyncio.sleep(600)

asyncio.run(main())
"""


async def test_everything_an_agent_started_dies_with_threadloom_killed(tmp_path: Path) -> None:
    """Killed with -9, Threadloom stops nothing itself: its agents and every process they started, in
    sessions of their own included, still end with it (the agent's PID namespace dies with its parent)."""
    marker = f"600.{os.getpid()}1"
    starter = await asyncio.create_subprocess_exec(
        sys.executable, "-c", STARTER, f"setsid sleep {marker} & cat >/dev/null", stdout=asyncio.subprocess.PIPE
    )
    assert starter.stdout is not None
    agent = int(await asyncio.wait_for(starter.stdout.readline(), 30))

    async def helper_started() -> int | None:
        return _helper_of(agent, marker)

    helper = await until(helper_started, within=10)
    tree = [pid for pid, _ in child_process.descendants(agent)]
    starter.kill()
    await starter.wait()
    for pid in [agent, *tree]:
        await _gone(pid)
    assert helper in tree


async def test_a_killed_child_is_not_alive_before_the_event_loop_reaps_it() -> None:
    """Between a child's death and the event loop noticing it, a turn sent to it would be lost with it: a
    killed agent must read as dead at once, so the next turn starts a new process instead."""
    # The agent says it is up first: a kill that lands while `unshare` is still setting up its child's death
    # signal (microseconds after the start, seen under load) would leave the sleep holding the pipes for 60 s.
    argv = ["sh", "-c", "echo up; exec sleep 60"]
    proc = await child_process.spawn_process(argv, env={"PATH": os.environ["PATH"]})
    assert proc.stdout is not None and await asyncio.wait_for(proc.stdout.readline(), 30) == b"up\n"
    child = child_process.ChildProcess(proc, "sleeper")
    child.start()
    assert child.alive
    # Opened before the kill: asyncio's watcher thread may reap the child at once, and its pid with it.
    exited = os.pidfd_open(proc.pid)
    signal.pidfd_send_signal(exited, signal.SIGKILL)
    # Blocking on purpose: the event loop must not run (and hand over the exit) before the checks below.
    try:
        assert select.select([exited], [], [], 10)[0], "the killed child did not exit"
    finally:
        os.close(exited)
    assert proc.returncode is None  # the event loop has not seen it yet…
    assert not child.alive and child.dead  # …and still it reads as dead
    await child.wait_closed()
    assert proc.returncode == -signal.SIGKILL

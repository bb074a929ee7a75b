"""`threadloom.subprocesses.create_subprocess_exec`: a child made with vfork (`subprocess.Popen`) under uvloop,
the server's loop, behaving as `asyncio.create_subprocess_exec`'s: pipes both ways, exit codes, signals,
large output, many at once, none left unreaped. Each check runs on uvloop and, the twin, on the standard loop
(where the helper is asyncio's own)."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import io
import os
import signal
import subprocess
from asyncio import unix_events
from collections.abc import Callable, Coroutine
from typing import Any

import psutil
import pytest
import uvloop

from tests.support import processes
from tests.support.waiting import until
from threadloom import subprocesses
from threadloom.subprocesses import create_subprocess_exec

LOOPS: dict[str, Callable[[], asyncio.AbstractEventLoop]] = {
    "uvloop": uvloop.new_event_loop,
    "asyncio": asyncio.SelectorEventLoop,
}
PIPES = {"stdin": asyncio.subprocess.PIPE, "stdout": asyncio.subprocess.PIPE, "stderr": asyncio.subprocess.PIPE}


def _reaped(pid: int) -> bool:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        return True
    return False


def _open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


def _run(loop: str, work: Callable[[], Coroutine[Any, Any, None]]) -> None:
    with asyncio.Runner(loop_factory=LOOPS[loop]) as runner:
        runner.run(work())


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_child_talks_exits_and_is_reaped_as_asyncios_would(loop: str) -> None:
    async def work() -> None:
        cat = await create_subprocess_exec("cat", **PIPES)
        if loop == "uvloop":  # made by subprocess.Popen (vfork), not by libuv (fork)
            assert isinstance(cat._transport._proc, subprocess.Popen)  # type: ignore[attr-defined]
        assert cat.stdin is not None and cat.stdout is not None
        cat.stdin.write(b"one line\n")
        await cat.stdin.drain()
        assert await cat.stdout.readline() == b"one line\n"
        out, err = await cat.communicate(b"the rest")
        assert (out, err, cat.returncode) == (b"the rest", b"", 0)

        big = await create_subprocess_exec("head", "-c", str(4 << 20), "/dev/zero", **PIPES)
        out, _ = await big.communicate()
        assert len(out) == 4 << 20 and big.returncode == 0

        failing = await create_subprocess_exec("sh", "-c", "echo no >&2; exit 3", **PIPES)
        assert await failing.communicate() == (b"", b"no\n") and failing.returncode == 3

        sleeper = await create_subprocess_exec("sleep", "60", **PIPES, start_new_session=True)
        sleeper.kill()
        assert await asyncio.wait_for(sleeper.wait(), 10) == -9

        many = [await create_subprocess_exec("sh", "-c", f"exit {i % 5}", **PIPES) for i in range(40)]
        codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in many)), 30)
        assert codes == [i % 5 for i in range(40)]
        for child in [cat, big, failing, sleeper, *many]:  # every child reaped: no zombie left
            assert _reaped(child.pid)

    _run(loop, work)


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_program_that_cannot_start_raises_as_asyncios_would(loop: str) -> None:
    async def work() -> None:
        before = {child.pid for child in psutil.Process().children()}
        with pytest.raises(FileNotFoundError):
            await create_subprocess_exec("/no/such/program", **PIPES)
        assert {child.pid for child in psutil.Process().children()} <= before

    _run(loop, work)


def _fork_before_exec() -> None:
    """Run in the child before its exec: a second process of the same program, in the child's group, holding
    the child's pipes (as `bwrap` forks its sandbox's first process)."""
    os.fork()


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_start_cancelled_at_any_step_returns_at_once_and_leaves_no_process(loop: str) -> None:
    """The caller is cancelled after 0, 1, 2 ... steps of the loop, so at every point of the start: the call
    ends at once and the child's whole group is killed. asyncio's own cleanup killed the child alone and then
    waited for its pipes, which the second process held open: the call never returned (an agent's interrupted
    `@write` under `bwrap` hung its turn so). The twin: a start left to finish returns the running child."""

    async def work() -> None:
        steps = 0
        while True:  # until the start is quicker than the cancel
            argv = ["sleep", f"600.{os.getpid()}{steps}"]  # told apart from every other process
            start = asyncio.ensure_future(
                create_subprocess_exec(*argv, start_new_session=True, preexec_fn=_fork_before_exec, **PIPES)
            )
            for _ in range(steps):
                await asyncio.sleep(0)
            start.cancel()
            async with asyncio.timeout(10):  # the old cleanup: forever
                with contextlib.suppress(asyncio.CancelledError):
                    await start
            if not start.cancelled():  # it had finished: the child runs, both its processes
                child = start.result()
                assert len(processes.with_command_line(argv)) == 2
                os.killpg(child.pid, signal.SIGKILL)
                await child.communicate()

            async def gone(argv: list[str] = argv) -> bool:
                return not processes.with_command_line(argv)

            await until(gone, within=10, interval=0.02)
            if not start.cancelled():
                break
            steps += 1
        assert steps > 1, steps  # cancelled at several points of the start before one came too late

    _run(loop, work)


@pytest.mark.parametrize("loop", list(LOOPS))
def test_a_cancelled_communicate_kills_the_childs_group_and_reaps_it_before_the_cancel_goes_on(loop: str) -> None:
    """`subprocesses.communicate`: a shell that started a `sleep`; the caller is cancelled while they run. When
    the cancel reaches the caller, the group is killed and the shell reaped (asyncio's own `communicate` left
    both running). The twin: left alone, the same call answers with the shell's output."""

    async def work() -> None:
        argv = ["sleep", f"600.{os.getpid()}{len(loop)}"]
        shell = await create_subprocess_exec(
            "sh", "-c", f"echo started; {' '.join(argv)}; echo never", start_new_session=True, **PIPES
        )
        call = asyncio.ensure_future(subprocesses.communicate(shell, b"", group=True))
        await asyncio.sleep(0)  # the call begins (a task cancelled before its first step never runs at all)

        async def started() -> bool:
            return bool(processes.with_command_line(argv))

        await until(started, within=10, interval=0.02)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert processes.with_command_line(argv) == [] and shell.returncode == -signal.SIGKILL and _reaped(shell.pid)

        quick = await create_subprocess_exec("sh", "-c", "cat; echo answered", start_new_session=True, **PIPES)
        assert await subprocesses.communicate(quick, b"asked\n", group=True) == (b"asked\nanswered\n", b"")

    _run(loop, work)


def test_a_child_whose_exit_cannot_be_watched_is_not_left_running(monkeypatch: pytest.MonkeyPatch) -> None:
    """No pidfd for the new child (the process is out of descriptors): the call fails and the child is killed
    and reaped, not left running with nothing to reap it. The twin is every test above: with a pidfd it runs."""

    def refused(pid: int) -> int:
        monkeypatch.undo()  # only the child's pidfd is refused
        raise OSError(24, "Too many open files")

    async def work() -> None:
        before = {child.pid for child in psutil.Process().children()}
        assert subprocesses._pidfds()  # this kernel's answer, read before the refusal below
        monkeypatch.setattr(os, "pidfd_open", refused)
        with pytest.raises(OSError, match="Too many open files"):
            await create_subprocess_exec("sleep", "60", **PIPES)
        assert {child.pid for child in psutil.Process().children()} <= before

    _run("uvloop", work)
    # The child's pipes were closed once: descriptors opened now take their numbers, and nothing left of the
    # failed start (a pipe connected as its loop ends, a file object collected) closes them again.
    taken = [fd for _ in range(8) for fd in os.pipe()]
    gc.collect()
    try:
        closed = [fd for fd in taken if not _open(fd)]
        assert closed == [], f"closed again by the failed start: {closed}"
    finally:
        for fd in taken:
            with contextlib.suppress(OSError):
                os.close(fd)


def test_a_pipe_the_loop_closed_is_not_closed_again_under_a_file_opened_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """uvloop closes a pipe transport's descriptor through libuv, then closes the file object it was given.
    Given the `Popen`'s own file object, that closed the number a second time, and a file another thread had
    opened in between lost its descriptor (in the server, another child's live pipe was later closed under it:
    `File descriptor N is used by transport`). Here each pipe's file object opens files as it closes, as such a
    thread would, until it holds the pipe's number or one above: every one of them stays open."""
    opened: list[int] = []

    class Grabbing(io.FileIO):
        def close(self) -> None:
            if not self.closed:
                number = self.fileno()
                while not opened or opened[-1] < number:
                    opened.append(os.open(os.devnull, os.O_RDONLY))
            super().close()

    start = unix_events._UnixSubprocessTransport._start  # type: ignore[attr-defined]

    def grabbing_start(self: Any, *args: Any, **kwargs: Any) -> None:
        start(self, *args, **kwargs)
        for name in ("stdin", "stdout", "stderr"):
            file = getattr(self._proc, name)
            setattr(self._proc, name, Grabbing(os.dup(file.fileno()), file.mode))
            file.close()

    monkeypatch.setattr(unix_events._UnixSubprocessTransport, "_start", grabbing_start)  # type: ignore[attr-defined]

    async def work() -> None:
        cat = await create_subprocess_exec("cat", **PIPES)
        assert await cat.communicate(b"through") == (b"through", b"")

    _run("uvloop", work)
    try:
        assert opened, "no pipe file object was closed"
        assert [fd for fd in opened if not _open(fd)] == []
    finally:
        for fd in opened:
            with contextlib.suppress(OSError):
                os.close(fd)

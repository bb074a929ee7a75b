"""Child processes started with `vfork`, whatever the event loop: `create_subprocess_exec`.

The server runs on uvloop (uvicorn's choice when it is installed). uvloop starts a child through libuv, which
calls `fork()`: the kernel copies the page tables of the whole server, and every page either side writes
afterwards faults and is copied, before the child even reaches `exec`. The server starts git for every
checkpoint and restore, and a sandbox for every agent: from a process with a 200 MB heap a child cost 7.2 ms
and 7.4 ms of CPU under uvloop, against 1.2 ms under the standard loop, whose `subprocess.Popen` uses `vfork`
(nothing copied; the parent waits the few microseconds until `exec`), and 1.0 ms this way
(bench/child_spawn.py).

So the child is made by `subprocess.Popen` (asyncio's own Unix subprocess transport, as the standard loop
makes it), its pipes are connected through the running loop (`connect_read_pipe` and `connect_write_pipe`,
which uvloop implements), and its exit is read from a pidfd the loop watches. What the caller gets is an
`asyncio.subprocess.Process`, the same as `asyncio.create_subprocess_exec` returns. On the standard loop, or on
a kernel without pidfds (before Linux 5.3), it is exactly `asyncio.create_subprocess_exec`.

The loop is not handed the `Popen`'s own pipe file objects (`_LoopPipe`): uvloop closes a pipe transport's
descriptor through libuv and then closes the file object it was given, which closed the same number a second
time. A file another thread opened in between (the server reads `/proc` and folders on threads) lost its
descriptor, and whatever took that number next, another child's live pipe, was closed under its owner later:
seen as `RuntimeError: File descriptor N is used by transport` when a new child's pidfd got the number.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
from asyncio import subprocess as aio_subprocess
from asyncio import unix_events
from typing import Any


async def create_subprocess_exec(
    program: str, *args: str, limit: int = 2**16, **kwargs: Any
) -> asyncio.subprocess.Process:
    """`asyncio.create_subprocess_exec(program, *args, limit=limit, **kwargs)`, the child made with vfork.

    A caller cancelled while the child is being started returns at once; the start runs to its end beside it
    and the child is then killed (its whole process group with `start_new_session`) and reaped. asyncio's own
    cleanup of a start cancelled halfway kills the child's pid alone and then waits for every pipe it had
    connected to close: a process the child had already made (the second process `bwrap` forks, still in
    the child's group) held the pipe open, and the caller waited forever. An agent's interrupted `@write`
    hung so, and its turn never ended."""
    loop = asyncio.get_running_loop()
    group = bool(kwargs.get("start_new_session"))  # read before `_start` takes what it needs from kwargs
    began = False

    async def begin() -> asyncio.subprocess.Process:
        nonlocal began
        began = True  # the child is made in this same step, before the first wait
        return await _start(loop, program, args, limit, kwargs)

    start = loop.create_task(begin())
    try:
        return await asyncio.shield(start)
    except asyncio.CancelledError:
        if not began:  # nothing made yet, nor will be: the caller may close the descriptors it passed
            start.cancel()
            raise
        discard = loop.create_task(_discard(start, group=group))
        _DISCARDING.add(discard)
        discard.add_done_callback(_DISCARDING.discard)
        raise


_DISCARDING: set[asyncio.Task[None]] = set()  # children of cancelled starts being ended (a task needs a holder)


async def _discard(start: asyncio.Task[asyncio.subprocess.Process], *, group: bool) -> None:
    """End the child of a start its caller no longer waits for, once it is made, and reap it."""
    try:
        child = await start
    except Exception:
        return  # it never started
    await _kill(child, group=group)


async def _kill(child: asyncio.subprocess.Process, *, group: bool) -> None:
    """SIGKILL the child (its whole process group when `group`), drain its pipes and reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if group:
            os.killpg(child.pid, signal.SIGKILL)
        else:
            child.kill()
    await child.communicate()


async def communicate(
    child: asyncio.subprocess.Process, stdin: bytes | None = None, *, group: bool
) -> tuple[bytes, bytes]:
    """`child.communicate(stdin)`, except that a caller cancelled meanwhile kills the child (its process group
    when `group`: it was started with `start_new_session`) and waits until it is reaped before the cancel goes
    on. asyncio's own `communicate` leaves the child running: a cancelled git call went on writing the shadow
    repository after its caller had let go of the workspace's lock, beside the next call."""
    try:
        stdout, stderr = await child.communicate(stdin)
    except asyncio.CancelledError:
        ending = asyncio.ensure_future(_kill(child, group=group))
        _DISCARDING.add(ending)
        ending.add_done_callback(_DISCARDING.discard)
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.shield(ending)  # a second cancel still leaves it to end the child
        raise
    return stdout, stderr


async def _start(
    loop: asyncio.AbstractEventLoop, program: str, args: tuple[str, ...], limit: int, kwargs: dict[str, Any]
) -> asyncio.subprocess.Process:
    if isinstance(loop, unix_events.SelectorEventLoop) or not _pidfds():
        return await asyncio.create_subprocess_exec(program, *args, limit=limit, **kwargs)
    stdin, stdout, stderr = (kwargs.pop(name, None) for name in ("stdin", "stdout", "stderr"))
    protocol = aio_subprocess.SubprocessStreamProtocol(limit=limit, loop=loop)
    waiter = loop.create_future()
    transport = unix_events._UnixSubprocessTransport(  # type: ignore[attr-defined]
        loop, protocol, [program, *args], False, stdin, stdout, stderr, 0, waiter=waiter, **kwargs
    )
    try:
        _hand_pipes_over(transport._proc)  # before its task connects them (it has not run yet)
    except BaseException:
        waiter.cancel()  # its task then fails on a released pipe, with no one to tell
        _end(transport)
        raise
    # The pipes are connected first (`waiter`): a transport closed while its task is still connecting them
    # leaves that task to connect a pipe as the loop ends (a `_LoopPipe` released by `_end` refuses it). Nothing
    # reaps the child meanwhile (it has no watcher yet), so a pidfd opened afterwards still finds it, exited or
    # not.
    try:
        await waiter
    except BaseException:
        _end(transport)
        raise
    try:
        _watch_exit(loop, transport)
    except OSError:  # no pidfd (out of descriptors): nothing would reap the child, so it is ended here
        _end(transport)
        raise
    return aio_subprocess.Process(transport, protocol, loop)


def _end(transport: Any) -> None:
    """Kill the child of a start that failed, close its pipes and reap it (it has no exit watcher)."""
    proc = transport._proc
    transport.close()  # kills it
    transport._process_exited(proc.wait())  # killed: reaped at once
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if isinstance(pipe, _LoopPipe):
            pipe.release()


class _LoopPipe:
    """A pipe end as the loop is given it: its descriptor, which libuv closes once the loop has taken it
    (`fileno`). `close`, which uvloop calls after libuv's close, closes nothing; `release` closes an end the loop
    never took (a start that failed before its pipes were connected)."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._taken = False

    def fileno(self) -> int:
        if self._fd < 0:
            raise ValueError("the pipe was released")
        self._taken = True
        return self._fd

    def close(self) -> None:
        """The loop's close after libuv's: the descriptor is closed already, its number may be another's."""

    def release(self) -> None:
        if not self._taken and self._fd >= 0:
            fd, self._fd = self._fd, -1
            os.close(fd)


def _hand_pipes_over(proc: Any) -> None:
    """Replace the `Popen`'s pipe file objects by `_LoopPipe`s holding duplicates of their descriptors (the
    originals closed now, by their only owner)."""
    for name in ("stdin", "stdout", "stderr"):
        file = getattr(proc, name)
        if file is not None:
            pipe = _LoopPipe(os.dup(file.fileno()))  # not inherited by later children (PEP 446)
            file.close()
            setattr(proc, name, pipe)


@functools.cache
def _pidfds() -> bool:
    """Whether this kernel opens pidfds (Linux 5.3 and later)."""
    try:
        os.close(os.pidfd_open(os.getpid()))
    except (AttributeError, OSError):
        return False
    return True


def _watch_exit(loop: asyncio.AbstractEventLoop, transport: Any) -> None:
    """Tell the transport its child exited once the child's pidfd becomes readable (it does at exit)."""
    pid = transport.get_pid()
    fd = os.pidfd_open(pid)

    def exited() -> None:
        loop.remove_reader(fd)
        os.close(fd)
        returncode = 255
        with contextlib.suppress(ChildProcessError):
            _, status = os.waitpid(pid, 0)
            returncode = os.waitstatus_to_exitcode(status)
        transport._process_exited(returncode)

    loop.add_reader(fd, exited)

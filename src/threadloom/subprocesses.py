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
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from asyncio import subprocess as aio_subprocess
from asyncio import unix_events
from typing import Any


async def create_subprocess_exec(
    program: str, *args: str, limit: int = 2**16, **kwargs: Any
) -> asyncio.subprocess.Process:
    """`asyncio.create_subprocess_exec(program, *args, limit=limit, **kwargs)`, the child made with vfork."""
    loop = asyncio.get_running_loop()
    if isinstance(loop, unix_events.SelectorEventLoop) or not _pidfds():
        return await asyncio.create_subprocess_exec(program, *args, limit=limit, **kwargs)
    stdin, stdout, stderr = (kwargs.pop(name, None) for name in ("stdin", "stdout", "stderr"))
    protocol = aio_subprocess.SubprocessStreamProtocol(limit=limit, loop=loop)
    waiter = loop.create_future()
    transport = unix_events._UnixSubprocessTransport(  # type: ignore[attr-defined]
        loop, protocol, [program, *args], False, stdin, stdout, stderr, 0, waiter=waiter, **kwargs
    )
    # The pipes are connected first (`waiter`): a transport closed while its task is still connecting them
    # leaves that task to connect a pipe as the loop ends, whose descriptor the child's file object then closes
    # a second time: by then another socket or file may have its number. Nothing reaps the child meanwhile (it
    # has no watcher yet), so a pidfd opened afterwards still finds it, exited or not.
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
    transport.close()  # kills it
    transport._process_exited(transport._proc.wait())  # killed: reaped at once


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

"""`@tool` commands: `bash -c` in the thread's cwd inside its sandbox, output streamed, killable as a group.

The command runs in its own session so an interrupt can kill everything it started (pipelines, background
jobs), not just the `bash` at the top. It always runs under `bwrap` (sandbox.py); there is no unconfined path.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import signal
from collections.abc import Awaitable, Callable
from pathlib import Path

from threadloom import subprocesses
from threadloom.agent.sandbox import BWRAP_ENV, Sandbox

READ_SIZE = 64 * 1024


async def run(command: str, cwd: str, on_output: Callable[[str], Awaitable[None]], sandbox: Sandbox) -> int:
    """Runs the command in the sandbox to its end and returns its exit code (negative: killed by that signal).

    stdout and stderr are merged, as a terminal would show them. Raises `OSError` if it cannot start (no
    `bwrap`: `SandboxUnavailable`). If the
    caller is cancelled, the whole process group is killed before the cancellation goes on.

    The output pipe is ours rather than asyncio's: asyncio's `wait()` also waits for the process's pipes to
    close, which never happens once we stop reading (or while an escaped grandchild holds the pipe).
    """
    argv = sandbox.argv(["bash", "-c", command], cwd)
    read_fd, write_fd = os.pipe()
    try:
        proc = await subprocesses.create_subprocess_exec(
            *argv,
            cwd=cwd,
            env=BWRAP_ENV,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=write_fd,
            stderr=asyncio.subprocess.STDOUT,
            start_new_session=True,
        )
    except BaseException:
        os.close(read_fd)
        raise
    finally:
        os.close(write_fd)
    pipe = os.fdopen(read_fd, "rb", buffering=0)
    transport: asyncio.ReadTransport | None = None
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    finished = False
    try:
        reader = asyncio.StreamReader()
        transport, _ = await asyncio.get_running_loop().connect_read_pipe(
            lambda: asyncio.StreamReaderProtocol(reader), pipe
        )
        while data := await reader.read(READ_SIZE):
            if text := decoder.decode(data):
                await on_output(text)
        if tail := decoder.decode(b"", final=True):
            await on_output(tail)
        code = await proc.wait()
        finished = True
        return code
    finally:
        if transport is not None:
            transport.close()
        else:
            pipe.close()
        if not finished:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()


_WRITE = 'mkdir -p -- "$(dirname -- "$1")" && cat > "$1"'


async def write_file(sandbox: Sandbox, cwd: str, target: Path, text: str) -> None:
    """Writes `text` to `target` from inside the sandbox (so only the workspace is reachable); raises `OSError`."""
    argv = sandbox.argv(["bash", "-c", _WRITE, "write", str(target)], cwd)
    proc = await subprocesses.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=BWRAP_ENV,
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        output, _ = await proc.communicate(text.encode("utf-8"))
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
    if proc.returncode != 0:
        raise OSError(output.decode("utf-8", "replace").strip() or f"exit code {proc.returncode}")

"""One agent child process speaking JSON lines on stdio: what every CLI driver shares.

Every agent CLI here (the scripted agent, `codex app-server`, `claude -p`) is a child in its own
process group, started with the minimal environment the driver built (`agent_cli.child_env`),
reading one JSON object a line on stdin and writing one a line on stdout. `ChildProcess` owns
that: spawning, reading lines with a size bound (`LINE_LIMIT`), serialized writes, the stderr
tail kept for the exit reason, and stopping (EOF on stdin, then a kill of the whole group). What a
message means is the subclass's business (`handle`, `exited`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import errno
import logging
import os
import shutil
import signal
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import orjson

from threadloom import io_guard, subprocesses, unprivileged
from threadloom.providers.contract import ProviderError

log = logging.getLogger("threadloom.providers")
LINE_LIMIT = 64 * 1024 * 1024  # the longest stdout line read; a longer one stops the child (read as a hang otherwise)
STDERR_TAIL = 5  # stderr lines kept to explain an exit
AGENT_USER_CANNOT_RUN = "agent_user_cannot_run"  # ProviderError code: the agent user cannot reach its program


def contained(argv: Sequence[str]) -> list[str]:
    """`argv` in a PID namespace of its own, so every process the agent starts ends with it, and as the
    unprivileged agent user when the server is root (`threadloom.unprivileged`).

    An agent may start processes in sessions of their own (Codex's sandboxed file helper is one), out of
    reach of a kill of its process group. In a PID namespace they all die when its first process does.
    `unshare` starts the agent as that process and takes it along when it dies itself (`--kill-child`);
    `setpriv --pdeathsig` makes `unshare` die with Threadloom, even one killed with -9. The namespace has its
    own /proc (`--mount-proc`) and shares everything else, so the agent CLIs' own sandboxes still nest in it.

    As root, a first `setpriv` switches to the agent user (`--reuid/--regid/--clear-groups`) before the one
    setting the death signal: the kernel clears a death signal when the uid changes, so the order matters.
    A process that is not root needs a user namespace for `--pid` (`--user --map-current-user`, mapping the
    agent's uid to itself: files it makes belong to it outside too).
    Without util-linux's `unshare` and `setpriv` the agent runs as is, and `stop_child` kills the process
    tree it finds -- unless it must change users: then it does not start at all (OSError), never as root."""
    unshare, setpriv = shutil.which("unshare"), shutil.which("setpriv")
    user = unprivileged.current()
    if unshare is None or setpriv is None:
        if user is not None:
            raise FileNotFoundError(
                errno.ENOENT, "setpriv and unshare (util-linux) are needed to run agents as the agent user"
            )
        return list(argv)
    drop = [] if user is None else [setpriv, *user.setpriv_args(), "--"]
    userns = [] if os.geteuid() == 0 and user is None else ["--user", "--map-current-user"]
    return [
        *drop, setpriv, "--pdeathsig", "KILL", "--",
        unshare, *userns, "--pid", "--fork", "--kill-child", "--mount-proc", "--", *argv,
    ]  # fmt: skip


async def spawn_process(
    argv: Sequence[str], *, env: Mapping[str, str], cwd: str | None = None
) -> asyncio.subprocess.Process:
    """Start `argv` with exactly `env`, piped stdio and its own process group (so a stop reaches its tools),
    `contained` in a PID namespace.

    Raises OSError when it cannot start; each driver says what that means for it. As the agent user
    (`threadloom.unprivileged`), the program and `cwd` are first checked to be within that user's reach:
    ProviderError `agent_user_cannot_run`, naming the path, rather than an exec failure with no word.
    """
    io_guard.check("agent")  # never inside a database transaction
    if unprivileged.current() is not None:
        program = argv[0] if os.sep in argv[0] else (shutil.which(argv[0], path=env.get("PATH")) or argv[0])
        try:
            await asyncio.to_thread(unprivileged.check_reach, [program] + ([cwd] if cwd else []))
        except unprivileged.CannotReach as error:
            raise ProviderError(AGENT_USER_CANNOT_RUN, str(error)) from error
    return await subprocesses.create_subprocess_exec(
        *contained(argv),
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
        env=dict(env),
        cwd=cwd,
        limit=LINE_LIMIT,
        start_new_session=True,
    )


async def stop_child(proc: asyncio.subprocess.Process, grace: float = 5.0) -> None:
    """Close an agent's stdin (every CLI here ends on EOF), then kill its process group after `grace` s.

    Whatever the agent started in sessions of its own (Codex's sandboxed file helper is one) is not in
    that group and would outlive it, adopted by init: the agent's process tree is noted first, and what
    is left of it once the agent is gone is killed."""
    tree = await asyncio.to_thread(descendants, proc.pid)
    if proc.stdin is not None and not proc.stdin.is_closing():
        proc.stdin.close()
    try:
        await asyncio.wait_for(proc.wait(), grace)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        await proc.wait()
    await asyncio.to_thread(kill_remaining, tree)


EXITED_STATES = frozenset({b"Z", b"X", b"x"})


def _stat(pid: int | str) -> list[bytes] | None:
    """The fields of /proc/<pid>/stat after the command name (state first), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            return file.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return None


def descendants(root: int) -> list[tuple[int, bytes]]:
    """Every process below `root`, with its start time (so a pid reused later is not taken for it)."""
    children: dict[int, list[tuple[int, bytes]]] = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit() and (fields := _stat(entry.name)) is not None:
            children.setdefault(int(fields[1]), []).append((int(entry.name), fields[19]))
    found: list[tuple[int, bytes]] = []
    todo = [root]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child[0])
    return found


def kill_remaining(tree: list[tuple[int, bytes]]) -> None:
    """SIGKILL each process of `tree` that still runs (the same process: same pid, same start time)."""
    for pid, started in tree:
        fields = _stat(pid)
        if fields is not None and fields[19] == started:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)


class ChildProcess:
    """A started child: its JSON-lines output read into `handle`, its stderr tail, its writes and its stop.

    Reading starts with `start()` (so a subclass finishes its own setup first). Any failure while
    reading (an over-long line, a handler that raises) kills the child: a peer whose output is no
    longer read would otherwise look alive while nothing moves. When stdout ends the exit code is
    awaited and passed to `exited`.
    """

    def __init__(self, proc: asyncio.subprocess.Process, name: str, scrub: Callable[[str], str] | None = None) -> None:
        self.proc = proc
        self.name = name
        self.exit_code: int | None = None
        self.stderr_tail: collections.deque[str] = collections.deque(maxlen=STDERR_TAIL)
        self._scrub = scrub
        self._write_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """Start reading stdout and stderr."""
        self._tasks = [
            asyncio.create_task(self._read(), name=f"{self.name}-reader"),
            asyncio.create_task(self._drain_stderr(), name=f"{self.name}-stderr"),
        ]

    @property
    def alive(self) -> bool:
        """Running: not exited, still read, and not dead unnoticed (a killed child is a zombie until the event
        loop reaps it; a turn sent to it in between would be lost with it)."""
        return not self.dead and bool(self._tasks) and not self._tasks[0].done()

    @property
    def dead(self) -> bool:
        """Exited, whether or not the event loop has reaped it yet."""
        if self.proc.returncode is not None:
            return True
        fields = _stat(self.proc.pid)
        # Z: a zombie not reaped yet. X: reaped by asyncio's watcher thread, its /proc entry not gone yet.
        return fields is None or fields[0] in EXITED_STATES

    def scrub(self, text: str) -> str:
        """Text about to be logged or shown, with the instance's secrets redacted."""
        return self._scrub(text) if self._scrub is not None else text

    def clean_stderr(self, line: bytes) -> str:
        """A stderr line as logged and kept in the tail ("" to drop it)."""
        return self.scrub(line.decode(errors="replace").rstrip())

    async def handle(self, message: dict[str, Any]) -> None:
        """One JSON object from stdout."""

    def exited(self, code: int) -> None:
        """The child is gone (stdout ended and the process was reaped)."""

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        try:
            while line := await self.proc.stdout.readline():
                try:
                    message = orjson.loads(line)
                except orjson.JSONDecodeError:
                    log.warning(
                        "%s sent a non-JSON line: %r", self.name, self.scrub(line[:200].decode(errors="replace"))
                    )
                    continue
                if isinstance(message, dict):
                    await self.handle(message)
        except Exception:
            log.exception("%s: unreadable output; stopping the process", self.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        except asyncio.CancelledError:
            # Cancelled with the child still running: its owner is going away without closing it (a start
            # cancelled by a shutdown). Waiting for it below would hold the process's exit until it ends.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            raise
        finally:
            self.exit_code = await self.proc.wait()
            self.exited(self.exit_code)

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while line := await self.proc.stderr.readline():
            text = self.clean_stderr(line)
            if text:
                self.stderr_tail.append(text)
                log.debug("%s: %s", self.name, text)

    async def write(self, message: dict[str, Any]) -> None:
        """Send one message; ProviderError `exited` if the child no longer reads. Every call into an agent
        is a message written here: never inside a database transaction (`threadloom.io_guard`)."""
        io_guard.check("agent")
        stdin = self.proc.stdin
        assert stdin is not None
        async with self._write_lock:
            if stdin.is_closing():
                raise ProviderError("exited", f"{self.name} is not running")
            stdin.write(orjson.dumps(message) + b"\n")
            try:
                await stdin.drain()
            except (BrokenPipeError, ConnectionResetError) as error:
                raise ProviderError("exited", f"{self.name} is not running") from error

    async def wait_closed(self) -> None:
        """Wait until the reader and the stderr drain are done (after the child exited)."""
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def close(self, grace: float = 5.0) -> None:
        """Close stdin (the polite stop), then kill the process group if it lingers."""
        await stop_child(self.proc, grace)
        await self.wait_closed()

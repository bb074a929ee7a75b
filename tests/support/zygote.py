"""`threadloom serve` forked from a process that has already imported it.

A server start costs about a second of CPU, most of it importing (strawberry, SQLAlchemy, uvicorn and our own
modules), and the suite starts several hundred: on two cores that was minutes of a run. A forkserver (one per
test process, started on first use) imports the server's modules once; each server is a fork of it that runs
the same `threadloom.cli.main(["serve", ...])` with the environment and arguments a subprocess would get, its
stdout and stderr on pipes, its exit code reported as a subprocess's is. What a fork skips is only the
imports: settings, the database check, the app, uvicorn and every signal handler are made in the child.

Tests of the command line itself (the embedded database, packaging, a refused start) start the real
`python -m threadloom serve` (`ServerProcess(..., fork=False)`); `THREADLOOM_TEST_FORK=0` makes every start
a real one.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import signal
import subprocess
import sys
from typing import IO, Any

_PRELOAD = ["tests.support.zygote_preload"]
_context: Any = None


def enabled() -> bool:
    return os.environ.get("THREADLOOM_TEST_FORK", "1") != "0"


def _ctx() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def _serve(
    argv: list[str],
    env: dict[str, str],
    out: multiprocessing.connection.Connection,
    err: multiprocessing.connection.Connection,
) -> None:
    """The child: stdout/stderr on the parent's pipes, the given environment, then the CLI as `main` runs it."""
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    out.close()
    err.close()
    os.environ.clear()
    os.environ.update(env)
    sys.argv = ["threadloom", *argv]
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    from threadloom.cli import main

    code: Any = 1
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    finally:
        atexit._run_exitfuncs()  # a multiprocessing child ends with os._exit, which runs none
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


class Forked:
    """The parts of `subprocess.Popen` the tests use, over a forked server."""

    def __init__(self, argv: list[str], env: dict[str, str]) -> None:
        ctx = _ctx()
        out_r, out_w = ctx.Pipe(duplex=False)
        err_r, err_w = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_serve, args=(argv, env, out_w, err_w), daemon=False)
        self._process.start()
        out_w.close()
        err_w.close()
        self.pid: int = self._process.pid
        self.stdout: IO[str] = os.fdopen(os.dup(out_r.fileno()), "r")
        self.stderr: IO[str] = os.fdopen(os.dup(err_r.fileno()), "r")
        out_r.close()
        err_r.close()
        self.stdin = None

    @property
    def returncode(self) -> int | None:
        return self._process.exitcode  # type: ignore[no-any-return]

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        self._process.join(timeout)
        code = self._process.exitcode
        if code is None:
            raise subprocess.TimeoutExpired("threadloom serve", timeout or 0)
        return int(code)

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

"""`threadloom serve` forked from a process that has already imported it.

A server start costs about a second of CPU, most of it importing (strawberry, SQLAlchemy, uvicorn and our own
modules), and the suite starts several hundred: on two cores that was minutes of a run. A forkserver (one per
test process, started on first use) imports the server's modules once; each server is a fork of it that runs
the same `threadloom.cli.main(["serve", ...])` with the environment and arguments a subprocess would get, its
stdout and stderr on pipes, its exit code reported as a subprocess's is. What a fork skips is only the
imports: settings, the database check, the app, uvicorn and every signal handler are made in the child.

Tests of the command line itself (the embedded database, packaging, a refused start) start the real
`python -m threadloom serve` (`ServerProcess(..., fork=False)`); `THREADLOOM_TEST_FORK=0` makes every start
a real one. `run` does the same for other commands (`threadloom token list`) and for scripts that import the
app (the benchmarks' smoke runs): `subprocess.run` semantics, a fork underneath.
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import multiprocessing.connection
import os
import runpy
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

_PRELOAD = ["tests.support.zygote_preload"]
_context: Any = None
# multiprocessing's Process is not thread-safe: `start()` polls every other live child, and a forkserver
# child's exit status is read once from a pipe, so a second reader gets EOF (reported as status 255). Starts and
# status reads hold this lock; a wait for the exit itself does not.
_children_lock = threading.Lock()


def enabled() -> bool:
    return os.environ.get("THREADLOOM_TEST_FORK", "1") != "0"


def _ctx() -> Any:
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(_PRELOAD)
    return _context


def _child_setup(
    env: dict[str, str],
    cwd: str | None,
    out: multiprocessing.connection.Connection,
    err: multiprocessing.connection.Connection,
) -> None:
    """In the child: stdout/stderr on the parent's pipes, the given environment and working folder, default
    signal handlers."""
    if cwd is not None:
        os.chdir(cwd)
    os.dup2(out.fileno(), 1)
    os.dup2(err.fileno(), 2)
    out.close()
    err.close()
    os.environ.clear()
    os.environ.update(env)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)


def _finish(run: Callable[[], Any], *, threads: bool = False) -> None:
    """Run the child's program; its exit code is `run`'s return value or the code it exits with. `threads`:
    first wait for its threads and run their exit hooks, as the interpreter does before the atexit ones (a
    process pool's workers are told to stop there; `multiprocessing`'s atexit hook then joins them)."""
    code: Any = 1
    try:
        code = run()
    except SystemExit as exit_:
        code = exit_.code
    finally:
        if threads:
            threading._shutdown()  # type: ignore[attr-defined]
        atexit._run_exitfuncs()  # a multiprocessing child ends with os._exit, which runs none
        sys.stdout.flush()
        sys.stderr.flush()
    sys.exit(code)


def _child(
    argv: list[str],
    env: dict[str, str],
    cwd: str | None,
    script: bool,
    out: multiprocessing.connection.Connection,
    err: multiprocessing.connection.Connection,
) -> None:
    """The child: the CLI as `main` runs it (`threadloom ARGV...`), or with `script` `python SCRIPT ARGS...` as
    the interpreter runs it (the script's folder first on sys.path); in `cwd` if given."""
    _child_setup(env, cwd, out, err)
    if not script:
        sys.argv = ["threadloom", *argv]
        from threadloom.cli import main

        _finish(lambda: main(argv), threads=cwd is not None)
        return
    sys.argv = list(argv)
    sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))

    def run() -> int:
        runpy.run_path(argv[0], run_name="__main__")
        return 0

    _finish(run, threads=True)


class Forked:
    """The parts of `subprocess.Popen` the tests use, over a forked server, command or script."""

    def __init__(self, argv: list[str], env: dict[str, str], *, script: bool = False, cwd: str | None = None) -> None:
        """`threadloom ARGV...`, or with `script` `python ARGV...` (a script and its arguments), in `cwd`."""
        ctx = _ctx()
        out_r, out_w = ctx.Pipe(duplex=False)
        err_r, err_w = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_child, args=(argv, env, cwd, script, out_w, err_w), daemon=False)
        with _children_lock:
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
        with _children_lock:
            return self._process.exitcode  # type: ignore[no-any-return]

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        multiprocessing.connection.wait([self._process.sentinel], timeout)  # readable once it has exited
        code = self.returncode
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


def run(
    argv: list[str], env: dict[str, str], *, cwd: str | None = None, timeout: float, script: bool = False
) -> subprocess.CompletedProcess[str]:
    """`subprocess.run([python, "-m", "threadloom", *argv], capture_output=True, text=True)`, or with `script`
    `[python, *argv]` (a benchmark), forked from the preloaded forkserver: it skips about a second of imports.
    A real process when forking is off (THREADLOOM_TEST_FORK=0)."""
    if not enabled():
        command = [sys.executable, *argv] if script else [sys.executable, "-m", "threadloom", *argv]
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    child = Forked(argv, env, script=script, cwd=cwd or os.getcwd())
    texts: dict[str, str] = {}
    readers = [
        threading.Thread(target=lambda name=name, stream=stream: texts.__setitem__(name, stream.read()), daemon=True)
        for name, stream in (("out", child.stdout), ("err", child.stderr))
    ]
    for reader in readers:
        reader.start()
    try:
        code = child.wait(timeout)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait(10)
        raise
    for reader in readers:
        reader.join(10)
    child.stdout.close()
    child.stderr.close()
    return subprocess.CompletedProcess(argv, code, texts.get("out", ""), texts.get("err", ""))

"""Ending a child process the way a supervisor would: ask (SIGTERM), wait, then kill."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import psutil


def stop(proc: Any, grace: float = 10) -> None:
    """SIGTERM, then SIGKILL if it has not exited after `grace` seconds."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            kill(proc)


def kill(proc: Any) -> None:
    """SIGKILL (kill -9) and reap."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def children(pid: int) -> set[int]:
    """The processes `pid` started, from /proc."""
    found: set[int] = set()
    for tasks in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            found |= {int(child) for child in tasks.read_text().split()}
        except OSError:
            continue  # it exited meanwhile
    return found


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (a server's agent processes and what they run)."""
    found: set[int] = set()
    todo = [pid]
    while todo:
        below = children(todo.pop()) - found
        todo.extend(below)
        found |= below
    return found


def running(pids: set[int]) -> set[int]:
    """Those of `pids` that have not ended (a zombie has: it only waits to be reaped)."""
    alive = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.add(pid)
    return alive


def with_command_line(argv: list[str]) -> list[psutil.Process]:
    """The live processes (zombies left out) whose command line is exactly `argv`: a test gives each process it
    looks for an argument no other process has (`sleep 600.<pid><n>`)."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["cmdline"] == argv and process.info["status"] != psutil.STATUS_ZOMBIE:
            found.append(process)
    return found

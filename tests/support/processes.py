"""Ending a child process the way a supervisor would: ask (SIGTERM), wait, then kill."""

from __future__ import annotations

import subprocess
from typing import Any


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

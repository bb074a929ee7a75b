"""`Git.run`, the one place the server starts git: a call whose caller is cancelled (a request that went away, a
server stopping, a capture that lost a race) ends git and everything git started before the cancel goes on,
plain or in the workspace's sandbox. Left running, it went on writing the shadow repository after its caller
had let go of the workspace, beside the next call."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

from tests.support import processes
from tests.support.waiting import until
from threadloom.checkpoints.confine import open_root
from threadloom.checkpoints.git import Git, find_git


@pytest.fixture
async def git(tmp_path: Path) -> Git:
    workspace = tmp_path / "ws"
    workspace.mkdir()
    shadow = tmp_path / "shadow"
    made = Git(find_git(), shadow, workspace, shadow / "index")
    await made.run("init", "--bare", "--quiet", "--template=", str(shadow), bare=True)
    return made


@pytest.mark.parametrize("sandboxed", [False, True], ids=["plain", "sandboxed"])
async def test_a_cancelled_git_call_ends_git_and_what_it_started_before_returning(git: Git, sandboxed: bool) -> None:
    """git runs a shell alias (git, then `sh`, then `sleep`); once the `sleep` runs, the caller is cancelled.
    When the cancel reaches the caller, none of them runs any more. The twin: the same call, not cancelled,
    runs to its end and answers."""
    fd = open_root(git.work_tree) if sandboxed else None
    try:
        argv = ["sleep", f"600.{os.getpid()}{int(sandboxed)}"]  # told apart from every other process
        call = asyncio.ensure_future(git.run("-c", f"alias.hang=!{' '.join(argv)}", "hang", workspace_fd=fd))

        async def started() -> bool:
            return bool(processes.with_command_line(argv))

        await until(started, within=30, interval=0.02)
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        # The old call returned at once and left git, sh and sleep running.
        assert processes.with_command_line(argv) == []

        done = await git.run("-c", "alias.quick=!echo answered", "quick", workspace_fd=fd)
        assert (done.returncode, done.stdout) == (0, b"answered\n")
    finally:
        if fd is not None:
            os.close(fd)

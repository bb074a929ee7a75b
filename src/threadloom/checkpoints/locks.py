"""Serializing work on one shadow repository.

Captures and restores of a project share its shadow index, so they must not overlap. Within a
process an asyncio lock per repository orders them; across processes (several `threadloom serve`
workers on one data dir) an exclusive `flock` on `<project>.lock` next to the git dir does. The
file lock is tried without blocking and retried after a short pause, so a cancelled waiter never
leaves a thread behind holding it; the kernel drops it when its holder dies, so a crashed process
never blocks the others.
"""

from __future__ import annotations

import asyncio
import fcntl
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

_RETRY_SECONDS = 0.02


class RepoLock:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._local = asyncio.Lock()
        # Set while a holder in this process waits for another process's flock (observable in logs and tests).
        self.blocked_by_other_process = asyncio.Event()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        async with self._local:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
            try:
                while True:
                    try:
                        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                        break
                    except BlockingIOError:
                        self.blocked_by_other_process.set()
                        await asyncio.sleep(_RETRY_SECONDS)  # another process holds it: poll
                self.blocked_by_other_process.clear()
                yield
            finally:
                os.close(fd)  # closing releases the flock

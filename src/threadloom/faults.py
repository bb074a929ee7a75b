"""Test-only crash and hold points, read only when set; never set them in production.

`THREADLOOM_TEST_CRASH_AT=<name>` makes this process die by SIGKILL when it reaches the point of that name,
as a `kill -9` from outside would, at an exact step boundary: the suite shows that a rollback killed between
(or inside) its steps is completed or taken back by the next process to start. `THREADLOOM_TEST_HOLD_AT`
holds an operation at a point until a file appears (`hold_point`).
"""

from __future__ import annotations

import asyncio
import os
import pathlib
import signal

CRASH_ENV = "THREADLOOM_TEST_CRASH_AT"


def crash_point(name: str) -> None:
    """Die here, at once and without cleanup, when the crash point `name` was asked for."""
    if os.environ.get(CRASH_ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)


HOLD_ENV = "THREADLOOM_TEST_HOLD_AT"


async def hold_point(name: str) -> None:
    """Wait here while the hold point `name` was asked for (`THREADLOOM_TEST_HOLD_AT=<name>:<path>`) and the
    file `path` does not exist yet: a test holds an operation between two steps and releases it by creating
    the file, as the scripted agent's `@await PATH` gate holds a turn. Reaching the point creates `<path>.held`,
    so the test knows the operation is waiting there."""
    wanted = os.environ.get(HOLD_ENV, "")
    point, _, path = wanted.partition(":")
    if point != name or not path:
        return
    gate = pathlib.Path(path)
    await asyncio.to_thread(pathlib.Path(f"{path}.held").touch)  # says the operation is waiting here
    while not await asyncio.to_thread(gate.exists):  # noqa: ASYNC110 - a file another process makes, not a flag
        await asyncio.sleep(0.02)

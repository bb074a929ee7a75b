"""Small asyncio helpers shared by the server's background loops."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterable


async def cancel_all(tasks: Iterable[asyncio.Task[None]]) -> None:
    """Cancel every task, then wait for each to finish unwinding (their cancellation is expected)."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    for task in tasks:
        with contextlib.suppress(asyncio.CancelledError):
            await task

"""Wait for an observable condition instead of sleeping: poll until it holds or time runs out."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")


async def until(check: Callable[[], Awaitable[T | None]], *, within: float = 30.0, interval: float = 0.05) -> T:
    """The first truthy result of `check()`; fails with the last result after `within` seconds."""
    deadline = time.monotonic() + within
    last: T | None = None
    while True:
        last = await check()
        if last:
            return last
        if time.monotonic() > deadline:
            raise TimeoutError(f"condition not met in {within}s; last: {last!r}")
        await asyncio.sleep(interval)

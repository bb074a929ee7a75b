"""The headless Chromium the browser tests drive (Playwright), one per test module.

Playwright's own browser download is not reachable here, so it launches Debian's. `chromium-headless-shell`
is preferred: it is the headless-only build Playwright itself uses for `headless=True`, and it renders the
same pages for about half the CPU of the full `chromium` in its new headless mode (which draws through the
whole browser UI stack). `chromium` is the fallback; scripts/test installs both.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import AsyncIterator

from playwright.async_api import Browser, async_playwright, expect

BINARIES = ("chromium-headless-shell", "chromium")


def chromium_binary() -> str:
    for name in BINARIES:
        found = shutil.which(name)
        if found:
            return found
    raise AssertionError("Debian's chromium is needed: apt-get install -y chromium-headless-shell (scripts/test does)")


@contextlib.asynccontextmanager
async def launched() -> AsyncIterator[Browser]:
    """A browser for a module's tests (a launch costs about a second); each `new_page` or `new_context` is
    a context of its own. Waits for what a page shows get 20 s: room for a busy CI machine, never a sleep."""
    expect.set_options(timeout=20_000)
    async with async_playwright() as playwright:
        browser = await playwright.chromium.launch(executable_path=chromium_binary())
        try:
            yield browser
        finally:
            await browser.close()

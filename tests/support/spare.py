"""A server started ahead of the test that will use it.

A `threadloom serve` takes about a second of CPU to become ready, and about 180 tests each want a fresh
one. The pool keeps one spare per worker: its own fresh database and data dir, the same command and
environment a test's own start would use, started while the test before it runs, and only when that next
test takes the `server` fixture (pytest tells each test which one follows it). A test that takes `server`
gets the spare (the fixtures `database_url` and `data_dir` then name the spare's).

A spare is only handed out if nothing it was started with has changed since: the process environment and
the module's provider instances (`PROVIDERS`). Otherwise it is stopped and a server is started for the test,
as before. Each test still gets a server no other test has used.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import os
from pathlib import Path

import pytest

from tests.support.pg import PgServer
from tests.support.server import ServerProcess, providers_env


@dataclasses.dataclass
class Spare:
    database_url: str
    data_dir: Path
    providers: str | None
    environ: dict[str, str]
    proc: ServerProcess


@dataclasses.dataclass(frozen=True)
class Wanted:
    """A test that takes the `server` fixture, and the provider instances its module configures."""

    providers: str | None


class ServerPool:
    def __init__(self, pg: PgServer, folders: pytest.TempPathFactory) -> None:
        self.pg = pg
        self.folders = folders
        self.spare: Spare | None = None

    def _start(self, providers: str | None) -> Spare:
        folder = self.folders.mktemp("server")
        env = providers_env(folder, providers) if providers is not None else None
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # a fixture may run while the test's loop does
            url = pool.submit(asyncio.run, self.pg.fresh()).result(60)
        data_dir = folder / "data"
        return Spare(url, data_dir, providers, dict(os.environ), ServerProcess(url, data_dir, env=env))

    def _fits(self, providers: str | None) -> bool:
        spare = self.spare
        return spare is not None and spare.providers == providers and spare.environ == dict(os.environ)

    def take(self, now: Wanted | None, ahead: Wanted | None) -> Spare | None:
        """The server for this test (`now`: it wants one, with these providers): the spare when it was
        started as this test would start its server, else a new start. Then a spare for the next test when it
        wants a server (`ahead`), so none is started for a test that will not use it."""
        taken = None
        if now is not None:
            if self._fits(now.providers):
                taken, self.spare = self.spare, None
            else:
                taken = self._start(now.providers)
        if ahead is not None and not self._fits(ahead.providers):
            self.close()
            self.spare = self._start(ahead.providers)
        return taken

    def close(self) -> None:
        if self.spare is not None:
            self.spare.proc.kill()
            self.spare = None

"""A server started ahead of the test that will use it.

A `threadloom serve` takes 1-2 s to become ready, and about 180 tests each want a fresh one: most of a
serial run's waiting. The pool keeps one spare per worker — its own fresh database and data dir, the same
command and environment a test's own start would use — started while the test before it runs. A test that
asks for the `server` fixture takes the spare (the fixtures `database_url` and `data_dir` then name the
spare's), and the next spare starts at once.

A spare is only handed out if nothing it was started with has changed since: the process environment and
the module's provider instances (`PROVIDERS`). Otherwise it is stopped and a server is started for the test,
as before. Each test still gets a server no other test has used.
"""

from __future__ import annotations

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


class ServerPool:
    def __init__(self, pg: PgServer, folders: pytest.TempPathFactory) -> None:
        self.pg = pg
        self.folders = folders
        self.spare: Spare | None = None

    async def _start(self, providers: str | None) -> Spare:
        folder = self.folders.mktemp("server")
        env = providers_env(folder, providers) if providers is not None else None
        url = await self.pg.fresh()
        data_dir = folder / "data"
        return Spare(url, data_dir, providers, dict(os.environ), ServerProcess(url, data_dir, env=env))

    async def take(self, providers: str | None) -> Spare:
        """The spare when it was started as this test would start its server, else a new start; either way a
        new spare (for the same providers) is started before returning."""
        spare, self.spare = self.spare, None
        if spare is not None and (spare.providers != providers or spare.environ != dict(os.environ)):
            spare.proc.kill()
            spare = None
        if spare is None:
            spare = await self._start(providers)
        self.spare = await self._start(providers)
        return spare

    def close(self) -> None:
        if self.spare is not None:
            self.spare.proc.kill()
            self.spare = None

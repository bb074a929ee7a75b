"""The state file a running `threadloom serve` announces itself in, so the CLI in another terminal finds its data.

`threadloom token …` run without `--data-dir` or `THREADLOOM_DATA_DIR` would otherwise open `./.threadloom` of
whatever folder it is run from, and make a new, empty database there. The server writes
`$XDG_STATE_HOME/threadloom/server.json` (default `~/.local/state/threadloom/server.json`) when it starts and
removes it when it stops cleanly; after a crash the file stays, and still names the right data dir. It holds no
secret: the URL, the data dir, whether the database is embedded, and the server's pid. With several servers the
last one started wins; `--data-dir` picks another.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


def state_file() -> Path:
    """Where the running server is announced (XDG Base Directory: state, not config or cache)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "threadloom" / "server.json"


@dataclass(frozen=True)
class Announced:
    url: str
    data_dir: Path
    embedded: bool
    pid: int


def write(url: str, data_dir: Path, embedded: bool) -> Path:
    """Announce this process; replaced atomically, so a reader never sees half a file."""
    path = state_file()
    path.parent.mkdir(parents=True, exist_ok=True)
    body = {"url": url, "data_dir": str(data_dir), "embedded": embedded, "pid": os.getpid()}
    tmp = path.with_name(f".server.json.{os.getpid()}")
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(path)
    return path


def remove_if_mine() -> None:
    """At a clean stop: remove the file unless a server started later has replaced it."""
    found = read()
    if found is not None and found.pid == os.getpid():
        with contextlib.suppress(OSError):
            state_file().unlink()


def read() -> Announced | None:
    """The announced server, or None when there is none (or the file is unreadable: treated as absent)."""
    try:
        body = json.loads(state_file().read_text())
        return Announced(str(body["url"]), Path(body["data_dir"]), bool(body["embedded"]), int(body["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None

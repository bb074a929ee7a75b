"""The driver's own record of its ACP sessions: alias → session id, cwd and turns.

The alias is the native thread ref Threadloom stores and shows; the session id stays here, in a file
only the agent user and the server can read (mode 0600 in a 0700 folder of the project's agent state
folder, which every replica reaches), because an ACP session id lets its holder `session/load` the
conversation. The turns (their ids and the fingerprints of their user messages) are what
`_session/rewind` names a message by.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

_ALIAS = re.compile(r"acp-[0-9a-f]{32}")


@dataclasses.dataclass(slots=True)
class SessionRecord:
    alias: str
    session_id: str
    cwd: str
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)


class SessionRecords:
    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def _path(self, alias: str) -> Path | None:
        return self.folder / f"{alias}.json" if _ALIAS.fullmatch(alias) else None

    def load(self, alias: str) -> SessionRecord | None:
        path = self._path(alias)
        if path is None:
            return None
        try:
            data = json.loads(path.read_text())
            return SessionRecord(alias, str(data["sessionId"]), str(data["cwd"]), list(data.get("turns") or []))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def save(self, record: SessionRecord) -> None:
        path = self._path(record.alias)
        if path is None:
            raise ValueError(f"not an ACP thread alias: {record.alias!r}")
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = {"sessionId": record.session_id, "cwd": record.cwd, "turns": record.turns}
        fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".session.")  # mkstemp: mode 0600
        with os.fdopen(fd, "w") as file:
            json.dump(data, file)
        os.replace(tmp, path)

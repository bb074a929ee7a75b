"""The driver's own record of its ACP sessions: alias → session id, cwd and turns.

The alias is the native thread ref Threadloom stores and shows; the session id stays here, because an ACP
session id lets its holder `session/load` the conversation. The turns (their ids and the fingerprints of
their user messages) are what `_session/rewind` names a message by.

Where: `<agent state dir>/<instance>/acp-sessions/<project>/<alias>.json` (files 0600, folders 0700), beside
the project's agent state folder rather than in it. That folder is the agent user's, so it could rename
anything in it and put a link in its place; this one is the server's (the instance folder stays root's and
only traversable), so the agent can neither read the ids nor point the server's writes elsewhere, and
every replica still reaches it through the shared agent state dir. All file work is still done through
O_NOFOLLOW descriptors (`threadloom.nofollow`), so a link found on the way is refused, never followed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from pathlib import Path
from typing import Any

from threadloom import nofollow

_ALIAS = re.compile(r"acp-[0-9a-f]{32}")


@dataclasses.dataclass(slots=True)
class SessionRecord:
    alias: str
    session_id: str
    cwd: str
    turns: list[dict[str, Any]] = dataclasses.field(default_factory=list)


FOLDER = "acp-sessions"
_LIMIT = 64 << 20  # a record holds a session's turn list: far below this


class SessionRecords:
    """The records of one project's ACP sessions, in the server's folder beside its agent state folder."""

    def __init__(self, state_dir: Path) -> None:
        """`state_dir` is the project's agent state folder `<instance folder>/<project>`; its parent, the
        instance folder, is the server's own."""
        self.base = state_dir.parent
        self.parts = (FOLDER, state_dir.name)

    @property
    def folder(self) -> Path:
        return self.base.joinpath(*self.parts)

    def load(self, alias: str) -> SessionRecord | None:
        if not _ALIAS.fullmatch(alias):
            return None
        raw = nofollow.read_file(self.base, (*self.parts, f"{alias}.json"), _LIMIT)
        if raw is None:
            return None
        try:
            data = json.loads(raw)
            return SessionRecord(alias, str(data["sessionId"]), str(data["cwd"]), list(data.get("turns") or []))
        except (ValueError, KeyError, TypeError):
            return None

    def save(self, record: SessionRecord) -> None:
        if not _ALIAS.fullmatch(record.alias):
            raise ValueError(f"not an ACP thread alias: {record.alias!r}")
        data = {"sessionId": record.session_id, "cwd": record.cwd, "turns": record.turns}
        folder = nofollow.open_folder(self.base, self.parts, make=0o700)
        try:
            nofollow.put_file_at(folder, f"{record.alias}.json", json.dumps(data).encode(), 0o600)
        finally:
            os.close(folder)

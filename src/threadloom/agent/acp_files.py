"""`_session/files/revert`: what each turn's `@write`s replaced, so the files can be put back.

Before a `@write` changes a file, its content (or its absence) is kept under the turn that wrote it, in
`<state dir>/acp-files/<session>.json`, written atomically: a revert after a crash and respawn still works.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from threadloom.agent import workspace


class FileHistory:
    def __init__(self, state_dir: Path) -> None:
        self.root = state_dir / "acp-files"
        self.root.mkdir(parents=True, exist_ok=True)

    def record(self, session: str, turn: str, target: Path) -> None:
        """Keeps the content of `target` (resolved inside the cwd) before `turn` writes it (the first time only)."""
        path = str(target)
        entries = self._load(session)
        if any(e["turn"] == turn and e["path"] == path for e in entries):
            return
        try:
            before: str | None = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            before = None
        except (OSError, ValueError):
            return  # not a text file we can put back; the revert leaves it alone
        entries.append({"turn": turn, "path": path, "before": before})
        self._save(session, entries)

    def revert(self, session: str, turns: list[str], cwd: str) -> list[str]:
        """Puts back every file the given turns wrote, latest first; returns the paths restored. A path that no
        longer resolves inside `cwd` (a symlink swapped in since) is left alone."""
        entries = self._load(session)
        chosen = [e for e in entries if e["turn"] in turns]
        restored: list[str] = []
        for entry in reversed(chosen):
            try:
                path = workspace.resolve(cwd, entry["path"])
            except workspace.EscapeError:
                continue
            if entry["before"] is None:
                path.unlink(missing_ok=True)
            else:
                path.write_text(entry["before"], encoding="utf-8")
            if entry["path"] not in restored:
                restored.append(entry["path"])
        self._save(session, [e for e in entries if e["turn"] not in turns])
        return restored

    def _file(self, session: str) -> Path:
        return self.root / f"{session}.json"

    def _load(self, session: str) -> list[dict[str, Any]]:
        try:
            data = json.loads(self._file(session).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return []
        return list(data) if isinstance(data, list) else []

    def _save(self, session: str, entries: list[dict[str, Any]]) -> None:
        fd, tmp = tempfile.mkstemp(prefix=f".{session}.", suffix=".tmp", dir=self.root)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(entries, f, ensure_ascii=False)
            os.replace(tmp, self._file(session))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

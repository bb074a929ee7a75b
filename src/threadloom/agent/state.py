"""The state folder: one JSON file per thread, so a new process can resume what a crashed one started.

Every write goes to a temporary file that then replaces the real one, so a crash (or `kill -9`) at any moment
leaves either the old or the new version on disk, never a torn file.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import tempfile
from pathlib import Path
from typing import Any

IN_PROGRESS = "inProgress"
INTERRUPTED = "interrupted"
DEFAULT_MODE = "workspace_write"
# Kinds of what a turn adds to the conversation (`@recall` shows them; docs/scripted-agent.md, "Recall").
USER = "user"
HANDOFF = "handoff"

# Thread ids come from clients on resume/read; only plain names may become file names.
_SAFE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*")


class StateError(Exception):
    """A thread file that exists but cannot be read."""


@dataclasses.dataclass(frozen=True, slots=True)
class ContextEntry:
    """One thing the agent received: a user message (turn start or steering) or an injected handoff text."""

    kind: str  # USER or HANDOFF
    text: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "text": self.text}


@dataclasses.dataclass(slots=True)
class TurnRecord:
    id: str
    input: str
    output: str = ""
    status: str = IN_PROGRESS
    # What this turn added to the conversation, in arrival order; `@recall` lists these over the thread's turns.
    context: list[ContextEntry] = dataclasses.field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "input": self.input,
            "output": self.output,
            "status": self.status,
            "context": [entry.to_json() for entry in self.context],
        }

    def copy(self) -> TurnRecord:
        return TurnRecord(self.id, self.input, self.output, self.status, list(self.context))


@dataclasses.dataclass(slots=True)
class ThreadRecord:
    id: str
    cwd: str
    turns: list[TurnRecord] = dataclasses.field(default_factory=list)
    runtime_mode: str = DEFAULT_MODE  # what its commands may do; see sandbox.py and docs/scripted-agent.md
    model: str | None = None  # the ACP face's `model` config option (the Codex face has none)

    def to_json(self) -> dict[str, Any]:
        turns = [turn.to_json() for turn in self.turns]
        data = {"id": self.id, "cwd": self.cwd, "runtimeMode": self.runtime_mode, "turns": turns}
        if self.model is not None:
            data["model"] = self.model
        return data

    def settle_stale_turns(self) -> bool:
        """Marks turns a dead process left `inProgress` as `interrupted`; True if any changed."""
        changed = False
        for turn in self.turns:
            if turn.status == IN_PROGRESS:
                turn.status = INTERRUPTED
                changed = True
        return changed


class StateStore:
    def __init__(self, root: Path) -> None:
        self.threads_dir = root / "threads"
        self.threads_dir.mkdir(parents=True, exist_ok=True)

    def load(self, thread_id: str) -> ThreadRecord | None:
        path = self._path(thread_id)
        if path is None or not path.is_file():
            return None
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
            turns = [_turn(t) for t in data["turns"]]
            mode = str(data.get("runtimeMode", DEFAULT_MODE))  # files written before modes existed
            model = data.get("model")
            return ThreadRecord(str(data["id"]), str(data["cwd"]), turns, mode, None if model is None else str(model))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StateError(f"cannot read thread {thread_id}: {exc}") from exc

    def save(self, thread: ThreadRecord) -> None:
        path = self._path(thread.id)
        if path is None:
            raise StateError(f"unsafe thread id {thread.id!r}")
        fd, tmp = tempfile.mkstemp(prefix=f".{thread.id}.", suffix=".tmp", dir=self.threads_dir)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(thread.to_json(), f, ensure_ascii=False, indent=1)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def _path(self, thread_id: str) -> Path | None:
        if not _SAFE_ID.fullmatch(thread_id):
            return None
        return self.threads_dir / f"{thread_id}.json"


def _turn(data: dict[str, Any]) -> TurnRecord:
    raw = data.get("context")
    if raw is None:  # files written before recall existed: the input was the only thing received
        context = [ContextEntry(USER, str(data["input"]))]
    else:
        context = [ContextEntry(str(e["kind"]), str(e["text"])) for e in raw]
    return TurnRecord(str(data["id"]), str(data["input"]), str(data["output"]), str(data["status"]), context)

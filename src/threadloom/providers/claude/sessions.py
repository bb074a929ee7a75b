"""Claude sessions on disk: the CLI's transcripts, and this driver's small record per thread.

The native thread ref is Claude's session id. `HOME` and `CLAUDE_CONFIG_DIR` live under the
project's state folder, so sessions survive processes and server restarts. A record per thread
(`<state>/threads/<sid>.json`: cwd, fork origin, last assistant message per turn) lets a later
runtime resume, fork, or fork from a turn without asking the model.

Behaviour of Claude Code 2.1.197 this relies on (observed against the fake model):
- `--session-id UUID` names a new session without a model call; its transcript
  (`$CLAUDE_CONFIG_DIR/projects/<cwd-slug>/<sid>.jsonl`) appears only with the first
  message, and the id is refused once that file exists. So a process is spawned with
  `--resume sid` when the file exists, else with `--session-id sid`. `--resume` works only
  from the session's cwd ("No conversation found with session ID" elsewhere).
- Fork: `--resume SID --fork-session --session-id NEW` forks under a chosen id (no model
  call; the new transcript, with the parent's message uuids, appears with the first
  message). `--resume-session-at <assistant message uuid>` (hidden flag) cuts the
  history after that message, so a fork from a turn uses the uuid of the turn's last
  assistant message.
- The CLI writes its transcript in batches (a short flush timer), so right after a turn ends the
  file may lack that turn, or not exist yet. A fork first waits until the parent's transcript
  holds the parent's last assistant message (`wait_flushed`); forking earlier silently lost history.
  A completed turn is reported only once its last message is written too, so a process killed
  right after a turn still resumes with that turn.
"""

from __future__ import annotations

import asyncio
import os
import re
import uuid
from pathlib import Path
from typing import Any

import orjson

from threadloom import nofollow, unprivileged
from threadloom.providers.contract import ProviderError

Record = dict[str, Any]  # {"cwd", "marks": {turn: last assistant uuid | None}, "fork_of"?, "resume_at"?}


def new_record(cwd: str) -> Record:
    return {"cwd": cwd, "marks": {}}


def last_mark(record: Record) -> str | None:
    """The uuid of the last assistant message the record knows (where the next turn's fork point starts)."""
    known = [m for m in (record.get("marks") or {}).values() if m]
    return known[-1] if known else None


def mark_turn(record: Record, turn: str, assistant_uuid: str | None) -> None:
    """Remember the turn's last assistant message, so a fork from this turn can cut there."""
    record.setdefault("marks", {})[turn] = assistant_uuid


def check_sid(sid: str) -> None:
    try:
        uuid.UUID(sid)
    except ValueError as error:
        raise ProviderError("not_found", f"{sid!r} is not a Claude session id") from error


def _slug(path: str) -> str:
    return re.sub(r"[^A-Za-z0-9]", "-", path)


_RECORD_LIMIT = 16 << 20
_TRANSCRIPT_LIMIT = 1 << 30


class SessionStore:
    """The records under `home/threads` and the transcripts under the CLI's config folder.

    Both are in the project's agent state folder `home`, which is the agent user's: any name in it may be a
    link or a FIFO the agent put there. So they are read only through O_NOFOLLOW descriptors opened from
    `home` (`threadloom.nofollow`): a link on the way is not followed, a file that is not a regular one is
    not read."""

    def __init__(self, home: Path, config_dir: Path) -> None:
        self.home = home
        self.config_dir = config_dir
        # The config folder as components below `home` (it is `home/claude-home/.claude`).
        if config_dir.is_relative_to(home):
            self._config = (home, config_dir.relative_to(home).parts)
        else:
            self._config = (config_dir, ())

    def _record_path(self, sid: str) -> Path:
        return self.home / "threads" / f"{sid}.json"

    def load(self, sid: str) -> Record | None:
        raw = nofollow.read_file(self.home, ("threads", f"{sid}.json"), _RECORD_LIMIT)
        try:
            data = orjson.loads(raw) if raw is not None else None
        except orjson.JSONDecodeError:
            return None
        return data if isinstance(data, dict) else None

    def save(self, sid: str, record: Record) -> None:
        # The folder is the agent user's (threadloom.unprivileged): made and written without following a link.
        path = self._record_path(sid)
        self.home.mkdir(parents=True, exist_ok=True)
        unprivileged.agent_folders(self.home, ("threads",))
        unprivileged.put_file(path.parent, path.name, orjson.dumps(record))

    def transcript(self, sid: str) -> Path | None:
        """The session's transcript, wherever its project folder is (None before the first message).
        Only a regular file in a real folder counts: a link to one, or a folder that is a link, does not."""
        base, parts = self._config
        try:
            projects = nofollow.open_folder(base, (*parts, "projects"))
        except OSError:
            return None
        try:
            for entry in sorted(os.scandir(projects), key=lambda e: e.name):
                if not entry.is_dir(follow_symlinks=False):
                    continue
                try:
                    folder = os.open(entry.name, nofollow.DIR_FLAGS, dir_fd=projects)
                except OSError:
                    continue
                try:
                    if nofollow.is_file_at(folder, f"{sid}.jsonl"):
                        return self.config_dir / "projects" / entry.name / f"{sid}.jsonl"
                finally:
                    os.close(folder)
        finally:
            os.close(projects)
        return None

    def _read_transcript(self, path: Path) -> bytes:
        """The transcript `transcript()` found, read again without following a link (b"" if it is gone)."""
        base, parts = self._config
        found = nofollow.read_file(base, (*parts, "projects", path.parent.name, path.name), _TRANSCRIPT_LIMIT)
        return found or b""

    async def wait_flushed(self, sid: str, record: Record, mark: str | None, within: float) -> None:
        """Return once the transcript session `sid` resumes from holds message `mark`; else `not_flushed`.

        That transcript is the session's own, or its origin's while a fork has had no turn yet
        (a fork keeps its origin's message ids, so the mark is found in either).
        """
        if mark is None:
            return
        needle = mark.encode()
        sources = [sid, *([str(record["fork_of"])] if record.get("fork_of") else [])]
        try:
            async with asyncio.timeout(within):
                while True:
                    for source in sources:
                        path = self.transcript(source)
                        if path is not None and needle in await asyncio.to_thread(self._read_transcript, path):
                            return
                    await asyncio.sleep(0.02)  # the CLI offers no flush signal; its timer is ~100 ms
        except TimeoutError:
            raise ProviderError("not_flushed", f"Claude has not written session {sid} up to its last turn") from None

    async def check_workspace(self, sid: str, transcript: Path, cwd: str) -> None:
        """Refuse (`cwd_mismatch`) a session whose transcript belongs to another workspace: it would not resume."""
        folder = transcript.parent.name
        wanted = {_slug(cwd), _slug(await asyncio.to_thread(os.path.realpath, cwd))}
        if folder not in wanted and all(len(w) <= 200 for w in wanted):
            raise ProviderError("cwd_mismatch", f"Claude session {sid} belongs to another workspace than {cwd}")

    def args(self, sid: str, record: Record) -> list[str]:
        """The CLI flags that open the session: resume it, fork it from its origin, or name a new one."""
        if self.transcript(sid) is not None:
            return ["--resume", sid]
        origin = record.get("fork_of")
        if origin:
            args = ["--resume", str(origin), "--fork-session", "--session-id", sid]
            at = record.get("resume_at")
            return [*args, "--resume-session-at", str(at)] if at else args
        return ["--session-id", sid]

    def fork_record(self, sid: str, record: Record, turn: str | None, cwd: str) -> Record:
        """The record of a fork of session `sid` (up to `turn`); materialized by the fork's first turn."""
        marks: dict[str, str | None] = dict(record.get("marks") or {})
        at: str | None = None
        if turn is not None:
            if turn not in marks:
                raise ProviderError("unknown_turn", f"turn {turn} is not known in thread {sid}")
            at = marks[turn]
            keep = list(marks)[: list(marks).index(turn) + 1]
            marks = {k: marks[k] for k in keep}
        origin: str | None = sid
        if self.transcript(sid) is None:  # the parent itself is not materialized yet
            origin = record.get("fork_of")
            at = at or record.get("resume_at")
        if origin is not None and turn is not None and at is None:
            origin = None  # the turn left no assistant message in an otherwise empty history
        return {"cwd": cwd, "marks": marks, "fork_of": origin, "resume_at": at}

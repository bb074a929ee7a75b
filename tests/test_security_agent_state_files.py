"""The server's own file work in an agent's state folder and workspace never follows a link the agent put there.

At the lowest honest level: the drivers' stores and the workspace grant on real folders, the planted links,
FIFOs and swaps made exactly as an agent would (tests/test_security_agent_reach.py runs the attacks through a
real server). Each denial has its twin: the same call on the real folder does its work.

- ACP session records (`providers/acp/sessions.py`): kept beside the project's state folder, in the server's
  own folder; even so every step is made through O_NOFOLLOW descriptors, so a link on the way is refused.
- Claude's thread records and transcripts (`providers/claude/sessions.py`): in the agent's own folder, read
  without following links and only when they are regular files.
- The workspace grant (`unprivileged.grant_workspace`): a folder swapped for a link while the walk runs
  (renameat2 RENAME_EXCHANGE in a loop) never gets the target an ACL entry.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
import threading
import uuid
from pathlib import Path

import orjson
import pytest

from tests.support.hostile import exchange, snapshot
from threadloom import unprivileged
from threadloom.providers.acp.sessions import SessionRecord, SessionRecords
from threadloom.providers.claude.sessions import SessionStore
from threadloom.providers.contract import ProviderError

ALIAS = "acp-" + "ab" * 16
RECORD = SessionRecord(ALIAS, "secret-session-id", "/work", [{"id": "t1"}])


def outside_folder(tmp_path: Path) -> Path:
    """A folder outside every store, with a record-shaped file the store must never read or change."""
    outside = tmp_path / "outside"
    outside.mkdir()
    bait = {"sessionId": "outsider", "cwd": "/elsewhere", "turns": []}
    (outside / f"{ALIAS}.json").write_bytes(orjson.dumps(bait))
    return outside


# ---- ACP session records ---------------------------------------------------------------------------------


def acp_records(tmp_path: Path) -> SessionRecords:
    state = tmp_path / "agents" / "acp" / "p1"
    state.mkdir(parents=True)
    return SessionRecords(state)


def test_acp_records_live_beside_the_state_folder_and_round_trip(tmp_path: Path) -> None:
    """The twin of the tests below: on real folders a record is saved 0600 in a 0700 folder and loaded back."""
    records = acp_records(tmp_path)
    records.save(RECORD)
    assert records.folder == tmp_path / "agents" / "acp" / "acp-sessions" / "p1"
    saved = records.folder / f"{ALIAS}.json"
    assert saved.stat().st_mode & 0o777 == 0o600 and records.folder.stat().st_mode & 0o777 == 0o700
    assert records.load(ALIAS) == RECORD


@pytest.mark.parametrize("swapped", ["acp-sessions", "acp-sessions/p1"])
def test_a_records_folder_swapped_for_a_link_is_neither_written_nor_read(tmp_path: Path, swapped: str) -> None:
    """Either folder on the way replaced by a link to a folder outside: saving fails and creates nothing there,
    loading does not read the record-shaped file there."""
    records = acp_records(tmp_path)
    outside = outside_folder(tmp_path)
    before = snapshot(outside)
    link = tmp_path / "agents" / "acp" / swapped
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(outside)
    with pytest.raises(OSError):
        records.save(RECORD)
    assert records.load(ALIAS) is None
    assert snapshot(outside) == before


def test_a_link_at_a_record_s_name_is_replaced_never_written_through(tmp_path: Path) -> None:
    """A link where a record goes: loading does not read its target; saving replaces the link itself, and the
    target keeps its content. The twin: the record then saved is the one loaded."""
    records = acp_records(tmp_path)
    outside = outside_folder(tmp_path)
    before = snapshot(outside)
    records.folder.mkdir(parents=True)
    (records.folder / f"{ALIAS}.json").symlink_to(outside / f"{ALIAS}.json")
    assert records.load(ALIAS) is None
    records.save(RECORD)
    assert not (records.folder / f"{ALIAS}.json").is_symlink()
    assert records.load(ALIAS) == RECORD
    assert snapshot(outside) == before


async def test_a_fifo_at_a_record_s_name_is_not_read(tmp_path: Path) -> None:
    """A FIFO where a record is looked for: the load answers None at once instead of waiting for a writer;
    the twin, a regular file there, is read."""
    records = acp_records(tmp_path)
    records.folder.mkdir(parents=True)
    fifo = records.folder / f"{ALIAS}.json"
    os.mkfifo(fifo)
    try:
        assert await asyncio.wait_for(asyncio.to_thread(records.load, ALIAS), 10) is None
    finally:
        _unblock(fifo)
    fifo.unlink()
    records.save(RECORD)
    assert records.load(ALIAS) == RECORD


def _unblock(fifo: Path) -> None:
    """Open the FIFO's writing end once, so a reader stuck in open() (a failed test) is released."""
    with contextlib.suppress(OSError):  # no reader waiting: nothing to release
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


# ---- Claude's records and transcripts --------------------------------------------------------------------


SID = str(uuid.UUID(int=7))
MARK = "assistant-uuid-0007"


def claude_store(tmp_path: Path) -> SessionStore:
    state = tmp_path / "agents" / "claude" / "p1"
    (state / "claude-home" / ".claude").mkdir(parents=True)
    return SessionStore(state, state / "claude-home" / ".claude")


def transcript_in(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{SID}.jsonl"
    path.write_bytes(orjson.dumps({"uuid": MARK}) + b"\n")
    return path


def test_claude_records_through_a_linked_threads_folder_are_neither_read_nor_written(tmp_path: Path) -> None:
    """`threads` replaced by a link to a folder holding a record-shaped file: load does not read it, save fails
    without writing there. The twin: with a real `threads` folder the record saved is the one loaded."""
    store = claude_store(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / f"{SID}.json").write_bytes(orjson.dumps({"cwd": "/elsewhere", "marks": {}}))
    before = snapshot(outside)
    (store.home / "threads").symlink_to(outside)
    assert store.load(SID) is None
    with pytest.raises(OSError):
        store.save(SID, {"cwd": "/work", "marks": {}})
    assert snapshot(outside) == before
    (store.home / "threads").unlink()
    store.save(SID, {"cwd": "/work", "marks": {"t1": MARK}})
    assert store.load(SID) == {"cwd": "/work", "marks": {"t1": MARK}}


async def test_a_fifo_or_a_link_at_a_claude_record_s_name_is_not_read(tmp_path: Path) -> None:
    store = claude_store(tmp_path)
    (store.home / "threads").mkdir()
    fifo = store.home / "threads" / f"{SID}.json"
    os.mkfifo(fifo)
    try:
        assert await asyncio.wait_for(asyncio.to_thread(store.load, SID), 10) is None
    finally:
        _unblock(fifo)
    fifo.unlink()
    fifo.symlink_to("/dev/zero")  # followed, a read would never end
    assert await asyncio.wait_for(asyncio.to_thread(store.load, SID), 10) is None


@pytest.mark.parametrize("planted", ["linked-project-folder", "linked-transcript", "linked-config-folder"])
async def test_a_transcript_reached_through_a_link_is_not_found_nor_read(tmp_path: Path, planted: str) -> None:
    """A transcript holding the awaited mark, outside the state folder, reached through a link planted as a
    project folder, as the transcript file itself, or as the CLI's config folder: not found, and waiting for
    the mark gives up (`not_flushed`) rather than reading it. The twin (test below): a real one is found."""
    store = claude_store(tmp_path)
    outside = tmp_path / "outside"
    real = transcript_in(outside / "projects" / "-work")
    before = snapshot(outside)
    projects = store.config_dir / "projects"
    if planted == "linked-project-folder":
        projects.mkdir()
        (projects / "-work").symlink_to(real.parent)
    elif planted == "linked-transcript":
        (projects / "-work").mkdir(parents=True)
        (projects / "-work" / f"{SID}.jsonl").symlink_to(real)
    else:
        store.config_dir.rmdir()
        store.config_dir.symlink_to(outside)
    assert store.transcript(SID) is None
    assert store.args(SID, {"cwd": "/work", "marks": {}}) == ["--session-id", SID]
    with pytest.raises(ProviderError) as caught:
        await store.wait_flushed(SID, {"cwd": "/work"}, MARK, within=0.3)
    assert caught.value.code == "not_flushed"
    assert snapshot(outside) == before


async def test_the_twin_a_real_transcript_is_found_and_read(tmp_path: Path) -> None:
    store = claude_store(tmp_path)
    real = transcript_in(store.config_dir / "projects" / "-work")
    assert store.transcript(SID) == real
    assert store.args(SID, {"cwd": "/work", "marks": {}}) == ["--resume", SID]
    await store.wait_flushed(SID, {"cwd": "/work"}, MARK, within=5.0)


# ---- the workspace grant under a racing swap ----------------------------------------------------------------


AGENT_UID = unprivileged.DEFAULT_UID


def agent_entry(path: Path) -> bool:
    try:
        acl = os.getxattr(path, unprivileged.ACCESS_ACL, follow_symlinks=False)
    except OSError:
        return False
    entries = [struct.unpack_from("<HHI", acl, at) for at in range(4, len(acl), 8)]
    return any(tag == 0x02 and uid == AGENT_UID for tag, _, uid in entries)


@pytest.mark.skipif(os.geteuid() != 0, reason="the grant is made only by a root server")
def test_a_folder_swapped_for_a_link_during_the_grant_never_grants_the_target(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While `grant_workspace` walks the workspace again and again, the agent swaps a real folder and a link to
    a folder outside (renameat2 RENAME_EXCHANGE in a loop): the folder outside and its file never get an ACL
    entry. The twin: the real folder and its file, whatever name they have now, got it."""
    monkeypatch.setattr(unprivileged, "_current", unprivileged.current())  # put back after the test
    assert unprivileged.configure(AGENT_UID, AGENT_UID) is not None  # what `threadloom serve` does as root
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("outside\n")
    workspace = tmp_path / "ws"
    (workspace / "sub").mkdir(parents=True)
    (workspace / "sub" / "mine.txt").write_text("inside\n")
    (workspace / "sub-link").symlink_to(outside)
    stop = threading.Event()
    swaps = [0]

    def race() -> None:
        while not stop.is_set():
            if exchange(workspace / "sub", workspace / "sub-link") == 0:
                swaps[0] += 1

    racer = threading.Thread(target=race)
    racer.start()
    try:
        for _ in range(300):
            unprivileged.grant_workspace(workspace)
    finally:
        stop.set()
        racer.join()
    assert swaps[0] > 100  # the race really ran
    assert not agent_entry(outside) and not agent_entry(outside / "secret.txt")
    real = next(p for p in (workspace / "sub", workspace / "sub-link") if not p.is_symlink())
    assert agent_entry(real) and agent_entry(real / "mine.txt")

"""A database made by the first release, upgraded with `threadloom migrate` and served: nothing is lost.

The database is created at the earliest migration (0001) and filled with plain SQL in that revision's shapes —
rows in its tables and the events that made them, their payloads as that release wrote them (a provider thread's
owner under `app_thread_id`, a transfer's under `target_thread_id`, no `workspace_path`, no `fresh_context`, a
token without `expires_at`, an effect without `affinity`): a project; a thread with a completed run (attempt,
provider turn, execution graph of four nodes, messages, an approval, a todo list, checkpoints), a failed run
retried once, and a run queued behind it in the queue that failure held; a fork of it, made through a transfer
with its context handoff and a run of its own; activities; a provider session; an outbox effect and a command
receipt. Every later migration has rows to transform.

The checkpoints are real: commits in a shadow repository laid out as the first release that kept checkpoints
made it (`OldCheckpoints`, plain git: `<data dir>/checkpoints/<project id>.git`, its `threadloom-index`, refs
`refs/threadloom/<thread>/root/<ordinal>` named in the rows' `ref`). Today's store reads the same layout (the
same paths, index name, ref names and settings), so the upgrade needs no step for it; this test is what says so.

Then the real `threadloom migrate` runs on it, a real `threadloom serve` serves it, and the API answers every
query with exactly that data: threads, runs, messages, the fork's lineage, checkpoints, `node(id:)` and
`nodes(ids:)` for every entity, and `threadEvents` replayed from sequence 0. The old token still authenticates.
And today's code works on the old data: `Checkpoint.diff` reads the old commits, a fork from the old checkpoint
gets its files in a folder of its own, `resumeQueue` runs the queued run to completion (its checkpoint on top of
the old ones), `rollbackToRun` to before run 1 puts back the old baseline's files, and the old fork takes a new
run.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import orjson
import pytest

from tests.support.cli import threadloom
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.ws import WsClient
from threadloom.api import ids as gid
from threadloom.domain.ids import new_id  # UUIDv7, as the first release made them (pages follow creation order)
from threadloom.store import migrate
from threadloom.store.db import Database
from threadloom.store.tokens import hash_token

EARLIEST = "0001"
TOKEN = "tl_old_release_admin_token_0123456789abcdef"
T0 = datetime(2026, 11, 30, 10, 0, tzinfo=UTC)
ENTITY_TYPENAMES = {
    "thread": "Thread",
    "run": "Run",
    "run_attempt": "RunAttempt",
    "execution_node": "ExecutionNode",
    "conversation_message": "ConversationMessage",
    "provider_thread": "ProviderThread",
    "provider_turn": "ProviderTurn",
    "context_transfer": "ContextTransfer",
    "context_handoff": "ContextHandoff",
    "checkpoint_scope": "CheckpointScope",
    "checkpoint": "Checkpoint",
    "runtime_request": "RuntimeRequest",
    "plan_artifact": "PlanArtifact",
    "activity": "Activity",
    "provider_session": "ProviderSession",
    "project": "Project",
}
TABLES = {
    "project": "projects",
    "thread": "threads",
    "run": "runs",
    "run_attempt": "run_attempts",
    "execution_node": "execution_nodes",
    "conversation_message": "conversation_messages",
    "provider_session": "provider_sessions",
    "provider_thread": "provider_threads",
    "provider_turn": "provider_turns",
    "context_transfer": "context_transfers",
    "context_handoff": "context_handoffs",
    "checkpoint_scope": "checkpoint_scopes",
    "checkpoint": "checkpoints",
    "runtime_request": "runtime_requests",
    "plan_artifact": "plan_artifacts",
    "activity": "activities",
}
# The first release's event names (`<prefix>.<verb>`), where the prefix is not the entity type.
PREFIX = {
    "run_attempt": "attempt",
    "execution_node": "node",
    "conversation_message": "message",
    "context_transfer": "transfer",
    "runtime_request": "request",
    "plan_artifact": "plan",
}


class OldRelease:
    """Writes rows and their events as the first release did: each change upserts its row and appends an event
    whose payload is the whole row, numbered in its thread's log."""

    def __init__(self, conn: asyncpg.Connection) -> None:
        self.conn = conn
        self.clock = T0
        self.sequences: dict[uuid.UUID, int] = {}
        self.log: dict[uuid.UUID, list[tuple[int, str, uuid.UUID]]] = {}  # thread -> (sequence, type, entity id)
        self.entities: dict[uuid.UUID, str] = {}  # every entity id -> its entity type

    def now(self) -> datetime:
        self.clock += timedelta(seconds=1)
        return self.clock

    async def write(
        self,
        entity_type: str,
        row: dict[str, Any],
        verb: str = "created",
        *,
        thread: uuid.UUID | None,
        project: uuid.UUID | None,
        run: uuid.UUID | None = None,
        node: uuid.UUID | None = None,
    ) -> dict[str, Any]:
        table = TABLES[entity_type]
        payload = dict(row)
        sequence = None
        if thread is not None:
            sequence = self.sequences[thread] = self.sequences.get(thread, 0) + 1
            self.log.setdefault(thread, []).append(
                (sequence, f"{PREFIX.get(entity_type, entity_type)}.{verb}", row["id"])
            )
            if entity_type == "activity":
                payload["sequence"] = row["sequence"] = sequence
        if entity_type == "thread":
            row = {**row, "last_sequence": sequence}
        body = orjson.dumps(row).decode()
        updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in row if c != "id")
        await self.conn.execute(
            f"INSERT INTO {table} SELECT * FROM jsonb_populate_record(NULL::{table}, $1::jsonb) "
            f"ON CONFLICT (id) DO UPDATE SET {updates}",
            body,
        )
        await self.conn.execute(
            "INSERT INTO events (thread_id, sequence, project_id, event_type, entity_type, entity_id, run_id, "
            "node_id, occurred_at, payload) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10::jsonb)",
            thread,
            sequence,
            project,
            f"{PREFIX.get(entity_type, entity_type)}.{verb}",
            entity_type,
            row["id"],
            run if run is not None else (row["id"] if entity_type == "run" else row.get("run_id")),
            node if node is not None else (row["id"] if entity_type == "execution_node" else row.get("node_id")),
            self.clock,
            orjson.dumps(payload).decode(),
        )
        self.entities[row["id"]] = entity_type
        return row

    async def touch_thread(self, thread: uuid.UUID) -> None:
        """The thread's `last_sequence`: its log's length (the first release kept it so too)."""
        await self.conn.execute("UPDATE threads SET last_sequence = $2 WHERE id = $1", thread, self.sequences[thread])


# The workspace as the first run found it (checkpoint 0) and as it left it (checkpoint 1: one file modified by
# +3 -1, one renamed unchanged, one binary added).
CLOCK_BEFORE = (
    "import time\n\n\ndef test_clock():\n    start = time.time()\n    time.sleep(1)\n"
    "    assert time.time() - start >= 1\n"
)
CLOCK_AFTER = CLOCK_BEFORE.replace(
    "    time.sleep(1)\n", "    deadline = start + 1\n    while time.time() < deadline:\n        time.sleep(0.01)\n"
)
NOTES = "# How the clock is read\n\nThrough `time.time()`, never a sleep of its own.\n"
README = "An old project.\n"
LOGO = b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x01\x00\x00\x00\x01\x08\x06"
BEFORE_RUN_1: dict[str, str | bytes] = {"README.md": README, "tests/test_clock.py": CLOCK_BEFORE, "docs/old.md": NOTES}
QUEUED_FILE, QUEUED_TEXT = "notes/queued.txt", "written-by-the-queued-run"
AFTER_RUN_1: dict[str, str | bytes] = {
    "README.md": README,
    "tests/test_clock.py": CLOCK_AFTER,
    "docs/new.md": NOTES,
    "logo.png": LOGO,
}


def tree_of(folder: Path) -> dict[str, str | bytes]:
    """Every file under `folder` by relative path, text where it decodes."""
    found: dict[str, str | bytes] = {}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        data = path.read_bytes()
        found[path.relative_to(folder).as_posix()] = data if b"\x00" in data else data.decode()
    return found


def lay_out(folder: Path, files: dict[str, str | bytes]) -> None:
    """Make `folder` hold exactly `files`."""
    for name in set(tree_of(folder)) - set(files):
        (folder / name).unlink()
    for name, content in files.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            (folder / name).write_bytes(content)
        else:
            (folder / name).write_text(content)


class OldCheckpoints:
    """The first release that kept checkpoints (commits 42a3fc7 and 45d6e49), its shadow repository made with plain
    git as that release's store made it: `<data dir>/checkpoints/<project id>.git`, bare, its private index
    `threadloom-index` in it, each checkpoint a commit of the whole workspace (staged path by path with
    `update-index`, the stale entries force-removed, `write-tree`, `commit-tree` with the previous checkpoint as
    parent) on `refs/threadloom/<thread id>/root/<ordinal>`, and the checkpoint row's `ref` that ref's name."""

    IDENTITY = {
        "GIT_AUTHOR_NAME": "Threadloom", "GIT_AUTHOR_EMAIL": "checkpoints@threadloom.invalid",
        "GIT_COMMITTER_NAME": "Threadloom", "GIT_COMMITTER_EMAIL": "checkpoints@threadloom.invalid",
    }  # fmt: skip
    CONFIG = {
        "core.bare": "true", "core.autocrlf": "false", "core.symlinks": "true", "core.filemode": "true",
        "core.hooksPath": "/dev/null", "core.excludesFile": "/dev/null", "core.attributesFile": "/dev/null",
        "core.quotePath": "false", "core.logAllRefUpdates": "false", "gc.auto": "0", "index.version": "4",
        "commit.gpgSign": "false", "diff.renames": "false",
    }  # fmt: skip

    def __init__(self, data_dir: Path, project: uuid.UUID, workspace: Path) -> None:
        self.git_dir = data_dir / "checkpoints" / f"{project}.git"
        self.workspace = workspace
        self.commits: dict[str, str] = {}  # ref -> commit
        self.git_dir.parent.mkdir(parents=True)
        self.git("init", "--bare", "--quiet", "--template=", str(self.git_dir), bare=True)
        for key, value in self.CONFIG.items():
            self.git("config", key, value)
        (self.git_dir / "info").mkdir()
        (self.git_dir / "info" / "attributes").write_text(
            "* -text !eol -filter -ident -working-tree-encoding !diff !merge\n"
        )
        (self.git_dir / "info" / "exclude").write_text("")

    def git(self, *args: str, stdin: bytes | None = None, bare: bool = False) -> str:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(self.git_dir / "home"), "LC_ALL": "C",
            "TZ": "UTC", "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null", **self.IDENTITY,
        }  # fmt: skip
        if not bare:
            env |= {
                "GIT_DIR": str(self.git_dir), "GIT_WORK_TREE": str(self.workspace),
                "GIT_INDEX_FILE": str(self.git_dir / "threadloom-index"),
            }  # fmt: skip
        done = subprocess.run(
            ["git", *args], input=stdin, capture_output=True, env=env, cwd=self.workspace, check=False, timeout=30
        )
        assert done.returncode == 0, done.stderr
        return done.stdout.decode().strip()

    def capture(self, thread: uuid.UUID, ordinal: int, message: str, parent: str | None = None) -> str:
        """Checkpoint `ordinal` of the thread's root scope; returns its ref."""
        present = sorted(tree_of(self.workspace))
        listed = [p for p in self.git("ls-files", "-z").split("\0") if p]
        stale = sorted(set(listed) - set(present))
        if stale:
            self.git(
                "update-index", "-z", "--force-remove", "--stdin", stdin=b"".join(os.fsencode(p) + b"\0" for p in stale)
            )
        self.git(
            "update-index", "-z", "--add", "--remove", "--replace", "--stdin",
            stdin=b"".join(os.fsencode(p) + b"\0" for p in present),
        )  # fmt: skip
        tree = self.git("write-tree")
        parents = ["-p", self.commits[parent]] if parent is not None else []
        commit = self.git("commit-tree", tree, *parents, stdin=message.encode())
        ref = f"refs/threadloom/{thread}/root/{ordinal}"
        self.git("update-ref", "--no-deref", ref, commit)
        self.commits[ref] = commit
        return ref


async def fill(old: OldRelease, workspace: Path, data_dir: Path) -> dict[str, Any]:
    """The representative data set, its checkpoints in a real shadow repository; returns the ids and facts the
    checks compare against."""
    P, A, B = new_id(), new_id(), new_id()
    shadow = OldCheckpoints(data_dir, P, workspace)
    lay_out(workspace, BEFORE_RUN_1)
    ids: dict[str, Any] = {"project": P, "main": A, "fork": B}
    await old.write(
        "project",
        {
            "id": P,
            "name": "old project",
            "workspace_root": str(workspace),
            "created_at": old.now(),
            "updated_at": old.clock,
        },
        thread=None,
        project=P,
    )
    thread_a = {
        "id": A, "project_id": P, "title": "old main", "provider_instance_id": "scripted", "model": None,
        "runtime_mode": "workspace_write", "active_provider_thread_id": None, "active_run_id": None,
        "parent_thread_id": None, "lineage_relationship": None, "root_thread_id": None,
        "forked_from_transfer_id": None, "queue_held": False, "queue_hold_reason": None, "archived_at": None,
        "created_at": old.now(), "updated_at": old.clock,
    }  # fmt: skip
    await old.write("thread", thread_a, thread=A, project=P)
    session = {
        "id": new_id(), "provider_instance_id": "scripted", "status": "stopped", "owner": None,
        "lease_expires_at": None, "capabilities": {"interrupt": True}, "last_error": None,
        "created_at": old.now(), "updated_at": old.clock,
    }  # fmt: skip
    await old.write("provider_session", session, thread=None, project=None)
    ids["session"] = session["id"]

    # Run 1: completed, with its whole execution graph, an approval, a todo list and a checkpoint.
    m1 = {
        "id": new_id(), "thread_id": A, "run_id": None, "node_id": None, "role": "user",
        "text": "Fix the flaky test", "streaming": False, "input_intent": "turn_start",
        "client_message_id": "old-1", "created_at": old.now(), "updated_at": old.clock,
    }  # fmt: skip
    await old.write("conversation_message", m1, thread=A, project=P)
    r1 = {
        "id": new_id(), "thread_id": A, "ordinal": 1, "provider_instance_id": "scripted", "model": None,
        "provider_thread_id": None, "user_message_id": m1["id"], "root_node_id": None, "active_attempt_id": None,
        "status": "queued", "status_reason": None, "queue_position": None, "supersedes_run_id": None,
        "context_handoff_id": None, "checkpoint_id": None, "interrupt_requested_at": None,
        "requested_at": old.now(), "started_at": None, "completed_at": None,
    }  # fmt: skip
    await old.write("run", r1, thread=A, project=P)
    await old.write(
        "conversation_message", {**m1, "run_id": r1["id"], "updated_at": old.now()}, "updated", thread=A, project=P
    )
    scope = {
        "id": new_id(), "thread_id": A, "run_id": None, "node_id": None, "parent_scope_id": None,
        "kind": "root_run", "advances_run_count": True, "created_at": old.now(),
    }  # fmt: skip
    await old.write("checkpoint_scope", scope, thread=A, project=P)
    c0: dict[str, Any] = {
        "id": new_id(), "thread_id": A, "scope_id": scope["id"], "run_id": None, "ordinal": 0,
        "ref": shadow.capture(A, 0, "baseline before run 1"), "status": "ready", "files": [], "created_at": old.now(),
    }  # fmt: skip
    await old.write("checkpoint", c0, thread=A, project=P)
    pt = {
        "id": new_id(), "provider_instance_id": "scripted", "app_thread_id": A, "owner_node_id": None,
        "native_thread_ref": "scripted-old-1", "status": "active", "forked_from_provider_thread_id": None,
        "session_id": session["id"], "first_run_ordinal": 1, "last_run_ordinal": 1,
        "created_at": old.now(), "updated_at": old.clock,
    }  # fmt: skip
    await old.write("provider_thread", pt, thread=A, project=P)
    n1, at1 = new_id(), new_id()
    attempt1 = {
        "id": at1, "thread_id": A, "run_id": r1["id"], "attempt_ordinal": 1, "root_node_id": n1,
        "provider_thread_id": pt["id"], "provider_turn_id": None, "reason": "initial", "status": "running",
        "status_reason": None, "created_at": old.now(), "completed_at": None,
    }  # fmt: skip
    await old.write("run_attempt", attempt1, thread=A, project=P)
    root = {
        "id": n1, "thread_id": A, "run_id": r1["id"], "attempt_id": at1, "parent_node_id": None,
        "root_node_id": n1, "kind": "root_turn", "status": "running", "counts_for_run": True,
        "provider_turn_id": None, "runtime_request_id": None, "checkpoint_scope_id": scope["id"],
        "child_thread_id": None, "title": None, "detail": None, "created_at": old.now(), "updated_at": old.clock,
        "completed_at": None,
    }  # fmt: skip
    await old.write("execution_node", root, thread=A, project=P)
    turn = {
        "id": new_id(), "thread_id": A, "provider_thread_id": pt["id"], "run_attempt_id": at1, "node_id": n1,
        "native_turn_ref": "turn-old-1", "ordinal": 1, "status": "running", "created_at": old.now(),
        "completed_at": None,
    }  # fmt: skip
    await old.write("provider_turn", turn, thread=A, project=P)
    r1 = await old.write(
        "run",
        {**r1, "status": "running", "provider_thread_id": pt["id"], "root_node_id": n1, "active_attempt_id": at1,
         "started_at": old.now()},
        "updated", thread=A, project=P,
    )  # fmt: skip
    children = []
    for kind, title, detail in (
        ("assistant_message", None, None),
        ("tool_call", "pytest -x", {"command": "pytest -x", "output": "1 passed", "exitCode": 0}),
        ("approval_request", "rm -rf build", {"command": "rm -rf build"}),
    ):
        child = {
            **root, "id": new_id(), "attempt_id": at1, "parent_node_id": n1, "kind": kind, "status": "completed",
            "counts_for_run": False, "checkpoint_scope_id": None, "title": title, "detail": detail,
            "created_at": old.now(), "updated_at": old.clock, "completed_at": old.clock,
        }  # fmt: skip
        children.append(await old.write("execution_node", child, thread=A, project=P))
    request = {
        "id": new_id(), "thread_id": A, "run_id": r1["id"], "node_id": children[2]["id"],
        "native_request_ref": "req-old-1", "kind": "command_approval", "status": "resolved",
        "response_capability": "live", "not_resumable_reason": None, "payload": {"command": "rm -rf build"},
        "response": {"decision": "accept"}, "created_at": old.now(), "resolved_at": old.clock,
    }  # fmt: skip
    await old.write("runtime_request", request, thread=A, project=P)
    children[2] = await old.write(
        "execution_node", {**children[2], "runtime_request_id": request["id"], "updated_at": old.now()}, "updated",
        thread=A, project=P,
    )  # fmt: skip
    m2 = {
        **m1, "id": new_id(), "run_id": r1["id"], "node_id": children[0]["id"], "role": "assistant",
        "text": "Fixed it: the test waited on a clock.", "input_intent": None, "client_message_id": None,
        "created_at": old.now(), "updated_at": old.clock,
    }  # fmt: skip
    await old.write("conversation_message", m2, thread=A, project=P)
    plan = {
        "id": new_id(), "thread_id": A, "run_id": r1["id"], "node_id": n1, "kind": "todo_list",
        "items": [{"step": "read the test", "status": "completed"}, {"step": "fix it", "status": "completed"}],
        "text": None, "status": "finalized", "created_at": old.now(), "updated_at": old.clock,
    }  # fmt: skip
    await old.write("plan_artifact", plan, thread=A, project=P)
    files = [
        {"path": "tests/test_clock.py", "status": "modified", "additions": 3, "deletions": 1},
        {"path": "docs/new.md", "status": "renamed", "additions": 0, "deletions": 0, "oldPath": "docs/old.md"},
        {"path": "logo.png", "status": "added", "additions": 0, "deletions": 0, "binary": True},
    ]
    lay_out(workspace, AFTER_RUN_1)  # what the agent of run 1 did
    c1 = {
        **c0,
        "id": new_id(),
        "run_id": r1["id"],
        "ordinal": 1,
        "ref": shadow.capture(A, 1, "after run 1", parent=c0["ref"]),
        "files": files,
        "created_at": old.now(),
    }
    await old.write("checkpoint", c1, thread=A, project=P)
    done = old.now()
    await old.write(
        "provider_turn", {**turn, "status": "completed", "completed_at": done}, "updated", thread=A, project=P
    )
    await old.write(
        "run_attempt", {**attempt1, "provider_turn_id": turn["id"], "status": "completed", "completed_at": done},
        "updated", thread=A, project=P,
    )  # fmt: skip
    root = await old.write(
        "execution_node", {**root, "status": "completed", "provider_turn_id": turn["id"], "updated_at": done,
                           "completed_at": done},
        "updated", thread=A, project=P,
    )  # fmt: skip
    r1 = await old.write(
        "run",
        {**r1, "status": "completed", "checkpoint_id": c1["id"], "active_attempt_id": None, "completed_at": done},
        "updated", thread=A, project=P,
    )  # fmt: skip
    await old.write(
        "activity",
        {"id": new_id(), "thread_id": A, "run_id": r1["id"], "node_id": None, "sequence": 0, "kind": "run.completed",
         "summary": "Run 1 completed", "payload": {"runId": str(r1["id"]), "checkpointId": str(c1["id"])},
         "created_at": done},
        "recorded", thread=A, project=P,
    )  # fmt: skip

    # Run 2: failed, after a retry; the queue held behind it.
    m3 = {**m1, "id": new_id(), "text": "Run the whole suite", "client_message_id": "old-2", "created_at": old.now(),
          "updated_at": old.clock}  # fmt: skip
    await old.write("conversation_message", m3, thread=A, project=P)
    r2 = {**r1, "id": new_id(), "ordinal": 2, "user_message_id": m3["id"], "status": "queued", "root_node_id": None,
          "checkpoint_id": None, "requested_at": old.now(), "started_at": None, "completed_at": None}  # fmt: skip
    await old.write("run", r2, thread=A, project=P)
    attempts2 = []
    for ordinal, reason, why in ((1, "initial", "provider_crashed"), (2, "retry", "provider_lost")):
        node_id, attempt_id = new_id(), new_id()
        attempts2.append(
            await old.write(
                "run_attempt",
                {
                    "id": attempt_id,
                    "thread_id": A,
                    "run_id": r2["id"],
                    "attempt_ordinal": ordinal,
                    "root_node_id": node_id,
                    "provider_thread_id": pt["id"],
                    "provider_turn_id": None,
                    "reason": reason,
                    "status": "failed",
                    "status_reason": why,
                    "created_at": old.now(),
                    "completed_at": old.clock,
                },
                thread=A,
                project=P,
            )
        )
        await old.write(
            "execution_node",
            {**root, "id": node_id, "run_id": r2["id"], "attempt_id": attempt_id, "root_node_id": node_id,
             "status": "failed", "provider_turn_id": None, "created_at": old.now(), "updated_at": old.clock,
             "completed_at": old.clock},
            thread=A, project=P,
        )  # fmt: skip
    # Run 3, sent while run 2 ran: queued with its root node and pending attempt (the first release made them with the
    # run), then held by run 2's failure, waiting for `resumeQueue`.
    queued_id, queued_node, queued_attempt = new_id(), new_id(), new_id()
    m6 = {**m1, "id": new_id(), "run_id": queued_id, "text": f"@write {QUEUED_FILE} {QUEUED_TEXT}",
          "input_intent": "queued_turn", "client_message_id": "old-4", "created_at": old.now(),
          "updated_at": old.clock}  # fmt: skip
    queued = {**r2, "id": queued_id, "ordinal": 3, "user_message_id": m6["id"], "status": "queued",
              "root_node_id": queued_node, "active_attempt_id": queued_attempt, "queue_position": 1,
              "requested_at": old.clock}  # fmt: skip
    await old.write("run", queued, thread=A, project=P)  # first: the message's row refers to it
    await old.write("conversation_message", m6, thread=A, project=P)
    await old.write(
        "run_attempt",
        {**attempt1, "id": queued_attempt, "run_id": queued_id, "root_node_id": queued_node,
         "provider_thread_id": pt["id"], "provider_turn_id": None, "status": "pending", "created_at": old.clock,
         "completed_at": None},
        thread=A, project=P,
    )  # fmt: skip
    await old.write(
        "execution_node",
        {**root, "id": queued_node, "run_id": queued_id, "attempt_id": queued_attempt, "root_node_id": queued_node,
         "status": "pending", "provider_turn_id": None, "title": m6["text"], "created_at": old.clock,
         "updated_at": old.clock, "completed_at": None},
        thread=A, project=P,
    )  # fmt: skip
    await old.write(
        "activity",
        {"id": new_id(), "thread_id": A, "run_id": queued_id, "node_id": None, "sequence": 0, "kind": "run.queued",
         "summary": "run 3 queued at position 1", "payload": None, "created_at": old.clock},
        "recorded", thread=A, project=P,
    )  # fmt: skip
    r2 = await old.write(
        "run",
        {**r2, "status": "failed", "status_reason": "provider_lost", "root_node_id": attempts2[-1]["root_node_id"],
         "provider_thread_id": pt["id"], "started_at": old.now(), "completed_at": old.clock},
        "updated", thread=A, project=P,
    )  # fmt: skip
    await old.write(
        "activity",
        {"id": new_id(), "thread_id": A, "run_id": r2["id"], "node_id": None, "sequence": 0, "kind": "run.failed",
         "summary": "Run 2 failed: provider_lost", "payload": {"runId": str(r2["id"])}, "created_at": old.now()},
        "recorded", thread=A, project=P,
    )  # fmt: skip
    await old.write("provider_thread", {**pt, "status": "idle", "last_run_ordinal": 2, "updated_at": old.now()},
                    "updated", thread=A, project=P)  # fmt: skip
    thread_a = await old.write(
        "thread",
        {**thread_a, "active_provider_thread_id": pt["id"], "queue_held": True,
         "queue_hold_reason": "run 2 failed: provider_lost", "updated_at": old.now()},
        "updated", thread=A, project=P,
    )  # fmt: skip

    # The fork: thread B, made from run 1 through a transfer, its context handoff and a run of its own.
    transfer_id, handoff_id, r3_id, m4_id, n7, at4 = (new_id() for _ in range(6))
    thread_b = {
        **thread_a, "id": B, "title": "old fork", "active_provider_thread_id": None, "parent_thread_id": A,
        "lineage_relationship": "fork", "root_thread_id": A, "forked_from_transfer_id": transfer_id,
        "queue_held": False, "queue_hold_reason": None, "created_at": old.now(), "updated_at": old.clock,
    }  # fmt: skip
    await old.write("thread", thread_b, thread=B, project=P)
    point = {"threadId": str(A), "runOrdinal": 1, "runId": str(r1["id"]), "providerThreadId": str(pt["id"]),
             "providerInstanceId": "scripted", "nativeThreadRef": "scripted-old-1", "nativeTurnRef": "turn-old-1",
             "checkpointId": str(c1["id"])}  # fmt: skip
    transfer = {
        "id": transfer_id, "type": "fork", "source_thread_id": A, "target_thread_id": B, "source_point": point,
        "base_point": None, "status": "consumed", "resolution_strategy": "portable",
        "resolution_fidelity": "summary", "target_run_id": r3_id, "created_at": old.now(), "updated_at": old.clock,
    }  # fmt: skip
    await old.write("context_transfer", transfer, thread=B, project=P)
    handoff = {
        "id": handoff_id, "transfer_id": transfer_id, "thread_id": B, "target_run_id": r3_id,
        "from_provider_thread_ids": [str(pt["id"])], "to_provider_thread_id": None, "covered_run_ordinals": [1],
        "strategy": "fork_delta_summary", "status": "delivered",
        "text": "Earlier: the user asked to fix the flaky test; it was fixed.", "token_estimate": 14,
        "created_at": old.now(),
    }  # fmt: skip
    await old.write("context_handoff", handoff, thread=B, project=P)
    r3 = {
        **r1, "id": r3_id, "thread_id": B, "ordinal": 1, "provider_thread_id": None, "user_message_id": m4_id,
        "root_node_id": n7, "context_handoff_id": handoff_id, "checkpoint_id": None, "requested_at": old.now(),
        "started_at": old.clock, "completed_at": old.clock,
    }  # fmt: skip
    await old.write("run", r3, thread=B, project=P)
    m4 = {**m1, "id": m4_id, "thread_id": B, "run_id": r3_id, "text": "Try another way", "client_message_id": "old-3",
          "created_at": old.now(), "updated_at": old.clock}  # fmt: skip
    await old.write("conversation_message", m4, thread=B, project=P)
    await old.write(
        "run_attempt",
        {**attempt1, "id": at4, "thread_id": B, "run_id": r3_id, "root_node_id": n7, "provider_thread_id": None,
         "provider_turn_id": None, "status": "completed", "created_at": old.now(), "completed_at": old.clock},
        thread=B, project=P,
    )  # fmt: skip
    await old.write(
        "execution_node",
        {**root, "id": n7, "thread_id": B, "run_id": r3_id, "attempt_id": at4, "root_node_id": n7,
         "provider_turn_id": None, "checkpoint_scope_id": None, "created_at": old.now(), "updated_at": old.clock,
         "completed_at": old.clock},
        thread=B, project=P,
    )  # fmt: skip
    m5 = {**m4, "id": new_id(), "role": "assistant", "node_id": n7, "text": "Done another way.", "input_intent": None,
          "client_message_id": None, "created_at": old.now(), "updated_at": old.clock}  # fmt: skip
    await old.write("conversation_message", m5, thread=B, project=P)
    for thread in (A, B):
        await old.touch_thread(thread)

    # Rows outside the log: the outbox (0002 adds `affinity`), a command receipt, an admin token (0003 adds expiry).
    await old.conn.execute(
        "INSERT INTO effects (thread_id, kind, payload, status, replay_safe, attempts, available_at, created_at, "
        "completed_at) VALUES ($1, 'provider-turn.start', $2::jsonb, 'done', false, 1, $3, $3, $3)",
        A, orjson.dumps({"runId": str(r1["id"]), "attemptId": str(at1)}).decode(), T0,
    )  # fmt: skip
    await old.conn.execute(
        "INSERT INTO command_receipts (key, command_type, fingerprint, token_id, result, created_at) "
        "VALUES ('old-key', 'createThread', 'f', NULL, $1::jsonb, $2)",
        orjson.dumps({"threadId": str(A)}).decode(), T0,
    )  # fmt: skip
    await old.conn.execute(
        "INSERT INTO api_tokens (id, name, scope, project_id, token_hash, created_at) VALUES ($1, 'old admin', "
        "'admin', NULL, $2, $3)",
        new_id(), hash_token(TOKEN), T0,
    )  # fmt: skip
    ids.update(
        r1=r1, r2=r2, r3=r3, m1=m1, m2=m2, m3=m3, m4=m4, m5=m5, pt=pt, turn=turn, root=root, children=children,
        queued=queued, m6=m6, attempt1=attempt1, attempts2=attempts2, request=request, plan=plan, scope=scope,
        c0=c0, c1=c1, transfer=transfer, handoff=handoff, files=files,
    )  # fmt: skip
    return ids


@pytest.fixture
async def old_database(pg: PgServer, tmp_path: Path) -> AsyncIterator[tuple[str, dict[str, Any], OldRelease]]:
    """A database at the earliest revision holding the first release's data (see the module's docstring)."""
    url = await pg.fresh(migrated=False)
    db = Database.from_url(url, pool_size=1)
    try:
        await migrate.upgrade(db.engine, EARLIEST)
        assert await migrate.current_revision(db.engine) == EARLIEST
    finally:
        await db.dispose()
    (tmp_path / "ws").mkdir()
    conn = await pg.connect(url)
    try:
        old = OldRelease(conn)
        ids = await fill(old, tmp_path / "ws", tmp_path / "data")
        yield url, ids, old
    finally:
        await conn.close()


def g(type_name: str, value: uuid.UUID) -> str:
    return gid.encode(type_name, value)


THREAD = """query($t: ID!) { thread(id: $t) {
  id title latestSequence queueHeld queueHoldReason workspacePath status providerInstanceId runtimeMode
  project { id name workspaceRoot }
  lineage { relationship parentThread { id } rootThread { id }
            forkedFrom { id type status resolutionStrategy sourcePoint sourceThread { id } targetThread { id }
                         sourceRun { id } targetRun { id } handoff { id text } }
            forks(first: 5) { edges { node { id } } } }
  messages(first: 10) { edges { node { id role text run { id } thread { id } } } }
  runs(first: 5) { edges { node {
    id ordinal status statusReason freshContext startedAt completedAt
    userMessage { id text } providerThread { id nativeThreadRef thread { id } session { id status } }
    rootNode { id kind status } activeAttempt { id }
    attempts { id attemptOrdinal reason status statusReason rootNode { id }
               providerTurns { id ordinal status nativeTurnRef } }
    executionGraph { nodes { id kind status title detail parent { id } } edges { parent { id } child { id } } }
    checkpoint { id ordinal ref status files { path status additions deletions oldPath binary } scope { id } }
    plans { id kind status items }
    runtimeRequests { id kind status payload response node { id } }
    contextHandoff { id text transfer { id } }
  } } }
  checkpoints(first: 5) { edges { node { id ordinal ref status run { id } } } }
  providerThreads { id nativeThreadRef status }
  activities(first: 5) { edges { node { kind summary sequence runId payload } } }
  transfers { id type }
} }"""

EVENTS = """subscription($t: ID!) {
  threadEvents(threadId: $t, afterSequence: 0) { sequence type entity { __typename ... on Node { id } } }
}"""

CHECKPOINT = """query($id: ID!) { node(id: $id) { ... on Checkpoint {
  ordinal ref status files { path status additions deletions oldPath binary }
  clock: diff(path: "tests/test_clock.py") renamed: diff(path: "docs/new.md") logo: diff(path: "logo.png")
} } }"""
FORK = """mutation($c: ID!) { forkThread(input: {source: {checkpoint: $c}, title: "new fork of old run 1"}) {
  thread { id workspacePath } userErrors { code message } } }"""
RESUME = "mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { thread { queueHeld } userErrors { code message } } }"
ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) {
  rolledBackRuns { ordinal status } userErrors { code message } } }"""
RUN_CHECKPOINT = """query($id: ID!) { run(id: $id) { status checkpoint { ordinal status ref
  files { path status additions deletions } } } }"""
THREAD_STATE = "query($t: ID!) { thread(id: $t) { status queueHeld runs(first: 10) { nodes { ordinal status } } } }"


async def _old_checkpoints_work(client: Client, ids: dict[str, Any], tmp_path: Path) -> None:
    """Diff, fork from, resume after and roll back to the first release's checkpoints, on the upgraded database."""
    workspace, A = tmp_path / "ws", g("Thread", ids["main"])
    assert tree_of(workspace) == AFTER_RUN_1  # as run 1 left it (run 2 failed before writing)

    # Checkpoint.files as recorded; Checkpoint.diff read from the old commits (run 1's against its baseline).
    found = (await client.gql(CHECKPOINT, {"id": g("Checkpoint", ids["c1"]["id"])}))["node"]
    assert [(f["path"], f["status"], f["additions"], f["deletions"], f["oldPath"]) for f in found["files"]] == [
        ("tests/test_clock.py", "MODIFIED", 3, 1, None),
        ("docs/new.md", "RENAMED", 0, 0, "docs/old.md"),
        ("logo.png", "ADDED", 0, 0, None),
    ]
    assert "\n-    time.sleep(1)\n+    deadline = start + 1\n+    while time.time() < deadline:\n" in found["clock"]
    assert "rename from docs/old.md" in found["renamed"] and "rename to docs/new.md" in found["renamed"]
    assert "Binary files" in found["logo"]

    # A fork from run 1's checkpoint (its own folder, the default) gets run 1's files from the old commit, and its
    # agent reads them there.
    forked = (await client.gql(FORK, {"c": g("Checkpoint", ids["c1"]["id"])}))["forkThread"]
    assert forked["userErrors"] == [], forked
    fork_folder = tmp_path / "data" / "workspaces" / str(ids["project"]) / forked["thread"]["workspacePath"]
    assert tree_of(fork_folder) == AFTER_RUN_1
    sent = await send(client, forked["thread"]["id"], "@tool cat tests/test_clock.py")
    assert sent["userErrors"] == [], sent
    read = await finished(client, sent["run"]["id"])
    assert read["status"] == "COMPLETED", read
    tool = next(n for n in read["rootNode"]["children"] if n["kind"] == "TOOL_CALL")
    assert tool["detail"]["output"] == CLOCK_AFTER

    # The held queue resumes: the run queued before the upgrade runs, and its checkpoint follows the old ones.
    resumed = (await client.gql(RESUME, {"t": A}))["resumeQueue"]
    assert resumed["userErrors"] == [] and resumed["thread"]["queueHeld"] is False, resumed
    queued = await finished(client, g("Run", ids["queued"]["id"]))
    assert queued["status"] == "COMPLETED", queued
    checkpoint = (await client.gql(RUN_CHECKPOINT, {"id": g("Run", ids["queued"]["id"])}))["run"]["checkpoint"]
    assert (checkpoint["ordinal"], checkpoint["status"]) == (3, "READY")
    assert checkpoint["files"] == [{"path": QUEUED_FILE, "status": "ADDED", "additions": 1, "deletions": 0}]
    assert tree_of(workspace) == {**AFTER_RUN_1, QUEUED_FILE: QUEUED_TEXT}

    # Rolling back to before run 1 puts back the old baseline's files: run 1's changes and the queued run's undone.
    rolled = (await client.gql(ROLLBACK, {"t": A, "n": 0}))["rollbackToRun"]
    assert rolled["userErrors"] == [], rolled
    assert sorted((r["ordinal"], r["status"]) for r in rolled["rolledBackRuns"]) == [
        (1, "ROLLED_BACK"),
        (2, "ROLLED_BACK"),
        (3, "ROLLED_BACK"),
    ]
    after = (await client.gql(THREAD_STATE, {"t": A}))["thread"]
    assert after["status"] == "IDLE"
    assert tree_of(workspace) == BEFORE_RUN_1
    assert tree_of(fork_folder) == AFTER_RUN_1  # the fork's own folder is its own


async def _replay(url: str, token: str, thread: str) -> list[tuple[int, str, str | None, str | None]]:
    """The thread's events replayed from sequence 0 up to the `synchronized` marker."""
    ws = await WsClient.connect(url, token)
    try:
        await ws.subscribe(EVENTS, {"t": thread})
        found = []
        while True:
            message = await ws.receive(within=30)
            assert message["type"] == "next" and not message["payload"].get("errors"), message
            item = message["payload"]["data"]["threadEvents"]
            if item["type"] == "synchronized":
                return found
            entity = item["entity"] or {}
            found.append((item["sequence"], item["type"], entity.get("__typename"), entity.get("id")))
    finally:
        await ws.close()


async def test_a_first_release_database_is_migrated_and_served_with_nothing_lost(
    old_database: tuple[str, dict[str, Any], OldRelease], tmp_path: Path
) -> None:
    url, ids, old = old_database
    migrated = threadloom(url, "migrate", data_dir=tmp_path / "data")
    assert migrated.returncode == 0, migrated.stderr
    assert migrated.stdout.strip() == f"migrated to {migrate.head_revision()}"

    server = ServerProcess(url, tmp_path / "data").wait_ready()
    client = Client(server.url, TOKEN)
    try:
        assert server.admin_token is None  # the old token exists: no new one is made
        viewer = await client.gql("{ viewer { scope } }")
        assert viewer["viewer"]["scope"] == "ADMIN"  # the first release's token authenticates

        A, B, P = g("Thread", ids["main"]), g("Thread", ids["fork"]), g("Project", ids["project"])
        page = await client.gql(
            "query($p: ID!) { threads(projectId: $p, first: 10) { totalCount edges { node { id title } } } }",
            {"p": P},
        )
        assert page["threads"]["totalCount"] == 2
        assert [e["node"]["title"] for e in page["threads"]["edges"]] == ["old main", "old fork"]

        main = (await client.gql(THREAD, {"t": A}))["thread"]
        r1, r2 = ids["r1"], ids["r2"]
        assert main["latestSequence"] == old.sequences[ids["main"]]
        assert (main["title"], main["workspacePath"], main["status"]) == ("old main", None, "IDLE")
        assert main["queueHeld"] and main["queueHoldReason"] == "run 2 failed: provider_lost"
        assert main["project"] == {"id": P, "name": "old project", "workspaceRoot": str(tmp_path / "ws")}
        assert main["lineage"]["relationship"] is None and main["lineage"]["forkedFrom"] is None
        assert [e["node"]["id"] for e in main["lineage"]["forks"]["edges"]] == [B]
        assert [(m["node"]["role"], m["node"]["text"]) for m in main["messages"]["edges"]] == [
            ("USER", ids["m1"]["text"]),
            ("ASSISTANT", ids["m2"]["text"]),
            ("USER", ids["m3"]["text"]),
            ("USER", ids["m6"]["text"]),
        ]
        runs = [e["node"] for e in main["runs"]["edges"]]
        assert [(r["id"], r["ordinal"], r["status"], r["statusReason"], r["freshContext"]) for r in runs] == [
            (g("Run", r1["id"]), 1, "COMPLETED", None, False),
            (g("Run", r2["id"]), 2, "FAILED", "provider_lost", False),
            (g("Run", ids["queued"]["id"]), 3, "QUEUED", None, False),
        ]
        first = runs[0]
        assert first["userMessage"] == {"id": g("ConversationMessage", ids["m1"]["id"]), "text": "Fix the flaky test"}
        assert first["providerThread"] == {
            "id": g("ProviderThread", ids["pt"]["id"]),
            "nativeThreadRef": "scripted-old-1",
            "thread": {"id": A},  # the old `app_thread_id`
            "session": {"id": g("ProviderSession", ids["session"]), "status": "STOPPED"},
        }
        assert first["rootNode"] == {
            "id": g("ExecutionNode", ids["root"]["id"]),
            "kind": "ROOT_TURN",
            "status": "COMPLETED",
        }
        assert first["activeAttempt"] is None
        assert first["attempts"] == [
            {
                "id": g("RunAttempt", ids["attempt1"]["id"]), "attemptOrdinal": 1, "reason": "INITIAL",
                "status": "COMPLETED", "statusReason": None, "rootNode": {"id": g("ExecutionNode", ids["root"]["id"])},
                "providerTurns": [{"id": g("ProviderTurn", ids["turn"]["id"]), "ordinal": 1, "status": "COMPLETED",
                                   "nativeTurnRef": "turn-old-1"}],
            }
        ]  # fmt: skip
        graph = first["executionGraph"]
        assert {n["id"]: n["kind"] for n in graph["nodes"]} == {
            g("ExecutionNode", n["id"]): n["kind"].upper() for n in [ids["root"], *ids["children"]]
        }
        tool = next(n for n in graph["nodes"] if n["kind"] == "TOOL_CALL")
        assert tool["detail"] == {"command": "pytest -x", "output": "1 passed", "exitCode": 0}
        assert sorted((e["parent"]["id"], e["child"]["id"]) for e in graph["edges"]) == sorted(
            (g("ExecutionNode", ids["root"]["id"]), g("ExecutionNode", c["id"])) for c in ids["children"]
        )
        assert first["checkpoint"] == {
            "id": g("Checkpoint", ids["c1"]["id"]), "ordinal": 1, "ref": ids["c1"]["ref"], "status": "READY",
            "scope": {"id": g("CheckpointScope", ids["scope"]["id"])},
            "files": [
                {"path": "tests/test_clock.py", "status": "MODIFIED", "additions": 3, "deletions": 1, "oldPath": None,
                 "binary": False},
                {"path": "docs/new.md", "status": "RENAMED", "additions": 0, "deletions": 0, "oldPath": "docs/old.md",
                 "binary": False},
                {"path": "logo.png", "status": "ADDED", "additions": 0, "deletions": 0, "oldPath": None,
                 "binary": True},
            ],
        }  # fmt: skip
        assert first["plans"] == [
            {"id": g("PlanArtifact", ids["plan"]["id"]), "kind": "TODO_LIST", "status": "FINALIZED",
             "items": ids["plan"]["items"]}
        ]  # fmt: skip
        assert first["runtimeRequests"] == [
            {"id": g("RuntimeRequest", ids["request"]["id"]), "kind": "COMMAND_APPROVAL", "status": "RESOLVED",
             "payload": {"command": "rm -rf build"}, "response": {"decision": "accept"},
             "node": {"id": g("ExecutionNode", ids["children"][2]["id"])}}
        ]  # fmt: skip
        second = runs[1]
        assert [(a["attemptOrdinal"], a["reason"], a["status"], a["statusReason"]) for a in second["attempts"]] == [
            (1, "INITIAL", "FAILED", "provider_crashed"),
            (2, "RETRY", "FAILED", "provider_lost"),
        ]
        assert [(c["node"]["ordinal"], c["node"]["ref"], c["node"]["run"]) for c in main["checkpoints"]["edges"]] == [
            (0, f"refs/threadloom/{ids['main']}/root/0", None),
            (1, f"refs/threadloom/{ids['main']}/root/1", {"id": g("Run", r1["id"])}),
        ]
        assert main["providerThreads"] == [
            {"id": g("ProviderThread", ids["pt"]["id"]), "nativeThreadRef": "scripted-old-1", "status": "IDLE"}
        ]
        activities = [a["node"] for a in main["activities"]["edges"]]
        assert [(a["kind"], a["summary"], a["runId"]) for a in activities] == [
            ("run.completed", "Run 1 completed", g("Run", r1["id"])),
            ("run.queued", "run 3 queued at position 1", g("Run", ids["queued"]["id"])),
            ("run.failed", "Run 2 failed: provider_lost", g("Run", r2["id"])),
        ]
        assert activities[0]["payload"] == {
            "runId": g("Run", r1["id"]),
            "checkpointId": g("Checkpoint", ids["c1"]["id"]),
        }
        assert [a["sequence"] for a in activities] == [
            s for s, kind, _ in old.log[ids["main"]] if kind == "activity.recorded"
        ]
        assert main["transfers"] == [{"id": g("ContextTransfer", ids["transfer"]["id"]), "type": "FORK"}]

        fork = (await client.gql(THREAD, {"t": B}))["thread"]  # the fork's lineage, through the old transfer
        assert fork["lineage"]["relationship"] == "FORK"
        assert fork["lineage"]["parentThread"] == {"id": A} and fork["lineage"]["rootThread"] == {"id": A}
        transfer = fork["lineage"]["forkedFrom"]
        assert transfer["id"] == g("ContextTransfer", ids["transfer"]["id"])
        assert (transfer["type"], transfer["status"], transfer["resolutionStrategy"]) == (
            "FORK",
            "CONSUMED",
            "portable",
        )
        assert transfer["sourcePoint"] == ids["transfer"]["source_point"]
        assert transfer["sourceThread"] == {"id": A} and transfer["targetThread"] == {"id": B}  # old `target_thread_id`
        assert transfer["sourceRun"] == {"id": g("Run", r1["id"])} and transfer["targetRun"] == {
            "id": g("Run", ids["r3"]["id"])
        }
        assert transfer["handoff"] == {"id": g("ContextHandoff", ids["handoff"]["id"]), "text": ids["handoff"]["text"]}
        fork_runs = [e["node"] for e in fork["runs"]["edges"]]
        assert [(r["id"], r["status"]) for r in fork_runs] == [(g("Run", ids["r3"]["id"]), "COMPLETED")]
        assert fork_runs[0]["contextHandoff"]["id"] == g("ContextHandoff", ids["handoff"]["id"])
        assert [m["node"]["text"] for m in fork["messages"]["edges"]] == ["Try another way", "Done another way."]

        # node(id:) and nodes(ids:) for every entity written, each its own type and id.
        every = [g(ENTITY_TYPENAMES[kind], entity) for entity, kind in old.entities.items()]
        found = await client.gql("query($ids: [ID!]!) { nodes(ids: $ids) { __typename id } }", {"ids": every})
        assert [(n or {}).get("id") for n in found["nodes"]] == every
        for entity, kind in old.entities.items():
            one = await client.gql(
                "query($id: ID!) { node(id: $id) { __typename id } }", {"id": g(ENTITY_TYPENAMES[kind], entity)}
            )
            assert one["node"] == {"__typename": ENTITY_TYPENAMES[kind], "id": g(ENTITY_TYPENAMES[kind], entity)}

        # Each thread's log replays from 0: every event, in order, each entity as its type.
        for thread, thread_gid in ((ids["main"], A), (ids["fork"], B)):
            replayed = await _replay(server.url, TOKEN, thread_gid)
            assert replayed == [
                (
                    sequence,
                    event,
                    ENTITY_TYPENAMES[old.entities[entity]],
                    g(ENTITY_TYPENAMES[old.entities[entity]], entity),
                )
                for sequence, event, entity in old.log[thread]
            ]

        # The old checkpoints are real commits in the old shadow repository, read by today's code.
        await _old_checkpoints_work(client, ids, tmp_path)

        # And it is served, not just readable: the fork takes a new run on the upgraded database.
        sent = await send(client, B, "@reply after the upgrade")
        assert sent["userErrors"] == [], sent
        assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
        fork = (await client.gql(THREAD, {"t": B}))["thread"]
        assert [m["node"]["text"] for m in fork["messages"]["edges"]][-2:] == [
            "@reply after the upgrade",
            "after the upgrade",
        ]
    finally:
        await client.aclose()
        server.stop()
        print(server.report(60))

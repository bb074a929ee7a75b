"""Reading the facts a handoff is built from (`domain.handoffs.RunFacts`) out of the projection tables.

Seven statements for any number of runs (runs, messages, nodes, requests, plans, checkpoints and the thread's
workspace root go in one each), so building a handoff for a long thread costs the same number of round trips
as for a short one. Everything is ordered by creation (UUIDv7 ids break ties), so the same log always gives the
same facts and therefore the same handoff text.

What counts for a run:
- user messages: all of the run's, in order (its message, steering and restart messages);
- assistant messages: the finished replies of the run's current attempt, not a subagent's;
- decisions and unresolved requests: its runtime requests, answered or not;
- files changed: from the run's root checkpoint when one is ready (with line counts), otherwise from the file
  changes the agent reported (paths made relative to the workspace, no line counts);
- commands: every tool call that ran a command, in every attempt (a superseded attempt's commands ran too);
- plans: todo lists and proposed plans (questions are decisions);
- subagents: subagent nodes with the replies of their child turn, or a delegated task's delivered answer.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Collection, Mapping
from typing import Any

import sqlalchemy as sa

from threadloom.domain.dispatch import steer_leaves_its_run
from threadloom.domain.effects import SteerTurn
from threadloom.domain.entities import RunAttempt
from threadloom.domain.handoffs import (
    CommandRun,
    Decision,
    FileChange,
    OpenRequest,
    PlanFact,
    RunFacts,
    SubagentResult,
    TodoItem,
)
from threadloom.domain.statuses import (
    CheckpointScopeKind,
    CheckpointStatus,
    EffectStatus,
    MessageRole,
    NodeKind,
    NodeStatus,
    PlanKind,
    RunStatus,
    RuntimeRequestKind,
    RuntimeRequestStatus,
)
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader

_REPORTED_STATUS = {"add": "added", "update": "modified", "delete": "deleted", "rename": "renamed"}
_NODE_KINDS = [NodeKind.TOOL_CALL.value, NodeKind.SUBAGENT.value, NodeKind.ASSISTANT_MESSAGE.value]


async def read_run_facts(db: Reader, thread_id: uuid.UUID, ordinals: Collection[int] | None = None) -> list[RunFacts]:
    """The facts of the thread's runs with these ordinals (all runs when None), ascending by ordinal.

    Runs of every status are returned; the builder leaves out those that are not part of the conversation
    (queued, cancelled, rolled back), and `choose_strategy` callers can read the statuses here.
    """
    run_filter = [t.runs.c.thread_id == thread_id]
    if ordinals is not None:
        if not ordinals:
            return []
        run_filter.append(t.runs.c.ordinal.in_(sorted(set(ordinals))))
    runs = await db.rows(sa.select(t.runs).where(*run_filter).order_by(t.runs.c.ordinal))
    if not runs:
        return []
    run_ids = [r["id"] for r in runs]
    root = await db.scalar(
        sa.select(t.projects.c.workspace_root)
        .select_from(t.threads.join(t.projects, t.projects.c.id == t.threads.c.project_id))
        .where(t.threads.c.id == thread_id)
    )
    leaving = await _steers_leaving(db, thread_id, runs)
    messages = [m for m in await _of_runs(db, t.conversation_messages, run_ids) if m["id"] not in leaving]
    nodes = await _of_runs(db, t.execution_nodes, run_ids, t.execution_nodes.c.kind.in_(_NODE_KINDS))
    requests = await _of_runs(db, t.runtime_requests, run_ids)
    plans = await _of_runs(db, t.plan_artifacts, run_ids, t.plan_artifacts.c.kind != PlanKind.QUESTIONS.value)
    checkpoints = await db.rows(
        sa.select(t.checkpoints)
        .select_from(t.checkpoints.join(t.checkpoint_scopes, t.checkpoint_scopes.c.id == t.checkpoints.c.scope_id))
        .where(
            t.checkpoints.c.run_id.in_(run_ids),
            t.checkpoints.c.status == CheckpointStatus.READY.value,
            t.checkpoint_scopes.c.kind == CheckpointScopeKind.ROOT_RUN.value,
        )
        .order_by(t.checkpoints.c.ordinal, t.checkpoints.c.id)
    )
    per_run: dict[uuid.UUID, _Rows] = {rid: _Rows() for rid in run_ids}
    for m in messages:
        per_run[m["run_id"]].messages.append(m)
    for n in nodes:
        per_run[n["run_id"]].nodes.append(n)
    for q in requests:
        per_run[q["run_id"]].requests.append(q)
    for p in plans:
        per_run[p["run_id"]].plans.append(p)
    for c in checkpoints:
        per_run[c["run_id"]].checkpoint = c  # the latest ready root checkpoint of the run
    return [_facts(run, per_run[run["id"]], str(root) if root else None) for run in runs]


async def _steers_leaving(db: Reader, thread_id: uuid.UUID, runs: list[sa.RowMapping]) -> set[uuid.UUID]:
    """The messages steered into these runs that will leave them (`domain.dispatch.steer_leaves_its_run`): the
    run ended while the steer's delivery was still pending, so the message is about to become a later run."""
    status = {r["id"]: RunStatus(r["status"]) for r in runs}
    pending = await db.rows(
        sa.select(t.effects.c.payload).where(
            t.effects.c.thread_id == thread_id,
            t.effects.c.kind == SteerTurn.KIND,
            t.effects.c.status.in_((EffectStatus.PENDING.value, EffectStatus.RUNNING.value)),
        )
    )
    steers = [s for s in (SteerTurn.decode(row["payload"]) for row in pending) if s.run_id in status]
    if not steers:
        return set()
    attempts: dict[uuid.UUID, list[RunAttempt]] = {}
    steered = t.run_attempts.c.run_id.in_(sorted({s.run_id for s in steers}))
    for attempt in await entities.in_order(db, RunAttempt, steered):
        attempts.setdefault(attempt.run_id, []).append(attempt)
    return {
        s.message_id
        for s in steers
        if steer_leaves_its_run(status[s.run_id], s.attempt_id, attempts.get(s.run_id, []))
    }


async def _of_runs(
    db: Reader, table: sa.Table, run_ids: list[uuid.UUID], *conditions: sa.ColumnElement[bool]
) -> list[sa.RowMapping]:
    """The table's rows of these runs (that also meet `conditions`), in the order they were created."""
    stmt = sa.select(table).where(table.c.run_id.in_(run_ids), *conditions)
    return await db.rows(stmt.order_by(table.c.created_at, table.c.id))


class _Rows:
    __slots__ = ("checkpoint", "messages", "nodes", "plans", "requests")

    def __init__(self) -> None:
        self.messages: list[sa.RowMapping] = []
        self.nodes: list[sa.RowMapping] = []
        self.requests: list[sa.RowMapping] = []
        self.plans: list[sa.RowMapping] = []
        self.checkpoint: sa.RowMapping | None = None


def _facts(run: sa.RowMapping, rows: _Rows, root: str | None) -> RunFacts:
    nodes = {n["id"]: n for n in rows.nodes}
    subagents = [n for n in rows.nodes if n["kind"] == NodeKind.SUBAGENT.value]
    subagent_ids = {n["id"] for n in subagents}
    attempt = run["active_attempt_id"]
    results: dict[uuid.UUID, list[str]] = {sid: [] for sid in subagent_ids}
    user: list[str] = []
    assistant: list[str] = []
    for m in rows.messages:
        if m["role"] == MessageRole.USER.value:
            user.append(m["text"])
            continue
        if m["streaming"]:
            continue
        node = nodes.get(m["node_id"])
        owner: uuid.UUID | None = (
            m["node_id"] if m["node_id"] in subagent_ids else (node["parent_node_id"] if node else None)
        )
        if owner is not None and owner in subagent_ids:
            results[owner].append(m["text"])  # the child turn's reply, or a delegated task's delivered answer
        elif m["role"] == MessageRole.ASSISTANT.value and (node is None or attempt in (None, node["attempt_id"])):
            assistant.append(m["text"])
    files, from_checkpoint = _files(rows, root)
    return RunFacts(
        ordinal=run["ordinal"],
        status=RunStatus(run["status"]),
        provider_instance_id=run["provider_instance_id"],
        model=run["model"],
        provider_thread_id=run["provider_thread_id"],
        user_messages=tuple(user),
        assistant_messages=tuple(assistant),
        decisions=tuple(
            Decision(q["kind"], _subject(q), _answer(q))
            for q in rows.requests
            if q["status"] == RuntimeRequestStatus.RESOLVED.value
        ),
        files_changed=files,
        files_from_checkpoint=from_checkpoint,
        commands=tuple(
            CommandRun(str(n["detail"]["command"]), _int(n["detail"].get("exitCode")), n["status"])
            for n in rows.nodes
            if n["kind"] == NodeKind.TOOL_CALL.value and isinstance(n["detail"], dict) and "command" in n["detail"]
        ),
        plans=tuple(_plan(p) for p in rows.plans),
        unresolved=tuple(
            OpenRequest(q["kind"], _subject(q), q["status"])
            for q in rows.requests
            if q["status"] != RuntimeRequestStatus.RESOLVED.value
        ),
        subagents=tuple(
            SubagentResult(
                n["title"] or str((n["detail"] or {}).get("prompt") or "subagent"),
                n["status"],
                "\n".join(results[n["id"]]) or None,
            )
            for n in subagents
        ),
    )


def _files(rows: _Rows, root: str | None) -> tuple[tuple[FileChange, ...], bool]:
    if rows.checkpoint is not None:
        listed = rows.checkpoint["files"] or []
        return tuple(_checkpoint_file(f) for f in listed if isinstance(f, dict)), True
    reported: dict[str, FileChange] = {}  # the last report per path wins
    for n in rows.nodes:
        detail = n["detail"]
        if n["status"] != NodeStatus.COMPLETED.value or not isinstance(detail, dict):
            continue
        for change in detail.get("changes") or []:
            if isinstance(change, dict) and change.get("path"):
                path = _relative(str(change["path"]), root)
                kind = str(change.get("kind") or "modified")
                reported.pop(path, None)
                reported[path] = FileChange(path, _REPORTED_STATUS.get(kind, kind))
    return tuple(reported.values()), False


def _checkpoint_file(entry: Mapping[str, Any]) -> FileChange:
    status = str(entry.get("status") or entry.get("kind") or "modified")
    old = entry.get("oldPath") or entry.get("old_path")
    path = f"{old} → {entry.get('path')}" if old else str(entry.get("path"))
    return FileChange(path, status, _int(entry.get("additions")), _int(entry.get("deletions")))


def _relative(path: str, root: str | None) -> str:
    if root and os.path.isabs(path):
        rel = os.path.relpath(path, root)
        if not rel.startswith(".."):
            return rel
    return path


def _subject(request: sa.RowMapping) -> str:
    payload = request["payload"] if isinstance(request["payload"], dict) else {}
    if payload.get("command"):
        return str(payload["command"])
    questions = payload.get("questions") or []
    if questions:
        return "; ".join(str(q.get("question")) for q in questions if isinstance(q, dict))
    return str(payload.get("reason") or request["kind"])


def _answer(request: sa.RowMapping) -> str:
    response = request["response"] if isinstance(request["response"], dict) else {}
    if request["kind"] != RuntimeRequestKind.USER_INPUT.value:
        return str(response.get("decision", response))
    answers = response.get("answers") or {}
    payload = request["payload"] if isinstance(request["payload"], dict) else {}
    ids = [str(q.get("id")) for q in payload.get("questions") or [] if isinstance(q, dict)]
    ids += sorted(k for k in answers if k not in ids)  # answers to ids the payload does not list, in key order
    return "; ".join(", ".join(str(v) for v in answers[i]) for i in ids if i in answers) or "(no answer)"


def _plan(row: sa.RowMapping) -> PlanFact:
    items = row["items"] if isinstance(row["items"], list) else []
    return PlanFact(
        kind=row["kind"],
        status=row["status"],
        text=row["text"],
        items=tuple(TodoItem(str(i.get("step")), str(i.get("status"))) for i in items if isinstance(i, dict)),
    )


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None

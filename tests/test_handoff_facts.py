"""`store.handoff_facts.read_run_facts` against a thread made by real runs of the scripted agent (in-process
services, real PostgreSQL, the agent as its own process), and the handoff built from what it read.

One thread, three runs: files, a failing command and a todo list; an approval, a question, a subagent and a
proposed plan; an approval left unanswered when the run is interrupted.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.inproc import ADMIN, new_thread, send
from tests.support.waiting import until
from threadloom.domain.changes import Change
from threadloom.domain.entities import Checkpoint, CheckpointScope
from threadloom.domain.handoffs import (
    CommandRun,
    Decision,
    FileChange,
    HandoffKind,
    OpenRequest,
    PlanFact,
    RunFacts,
    Selection,
    SubagentResult,
    TodoItem,
    build_handoff,
)
from threadloom.domain.ids import new_id
from threadloom.domain.requests import Decision as Answer
from threadloom.domain.statuses import CheckpointScopeKind, CheckpointStatus, RunStatus
from threadloom.engine.services import Services
from threadloom.store import log
from threadloom.store import tables as t
from threadloom.store.db import StatementCounter
from threadloom.store.handoff_facts import read_run_facts

RUN_1 = "@write a.txt hello\n@tool echo hi && exit 3\n@todo A; B\n@reply done one"
RUN_2 = "@approval echo approved\n@ask Which db? | Postgres | MySQL\n@subagent check docs\n@plan do X then Y"
RUN_3 = "@approval touch never"


@pytest.fixture
async def running(services: Services) -> AsyncIterator[Services]:
    await services.start()
    yield services


async def _status(services: Services, run_id: uuid.UUID) -> str | None:
    async with services.db.read() as db:
        status = await db.scalar(sa.select(t.runs.c.status).where(t.runs.c.id == run_id))
    return str(status) if status in ("completed", "failed", "interrupted") else None


async def _pending(services: Services, run_id: uuid.UUID, answered: set[uuid.UUID]) -> sa.RowMapping | None:
    async with services.db.read() as db:
        rows = await db.rows(
            sa.select(t.runtime_requests).where(
                t.runtime_requests.c.run_id == run_id, t.runtime_requests.c.status == "pending"
            )
        )
    fresh = [r for r in rows if r["id"] not in answered]
    return fresh[0] if fresh else None


async def _three_runs(services: Services, workspace: Path) -> tuple[uuid.UUID, list[uuid.UUID]]:
    thread = await new_thread(services, workspace)
    first = await send(services, thread, RUN_1)
    assert await until(lambda: _status(services, first)) == "completed"

    second = await send(services, thread, RUN_2)
    answered: set[uuid.UUID] = set()
    approval = await until(lambda: _pending(services, second, answered))
    answered.add(approval["id"])
    await services.requests.respond_to_approval(ADMIN, approval["id"], Answer.ACCEPT, None)
    question = await until(lambda: _pending(services, second, answered))
    await services.requests.respond_to_user_input(ADMIN, question["id"], {"q1": ["Postgres"]}, None)
    assert await until(lambda: _status(services, second)) == "completed"

    third = await send(services, thread, RUN_3)
    await until(lambda: _pending(services, third, set()))
    await services.interruption.interrupt_run(ADMIN, third, hold_queue=False, key=None)
    assert await until(lambda: _status(services, third)) == "interrupted"
    return thread, [first, second, third]


async def test_the_facts_of_real_runs_and_their_handoff(running: Services, workspace: Path) -> None:
    services = running
    thread, _ = await _three_runs(services, workspace)

    async with services.db.read() as db:
        facts = await read_run_facts(db, thread)
    provider_thread = facts[0].provider_thread_id
    assert provider_thread is not None
    expected = [
        RunFacts(
            ordinal=1,
            status=RunStatus.COMPLETED,
            provider_instance_id="scripted",
            provider_thread_id=provider_thread,
            user_messages=(RUN_1,),
            assistant_messages=("done one",),
            files_changed=(FileChange("a.txt", "added", 1, 0),),  # from the run's checkpoint, with line counts
            files_from_checkpoint=True,
            commands=(CommandRun("echo hi && exit 3", 3, "failed"),),
            plans=(PlanFact("todo_list", "finalized", items=(TodoItem("A", "completed"), TodoItem("B", "completed"))),),
        ),
        RunFacts(
            ordinal=2,
            status=RunStatus.COMPLETED,
            provider_instance_id="scripted",
            provider_thread_id=provider_thread,
            user_messages=(RUN_2,),
            assistant_messages=("Answer: Postgres",),  # the subagent's reply is its result, not the run's
            decisions=(
                Decision("command_approval", "echo approved", "accept"),
                Decision("user_input", "Which db?", "Postgres"),
            ),
            files_from_checkpoint=True,  # its checkpoint lists no file
            commands=(CommandRun("echo approved", 0, "completed"),),
            plans=(PlanFact("proposed_plan", "finalized", text="do X then Y"),),
            subagents=(SubagentResult("check docs", "completed", "Subagent: check docs"),),
        ),
    ]
    assert facts[:2] == expected
    third = facts[2]
    assert (third.ordinal, third.status, third.user_messages) == (3, RunStatus.INTERRUPTED, (RUN_3,))
    assert third.decisions == () and third.commands == ()
    assert third.unresolved == (OpenRequest("command_approval", "touch never", "expired"),)  # the interrupt ended it

    handoff = build_handoff(HandoffKind.FULL_THREAD_SUMMARY, facts, Selection.up_to(3))
    assert handoff.covered_run_ordinals == (1, 2, 3)
    lines = handoff.text.splitlines()
    assert [line for line in lines if line.startswith("## Run")] == [
        "## Run 3 · interrupted · scripted",
        "## Run 2 · completed · scripted",
        "## Run 1 · completed · scripted",
    ]
    for expected_line in (
        "  - `echo hi && exit 3` → exit 3",
        "  - added a.txt (+1 -0)",
        "  - user_input `Which db?`: Postgres",
        "  - command_approval `touch never` (expired)",
        "Subagent `check docs` (completed):",
        "    Subagent: check docs",
    ):
        assert expected_line in lines
    assert lines[-1] == "Omitted for length: none"
    # read again: the same bytes
    async with services.db.read() as db:
        again = build_handoff(HandoffKind.FULL_THREAD_SUMMARY, await read_run_facts(db, thread), Selection.up_to(3))
    assert again.text.encode() == handoff.text.encode()


async def test_a_constant_number_of_statements_and_a_selection(running: Services, workspace: Path) -> None:
    services = running
    thread, _ = await _three_runs(services, workspace)
    counts = []
    for ordinals in ({1}, {1, 2, 3}, None):
        counter = StatementCounter()
        async with services.db.read(counter) as db:
            facts = await read_run_facts(db, thread, ordinals)
        assert [f.ordinal for f in facts] == sorted(ordinals or {1, 2, 3})
        counts.append(counter.statements)
    assert counts == [8, 8, 8]  # one of them: the steers still on their way (none here)
    async with services.db.read() as db:
        assert await read_run_facts(db, thread, set()) == []
        assert await read_run_facts(db, thread, {9}) == []


async def test_a_ready_root_checkpoint_gives_the_files_with_line_counts(running: Services, workspace: Path) -> None:
    """The checkpoint's file list replaces what the agent reported (written as the capture will record it)."""
    services = running
    thread = await new_thread(services, workspace)
    run_id = await send(services, thread, "@write a.txt hello")
    assert await until(lambda: _status(services, run_id)) == "completed"
    now = datetime.now(UTC)
    scope = CheckpointScope(
        id=new_id(),
        thread_id=thread,
        run_id=run_id,
        kind=CheckpointScopeKind.ROOT_RUN,
        advances_run_count=True,
        created_at=now,
    )
    files = [
        {"path": "a.txt", "status": "added", "additions": 1, "deletions": 0},
        {"path": "b.txt", "oldPath": "old.txt", "status": "renamed", "additions": 0, "deletions": 0},
    ]
    ready = Checkpoint(
        id=new_id(),
        thread_id=thread,
        scope_id=scope.id,
        run_id=run_id,
        ordinal=1,
        status=CheckpointStatus.READY,
        files=files,
        created_at=now,
    )
    async with services.db.transaction() as db:
        changes = [Change("checkpoint_scope.created", scope), Change("checkpoint.created", ready)]
        await log.append(db, changes, project_id=None, command_id=None, now=now)
    async with services.db.read() as db:
        [facts] = await read_run_facts(db, thread)
    assert facts.files_from_checkpoint
    assert facts.files_changed == (FileChange("a.txt", "added", 1, 0), FileChange("old.txt → b.txt", "renamed", 0, 0))
    section = build_handoff(HandoffKind.ROLLBACK_CONTEXT, [facts], Selection.up_to(1)).text
    assert "Files changed (checkpoint):\n  - added a.txt (+1 -0)\n  - renamed old.txt → b.txt (+0 -0)" in section

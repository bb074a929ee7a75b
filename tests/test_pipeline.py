"""The command pipeline in process, against real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from tests.support.db import count, sequences, snapshot
from tests.support.graphql import workspace
from threadloom.domain import webhooks as webhook_rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Change
from threadloom.domain.entities import Activity, ConversationMessage, ExecutionNode, Run, RunAttempt
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import (
    AttemptReason,
    AttemptStatus,
    MessageRole,
    NodeKind,
    NodeStatus,
    RunStatus,
    TokenScope,
)
from threadloom.domain.webhooks import WebhookEvent
from threadloom.engine.services import Services
from threadloom.store import log
from threadloom.store import tables as t
from threadloom.store import threads as thread_store

ADMIN = Principal(uuid.uuid4(), TokenScope.ADMIN, None)


async def _project(services: Services, name: str = "P") -> uuid.UUID:
    return await services.catalog.create_project(ADMIN, name=name, workspace_root=workspace(), key=None)


async def _thread(services: Services, project: uuid.UUID, key: str | None = None, title: str = "T") -> uuid.UUID:
    return await services.catalog.create_thread(
        ADMIN,
        project_id=project,
        title=title,
        provider_instance_id=None,
        model=None,
        runtime_mode="workspace_write",
        key=key,
    )


async def _append_run_graph(services: Services, thread_id: uuid.UUID) -> None:
    """Write one run with an attempt, a node, a message and an activity straight through the log."""
    now = services.clock.now()
    async with services.db.transaction() as db:
        thread = await thread_store.lock(db, thread_id)
        assert thread is not None
        run = Run(
            id=new_id(),
            thread_id=thread_id,
            ordinal=1,
            provider_instance_id="scripted",
            model=None,
            status=RunStatus.QUEUED,
            requested_at=now,
        )
        node = ExecutionNode(
            id=new_id(),
            thread_id=thread_id,
            run_id=run.id,
            kind=NodeKind.ROOT_TURN,
            status=NodeStatus.PENDING,
            counts_for_run=True,
            created_at=now,
            updated_at=now,
        )
        attempt = RunAttempt(
            id=new_id(),
            thread_id=thread_id,
            run_id=run.id,
            attempt_ordinal=1,
            root_node_id=node.id,
            reason=AttemptReason.INITIAL,
            status=AttemptStatus.PENDING,
            created_at=now,
        )
        message = ConversationMessage(
            id=new_id(),
            thread_id=thread_id,
            run_id=run.id,
            role=MessageRole.USER,
            text="hi",
            created_at=now,
            updated_at=now,
        )
        activity = Activity(
            id=new_id(),
            thread_id=thread_id,
            sequence=0,
            kind="run.queued",
            run_id=run.id,
            node_id=node.id,
            summary="queued",
            created_at=now,
        )
        changes = [
            Change("run.created", run),
            Change("attempt.created", attempt),
            Change("node.created", node),
            Change("message.created", message),
            Change(
                "run.updated",
                run.evolve(root_node_id=node.id, active_attempt_id=attempt.id, user_message_id=message.id),
            ),
            Change("thread.updated", thread.evolve(title="busy")),
            Change("activity.recorded", activity),
        ]
        appended = await log.append(db, changes, project_id=thread.project_id, command_id=None, now=now)
        assert appended.sequences == list(range(2, 2 + len(changes)))


async def test_rebuilt_projections_equal_live(services: Services) -> None:
    project = await _project(services)
    threads = [await _thread(services, project, title=f"t{i}") for i in range(5)]
    await services.catalog.rename_thread(ADMIN, threads[0], "renamed", None)
    await services.catalog.archive_thread(ADMIN, threads[1], None)
    await services.catalog.archive_thread(ADMIN, threads[2], None)
    await services.catalog.unarchive_thread(ADMIN, threads[2], None)
    await _append_run_graph(services, threads[3])
    live = await snapshot(services.db)
    assert len(live["runs"]) == 1 and len(live["activities"]) == 1
    assert live["activities"][0]["sequence"] == 8  # the activity carries its event's sequence
    async with services.db.transaction() as db:
        applied = await log.rebuild_projections(db)
    assert applied == await count(services.db, t.events)
    assert await snapshot(services.db) == live
    async with services.db.read() as db:
        lasts = {r["id"]: r["last_sequence"] for r in await db.rows(t.threads.select())}
    assert lasts == {tid: seqs[-1] for tid, seqs in (await sequences(services.db)).items()}


async def test_sequences_are_gapless_per_thread(services: Services) -> None:
    project = await _project(services)
    thread = await _thread(services, project)
    await asyncio.gather(*(services.catalog.rename_thread(ADMIN, thread, f"n{i}", None) for i in range(30)))
    assert (await sequences(services.db))[thread] == list(range(1, 32))


async def test_same_key_returns_stored_result_and_writes_nothing(services: Services) -> None:
    project = await _project(services)
    results = await asyncio.gather(*(_thread(services, project, key="k-1") for _ in range(20)))
    assert len(set(results)) == 1
    assert await count(services.db, t.threads) == 1
    assert await count(services.db, t.command_receipts) == 1
    events = await count(services.db, t.events)
    assert await _thread(services, project, key="k-1") == results[0]
    assert await count(services.db, t.events) == events


async def test_same_key_with_other_input_is_refused(services: Services) -> None:
    project = await _project(services)
    await _thread(services, project, key="k-2", title="one")
    with pytest.raises(DomainError) as err:
        await _thread(services, project, key="k-2", title="two")
    assert err.value.code == ErrorCode.IDEMPOTENCY_KEY_REUSED


async def test_refused_command_writes_nothing(services: Services) -> None:
    project = await _project(services)
    thread = await _thread(services, project)
    before = (await count(services.db, t.events), await count(services.db, t.command_receipts))
    with pytest.raises(DomainError) as err:
        await services.catalog.unarchive_thread(ADMIN, thread, "k-3")
    assert err.value.code == ErrorCode.NOT_ARCHIVED
    with pytest.raises(DomainError) as err:
        await services.catalog.rename_thread(ADMIN, uuid.uuid4(), "x", None)
    assert err.value.code == ErrorCode.NOT_FOUND
    with pytest.raises(DomainError):
        await services.catalog.create_thread(
            ADMIN,
            project_id=project,
            title="x",
            provider_instance_id="nope",
            model=None,
            runtime_mode="workspace_write",
            key="k-4",
        )
    assert (await count(services.db, t.events), await count(services.db, t.command_receipts)) == before


async def test_invisible_thread_is_not_found_for_a_bound_token(services: Services) -> None:
    mine, theirs = await _project(services, "mine"), await _project(services, "theirs")
    thread = await _thread(services, theirs)
    operator = Principal(uuid.uuid4(), TokenScope.OPERATE, mine)
    with pytest.raises(DomainError) as err:
        await services.catalog.rename_thread(operator, thread, "x", None)
    assert err.value.code == ErrorCode.NOT_FOUND
    reader = Principal(uuid.uuid4(), TokenScope.READ, theirs)
    with pytest.raises(DomainError) as err:
        await services.catalog.rename_thread(reader, thread, "x", None)
    assert err.value.code == ErrorCode.FORBIDDEN


async def test_a_commit_counts_the_webhook_deliveries_it_wrote_none_without_an_endpoint(services: Services) -> None:
    """A run's end is a webhook event in every project, but only a project with a subscribed endpoint gets a
    delivery: the commit says how many it wrote, and the sender is woken only then (engine/services.py)."""
    hooked, bare = await _project(services, "hooked"), await _project(services, "bare")
    await services.webhooks.create(
        ADMIN,
        project_id=hooked,
        url="https://hooks.example/threadloom",
        events=[WebhookEvent.RUN_COMPLETED],
        description=None,
        include_subagents=False,
    )
    written: dict[uuid.UUID, int] = {}
    for project in (hooked, bare):
        thread_id = await _thread(services, project)
        now = services.clock.now()
        ended = Activity(
            id=new_id(), thread_id=thread_id, sequence=0, kind="run.completed", summary="done", created_at=now
        )
        changes = [Change("activity.recorded", ended)]
        async with services.db.transaction() as db:
            assert await thread_store.lock(db, thread_id) is not None
            hooks = [h.row() for h in webhook_rules.hooks_of(changes, project, now, new_id)]
            assert len(hooks) == 1  # the event exists in both projects
            appended = await log.append(db, changes, project_id=project, command_id=None, now=now, hooks=hooks)
        written[project] = appended.deliveries
        assert appended.sequences == [2]
    assert written == {hooked: 1, bare: 0}
    assert await count(services.db, t.webhook_deliveries) == 1

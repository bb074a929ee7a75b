"""The effect outbox and worker liveness, against real PostgreSQL."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import sqlalchemy as sa

from tests.support.graphql import workspace
from threadloom.domain.access import Principal
from threadloom.domain.changes import Effect
from threadloom.domain.recovery import RecoveryAction, recover_run
from threadloom.domain.statuses import RunStatus, TokenScope
from threadloom.engine import effects as effects_module
from threadloom.engine.effects import EffectWorker, backoff
from threadloom.engine.services import Services
from threadloom.engine.workers import Worker
from threadloom.store import outbox
from threadloom.store import tables as t
from threadloom.store.db import Database

ADMIN = Principal(uuid.uuid4(), TokenScope.ADMIN, None)


async def _threads(services: Services, n: int) -> list[uuid.UUID]:
    project = await services.catalog.create_project(ADMIN, name="p", workspace_root=workspace(), key=None)
    return [
        await services.catalog.create_thread(
            ADMIN,
            project_id=project,
            title=f"t{i}",
            provider_instance_id=None,
            model=None,
            runtime_mode="workspace_write",
            key=None,
        )
        for i in range(n)
    ]


async def _enqueue(services: Services, thread: uuid.UUID, *effects: Effect) -> None:
    async with services.db.transaction() as db:
        await outbox.enqueue(db, thread, effects, command_id=None, now=services.clock.now())


async def _claim(services: Services, worker: uuid.UUID) -> sa.RowMapping | None:
    now = services.clock.now()
    async with services.db.transaction() as db:
        return await outbox.claim(db, worker, now, now + timedelta(minutes=1))


async def _finish(services: Services, effect_id: int) -> None:
    async with services.db.transaction() as db:
        await outbox.finish(db, effect_id, services.clock.now())


async def test_one_effect_at_a_time_per_thread_in_order(services: Services) -> None:
    a, b = await _threads(services, 2)
    await _enqueue(services, a, Effect("x", {"n": 1}), Effect("x", {"n": 2}))
    await _enqueue(services, b, Effect("x", {"n": 3}))
    me = uuid.uuid4()
    first = await _claim(services, me)
    second = await _claim(services, me)
    assert first is not None and second is not None
    assert (first["payload"]["n"], second["payload"]["n"]) == (1, 3)  # a's second waits for its first
    assert await _claim(services, me) is None
    await _finish(services, first["id"])
    third = await _claim(services, me)
    assert third is not None and third["payload"]["n"] == 2 and third["attempts"] == 1


async def test_affinity_follows_the_owner_while_it_lives(services: Services) -> None:
    (thread,) = await _threads(services, 1)
    owner = Worker(services.db, services.clock)
    await owner.start()
    await _enqueue(services, thread, Effect("x", {}, affinity=owner.id))
    assert await _claim(services, uuid.uuid4()) is None  # another worker may not take it
    await owner.stop()  # the owner's lock goes with its connection
    claimed = await _claim(services, uuid.uuid4())
    assert claimed is not None


async def test_orphans_of_a_dead_worker_are_recovered(services: Services) -> None:
    (thread,) = await _threads(services, 1)
    dead = Worker(services.db, services.clock)
    await dead.start()
    await _enqueue(services, thread, Effect("safe", {}, replay_safe=True))
    claimed = await _claim(services, dead.id)
    assert claimed is not None
    async with services.db.transaction() as db:
        assert await outbox.orphaned(db) == []  # its worker is alive
    await dead.stop()
    await services.recovery.recover()
    async with services.db.read() as db:
        rows = await db.rows(sa.select(t.effects.c.kind, t.effects.c.status))
    assert [(r["kind"], r["status"]) for r in rows] == [("safe", "pending")]
    await _enqueue(services, thread, Effect("bound", {}, replay_safe=False))
    zombie = Worker(services.db, services.clock)
    await zombie.start()
    again = await _claim(services, zombie.id)
    assert again is not None and again["kind"] == "safe"
    await _finish(services, again["id"])
    bound = await _claim(services, zombie.id)
    assert bound is not None and bound["kind"] == "bound"
    await zombie.stop()
    await services.recovery.recover()
    async with services.db.read() as db:
        status = await db.scalar(sa.select(t.effects.c.status).where(t.effects.c.kind == "bound"))
    assert status == "cancelled"  # process-bound work is never blindly resent


async def test_failed_effects_back_off_and_give_up(services: Services) -> None:
    (thread,) = await _threads(services, 1)
    worker = EffectWorker(services.db, services.clock, uuid.uuid4())
    calls: list[int] = []

    async def broken(payload: dict[str, object]) -> None:
        calls.append(1)
        raise RuntimeError("nope")

    worker.handlers["broken"] = broken
    await _enqueue(services, thread, Effect("broken", {}))
    assert await worker.run_one() is True
    async with services.db.read() as db:
        row = (await db.rows(sa.select(t.effects)))[0]
    assert row["status"] == "pending" and row["attempts"] == 1 and "nope" in row["last_error"]
    assert row["available_at"] > services.clock.now()
    assert await worker.run_one() is False  # not due yet
    assert calls == [1]
    assert [backoff(n) for n in (1, 2, 3)] == [0.2, 0.4, 0.8] and backoff(50) == 30.0


async def test_an_idle_worker_looks_about_once_a_second_and_wakes_when_an_effect_falls_due(
    services: Services,
) -> None:
    """The polling idle loop sleeps until the next pending effect falls due, at most `IDLE_POLL` (1 s): a
    delayed effect runs without a wake-up, after a handful of claims (polling every 0.2 s made ~8 before it)."""
    (thread,) = await _threads(services, 1)
    async with services.db.read() as db:
        assert await outbox.next_due(db, services.clock.now()) is None  # nothing pending
    await _enqueue(services, thread, Effect("later", {}, delay_s=30))
    async with services.db.read() as db:
        due = await outbox.next_due(db, services.clock.now())
        [waiting] = await db.scalars_all(sa.select(t.effects.c.available_at))
    assert due == waiting  # the one waiting for its time (the twin of None above)
    async with services.db.transaction() as db:
        await db.execute(sa.delete(t.effects))

    worker = EffectWorker(services.db, services.clock, uuid.uuid4(), concurrency=1)
    ran = asyncio.Event()
    claims: list[str] = []
    every_statement(
        services.db, lambda statement: claims.append(statement) if "SET status = 'running'" in statement else None
    )

    async def later(payload: dict[str, object]) -> None:
        ran.set()

    worker.handlers["later"] = later
    await _enqueue(services, thread, Effect("later", {}, delay_s=1.5))  # no wake(): found by the idle loop
    worker.start()
    try:
        await asyncio.wait_for(ran.wait(), 30)
    finally:
        await worker.stop()
    assert 1 <= len(claims) <= 4, claims  # the first look, then at most once a second until it fell due


async def test_an_idle_start_opens_one_session_and_a_backlog_still_runs_on_every_loop(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One of the worker's loops claims at its start, the others start idle with their backstops spread, so
    a server starting with nothing to do opens one database session for its effects, not one per loop (the
    pool grows to what is checked out at once). A backlog still wakes every loop: four slow effects of four
    threads run at once."""
    monkeypatch.setattr(effects_module, "IDLE_BACKSTOP", 0.2)  # the idle loops' first claims come soon
    db = Database.from_url(services.db.engine.url.render_as_string(hide_password=False))
    worker = EffectWorker(db, services.clock, uuid.uuid4(), concurrency=4)
    claims: list[str] = []
    four = asyncio.Event()

    def on_statement(statement: str) -> None:
        if "SET status = 'running'" in statement:
            claims.append(statement)
            if len(claims) >= 4:
                four.set()

    every_statement(db, on_statement)
    worker.start()
    try:
        await asyncio.wait_for(four.wait(), 30)  # the first claim, then each idle loop's backstop
        assert db.engine.pool.checkedin() + db.engine.pool.checkedout() == 1

        running: set[object] = set()
        all_running, release = asyncio.Event(), asyncio.Event()

        async def slow(payload: dict[str, object]) -> None:
            running.add(payload["n"])
            if len(running) == 4:
                all_running.set()
            await release.wait()

        worker.handlers["slow"] = slow
        threads = await _threads(services, 4)
        for n, thread in enumerate(threads):  # no wake(): the polling loop finds the first, then wakes more
            await _enqueue(services, thread, Effect("slow", {"n": n}))
        await asyncio.wait_for(all_running.wait(), 30)
        assert running == {0, 1, 2, 3}
        release.set()
    finally:
        await worker.stop()
        await db.dispose()


def test_recover_run_decides_by_status_and_recorded_turn() -> None:
    assert recover_run(RunStatus.PREPARING, start_pending=True, turn_recorded=False, owner_alive=None) == (
        RecoveryAction.NONE
    )
    assert recover_run(RunStatus.PREPARING, start_pending=False, turn_recorded=False, owner_alive=None) == (
        RecoveryAction.REQUEUE_START
    )
    assert recover_run(RunStatus.STARTING, start_pending=False, turn_recorded=True, owner_alive=False) == (
        RecoveryAction.FAIL
    )
    assert recover_run(RunStatus.RUNNING, start_pending=False, turn_recorded=True, owner_alive=True) == (
        RecoveryAction.NONE
    )


async def test_loop_marks_an_effect_done_with_its_next_claim_in_one_statement(services: Services) -> None:
    """Two effects of one thread cost one statement each (the second claim also marks the first done),
    each on its own outside a transaction (no BEGIN, no COMMIT), and a claim that finds nothing changes
    no row."""
    (thread,) = await _threads(services, 1)
    worker = EffectWorker(services.db, services.clock, uuid.uuid4(), concurrency=1)
    seen: list[object] = []
    second_running, release = asyncio.Event(), asyncio.Event()
    claims: list[str] = []
    transactions: list[str] = []
    claimed = asyncio.Event()

    def on_statement(statement: str) -> None:
        if "UPDATE effects SET status = 'running'" in statement:
            claims.append(statement)
            claimed.set()
        elif statement.lstrip().upper().startswith("COMMIT"):  # a transaction's end (reads roll back)
            transactions.append(statement)

    every_statement(services.db, on_statement)
    sa.event.listen(services.db.engine.sync_engine, "commit", lambda conn: transactions.append("commit"))

    async def record(payload: dict[str, object]) -> None:
        seen.append(payload["n"])
        if payload["n"] == 2:
            second_running.set()
            await release.wait()

    worker.handlers["x"] = record
    await _enqueue(services, thread, Effect("x", {"n": 1}), Effect("x", {"n": 2}))
    transactions.clear()
    worker.start()
    try:
        await second_running.wait()
        async with services.db.read() as db:
            first = await db.scalar(sa.select(t.effects.c.status).where(t.effects.c.payload["n"].astext == "1"))
        assert first == "done"  # marked by the statement that claimed the second
        assert len(claims) == 2  # claim 1; done 1 + claim 2
        claimed.clear()
        release.set()
        await claimed.wait()  # done 2, with a claim that found nothing
    finally:
        release.set()
        await worker.stop()
    assert transactions == []  # each claim was a statement of its own
    async with services.db.read() as db:
        before = await db.rows(sa.text("SELECT id, status, xmin::text AS version FROM effects ORDER BY id"))
    assert seen == [1, 2] and [r["status"] for r in before] == ["done", "done"]
    assert await worker.run_one() is False  # nothing due
    async with services.db.read() as db:
        after = await db.rows(sa.text("SELECT id, status, xmin::text AS version FROM effects ORDER BY id"))
    assert after == before  # no row written


def every_statement(db: Database, seen: Callable[[str], None]) -> None:
    """Call `seen` with every statement the pool's connections run: through SQLAlchemy (its cursor event)
    or straight on the asyncpg connection (asyncpg's query logger, which SQLAlchemy's prepared statements
    do not pass through), so each statement is seen once."""
    watched: set[int] = set()

    def on_checkout(dbapi_connection: Any, record: object, proxy: object) -> None:
        driver = dbapi_connection.driver_connection
        if id(driver) not in watched:
            watched.add(id(driver))
            driver.add_query_logger(lambda logged: seen(logged.query))

    def on_execute(conn: object, cursor: object, statement: str, *args: object) -> None:
        seen(statement)

    sa.event.listen(db.engine.sync_engine, "checkout", on_checkout)
    sa.event.listen(db.engine.sync_engine, "after_cursor_execute", on_execute)

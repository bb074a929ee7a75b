"""The periodic recovery pass never fails a healthy run, however often it runs.

Recovery looks at every active run and fails those whose provider runtime is gone. Under
load it sees runs at every step of their start: effect claimed but turn not yet recorded,
session still opening, turn recorded but not yet started. None of those may be failed.
The services run in-process with the real scripted agent; the recovery pass runs every
50 ms while 500 runs go through 10 threads (the rest queue), and every run must complete.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.graphql import workspace
from tests.support.inproc import ADMIN, send
from tests.support.waiting import until
from threadloom.config import Settings
from threadloom.domain.recovery import RecoveryAction, recover_run
from threadloom.domain.statuses import RunStatus
from threadloom.engine.clock import SystemClock
from threadloom.engine.services import Services
from threadloom.providers.registry import load_instances
from threadloom.store import tables as t
from threadloom.store.db import Database

THREADS = 10
RUNS = 500


@pytest.fixture
async def busy_recovery(database_url: str, tmp_path: Path) -> AsyncIterator[Services]:
    db = Database.from_url(database_url)
    services = Services.build(
        Settings.from_env(data_dir=str(tmp_path / "data")), db, SystemClock(), load_instances(None)
    )
    await services.start()
    await services.recovery.stop()
    services.recovery.interval = 0.05  # far more often than in production: every step of a start is seen
    services.recovery.start()
    yield services
    await services.stop()
    await db.dispose()


async def test_recovery_every_50ms_fails_no_healthy_run(busy_recovery: Services, tmp_path: Path) -> None:
    services = busy_recovery
    project = await services.catalog.create_project(ADMIN, name="load", workspace_root=workspace(tmp_path), key=None)
    threads = [
        await services.catalog.create_thread(
            ADMIN,
            project_id=project,
            title=f"t{i}",
            provider_instance_id=None,
            model=None,
            runtime_mode="workspace_write",
            key=None,
        )
        for i in range(THREADS)
    ]
    passes = 0
    original = services.recovery.recover

    async def counted() -> None:
        nonlocal passes
        passes += 1
        await original()

    services.recovery.recover = counted  # type: ignore[method-assign]

    async def fill(thread: object) -> None:
        for i in range(RUNS // THREADS):
            await send(services, thread, f"message {i}")  # type: ignore[arg-type]

    await asyncio.gather(*(fill(thread) for thread in threads))

    async def settled() -> dict[str, int] | None:
        async with services.db.read() as db:
            rows = await db.rows(sa.select(t.runs.c.status, sa.func.count().label("n")).group_by(t.runs.c.status))
        counts = {str(r["status"]): int(r["n"]) for r in rows}
        return counts if sum(counts.get(s, 0) for s in ("completed", "failed", "interrupted")) == RUNS else None

    counts = await until(settled, within=100)  # 25-60 s on 2 loaded cores; under the 120 s test timeout
    async with services.db.read() as db:
        failed = await db.rows(
            sa.select(t.runs.c.id, t.runs.c.status, t.runs.c.status_reason).where(t.runs.c.status != "completed")
        )
    assert counts == {"completed": RUNS}, [dict(r) for r in failed]
    assert passes > 10  # the pass really ran while the runs went through


@pytest.mark.parametrize("status", [RunStatus.PREPARING, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.WAITING])
@pytest.mark.parametrize("turn_recorded", [False, True])
@pytest.mark.parametrize("owner_alive", [None, False, True])
def test_a_start_in_the_hands_of_a_live_worker_is_never_failed(
    status: RunStatus, turn_recorded: bool, owner_alive: bool | None
) -> None:
    """The start effect is claimed (orphans were requeued or cancelled first): its worker ends the run itself."""
    action = recover_run(
        status, start_pending=False, start_claimed=True, turn_recorded=turn_recorded, owner_alive=owner_alive
    )
    assert action == RecoveryAction.NONE


@pytest.mark.parametrize("status", [RunStatus.STARTING, RunStatus.RUNNING])
def test_a_session_with_no_owner_yet_is_not_failed_while_its_start_is_pending(status: RunStatus) -> None:
    assert recover_run(status, start_pending=True, turn_recorded=True, owner_alive=None) == RecoveryAction.NONE


def test_a_lost_turn_still_fails() -> None:
    assert recover_run(RunStatus.RUNNING, start_pending=False, turn_recorded=True, owner_alive=False) == (
        RecoveryAction.FAIL
    )
    assert recover_run(RunStatus.PREPARING, start_pending=False, turn_recorded=True, owner_alive=None) == (
        RecoveryAction.FAIL
    )
    assert recover_run(RunStatus.PREPARING, start_pending=False, turn_recorded=False, owner_alive=None) == (
        RecoveryAction.REQUEUE_START
    )

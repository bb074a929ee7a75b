"""Idle agent runtimes are reaped by the production reaper, driven by a manual clock.

The services run in-process with the real scripted agent; the periodic loop is stopped
so each reaper pass is the test's own. A reaped runtime is `stopped` (reason `idle`), its
process is gone, and the next message opens a new one that resumes the same thread.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.inproc import ADMIN, new_thread, send
from tests.support.waiting import until
from threadloom.config import Settings
from threadloom.engine.services import Services
from threadloom.providers.registry import ConfigError, load_instances
from threadloom.providers.scripted import ScriptedRuntime
from threadloom.store import tables as t
from threadloom.store.db import Database


class ManualClock:
    def __init__(self) -> None:
        self.at = datetime.now(UTC)

    def now(self) -> datetime:
        return self.at

    def advance(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)


@pytest.fixture
async def reaping(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Services, ManualClock]]:
    config = tmp_path / "providers.toml"
    config.write_text('[instances.scripted]\ndriver = "scripted"\nidle_timeout_s = 60\n')
    clock = ManualClock()
    db = Database.from_url(database_url)
    services = Services.build(Settings.from_env(data_dir=str(tmp_path / "data")), db, clock, load_instances(config))
    await services.start()
    await services.recovery.stop()  # the test runs each reaper pass itself
    yield services, clock
    await services.stop()
    await db.dispose()


async def _status(services: Services, run_id: uuid.UUID) -> str:
    async with services.db.read() as db:
        return str(await db.scalar(sa.select(t.runs.c.status).where(t.runs.c.id == run_id)))


async def _finished(services: Services, run_id: uuid.UUID) -> str:
    async def done() -> str | None:
        status = await _status(services, run_id)
        return status if status in ("completed", "failed", "interrupted") else None

    return await until(done)


async def test_an_idle_runtime_is_reaped_and_the_thread_resumes(
    reaping: tuple[Services, ManualClock], tmp_path: Path
) -> None:
    services, clock = reaping
    thread = await new_thread(services, tmp_path / "ws")
    assert await _finished(services, await send(services, thread, "@reply first")) == "completed"
    [session] = services.sessions.sessions_of("scripted")
    runtime = session.runtime
    assert isinstance(runtime, ScriptedRuntime)

    assert await services.sessions.reap_idle() == []  # idle from now on
    clock.advance(59)
    assert await services.sessions.reap_idle() == []  # not long enough
    clock.advance(2)
    assert await services.sessions.reap_idle() == [session.key]
    assert runtime.process.proc.returncode is not None  # the agent process is gone
    assert services.sessions.sessions_of("scripted") == []
    async with services.db.read() as db:
        rows = await db.rows(sa.select(t.provider_sessions).order_by(t.provider_sessions.c.created_at))
        native = await db.scalar(sa.select(t.provider_threads.c.native_thread_ref))
    assert [(r["status"], r["last_error"]) for r in rows] == [("stopped", "idle")]

    second = await send(services, thread, "@reply second")
    assert await _finished(services, second) == "completed"
    async with services.db.read() as db:
        rows = await db.rows(sa.select(t.provider_sessions).order_by(t.provider_sessions.c.created_at))
        threads = await db.rows(sa.select(t.provider_threads))
        texts = await db.scalars_all(
            sa.select(t.conversation_messages.c.text)
            .where(t.conversation_messages.c.role == "assistant")
            .order_by(t.conversation_messages.c.created_at)
        )
    assert [r["status"] for r in rows] == ["stopped", "ready"]  # a new runtime...
    assert [(p["native_thread_ref"], p["status"]) for p in threads] == [(native, "idle")]  # ...resumed the thread
    assert texts == ["first", "second"]


async def test_a_runtime_with_a_running_turn_is_not_reaped(
    reaping: tuple[Services, ManualClock], tmp_path: Path
) -> None:
    services, clock = reaping
    thread = await new_thread(services, tmp_path / "ws")
    busy = await send(services, thread, "@delay 60000\n@reply a b c")

    async def running() -> bool:
        return await _status(services, busy) == "running"

    await until(running)
    for _ in range(3):
        clock.advance(3600)
        assert await services.sessions.reap_idle() == []
    await services.interruption.interrupt_run(ADMIN, busy, hold_queue=False, key=None)
    assert await _finished(services, busy) == "interrupted"
    [session] = services.sessions.sessions_of("scripted")
    assert session.runtime.alive


def test_idle_timeout_must_be_seconds(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[instances.codex]\ndriver = "codex"\nidle_timeout_s = "soon"\n')
    with pytest.raises(ConfigError, match="idle_timeout_s"):
        load_instances(bad)

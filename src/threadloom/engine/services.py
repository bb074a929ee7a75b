"""The engine's services for one process, assembled once by `app.py`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging

from threadloom.config import Settings
from threadloom.domain.interruption import STOP_SESSION_EFFECT, STOP_TASKS_EFFECT, UnsupportedPolicy
from threadloom.domain.requests import RESPOND_EFFECT
from threadloom.domain.runs import DELIVER_EFFECT, ENSURE_THREAD_EFFECT, START_EFFECT
from threadloom.domain.statuses import RunStatus
from threadloom.domain.steering import INTERRUPT_EFFECT, STEER_EFFECT
from threadloom.engine.catalog import Catalog
from threadloom.engine.clock import Clock
from threadloom.engine.control import Control
from threadloom.engine.delegation import Delegation
from threadloom.engine.effects import EffectWorker
from threadloom.engine.ingest import Ingestor
from threadloom.engine.pipeline import Committed, Pipeline
from threadloom.engine.plans import Plans
from threadloom.engine.recovery import Recovery
from threadloom.engine.requests import Requests
from threadloom.engine.runs import RunEngine
from threadloom.engine.sessions import LiveSession, SessionManager
from threadloom.engine.workers import Worker
from threadloom.providers.registry import InstanceConfig, build_driver, full_access_instances
from threadloom.store.db import Database

log = logging.getLogger("threadloom.services")
DEFAULT_IDLE_TIMEOUT_S = 600.0  # an agent process with nothing to do for 10 minutes is closed


@dataclasses.dataclass(slots=True)
class Services:
    settings: Settings
    db: Database
    clock: Clock
    pipeline: Pipeline
    catalog: Catalog
    worker: Worker
    sessions: SessionManager
    runs: RunEngine
    effects: EffectWorker
    recovery: Recovery
    control: Control
    delegation: Delegation
    requests: Requests
    plans: Plans
    instances: dict[str, InstanceConfig] = dataclasses.field(default_factory=dict)
    started: bool = False

    @classmethod
    def build(cls, settings: Settings, db: Database, clock: Clock, instances: dict[str, InstanceConfig]) -> Services:
        pipeline = Pipeline(db, clock)
        catalog = Catalog(
            pipeline,
            provider_instances=list(instances),
            default_instance=settings.default_provider_instance,
            eager_instances=[name for name, config in instances.items() if config.eager_thread],
            data_dir=settings.data_dir,
            full_access_instances=full_access_instances(instances),
        )
        worker = Worker(db, clock)
        drivers = {name: build_driver(config, settings.data_dir) for name, config in instances.items()}
        idle = {
            name: float(config.options.get("idle_timeout_s", DEFAULT_IDLE_TIMEOUT_S))
            for name, config in instances.items()
        }
        sessions = SessionManager(pipeline, drivers, worker.id, idle)
        restart_as_run = frozenset(
            name for name, config in instances.items() if config.options.get("restart_as") == "new_run"
        )
        run_engine = RunEngine(pipeline, sessions, restart_as_run)
        effects = EffectWorker(db, clock, worker.id)
        effects.handlers[START_EFFECT] = run_engine.start_turn
        effects.handlers[ENSURE_THREAD_EFFECT] = run_engine.ensure_thread
        recovery = Recovery(pipeline, run_engine, worker.id)
        policies = {
            name: UnsupportedPolicy(str(config.options.get("interrupt_unsupported", "reject")))
            for name, config in instances.items()
        }
        control = Control(pipeline, sessions, run_engine, policies)
        effects.handlers[STEER_EFFECT] = control.steer_effect
        effects.handlers[INTERRUPT_EFFECT] = control.interrupt_effect
        effects.handlers[STOP_SESSION_EFFECT] = control.stop_session_effect
        effects.handlers[STOP_TASKS_EFFECT] = control.stop_tasks_effect
        delegation = Delegation(pipeline, run_engine)
        effects.handlers[DELIVER_EFFECT] = delegation.deliver_effect
        requests = Requests(pipeline, sessions, run_engine)
        effects.handlers[RESPOND_EFFECT] = requests.respond_effect
        services = cls(
            settings,
            db,
            clock,
            pipeline,
            catalog,
            worker,
            sessions,
            run_engine,
            effects,
            recovery,
            control,
            delegation,
            requests,
            Plans(pipeline, catalog, run_engine),
            dict(instances),
        )

        async def wake(committed: Committed) -> None:
            if committed.effects:
                effects.wake.set()

        async def open_ingest(session: LiveSession) -> None:
            ingestor = Ingestor(pipeline, session, run_engine.finish, run_engine.session_lost)
            session.task = asyncio.create_task(ingestor.run(), name=f"ingest-{session.instance_id}")

        pipeline.listeners.append(wake)
        sessions.on_open = open_ingest
        return services

    async def start(self) -> None:
        """Become a live worker, recover what lost workers left, then take effects."""
        await self.worker.start()
        await self.recovery.recover()
        self.effects.start()
        self.recovery.start()
        self.started = True

    async def stop(self) -> None:
        if not self.started:
            return
        await self.recovery.stop()
        await self.effects.stop()
        for session in list(self.sessions.live.values()):
            for binding in list(session.bindings.values()):
                await self.runs.finish(
                    binding.run_id, RunStatus.FAILED, "server_stopped", attempt_id=binding.attempt_id
                )
        await self.sessions.close_all()
        await self.worker.stop()
        self.started = False

"""The engine's services for one process, assembled once by `app.py`."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
from collections.abc import Callable

from threadloom import metrics, tracing, unprivileged
from threadloom.checkpoints.store import CHECKPOINTS_DIR
from threadloom.config import Settings
from threadloom.domain import checkpoints as checkpoint_rules
from threadloom.domain.effects import (
    DeliverToParent,
    EnsureThread,
    InterruptTurn,
    RespondToRequest,
    StartTurn,
    SteerTurn,
    StopSession,
    StopTasks,
)
from threadloom.domain.handoffs import DEFAULT_POLICY, SwitchPolicy
from threadloom.domain.interruption import UnsupportedPolicy
from threadloom.domain.retries import DEFAULT_RECOVERY, RetryPolicy
from threadloom.domain.statuses import RunStatus
from threadloom.domain.threads import WORKSPACES_DIR
from threadloom.domain.usage import Pricing, parse_prices
from threadloom.engine.budgets import Budgets
from threadloom.engine.catalog import Catalog
from threadloom.engine.checkpoints import Checkpoints
from threadloom.engine.clock import Clock
from threadloom.engine.delegation import Delegation
from threadloom.engine.dispatch import Dispatcher
from threadloom.engine.effects import EffectWorker
from threadloom.engine.forks import Forks
from threadloom.engine.ingest import Ingestor
from threadloom.engine.interruption import Interruption
from threadloom.engine.leases import Leases
from threadloom.engine.pipeline import Committed, Pipeline
from threadloom.engine.plans import Plans
from threadloom.engine.project_admin import ProjectAdmin, TokenAdmin
from threadloom.engine.queue import QueueCommands
from threadloom.engine.recovery import Recovery
from threadloom.engine.requests import Requests
from threadloom.engine.retry import RunRetries
from threadloom.engine.rollback import Rollbacks
from threadloom.engine.runs import RunEngine
from threadloom.engine.sessions import LiveSession, SessionManager
from threadloom.engine.webhooks import WebhookAdmin, WebhookSender
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
    dispatch: Dispatcher
    queue: QueueCommands
    interruption: Interruption
    delegation: Delegation
    requests: Requests
    plans: Plans
    instances: dict[str, InstanceConfig] = dataclasses.field(default_factory=dict)
    started: bool = False
    rollback: Rollbacks = dataclasses.field(init=False)  # set by build(): it needs the checkpoints
    forks: Forks = dataclasses.field(init=False)
    retries: RunRetries = dataclasses.field(init=False)  # retryRun
    project_admin: ProjectAdmin = dataclasses.field(init=False)  # updateProject, archive/unarchiveProject
    tokens: TokenAdmin = dataclasses.field(init=False)  # tokens, createToken, revokeToken
    webhooks: WebhookAdmin = dataclasses.field(init=False)  # endpoints, deliveries (docs/webhooks.md)
    webhook_sender: WebhookSender = dataclasses.field(init=False)
    leases: Leases = dataclasses.field(init=False)  # acquire/renew/releaseThreadLease
    budgets: Budgets = dataclasses.field(init=False)  # setBudget, clearBudget, and their checks

    @classmethod
    def build(cls, settings: Settings, db: Database, clock: Clock, instances: dict[str, InstanceConfig]) -> Services:
        # Agents run as the agent user from here on (when this process is root), and may reach only their
        # own folders of the data dir.
        unprivileged.configure(settings.agent_uid, settings.agent_gid)
        pipeline = Pipeline(db, clock)
        catalog = Catalog(
            pipeline,
            provider_instances=list(instances),
            default_instance=settings.default_provider_instance,
            eager_instances=[name for name, config in instances.items() if config.eager_thread],
            data_dir=settings.data_dir,
            full_access_instances=full_access_instances(instances),
            agents_dir=settings.agents_dir,
        )
        worker = Worker(db, clock)
        agents_dir = settings.agents_dir
        drivers = {name: build_driver(config, settings.data_dir, agents_dir) for name, config in instances.items()}
        idle = {
            name: float(config.options.get("idle_timeout_s", DEFAULT_IDLE_TIMEOUT_S))
            for name, config in instances.items()
        }
        excludes = checkpoint_rules.excludes(os.environ.get(checkpoint_rules.EXCLUDES_ENV))
        checkpoints = Checkpoints.open(pipeline, settings.data_dir, excludes)
        sessions = SessionManager(pipeline, drivers, worker.id, idle, checkpoints.workspaces_root)
        reachable = [WORKSPACES_DIR]
        if agents_dir.parent == settings.data_dir:
            reachable.append(agents_dir.name)
        unprivileged.close_data_dir(settings.data_dir, reachable, private=[CHECKPOINTS_DIR])
        restart_as_run = frozenset(
            name for name, config in instances.items() if config.options.get("restart_as") == "new_run"
        )
        retry_policies = {
            name: RetryPolicy(
                retries=int(config.options.get("crash_retries", 0)),
                backoff_s=float(config.options.get("crash_retry_backoff_s", 0.5)),
            )
            for name, config in instances.items()
        }
        switch_policies = {
            name: SwitchPolicy(
                max_runs_behind=int(config.options.get("handoff_max_runs_behind", DEFAULT_POLICY.max_runs_behind)),
                max_handoffs=int(config.options.get("handoff_max_deltas", DEFAULT_POLICY.max_handoffs)),
            )
            for name, config in instances.items()
        }
        pricings = {
            name: Pricing(parse_prices(config.options.get("prices")), config.options.get("model"))
            for name, config in instances.items()
        }
        run_engine = RunEngine(pipeline, sessions, checkpoints, retry_policies, switch_policies)
        project_admin = ProjectAdmin(pipeline, checkpoints)
        dispatcher = Dispatcher(pipeline, run_engine, restart_as_run, project_admin.check_runnable)
        queue = QueueCommands(pipeline, run_engine, project_admin.check_runnable)
        effects = EffectWorker(db, clock, worker.id)
        effects.register(StartTurn, run_engine.start_turn)
        effects.register(EnsureThread, run_engine.ensure_thread)
        recovery_policies = {
            name: RetryPolicy(
                retries=int(config.options.get("recovery_retries", DEFAULT_RECOVERY.retries)),
                backoff_s=float(config.options.get("recovery_backoff_s", DEFAULT_RECOVERY.backoff_s)),
            )
            for name, config in instances.items()
        }
        recovery = Recovery(pipeline, run_engine, worker.id, recovery_policies)
        policies = {
            name: UnsupportedPolicy(str(config.options.get("interrupt_unsupported", "reject")))
            for name, config in instances.items()
        }
        interruption = Interruption(pipeline, sessions, run_engine, policies)
        effects.register(SteerTurn, dispatcher.steer_effect)
        effects.register(InterruptTurn, interruption.interrupt_effect)
        effects.register(StopSession, interruption.stop_session_effect)
        effects.register(StopTasks, interruption.stop_tasks_effect)
        delegation = Delegation(pipeline, run_engine)
        effects.register(DeliverToParent, delegation.deliver_effect)
        requests = Requests(pipeline, sessions, run_engine)
        effects.register(RespondToRequest, requests.respond_effect)
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
            dispatcher,
            queue,
            interruption,
            delegation,
            requests,
            Plans(pipeline, catalog, run_engine, dispatcher),
            dict(instances),
        )

        services.rollback = Rollbacks(
            pipeline,
            sessions,
            checkpoints.repo,
            checkpoints.workspace_of,
            checkpoints.ensure_own_workspace,
            worker_id=worker.id,
        )
        recovery.resume_rollbacks = services.rollback.resume_abandoned
        services.forks = Forks(pipeline, checkpoints)
        services.retries = RunRetries(pipeline, run_engine, project_admin.check_runnable)
        services.project_admin = project_admin
        services.tokens = TokenAdmin(pipeline)
        services.webhooks = WebhookAdmin(pipeline, settings.webhooks)
        sender = services.webhook_sender = WebhookSender(pipeline, worker.id, settings.webhooks)
        services.leases = Leases(pipeline)

        def knows_cost(instance: str, model: str | None) -> bool:
            """A call's cost can be known: the agent reports it, or the instance prices the model."""
            driver, pricing = drivers.get(instance), pricings.get(instance)
            if driver is not None and driver.capabilities().reports_cost:
                return True
            named = model or (pricing.default_model if pricing else None)
            return pricing is not None and named is not None and named in pricing.prices

        budgets = services.budgets = Budgets(pipeline, run_engine, interruption, knows_cost)
        run_engine.turns.gate = budgets.gate
        requests.budgets = budgets

        async def wake(committed: Committed) -> None:
            if committed.effects:
                effects.wake()
            if committed.hooks:
                sender.wake()
            if committed.usage and committed.project_id is not None:
                metrics.usage(str(committed.project_id), committed.usage)

        async def open_ingest(session: LiveSession) -> None:
            pricing = pricings.get(session.instance_id)
            ingestor = Ingestor(
                pipeline, session, run_engine.finish, run_engine.session_lost, checkpoints, pricing, budgets.after_usage
            )
            with tracing.detached():  # the session outlives the request that opened it
                session.task = asyncio.create_task(ingestor.run(), name=f"ingest-{session.instance_id}")

        pipeline.listeners.append(wake)
        sessions.on_open = open_ingest
        return services

    async def start(self, on_worker_lost: Callable[[], None] | None = None) -> None:
        """Become a live worker, recover what lost workers left, then take effects.

        `on_worker_lost`: called if this process stops being a live worker while it runs (see
        engine.workers); the server stops itself."""
        await self.worker.start(on_worker_lost)
        await self.project_admin.start()
        await self.recovery.recover()
        self.effects.start()
        self.recovery.start()
        self.webhook_sender.start()
        self.started = True

    async def stop(self) -> None:
        if not self.started:
            return
        await self.recovery.stop()
        await self.webhook_sender.stop()
        await self.effects.stop()
        for session in list(self.sessions.live.values()):
            for binding in list(session.bindings.values()):
                try:
                    await self.runs.finish(
                        binding.run_id, RunStatus.FAILED, "server_stopped", attempt_id=binding.attempt_id
                    )
                except Exception as error:  # the database is gone (the reason this worker stops, often)
                    # Recovery fails the run once the database is back: this worker's lock went with it.
                    log.warning("could not fail run %s on stopping (%s); recovery will", binding.run_id, error)
        await self.sessions.close_all()  # the agents stop with this process, whether the database answers or not
        await self.worker.stop()
        self.started = False

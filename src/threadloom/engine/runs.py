"""The run lifecycle in the engine, as one object the other lifecycles hold: the helpers every command on a
run shares (`execute_on_run`, `execute_on_thread`, `route`, `ability`), and the parts of a run's life, each
in a module of its own: starting its turn (`engine.turns`, with `engine.native_threads` for the provider's
thread), and ending it through the completion barrier (`engine.run_finish`). Rules live in `domain.runs`;
sendMessage is in `engine.dispatch`, resumeQueue in `engine.queue`."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadloom.domain import dispatch as dispatch_rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Outcome
from threadloom.domain.entities import AppThread, Run
from threadloom.domain.errors import not_found
from threadloom.domain.handoffs import SwitchPolicy
from threadloom.domain.retries import RetryPolicy
from threadloom.domain.statuses import TokenScope
from threadloom.engine import routing
from threadloom.engine.checkpoints import Checkpoints
from threadloom.engine.native_threads import NativeThreads
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.run_finish import RunFinish
from threadloom.engine.sessions import SessionManager
from threadloom.engine.turns import Turns
from threadloom.store import entities
from threadloom.store.db import Reader
from threadloom.store.runs import SessionOf

Decide = Callable[[Reader, AppThread, Run], Awaitable[Outcome]]  # a command on a run, under its thread lock


class RunEngine:
    def __init__(
        self,
        pipeline: Pipeline,
        sessions: SessionManager,
        checkpoints: Checkpoints | None = None,
        retry_policies: dict[str, RetryPolicy] | None = None,
        switch_policies: dict[str, SwitchPolicy] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.checkpoints = checkpoints or Checkpoints(pipeline, None, ())
        ending = RunFinish(pipeline, sessions, self.checkpoints, retry_policies or {})
        native = NativeThreads(pipeline, sessions, self.checkpoints)
        turns = Turns(pipeline, sessions, self.checkpoints, native, ending, switch_policies or {})
        self.finish = ending.finish  # a run's end through the completion barrier
        self.session_lost = ending.session_lost  # a runtime died: its live turns are retried or fail
        self.start_turn = turns.start_turn  # the `provider-turn.start` effect
        self.turns = turns
        self.ensure_thread = native.ensure_thread  # the `provider-thread.ensure` effect

    # ---- commands ---------------------------------------------------------------------

    def ability(self, instance_id: str) -> dispatch_rules.SteerAbility:
        driver = self.sessions.drivers.get(instance_id)
        caps = driver.capabilities() if driver is not None else None
        return dispatch_rules.SteerAbility(
            native=bool(caps and caps.supports_active_steering),
            restart=bool(caps and caps.supports_steering_by_interrupt_restart),
        )

    async def execute_on_thread(
        self,
        principal: Principal,
        command_type: str,
        thread_id: uuid.UUID,
        key: str | None,
        decide: Callable[[Reader, AppThread], Awaitable[Outcome]],
    ) -> uuid.UUID:
        """A client's command on a thread (operate scope) under its lock, its effects routed; answers the thread."""

        async def locked(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            outcome = await decide(db, thread)
            await self.route(db, thread, outcome)
            outcome.result = {"threadId": str(thread.id)}
            return outcome

        data = {"threadId": str(thread_id)}
        command = Command(
            command_type=command_type, principal=principal, key=key, input=data, decide=locked, thread_id=thread_id
        )
        await self.pipeline.execute(command)
        return thread_id

    async def execute_on_run(
        self,
        principal: Principal,
        command_type: str,
        run_id: uuid.UUID,
        key: str | None,
        data: dict[str, Any],
        decide: Decide,
    ) -> dict[str, Any]:
        """A command on a run under its thread's lock; the command's result (stored or new)."""
        thread_id = await self.thread_of(run_id)

        async def locked(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "runId")
            run = await entities.get(db, Run, run_id)
            if run is None:
                raise not_found("runId")
            outcome = await decide(db, thread, run)
            await self.route(db, thread, outcome)
            return outcome

        asked = {"command_type": command_type, "principal": principal, "key": key, "decide": locked}
        return await self.pipeline.execute(Command.naming("runId", run_id, data, thread_id=thread_id, **asked))

    async def thread_of(self, run_id: uuid.UUID) -> uuid.UUID:
        async with self.pipeline.db.read() as db:
            run = await entities.get(db, Run, run_id)
        if run is None:
            raise not_found("runId")
        return run.thread_id

    async def route(self, db: Reader, thread: AppThread, outcome: Outcome, known: SessionOf | None = None) -> None:
        """Send turn starts to the worker whose live runtime holds the thread's provider thread (`known`: its
        session as read already, `SessionManager.owner_of`)."""
        await routing.route(self.sessions, db, thread, outcome, known)

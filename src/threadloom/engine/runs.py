"""The run lifecycle in the engine: sendMessage, resumeQueue, starting a provider turn,
and finishing a run through the completion barrier. Rules live in `domain.runs`."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadloom.domain import dispatch as dispatch_rules
from threadloom.domain import runs as rules
from threadloom.domain import steering
from threadloom.domain.access import Principal
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.entities import (
    AppThread,
    ConversationMessage,
    Project,
    ProviderThread,
    ProviderTurn,
    Run,
    RunAttempt,
)
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import (
    AttemptStatus,
    ProviderSessionStatus,
    ProviderThreadStatus,
    ProviderTurnStatus,
    RunStatus,
    TokenScope,
)
from threadloom.domain.threads import clean_model
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.sessions import LiveSession, SessionManager, TurnBinding
from threadloom.providers.contract import ProviderError, ThreadSettings
from threadloom.store import entities, runs
from threadloom.store import tables as t
from threadloom.store.db import Reader

log = logging.getLogger("threadloom.runs")
TURN_END_WAIT = 30.0


@dataclasses.dataclass(frozen=True, slots=True)
class Sent:
    run_id: uuid.UUID
    message_id: uuid.UUID
    applied: rules.AppliedDispatch


@dataclasses.dataclass(frozen=True, slots=True)
class _Target:
    """Where a native thread must exist: the app thread, its workspace, the run asking (if any)."""

    thread_id: uuid.UUID
    settings: ThreadSettings
    run_id: uuid.UUID | None
    provider_thread: ProviderThread
    project_id: uuid.UUID  # whose runtime serves it


@dataclasses.dataclass(frozen=True, slots=True)
class _Prepared:
    run: Run
    attempt: RunAttempt
    thread: AppThread
    provider_thread: ProviderThread
    text: str
    cwd: str

    @property
    def target(self) -> _Target:
        settings = _settings(self.thread, self.cwd, self.run.model)
        return _Target(self.thread.id, settings, self.run.id, self.provider_thread, self.thread.project_id)


def _settings(thread: AppThread, cwd: str, model: str | None = None) -> ThreadSettings:
    """A run's settings carry its own model (sendMessage's `model`, else the thread's)."""
    return ThreadSettings(cwd=cwd, runtime_mode=thread.runtime_mode, model=model or thread.model)


def _provider_thread_for(thread: AppThread, current: ProviderThread | None, instance: str, now: Any) -> list[Change]:
    """The changes that give a thread a (not yet loaded) provider thread of `instance`, if it lacks one."""
    if current is not None and current.provider_instance_id == instance:
        return []
    created = ProviderThread(
        id=new_id(),
        provider_instance_id=instance,
        app_thread_id=thread.id,
        status=ProviderThreadStatus.NOT_LOADED,
        created_at=now,
        updated_at=now,
    )
    return [
        Change("provider_thread.created", created),
        Change("thread.updated", thread.evolve(active_provider_thread_id=created.id, updated_at=now)),
    ]


class RunEngine:
    def __init__(
        self, pipeline: Pipeline, sessions: SessionManager, restart_as_run: frozenset[str] = frozenset()
    ) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.restart_as_run = restart_as_run  # instances whose restarts are new runs (supersedesRunId)

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    # ---- commands ---------------------------------------------------------------------

    def ability(self, instance_id: str) -> dispatch_rules.SteerAbility:
        driver = self.sessions.drivers.get(instance_id)
        caps = driver.capabilities() if driver is not None else None
        return dispatch_rules.SteerAbility(
            native=bool(caps and caps.supports_active_steering),
            restart=bool(caps and caps.supports_steering_by_interrupt_restart),
        )

    async def send_message(
        self,
        principal: Principal,
        thread_id: uuid.UUID,
        *,
        text: str,
        dispatch: dispatch_rules.Dispatch,
        provider_instance_id: str | None,
        model: str | None,
        client_message_id: str | None,
    ) -> Sent:
        now = self.now

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            assert thread is not None
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            if client_message_id is not None and await entities.where(
                db,
                ConversationMessage,
                t.conversation_messages.c.thread_id == thread.id,
                t.conversation_messages.c.client_message_id == client_message_id,
            ):
                # Keys are per token; the message id is per thread: another token's message took it.
                raise DomainError(
                    ErrorCode.IDEMPOTENCY_KEY_REUSED, "this clientMessageId is used on this thread", "clientMessageId"
                )
            if provider_instance_id is not None and provider_instance_id != thread.provider_instance_id:
                raise DomainError(
                    ErrorCode.PROVIDER_SWITCH_UNAVAILABLE,
                    "switching a thread's provider is not available on this server yet",
                    "providerInstanceId",
                )
            state = await runs.thread_state(db, thread)
            applied = dispatch_rules.choose(dispatch, state, self.ability(thread.provider_instance_id))
            if applied == rules.AppliedDispatch.STEER_ACTIVE:
                assert state.active is not None
                outcome = steering.steer(thread, state.active, text, client_message_id, now, new_id)
            elif applied == rules.AppliedDispatch.RESTART_ACTIVE and thread.provider_instance_id in self.restart_as_run:
                assert state.active is not None
                outcome = steering.restart_as_new_run(
                    state, state.active, text, client_message_id, clean_model(model), now, new_id
                )
            elif applied == rules.AppliedDispatch.RESTART_ACTIVE:
                assert state.active is not None
                outcome = await self._restart(db, thread, state.active, text, client_message_id)
            else:
                outcome = rules.new_run(
                    state,
                    applied=applied,
                    text=text,
                    provider_instance_id=thread.provider_instance_id,
                    model=clean_model(model),
                    client_message_id=client_message_id,
                    now=now,
                    new_id=new_id,
                )
            await self.route(db, thread, outcome)
            return outcome

        key = None if client_message_id is None else f"{thread_id}/{client_message_id}"
        data = {
            "threadId": str(thread_id),
            "text": text,
            "mode": dispatch.mode.value,
            "target": str(dispatch.target_run_id),
            "expected": str(dispatch.expected_attempt_id),
            "providerInstanceId": provider_instance_id,
            "model": model,
        }
        result = await self.pipeline.execute(Command("sendMessage", principal, key, data, decide, thread_id))
        return Sent(
            uuid.UUID(result["runId"]),
            uuid.UUID(result["messageId"]),
            rules.AppliedDispatch(result["appliedDispatch"]),
        )

    async def _restart(
        self, db: Reader, thread: AppThread, run: Run, text: str, client_message_id: str | None
    ) -> Outcome:
        graph = await runs.run_graph(db, thread, run)
        original = await runs.run_input(db, run)
        return steering.restart(
            thread,
            run,
            graph.attempt,
            graph.root,
            graph.open_children,
            original,
            text,
            client_message_id,
            self.now,
            new_id,
            pending_requests=graph.pending_requests,
        )

    async def resume_queue(self, principal: Principal, thread_id: uuid.UUID, key: str | None) -> uuid.UUID:
        now = self.now

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            assert thread is not None
            principal.require_project(thread.project_id, TokenScope.OPERATE, "threadId")
            outcome = rules.resume_queue(await runs.thread_state(db, thread), now, new_id)
            await self.route(db, thread, outcome)
            outcome.result = {"threadId": str(thread.id)}
            return outcome

        await self.pipeline.execute(
            Command("resumeQueue", principal, key, {"threadId": str(thread_id)}, decide, thread_id)
        )
        return thread_id

    async def route(self, db: Reader, thread: AppThread, outcome: Outcome) -> None:
        """Send turn starts to the worker whose live runtime holds the thread's provider thread."""
        if not outcome.effects:
            return
        owner = await self.sessions.owner_of(db, thread.active_provider_thread_id)
        if owner is not None:
            outcome.effects = [dataclasses.replace(e, affinity=owner) for e in outcome.effects]

    async def finish(
        self,
        run_id: uuid.UUID,
        status: RunStatus,
        reason: str | None,
        *,
        hold_reason: str | None = None,
        attempt_id: uuid.UUID | None = None,
        guard: Callable[[Reader, Run], Awaitable[bool]] | None = None,
    ) -> bool:
        """End a run through the completion barrier. A no-op (False) if it already ended,
        or if `guard`, checked under the thread lock, says no."""
        now = self.now
        done = {"finished": False}

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            assert thread is not None
            run = await entities.get(db, Run, run_id)
            if run is None or not rules.is_active(run):
                return Outcome()
            if attempt_id is not None and run.active_attempt_id != attempt_id:
                return await self._close_superseded_turn(db, attempt_id, status)
            if guard is not None and not await guard(db, run):
                return Outcome()
            graph = await runs.run_graph(db, thread, run)
            outcome = rules.finish_run(graph, status, reason, now, new_id, hold_reason=hold_reason)
            await self.route(db, thread, outcome)
            done["finished"] = True
            return outcome

        thread_id = await self._thread_of_run(run_id)
        if thread_id is None:
            return False
        await self.pipeline.execute(Command("run.finish", None, None, {}, decide, thread_id))
        return done["finished"]

    async def _close_superseded_turn(self, db: Reader, attempt_id: uuid.UUID, status: RunStatus) -> Outcome:
        """The provider ended the turn of a superseded attempt: record that, and nothing else."""
        attempt = await entities.get(db, RunAttempt, attempt_id)
        turn = await entities.get(db, ProviderTurn, attempt.provider_turn_id if attempt else None)
        if turn is None or turn.status not in (ProviderTurnStatus.PENDING, ProviderTurnStatus.RUNNING):
            return Outcome()
        ended = ProviderTurnStatus.INTERRUPTED if status == RunStatus.INTERRUPTED else ProviderTurnStatus.COMPLETED
        return Outcome([Change("provider_turn.updated", turn.evolve(status=ended, completed_at=self.now))])

    async def _thread_of_run(self, run_id: uuid.UUID) -> uuid.UUID | None:
        async with self.pipeline.db.read() as db:
            run = await entities.get(db, Run, run_id)
        return None if run is None else run.thread_id

    # ---- the provider-turn.start effect ---------------------------------------------------

    async def start_turn(self, payload: dict[str, Any]) -> None:
        """ensure session → ensure provider thread → record the turn → start it."""
        run_id = uuid.UUID(payload["runId"])
        prepared = await self._prepare(run_id, payload.get("input"))
        if prepared is None:
            return
        try:
            # The project's own runtime, kept from the reaper meanwhile.
            async with self.sessions.using(prepared.run.provider_instance_id, prepared.thread.project_id) as session:
                await self._start_on(session, prepared)
        except ProviderError as error:
            await self.finish(run_id, RunStatus.FAILED, "provider_error", hold_reason=f"provider error: {error}")

    async def _start_on(self, session: LiveSession, prepared: _Prepared) -> None:
        run_id = prepared.run.id
        provider_thread = await self._ensure_native_thread(session, prepared.target)
        previous = session.bindings.get(str(provider_thread.native_thread_ref))
        superseded = previous if previous is not None and previous.attempt_id != prepared.attempt.id else None
        # A restart: the superseded attempt's turn must end before the new one starts.
        if superseded is not None and not await session.wait_unbound(superseded.native_thread, TURN_END_WAIT):
            await self.finish(
                run_id, RunStatus.FAILED, "provider_error", hold_reason="the interrupted turn did not end in time"
            )
            return
        turn = await self._record_turn(prepared, provider_thread)
        if turn is None:
            return
        binding = TurnBinding(
            thread_id=prepared.thread.id,
            run_id=run_id,
            attempt_id=prepared.attempt.id,
            root_node_id=prepared.attempt.root_node_id,
            provider_turn_id=turn,
            native_thread=str(provider_thread.native_thread_ref),
        )
        session.bind(binding)
        try:
            native_turn = await session.runtime.start_turn(
                binding.native_thread, prepared.text, prepared.target.settings
            )
        except ProviderError as error:
            session.unbind(binding.native_thread)
            crashed = error.code == "exited"
            await self.finish(
                run_id,
                RunStatus.FAILED,
                "provider_crashed" if crashed else "provider_error",
                hold_reason=f"{'agent process exited' if crashed else 'provider refused the turn'}: {error}",
            )
            return
        binding.know_turn(native_turn)

    async def _prepare(self, run_id: uuid.UUID, text: str | None = None) -> _Prepared | None:
        now = self.now
        found: dict[str, _Prepared] = {}

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            assert thread is not None
            run = await entities.get(db, Run, run_id)
            if run is None or run.status != RunStatus.PREPARING:
                return Outcome()
            attempt = await entities.require(db, RunAttempt, run.active_attempt_id)
            if attempt.status != AttemptStatus.PENDING:
                return Outcome()
            project = await entities.require(db, Project, thread.project_id)
            message = await entities.require(db, ConversationMessage, run.user_message_id)
            outcome = Outcome()
            provider_thread = await entities.get(db, ProviderThread, thread.active_provider_thread_id)
            if provider_thread is None or provider_thread.provider_instance_id != run.provider_instance_id:
                provider_thread = ProviderThread(
                    id=new_id(),
                    provider_instance_id=run.provider_instance_id,
                    app_thread_id=thread.id,
                    status=ProviderThreadStatus.NOT_LOADED,
                    created_at=now,
                    updated_at=now,
                )
                outcome.changes += [
                    Change("provider_thread.created", provider_thread),
                    Change(
                        "thread.updated", thread.evolve(active_provider_thread_id=provider_thread.id, updated_at=now)
                    ),
                ]
            found["p"] = _Prepared(run, attempt, thread, provider_thread, text or message.text, project.workspace_root)
            return outcome

        thread_id = await self._thread_of_run(run_id)
        if thread_id is None:
            return None
        await self.pipeline.execute(Command("turn.prepare", None, None, {}, decide, thread_id))
        return found.get("p")

    async def _ensure_native_thread(self, session: LiveSession, p: _Target) -> ProviderThread:
        """Lazily create the native thread, or resume it in this runtime (Follow-Up Turns)."""
        pt = p.provider_thread
        runtime = session.runtime
        warning: str | None = None
        if pt.native_thread_ref is not None and pt.native_thread_ref not in session.loaded:
            try:
                await runtime.resume_thread(pt.native_thread_ref, p.settings)
            except ProviderError as error:
                if error.code == "exited":
                    raise
                warning = f"could not resume provider thread {pt.native_thread_ref}: {error}; starting a new one"
                pt = await self._replace_provider_thread(p, pt)
        if pt.native_thread_ref is None:
            with contextlib.suppress(OSError):
                os.makedirs(p.settings.cwd, exist_ok=True)
            ref = await runtime.start_thread(p.settings)
            pt = pt.evolve(native_thread_ref=ref)
        session.loaded.add(str(pt.native_thread_ref))
        return await self._record_provider_thread(
            p, pt.evolve(session_id=session.session_id, status=ProviderThreadStatus.ACTIVE), warning
        )

    async def _replace_provider_thread(self, p: _Target, broken: ProviderThread) -> ProviderThread:
        now = self.now
        replacement = ProviderThread(
            id=new_id(),
            provider_instance_id=broken.provider_instance_id,
            app_thread_id=p.thread_id,
            status=ProviderThreadStatus.NOT_LOADED,
            created_at=now,
            updated_at=now,
        )

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            assert thread is not None
            return Outcome(
                [
                    Change("provider_thread.updated", broken.evolve(status=ProviderThreadStatus.ERROR, updated_at=now)),
                    Change("provider_thread.created", replacement),
                    Change("thread.updated", thread.evolve(active_provider_thread_id=replacement.id, updated_at=now)),
                ]
            )

        await self.pipeline.execute(Command("provider_thread.replace", None, None, {}, decide, p.thread_id))
        return replacement

    async def _record_provider_thread(self, p: _Target, pt: ProviderThread, warning: str | None) -> ProviderThread:
        now = self.now

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            outcome = Outcome([Change("provider_thread.updated", pt.evolve(updated_at=now))])
            if warning:
                outcome.changes.append(
                    rules.activity(p.thread_id, "runtime.warning", warning, now, new_id, run_id=p.run_id)
                )
            return outcome

        await self.pipeline.execute(Command("provider_thread.ready", None, None, {}, decide, p.thread_id))
        return pt

    async def _record_turn(self, p: _Prepared, pt: ProviderThread) -> uuid.UUID | None:
        now = self.now
        found: dict[str, uuid.UUID] = {}

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            run = await entities.get(db, Run, p.run.id)
            attempt = await entities.get(db, RunAttempt, p.attempt.id)
            if run is None or attempt is None or run.status != RunStatus.PREPARING:
                return Outcome()
            ordinal = await runs.next_turn_ordinal(db, pt.id)
            outcome, turn = rules.turn_requested(run, attempt, pt, ordinal, now, new_id)
            found["turn"] = turn.id
            return outcome

        await self.pipeline.execute(Command("turn.request", None, None, {}, decide, p.thread.id))
        return found.get("turn")

    async def ensure_thread(self, payload: dict[str, Any]) -> None:
        """The `provider-thread.ensure` effect: eager provider-thread creation for instances configured so."""
        thread_id = uuid.UUID(payload["threadId"])
        now = self.now
        found: dict[str, _Target] = {}

        async def decide(db: Reader, thread: AppThread | None) -> Outcome:
            assert thread is not None
            current = await entities.get(db, ProviderThread, thread.active_provider_thread_id)
            if current is not None and current.native_thread_ref is not None:
                return Outcome()
            project = await entities.require(db, Project, thread.project_id)
            outcome = Outcome(_provider_thread_for(thread, current, thread.provider_instance_id, now))
            pt = next((c.entity for c in outcome.changes if isinstance(c.entity, ProviderThread)), current)
            assert pt is not None
            found["t"] = _Target(thread.id, _settings(thread, project.workspace_root), None, pt, project.id)
            return outcome

        await self.pipeline.execute(Command("provider_thread.ensure", None, None, {}, decide, thread_id))
        target = found.get("t")
        if target is not None:
            instance = target.provider_thread.provider_instance_id
            async with self.sessions.using(instance, target.project_id) as session:
                await self._ensure_native_thread(session, target)

    async def session_lost(self, session: LiveSession, reason: str) -> None:
        """The runtime died: its live turns failed; the provider threads stay resumable."""
        for binding in list(session.bindings.values()):
            await self.finish(
                binding.run_id,
                RunStatus.FAILED,
                "provider_crashed",
                hold_reason=f"agent process exited: {reason}",
                attempt_id=binding.attempt_id,
            )
        if not session.stopping:
            await self.sessions.mark(session, ProviderSessionStatus.ERROR, reason)

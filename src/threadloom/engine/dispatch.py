"""Where a message goes, in the engine: sendMessage (new run, steer in place, steer by restart) and the
steer effect (a steer whose turn has ended meanwhile becomes a new run). Rules live in `domain.dispatch`."""

from __future__ import annotations

import dataclasses
import logging
import uuid
from typing import Any

from threadloom.domain import dispatch as rules
from threadloom.domain import switching
from threadloom.domain.access import Principal
from threadloom.domain.activities import ActivityKind, activity
from threadloom.domain.changes import Change, Outcome
from threadloom.domain.effects import SteerTurn
from threadloom.domain.entities import AppThread, ConversationMessage, Run
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import TokenScope
from threadloom.domain.threads import clean_model
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.project_admin import Gate
from threadloom.engine.runs import RunEngine
from threadloom.faults import hold_point
from threadloom.providers.contract import ProviderError
from threadloom.store import entities, runs
from threadloom.store import tables as t
from threadloom.store.db import Reader

TURN_ID_WAIT = 30.0  # how long a steer waits for a turn start in flight to name its turn
log = logging.getLogger("threadloom.dispatch")


@dataclasses.dataclass(frozen=True, slots=True)
class Sent:
    run_id: uuid.UUID
    message_id: uuid.UUID
    applied: rules.AppliedDispatch


class Dispatcher:
    def __init__(
        self,
        pipeline: Pipeline,
        run_engine: RunEngine,
        restart_as_run: frozenset[str] = frozenset(),
        gate: Gate | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.gate = gate  # refuses a message in an archived project or a missing workspace (engine.project_admin)
        self.runs = run_engine
        self.sessions = run_engine.sessions
        self.restart_as_run = restart_as_run  # instances whose restarts are new runs (supersedesRunId)

    @property
    def now(self) -> Any:
        return self.pipeline.clock.now()

    async def send_message(
        self,
        principal: Principal,
        thread_id: uuid.UUID,
        *,
        text: str,
        dispatch: rules.Dispatch,
        provider_instance_id: str | None,
        model: str | None,
        client_message_id: str | None,
        fresh_context: bool = False,
    ) -> Sent:
        now = self.now
        if self.gate is not None:
            await self.gate(principal, thread_id)

        async def decide(db: Reader, thread: AppThread) -> Outcome:
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
            state, session = await runs.routed_thread_state(db, thread)
            chosen: list[Change] = []
            active_on = state.active.provider_instance_id if state.active else thread.provider_instance_id
            applied = rules.choose(dispatch, state, self.runs.ability(active_on))
            if provider_instance_id is not None and provider_instance_id != thread.provider_instance_id:
                known = self.runs.sessions.drivers
                thread, chosen = switching.switch(thread, provider_instance_id, clean_model(model), known, now, new_id)
                state = dataclasses.replace(state, thread=thread)
                applied = switching.dispatch_across(applied, dispatch)
            if applied == rules.AppliedDispatch.STEER_ACTIVE:
                assert state.active is not None
                outcome = rules.steer(thread, state.active, text, client_message_id, now, new_id)
            elif applied == rules.AppliedDispatch.RESTART_ACTIVE and thread.provider_instance_id in self.restart_as_run:
                assert state.active is not None
                outcome = rules.restart_as_new_run(
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
                    now=now,
                    new_id=new_id,
                    model=clean_model(model),
                    client_message_id=client_message_id,
                    fresh_context=fresh_context,
                )
            outcome.changes[:0] = chosen
            await self.runs.route(db, thread, outcome, session)
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
            **({"freshContext": True} if fresh_context else {}),  # absent when off: stored keys still match
        }
        result = await self.pipeline.execute(
            Command(
                command_type="sendMessage", principal=principal, key=key, input=data, decide=decide, thread_id=thread_id
            )
        )
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
        return rules.restart(
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

    async def steer_effect(self, effect: SteerTurn) -> None:
        """Steer the live turn; if it has ended meanwhile, the message becomes a new run."""
        run_id = effect.run_id
        async with self.pipeline.db.statements() as db:  # one statement: no transaction around it
            message = await entities.require(db, ConversationMessage, effect.message_id)
        found = self.sessions.binding_of_attempt(effect.attempt_id)
        native_turn = None if found is None else await found[1].wait_turn(TURN_ID_WAIT)
        if found is not None and native_turn is not None and found[0].bindings.get(found[1].native_thread) is found[1]:
            session, binding = found
            await hold_point("steer-delivery")  # test-only: the steer reaches the agent after its turn ended
            try:
                await session.runtime.steer_turn(binding.native_thread, native_turn, message.text)
                return
            except ProviderError as error:
                log.info("steer of run %s refused (%s); it becomes a new run", run_id, error)
        await self._late_steer(run_id, message, effect.attempt_id)

    async def _late_steer(
        self, run_id: uuid.UUID, message: ConversationMessage, attempt_id: uuid.UUID | None = None
    ) -> None:
        """The steer did not reach the turn of `attempt_id`: the message becomes a new run, unless the run's
        next attempt (a restart, a crash retry) carries it already (`domain.dispatch.steer_carried`)."""
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            if rules.steer_carried(attempt_id, await runs.attempts_of(db, run_id)):
                log.info("steer of run %s went with its next attempt's input", run_id)
                return Outcome()
            state = await runs.thread_state(db, thread)
            applied = rules.choose(
                rules.Dispatch(rules.DispatchMode.QUEUE_AFTER_ACTIVE),
                state,
                rules.SteerAbility(False, False),
            )
            outcome = rules.new_run(
                state,
                applied=applied,
                text=message.text,
                now=now,
                new_id=new_id,
                client_message_id=message.client_message_id,
                message_id=message.id,
            )
            outcome.changes.append(
                activity(
                    thread.id,
                    ActivityKind.STEER_BECAME_RUN,
                    "the steered turn had ended; the message became a new run",
                    now,
                    new_id,
                    run_id=run_id,
                )
            )
            await self.runs.route(db, thread, outcome)
            return outcome

        await self.pipeline.execute(Command(command_type="steer.late", decide=decide, thread_id=message.thread_id))

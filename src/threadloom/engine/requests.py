"""Answering runtime requests (approvals and questions): validate, record, deliver once."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from threadloom.domain import budgets as budget_rules
from threadloom.domain import requests as rules
from threadloom.domain.access import Principal
from threadloom.domain.changes import Outcome
from threadloom.domain.effects import RespondToRequest
from threadloom.domain.entities import AppThread, ExecutionNode, Run, RuntimeRequest
from threadloom.domain.errors import DomainError, ErrorCode, not_found
from threadloom.domain.ids import new_id
from threadloom.domain.statuses import RuntimeRequestKind, RuntimeRequestStatus, TokenScope
from threadloom.engine.pipeline import Command, Pipeline
from threadloom.engine.runs import RunEngine
from threadloom.engine.sessions import SessionManager
from threadloom.providers.contract import ProviderError
from threadloom.store import entities
from threadloom.store import tables as t
from threadloom.store.db import Reader

if TYPE_CHECKING:
    from threadloom.engine.budgets import Budgets

log = logging.getLogger("threadloom.requests")
Answer = tuple[dict[str, Any], dict[str, Any], bool]


class Requests:
    def __init__(self, pipeline: Pipeline, sessions: SessionManager, run_engine: RunEngine) -> None:
        self.pipeline = pipeline
        self.sessions = sessions
        self.runs = run_engine
        self.budgets: Budgets | None = None  # answers BUDGET requests (set once the budgets engine is made)

    async def respond_to_approval(
        self, principal: Principal, request_id: uuid.UUID, decision: rules.Decision, key: str | None
    ) -> uuid.UUID:
        def answer(request: RuntimeRequest) -> Answer:
            if request.kind == RuntimeRequestKind.USER_INPUT:
                raise DomainError(
                    ErrorCode.INVALID_INPUT, "this request is a question: use respondToUserInput", "requestId"
                )
            return rules.approval(decision)

        return await self._respond(
            principal, request_id, "respondToApproval", {"decision": decision.value}, answer, key
        )

    async def respond_to_user_input(
        self, principal: Principal, request_id: uuid.UUID, answers: dict[str, list[str]], key: str | None
    ) -> uuid.UUID:
        def answer(request: RuntimeRequest) -> Answer:
            if request.kind != RuntimeRequestKind.USER_INPUT:
                raise DomainError(
                    ErrorCode.INVALID_INPUT, "this request is an approval: use respondToApproval", "requestId"
                )
            rules.validate_answers((request.payload or {}).get("questions") or [], answers)
            return rules.answered(answers)

        return await self._respond(principal, request_id, "respondToUserInput", {"answers": answers}, answer, key)

    async def _respond(
        self,
        principal: Principal,
        request_id: uuid.UUID,
        command_type: str,
        data: dict[str, Any],
        answer: Callable[[RuntimeRequest], Answer],
        key: str | None,
    ) -> uuid.UUID:
        async with self.pipeline.db.read() as db:
            found = await entities.get(db, RuntimeRequest, request_id)
        if found is None:
            raise not_found("requestId")
        now = self.pipeline.clock.now()

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            principal.require_project(thread.project_id, TokenScope.OPERATE, "requestId")
            request = await entities.require(db, RuntimeRequest, request_id)
            response, native, accepted = answer(request)
            if rules.same_response(request, response):
                return Outcome(result={"requestId": str(request.id)})  # already answered so: sent once
            rules.require_open(request)
            run = await entities.require(db, Run, request.run_id)
            node = await entities.require(db, ExecutionNode, request.node_id)
            others = await entities.where(
                db,
                RuntimeRequest,
                t.runtime_requests.c.run_id == run.id,
                t.runtime_requests.c.status == RuntimeRequestStatus.PENDING.value,
                t.runtime_requests.c.id != request.id,
            )
            if request.kind == RuntimeRequestKind.BUDGET and self.budgets is not None:
                summary = rules.resolution_summary(request, response)
                outcome = await self.budgets.answer(
                    db, thread, run, request, node, len(others), response, accepted, summary, now
                )
            else:
                outcome = rules.respond(
                    thread, run, request, node, len(others), response, native, accepted, now, new_id
                )
            await self.runs.route(db, thread, outcome)
            return outcome

        asked = {"command_type": command_type, "principal": principal, "key": key, "decide": decide}
        await self.pipeline.execute(Command.naming("requestId", request_id, data, thread_id=found.thread_id, **asked))
        if found.kind == RuntimeRequestKind.BUDGET and self.budgets is not None:
            async with self.pipeline.db.read() as db:
                answered = await entities.require(db, RuntimeRequest, request_id)
            if not budget_rules.granted(answered):
                await self.budgets.declined(request_id)  # declined: as STOP (after the answer's commit)
        return request_id

    async def respond_effect(self, effect: RespondToRequest) -> None:
        """Deliver the answer to the live provider callback; if it is gone, the request expires."""
        found = self.sessions.binding_of_attempt(effect.attempt_id)
        if found is not None:
            try:
                await found[0].runtime.respond_to_request(str(effect.native_ref), dict(effect.response))
                return
            except ProviderError as error:
                log.warning("could not deliver the answer to %s: %s", effect.native_ref, error)
        await self._expire(effect.request_id, "the provider's callback was gone when the answer arrived")

    async def _expire(self, request_id: uuid.UUID, reason: str) -> None:
        now = self.pipeline.clock.now()
        async with self.pipeline.db.read() as db:
            request = await entities.get(db, RuntimeRequest, request_id)
        if request is None:
            return

        async def decide(db: Reader, thread: AppThread) -> Outcome:
            current = await entities.require(db, RuntimeRequest, request_id)
            node = await entities.get(db, ExecutionNode, current.node_id)
            return Outcome(rules.expire(current, node, reason, now))

        await self.pipeline.execute(Command(command_type="request.expire", decide=decide, thread_id=request.thread_id))

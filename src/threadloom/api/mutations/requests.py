"""Approvals and questions: respondToApproval, respondToUserInput."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context
from threadloom.api.enums import Decision
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import key, mutation, returning
from threadloom.api.types import RuntimeRequest
from threadloom.domain.errors import DomainError, ErrorCode


@strawberry.input
class RespondToApprovalInput:
    request_id: strawberry.ID
    decision: Decision
    client_mutation_id: str | None = None


@strawberry.input
class QuestionAnswer:
    question_id: str
    answers: list[str]


@strawberry.input
class RespondToUserInputInput:
    request_id: strawberry.ID
    answers: list[QuestionAnswer]
    client_mutation_id: str | None = None


@strawberry.type
class RuntimeRequestPayload:
    request: RuntimeRequest | None
    user_errors: list[UserError]
    client_mutation_id: str | None


REQUEST = returning(RuntimeRequestPayload, "request", RuntimeRequest)


def _request_id(value: str) -> uuid.UUID:
    return gid.decode_as(value, "RuntimeRequest", "requestId")


@strawberry.type
class RequestMutation:
    @mutation(REQUEST, description="Answer an approval. NOT_RESUMABLE when the provider's callback is gone.")
    async def respond_to_approval(ctx: Context, input: RespondToApprovalInput) -> uuid.UUID:
        request = _request_id(input.request_id)
        return await ctx.services.requests.respond_to_approval(
            ctx.principal, request, Decision(input.decision), key(input.client_mutation_id)
        )

    @mutation(REQUEST, description="Answer a question: every question once, options as offered.")
    async def respond_to_user_input(ctx: Context, input: RespondToUserInputInput) -> uuid.UUID:
        request = _request_id(input.request_id)
        answers: dict[str, list[str]] = {}
        for item in input.answers:
            if item.question_id in answers:
                raise DomainError(ErrorCode.INVALID_INPUT, f"question {item.question_id!r} answered twice", "answers")
            answers[item.question_id] = list(item.answers)
        return await ctx.services.requests.respond_to_user_input(
            ctx.principal, request, answers, key(input.client_mutation_id)
        )

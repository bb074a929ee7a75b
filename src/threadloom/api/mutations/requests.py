"""Approvals and questions: respondToApproval, respondToUserInput."""

from __future__ import annotations

import uuid

import strawberry

from threadloom.api import ids as gid
from threadloom.api.context import Context
from threadloom.api.enums import Decision, member
from threadloom.api.errors import UserError
from threadloom.api.mutations.payloads import KeyedInput, mutation, returning
from threadloom.api.types import RuntimeRequest
from threadloom.domain.errors import DomainError, ErrorCode


@strawberry.input
class RespondToApprovalInput(KeyedInput):
    request_id: strawberry.ID
    decision: Decision


@strawberry.input
class QuestionAnswer:
    question_id: str
    answers: list[str]


@strawberry.input
class RespondToUserInputInput(KeyedInput):
    request_id: strawberry.ID
    answers: list[QuestionAnswer]


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
    @mutation(REQUEST)
    async def respond_to_approval(ctx: Context, input: RespondToApprovalInput) -> uuid.UUID:
        """Answer an approval. NOT_RESUMABLE when the provider's callback is gone."""
        request = _request_id(input.request_id)
        return await ctx.services.requests.respond_to_approval(
            ctx.principal, request, member(Decision, input.decision), input.key()
        )

    @mutation(REQUEST)
    async def respond_to_user_input(ctx: Context, input: RespondToUserInputInput) -> uuid.UUID:
        """Answer a question: every question once, options as offered."""
        request = _request_id(input.request_id)
        answers: dict[str, list[str]] = {}
        for item in input.answers:
            if item.question_id in answers:
                raise DomainError(ErrorCode.INVALID_INPUT, f"question {item.question_id!r} answered twice", "answers")
            answers[item.question_id] = list(item.answers)
        return await ctx.services.requests.respond_to_user_input(ctx.principal, request, answers, input.key())

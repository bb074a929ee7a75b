"""Runtime requests: approvals and questions (docs/lifecycles/approvals-and-questions.md).

A provider's request becomes an app-owned RuntimeRequest (the provider's id is a ref), a
node under the node that asked, and — for questions — a question artifact; the run waits.
A response is validated here, recorded, and sent to the provider by an effect. When the
provider's callback is gone (turn ended, agent died, server restarted) a pending request
expires as `not_resumable`, and responding to it is refused with NOT_RESUMABLE.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime
from enum import StrEnum
from typing import Any

from threadloom.domain.activities import ActivityKind, run_activity
from threadloom.domain.changes import Change, NewId, Outcome
from threadloom.domain.effects import RespondToRequest
from threadloom.domain.entities import AppThread, ExecutionNode, PlanArtifact, Run, RuntimeRequest
from threadloom.domain.errors import DomainError, ErrorCode
from threadloom.domain.items import Turn
from threadloom.domain.nodes import open_node
from threadloom.domain.statuses import (
    NodeKind,
    NodeStatus,
    PlanKind,
    PlanStatus,
    ResponseCapability,
    RunStatus,
    RuntimeRequestKind,
    RuntimeRequestStatus,
)


class Decision(StrEnum):
    ACCEPT = "accept"
    ACCEPT_FOR_SESSION = "accept_for_session"
    DECLINE = "decline"
    CANCEL = "cancel"


_NATIVE_DECISION = {
    Decision.ACCEPT: "accept",
    Decision.ACCEPT_FOR_SESSION: "acceptForSession",
    Decision.DECLINE: "decline",
    Decision.CANCEL: "cancel",
}
_KINDS = {
    "command_approval": RuntimeRequestKind.COMMAND_APPROVAL,
    "file_change_approval": RuntimeRequestKind.FILE_CHANGE_APPROVAL,
    "permission": RuntimeRequestKind.PERMISSION,
    "user_input": RuntimeRequestKind.USER_INPUT,
}


def open_request(
    turn: Turn,
    run: Run,
    parent_node_id: uuid.UUID,
    kind: str,
    native_ref: str,
    payload: dict[str, Any],
    now: datetime,
    new_id: NewId,
) -> tuple[Outcome, RuntimeRequest]:
    """A provider's request in `turn`: the request, its node under `parent_node_id` (the turn's root or a
    subagent's turn) and, for questions, the question artifact; a running run now waits."""
    request_kind = _KINDS.get(kind, RuntimeRequestKind.PERMISSION)
    is_question = request_kind == RuntimeRequestKind.USER_INPUT
    request_id, node_id = new_id(), new_id()
    request = RuntimeRequest(
        id=request_id,
        thread_id=turn.thread_id,
        run_id=turn.run_id,
        node_id=node_id,
        native_request_ref=native_ref,
        kind=request_kind,
        status=RuntimeRequestStatus.PENDING,
        response_capability=ResponseCapability.LIVE,
        payload=payload,
        created_at=now,
    )
    title = payload.get("command") or (
        "; ".join(str(q.get("question")) for q in payload.get("questions") or []) if is_question else kind
    )
    summary = str(title)[:200]
    node_kind = NodeKind.USER_INPUT_REQUEST if is_question else NodeKind.APPROVAL_REQUEST
    node = open_node(
        turn, parent_node_id, node_id, node_kind, NodeStatus.WAITING, now, runtime_request_id=request_id, title=summary
    )
    changes = [Change.created(node), Change.created(request, node_id=node_id)]
    if is_question:
        changes.append(
            Change.created(
                PlanArtifact(
                    id=new_id(),
                    thread_id=turn.thread_id,
                    run_id=run.id,
                    node_id=node_id,
                    kind=PlanKind.QUESTIONS,
                    items=list(payload.get("questions") or []),
                    status=PlanStatus.ACTIVE,
                    created_at=now,
                    updated_at=now,
                ),
                node_id=node_id,
            )
        )
    if run.status == RunStatus.RUNNING:
        changes.append(Change.updated(run.evolve(status=RunStatus.WAITING)))
    kind_name = ActivityKind.QUESTION_ASKED if is_question else ActivityKind.APPROVAL_REQUESTED
    changes.append(
        run_activity(
            run,
            kind_name,
            summary,
            now,
            new_id,
            node_id=node_id,
            payload={"requestId": str(request_id), "kind": request_kind.value},
        )
    )
    return Outcome(changes), request


def require_open(request: RuntimeRequest) -> None:
    gone = request.response_capability == ResponseCapability.NOT_RESUMABLE
    if gone or request.status == RuntimeRequestStatus.EXPIRED:
        raise DomainError(
            ErrorCode.NOT_RESUMABLE,
            f"the provider can no longer take this answer: {request.not_resumable_reason or 'its callback is gone'}",
            "requestId",
        )
    if request.status != RuntimeRequestStatus.PENDING:
        raise DomainError(ErrorCode.REQUEST_NOT_PENDING, f"the request is already {request.status}", "requestId")


def validate_answers(questions: Sequence[dict[str, Any]], answers: dict[str, list[str]]) -> None:
    known = {str(q.get("id")): q for q in questions}
    for question_id in answers:
        if question_id not in known:
            raise DomainError(ErrorCode.INVALID_INPUT, f"no question {question_id!r}", "answers")
    for question_id, question in known.items():
        given = answers.get(question_id)
        if not given:
            raise DomainError(ErrorCode.INVALID_INPUT, f"question {question_id!r} needs an answer", "answers")
        offered = {str(o.get("label")) for o in question.get("options") or []}
        if offered and not question.get("isOther"):
            unknown = [a for a in given if a not in offered]
            if unknown:
                raise DomainError(
                    ErrorCode.INVALID_INPUT,
                    f"{unknown[0]!r} is not an option of question {question_id!r}: {sorted(offered)}",
                    "answers",
                )


def respond(
    thread: AppThread,
    run: Run,
    request: RuntimeRequest,
    node: ExecutionNode,
    other_pending: int,
    response: dict[str, Any],
    native_response: dict[str, Any],
    accepted: bool,
    now: datetime,
    new_id: NewId,
) -> Outcome:
    """Record the answer, close the node, let the run go on, and send the answer after commit."""
    resolved = request.evolve(status=RuntimeRequestStatus.RESOLVED, response=response, resolved_at=now)
    changes = [
        Change.updated(resolved, node_id=node.id),
        Change.updated(
            node.evolve(
                status=NodeStatus.COMPLETED if accepted else NodeStatus.CANCELLED, updated_at=now, completed_at=now
            ),
        ),
    ]
    if run.status == RunStatus.WAITING and other_pending == 0:
        changes.append(Change.updated(run.evolve(status=RunStatus.RUNNING)))
    kind = (
        ActivityKind.QUESTION_ANSWERED
        if request.kind == RuntimeRequestKind.USER_INPUT
        else ActivityKind.APPROVAL_RESOLVED
    )
    changes.append(
        run_activity(
            run,
            kind,
            resolution_summary(request, response),
            now,
            new_id,
            node_id=node.id,
            payload={"requestId": str(request.id), "response": response},
        )
    )
    effect = RespondToRequest(
        request_id=request.id,
        run_id=run.id,
        attempt_id=node.attempt_id,
        native_ref=request.native_request_ref,
        response=native_response,
    ).envelope()
    return Outcome(changes, [effect], result={"requestId": str(request.id)})


_DECISION_WORDS = {
    Decision.ACCEPT.value: "Approved",
    Decision.ACCEPT_FOR_SESSION.value: "Approved for the session",
    Decision.DECLINE.value: "Declined",
    Decision.CANCEL.value: "Cancelled",
}


def resolution_summary(request: RuntimeRequest, response: dict[str, Any]) -> str:
    """The activity line a person reads: "Approved: npm test", "Answered: Which database? → sqlite".

    The recorded response stays structured in the activity's payload; the summary is words, never a dict's repr.
    """
    payload = request.payload or {}
    if "answers" in response:
        questions = _questions(payload)
        asked = {str(q.get("id")): str(q.get("question") or q.get("header") or q.get("id")) for q in questions}
        answers = response.get("answers") or {}
        parts = [f"{asked.get(str(qid), qid)} → {', '.join(map(str, given))}" for qid, given in answers.items()]
        return "Answered: " + ("; ".join(parts) if parts else "no answer")
    decision = str(response.get("decision", ""))
    words = _DECISION_WORDS.get(decision, decision.replace("_", " ").capitalize() or "Resolved")
    subject = payload.get("command") or payload.get("path") or payload.get("reason")
    return f"{words}: {subject}" if subject else f"{words} ({str(request.kind).replace('_', ' ').lower()})"


def _questions(payload: dict[str, Any]) -> list[dict[str, Any]]:
    questions = payload.get("questions")
    return [q for q in questions if isinstance(q, dict)] if isinstance(questions, list) else []


def approval(decision: Decision) -> tuple[dict[str, Any], dict[str, Any], bool]:
    """(recorded response, what the provider gets, accepted?)"""
    return (
        {"decision": decision.value},
        {"decision": _NATIVE_DECISION[decision]},
        decision in (Decision.ACCEPT, Decision.ACCEPT_FOR_SESSION),
    )


def answered(answers: dict[str, list[str]]) -> tuple[dict[str, Any], dict[str, Any], bool]:
    native = {"answers": {qid: {"answers": list(values)} for qid, values in answers.items()}}
    return {"answers": answers}, native, True


def same_response(request: RuntimeRequest, response: dict[str, Any]) -> bool:
    """A repeat of the answer already given: answered the same, sent once."""
    return request.status == RuntimeRequestStatus.RESOLVED and request.response == response


def expire(request: RuntimeRequest, node: ExecutionNode | None, reason: str, now: datetime) -> list[Change]:
    changes = [
        Change.updated(
            request.evolve(
                status=RuntimeRequestStatus.EXPIRED,
                response_capability=ResponseCapability.NOT_RESUMABLE,
                not_resumable_reason=reason,
                resolved_at=now,
            ),
            node_id=request.node_id,
        )
    ]
    if node is not None and node.status in (NodeStatus.WAITING, NodeStatus.RUNNING, NodeStatus.PENDING):
        changes.append(Change.updated(node.evolve(status=NodeStatus.CANCELLED, updated_at=now, completed_at=now)))
    return changes

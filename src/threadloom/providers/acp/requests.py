"""The agent's own requests: `session/request_permission` → approvals, `elicitation/create` → questions.

Each becomes a `RequestOpened` whose ref is the request's JSON id, so several can wait at once; the
engine's answer is shaped back into what ACP wants: a permission's chosen option (`allow_once`,
`allow_always`, `reject_once`, `reject_always`, or the `cancelled` outcome), an elicitation's `accept`
with the form's content, typed as its schema says.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from threadloom.providers.contract import ProviderError

PERMISSION = "session/request_permission"
ELICITATION = "elicitation/create"

# Engine decision → the option kinds that carry it, best first.
DECISION_KINDS = {
    "accept": ("allow_once", "allow_always"),
    "acceptForSession": ("allow_always", "allow_once"),
    "decline": ("reject_once", "reject_always"),
}


@dataclasses.dataclass(frozen=True, slots=True)
class Pending:
    request_id: Any
    method: str
    session_id: str
    params: dict[str, Any]


def permission_payload(params: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """(request kind, payload) of a permission request: a command, a file change or another permission."""
    tool: Mapping[str, Any] = params.get("toolCall") or {}
    given = tool.get("rawInput")
    raw: Mapping[str, Any] = given if isinstance(given, Mapping) else {}
    acp_kind = str(tool.get("kind") or "other")
    payload: dict[str, Any] = {
        "title": str(tool.get("title") or acp_kind),
        "toolCallId": tool.get("toolCallId"),
        "options": [
            {"optionId": o.get("optionId"), "name": o.get("name"), "kind": o.get("kind")}
            for o in params.get("options") or []
            if isinstance(o, Mapping)
        ],
    }
    paths = [str(loc.get("path")) for loc in tool.get("locations") or [] if isinstance(loc, Mapping)]
    if acp_kind == "execute":
        payload["command"] = str(raw.get("command") or tool.get("title") or "")
        return "command_approval", payload
    if acp_kind in ("edit", "delete", "move"):
        payload["paths"] = paths
        payload["path"] = paths[0] if paths else payload["title"]
        return "file_change_approval", payload
    payload["reason"] = payload["title"]
    return "permission", payload


def permission_answer(params: Mapping[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    decision = str(response.get("decision", "decline"))
    if decision == "cancel":
        return {"outcome": {"outcome": "cancelled"}}
    if decision not in DECISION_KINDS:
        raise ProviderError("bad_response", f"unknown decision {decision!r}")
    options = [o for o in params.get("options") or [] if isinstance(o, Mapping)]
    for kind in DECISION_KINDS[decision]:
        for option in options:
            if option.get("kind") == kind:
                return {"outcome": {"outcome": "selected", "optionId": option.get("optionId")}}
    return {"outcome": {"outcome": "cancelled"}}  # nothing offered says it: the safe answer


def elicitation_questions(params: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """A form elicitation's fields as questions (None: not a form this client can ask)."""
    if params.get("mode", "form") != "form":
        return None
    schema = params.get("requestedSchema") or {}
    props = schema.get("properties") if isinstance(schema, Mapping) else None
    if not isinstance(props, Mapping) or not props:
        return None
    message = str(params.get("message") or "")
    questions = []
    for name, raw in props.items():
        prop: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
        labels = _labels(prop)
        question: dict[str, Any] = {
            "id": str(name),
            "header": str(prop.get("title") or name),
            "question": str(prop.get("description") or message or name),
            "options": [{"label": label, "description": ""} for label in labels],
        }
        if not labels:
            question["isOther"] = True
        questions.append(question)
    return questions


def _labels(prop: Mapping[str, Any]) -> list[str]:
    if prop.get("type") == "boolean":
        return ["true", "false"]
    items: Mapping[str, Any] = prop["items"] if isinstance(prop.get("items"), Mapping) else prop
    for key in ("enum",):
        if isinstance(items.get(key), list):
            return [str(v) for v in items[key]]
    for key in ("oneOf", "anyOf"):
        if isinstance(items.get(key), list):
            return [str(v.get("const")) for v in items[key] if isinstance(v, Mapping) and "const" in v]
    return []


def elicitation_answer(params: Mapping[str, Any], response: Mapping[str, Any]) -> dict[str, Any]:
    """The engine's answers (`{question: {answers: [...]}}` or `{question: [...]}`) → an `accept`."""
    answers = response.get("answers") or {}
    if not answers:
        return {"action": "decline"}
    props = ((params.get("requestedSchema") or {}).get("properties")) or {}
    content: dict[str, Any] = {}
    for name, given in answers.items():
        values = given.get("answers") if isinstance(given, Mapping) else given
        values = [str(v) for v in values] if isinstance(values, list) else [str(values)]
        prop = props.get(name)
        content[str(name)] = _typed(prop if isinstance(prop, Mapping) else {}, values)
    return {"action": "accept", "content": content}


def _typed(prop: Mapping[str, Any], values: list[str]) -> Any:
    kind = prop.get("type")
    if kind == "array":
        return values
    first = values[0] if values else ""
    if kind == "boolean":
        return first.lower() in ("true", "yes", "1")
    if kind in ("number", "integer"):
        try:
            return int(first) if kind == "integer" else float(first)
        except ValueError:
            return first
    return first

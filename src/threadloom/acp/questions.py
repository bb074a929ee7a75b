"""A run's questions (`USER_INPUT` runtime requests) as an ACP form elicitation, and the form's answer back.

Pure. Each question is one field of the form, named by its id: a choice among its options (several for a
multi-select question), or free text when the question takes any answer. The form's content becomes the
`respondToUserInput` answers, one list per question.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any


def form(questions: Sequence[Mapping[str, Any]]) -> tuple[str, dict[str, Any]]:
    """The elicitation's message and its requested schema (one required field per question)."""
    properties: dict[str, Any] = {}
    for question in questions:
        text = str(question.get("question") or question.get("header") or question.get("id"))
        labels = [str(o.get("label")) for o in question.get("options") or []]
        field: dict[str, Any] = {"title": str(question.get("header") or text), "description": text}
        if labels and question.get("multiSelect"):
            choices = [{"const": label, "title": label} for label in labels]
            field.update(type="array", items={"anyOf": choices}, minItems=1)
        elif labels and not question.get("isOther"):
            field.update(type="string", oneOf=[_choice(o) for o in question.get("options") or []])
        else:
            field["type"] = "string"
            if labels:  # options offered, any other answer taken too
                field["description"] = f"{text} (for example: {', '.join(labels)})"
        properties[str(question.get("id"))] = field
    if len(questions) == 1:
        message = str(next(iter(properties.values()))["description"])
    else:
        message = f"The agent asks {len(questions)} questions"
    return message, {"type": "object", "properties": properties, "required": list(properties)}


def answers(questions: Sequence[Mapping[str, Any]], content: Mapping[str, Any]) -> list[dict[str, Any]]:
    """`respondToUserInput`'s answers from an accepted form's content; ValueError when a question has none."""
    given: list[dict[str, Any]] = []
    for question in questions:
        question_id = str(question.get("id"))
        value = content.get(question_id)
        if isinstance(value, list):
            picked = [str(v) for v in value]
        elif value is None or value == "":
            picked = []
        else:
            picked = [value if isinstance(value, str) else str(value)]
        if not picked:
            raise ValueError(f"no answer to question {question_id!r}")
        given.append({"questionId": question_id, "answers": picked})
    return given


def _choice(option: Mapping[str, Any]) -> dict[str, Any]:
    choice = {"const": str(option.get("label")), "title": str(option.get("label"))}
    if option.get("description"):
        choice["description"] = str(option["description"])
    return choice

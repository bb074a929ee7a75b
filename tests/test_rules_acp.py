"""The ACP bridge's pure rules: what the editor is told for each thread event of a run, a session's settings as
config options, and questions as form elicitations."""

from __future__ import annotations

from typing import Any

import pytest

from threadloom.acp.questions import answers, form
from threadloom.acp.settings import UnknownSetting, config_options, model_value, modes_state, runtime_mode
from threadloom.acp.updates import Turn, history, prompt_text, stop_reason

RUN = "UnVuOjE"


def event(entity: dict[str, Any], run: str | None = RUN, sequence: int = 1) -> dict[str, Any]:
    return {"sequence": sequence, "type": "x.updated", "runId": run, "entity": entity}


def message(text: str, id: str = "m1", role: str = "ASSISTANT") -> dict[str, Any]:
    return event({"__typename": "ConversationMessage", "id": id, "role": role, "text": text})


def node(status: str, detail: dict[str, Any] | None = None, kind: str = "TOOL_CALL") -> dict[str, Any]:
    entity = {"__typename": "ExecutionNode", "id": "n1", "nodeKind": kind, "nodeStatus": status, "title": "ls"}
    return event({**entity, "detail": detail})


def chunks(turn: Turn, *events: dict[str, Any]) -> list[str]:
    return [u["content"]["text"] for e in events for u in turn.updates(e)]


def test_a_growing_message_is_sent_as_its_new_parts_once() -> None:
    turn = Turn(RUN)
    assert chunks(turn, message(""), message("hel"), message("hello"), message("hello"), message("hel")) == [
        "hel",
        "lo",
    ]
    # Another message's text is its own; a user message or another run's is not the run's answer.
    elsewhere = event(message("x")["entity"], run="another run")
    assert chunks(turn, message("two", id="m2"), message("me", role="USER"), elsewhere) == ["two"]


def test_a_rewritten_message_is_not_unsaid() -> None:
    turn = Turn(RUN)
    assert chunks(turn, message("draft"), message("final text")) == ["draft"]


def test_a_tool_call_starts_once_and_ends_with_its_output() -> None:
    turn = Turn(RUN)
    started = turn.updates(node("RUNNING", {"command": "ls", "cwd": "/w"}))
    assert started == [
        {
            "sessionUpdate": "tool_call",
            "toolCallId": "n1",
            "title": "ls",
            "kind": "execute",
            "status": "in_progress",
            "rawInput": {"command": "ls", "cwd": "/w"},
        }
    ]
    assert turn.updates(node("RUNNING", {"command": "ls", "output": "a"})) == []  # output while it runs
    ended = turn.updates(node("FAILED", {"command": "ls", "output": "a\nb", "exitCode": 2}))
    assert ended == [
        {
            "sessionUpdate": "tool_call_update",
            "toolCallId": "n1",
            "status": "failed",
            "content": [{"type": "content", "content": {"type": "text", "text": "a\nb"}}],
            "rawOutput": {"exitCode": 2},
        }
    ]
    assert turn.updates(node("FAILED", {"command": "ls", "output": "a\nb", "exitCode": 2})) == []


def test_file_changes_and_subagents_have_their_tool_kinds() -> None:
    assert Turn(RUN).updates(node("RUNNING", {"changes": [{"path": "a"}]}))[0]["kind"] == "edit"
    assert Turn(RUN).updates(node("RUNNING", None, kind="SUBAGENT"))[0]["kind"] == "other"


def test_an_approval_is_asked_once_and_only_while_pending() -> None:
    turn = Turn(RUN)
    request = {
        "__typename": "RuntimeRequest",
        "id": "r1",
        "requestKind": "COMMAND_APPROVAL",
        "requestStatus": "PENDING",
        "payload": {"command": "rm -rf build"},
        "node": {"id": "n9"},
    }
    ask = turn.permission(event(request))
    assert ask is not None and ask.request_id == "r1"
    assert ask.tool_call == {
        "toolCallId": "n9",
        "title": "rm -rf build",
        "kind": "execute",
        "status": "pending",
        "rawInput": {"command": "rm -rf build"},
    }
    assert turn.permission(event(request)) is None  # a replayed event does not ask twice
    assert Turn(RUN).permission(event({**request, "requestStatus": "RESOLVED"})) is None
    assert Turn(RUN).permission(event({**request, "requestKind": "USER_INPUT"})) is None


def test_the_run_end_sets_the_status_and_stop_reason() -> None:
    turn = Turn(RUN)
    turn.updates(event({"__typename": "Run", "id": "other", "runStatus": "COMPLETED"}))
    assert turn.status is None
    turn.updates(event({"__typename": "Run", "id": RUN, "runStatus": "RUNNING"}))
    assert turn.status is None
    turn.updates(event({"__typename": "Run", "id": RUN, "runStatus": "FAILED", "statusReason": "agent crashed"}))
    assert (turn.status, turn.reason) == ("FAILED", "agent crashed")
    assert stop_reason("COMPLETED", False) == "end_turn"
    assert stop_reason("INTERRUPTED", False) == stop_reason("CANCELLED", False) == "cancelled"
    assert stop_reason("COMPLETED", True) == "cancelled"  # after session/cancel, whatever the run did
    assert stop_reason("FAILED", False) is None


def test_a_todo_list_is_the_plan() -> None:
    todo = {"__typename": "PlanArtifact", "id": "p", "planKind": "TODO_LIST"}
    items = [{"step": "a", "status": "completed"}, {"step": "b", "status": "inProgress"}, {"step": "c"}]
    assert Turn(RUN).updates(event({**todo, "items": items})) == [
        {
            "sessionUpdate": "plan",
            "entries": [
                {"content": "a", "priority": "medium", "status": "completed"},
                {"content": "b", "priority": "medium", "status": "in_progress"},
                {"content": "c", "priority": "medium", "status": "pending"},
            ],
        }
    ]


def test_prompt_text_and_history() -> None:
    blocks = [
        {"type": "text", "text": "look at"},
        {"type": "resource_link", "uri": "file:///w/a.py", "name": "a.py"},
        {"type": "resource", "resource": {"uri": "file:///w/b.py", "text": "x = 1"}},
    ]
    assert prompt_text(blocks) == "look at\nfile:///w/a.py\nfile:///w/b.py\n```\nx = 1\n```"
    with pytest.raises(ValueError, match="not 'image'"):
        prompt_text([{"type": "image", "data": "", "mimeType": "image/png"}])
    with pytest.raises(ValueError, match="empty"):
        prompt_text([{"type": "text", "text": "  "}])
    messages = [{"role": "USER", "text": "q"}, {"role": "SYSTEM", "text": "s"}, {"role": "ASSISTANT", "text": "a"}]
    assert [u["sessionUpdate"] for u in history(messages)] == ["user_message_chunk", "agent_message_chunk"]


def test_another_runs_approval_is_not_asked() -> None:
    request = {"__typename": "RuntimeRequest", "id": "r1", "requestKind": "COMMAND_APPROVAL"}
    request["requestStatus"] = "PENDING"
    assert Turn(RUN).permission(event(request, run="another run")) is None


def test_settings_show_the_threads_mode_and_model_as_config_options() -> None:
    shown = config_options("APPROVAL_REQUIRED", None, ["model-a"])
    assert [(o["id"], o["category"], o["currentValue"]) for o in shown] == [
        ("mode", "mode", "approval_required"),
        ("model", "model", "default"),
    ]
    assert [o["value"] for o in shown[0]["options"]] == [
        "workspace_write",
        "approval_required",
        "read_only",
        "full_access",
    ]
    assert [o["value"] for o in shown[1]["options"]] == ["default", "model-a"]
    # A model set elsewhere is offered too, so the current value is always one of the options.
    assert [o["value"] for o in config_options("READ_ONLY", "model-z", ["model-a"])[1]["options"]] == [
        "default",
        "model-a",
        "model-z",
    ]
    assert modes_state("READ_ONLY")["currentModeId"] == "read_only"
    assert runtime_mode("full_access") == "FULL_ACCESS" and model_value("default") is None
    assert model_value(" gpt-x ") == "gpt-x"
    with pytest.raises(UnknownSetting):
        runtime_mode("WORKSPACE_WRITE")  # the option's values, not the enum's names
    with pytest.raises(UnknownSetting):
        model_value("  ")


def test_questions_become_one_form_field_each_and_its_content_the_answers() -> None:
    asked = [
        {"id": "q1", "question": "Which colour?", "options": [{"label": "red"}, {"label": "blue", "description": "b"}]},
        {"id": "q2", "question": "Which files?", "multiSelect": True, "options": [{"label": "a"}, {"label": "b"}]},
        {"id": "q3", "question": "Why?", "options": [], "isOther": True},
        {"id": "q4", "question": "Name?", "options": [{"label": "x"}], "isOther": True},
    ]
    message, schema = form(asked)
    assert message == "The agent asks 4 questions" and schema["required"] == ["q1", "q2", "q3", "q4"]
    fields = schema["properties"]
    assert fields["q1"]["oneOf"] == [
        {"const": "red", "title": "red"},
        {"const": "blue", "title": "blue", "description": "b"},
    ]
    assert fields["q2"]["type"] == "array" and [c["const"] for c in fields["q2"]["items"]["anyOf"]] == ["a", "b"]
    assert fields["q3"] == {"title": "Why?", "description": "Why?", "type": "string"}
    assert fields["q4"]["type"] == "string" and "x" in fields["q4"]["description"]  # any answer, x suggested
    content = {"q1": "blue", "q2": ["a", "b"], "q3": "because", "q4": "y"}
    assert answers(asked, content) == [
        {"questionId": "q1", "answers": ["blue"]},
        {"questionId": "q2", "answers": ["a", "b"]},
        {"questionId": "q3", "answers": ["because"]},
        {"questionId": "q4", "answers": ["y"]},
    ]
    with pytest.raises(ValueError, match="q3"):
        answers(asked, {**content, "q3": ""})
    assert form(asked[:1])[0] == "Which colour?"


def test_a_question_is_asked_once_and_withdrawn_when_settled_elsewhere() -> None:
    turn = Turn(RUN)
    request = {
        "__typename": "RuntimeRequest",
        "id": "r2",
        "requestKind": "USER_INPUT",
        "requestStatus": "PENDING",
        "payload": {"questions": [{"id": "q1", "question": "?"}]},
    }
    assert turn.permission(event(request)) is None  # a question is no approval
    ask = turn.question(event(request))
    assert ask is not None and ask.questions == [{"id": "q1", "question": "?"}]
    assert turn.question(event(request)) is None
    assert turn.settled(event({**request, "requestStatus": "RESOLVED"})) == "r2"
    assert Turn(RUN).settled(event({**request, "requestStatus": "RESOLVED"})) is None  # never asked here

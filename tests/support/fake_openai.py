"""The OpenAI Responses API side of the fake model (`POST /v1/responses`, SSE), for Codex.

Codex resends the whole conversation on every request. The reply is decided by
`Script.of(last user text, tool output)`: the tool output when the last input item is a
tool result, else the text of the last user message (its last `input_text`; Codex also
puts environment context and instructions into user-role items, which come earlier).
Faults (`FAIL:`, `CUT`, see `fake_model`) apply to a turn's first request: `turn_text`.
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from tests.support.fake_model import CUT_SHOWN, Script, StreamCut, chunks, held_after, sse

if TYPE_CHECKING:
    from tests.support.fake_model import FakeModel, Fault

_ids = itertools.count(1)
TOOL_OUTPUTS = ("function_call_output", "custom_tool_call_output")


def _text_of(item: dict[str, Any]) -> str | None:
    """The last input_text of a user message item, or None."""
    if item.get("type", "message") != "message" or item.get("role") != "user":
        return None
    content = item.get("content")
    if isinstance(content, str):
        return content
    texts = [str(c.get("text", "")) for c in content or [] if c.get("type") == "input_text"]
    return texts[-1] if texts else None


def last_user_text(body: dict[str, Any]) -> str:
    """The real user text: the last user message that is not injected context."""
    for item in reversed(body.get("input") or []):
        text = _text_of(item)
        if text is None or text.lstrip().startswith("<"):
            continue  # <environment_context>, <user_instructions>, AGENTS.md ... are not the user speaking
        return text
    return ""


def tool_output(body: dict[str, Any]) -> str | None:
    """The output of the tool call that the last input item answers, if it is one."""
    items = body.get("input") or []
    if not items or items[-1].get("type") not in TOOL_OUTPUTS:
        return None
    output = items[-1].get("output")
    if isinstance(output, dict):  # {"content": ..., "success": ...} in some versions
        output = output.get("content")
    if isinstance(output, list):
        output = "".join(str(part.get("text", "")) for part in output if isinstance(part, dict))
    return str(output)


def turn_text(body: dict[str, Any]) -> str | None:
    """The user's message when `body` is the first request of a turn (no tool result to answer), else None."""
    return last_user_text(body) if tool_output(body) is None else None


# What the Responses API answers for each error status: (type, code, message).
ERRORS = {
    401: ("invalid_request_error", "invalid_api_key", "Incorrect API key provided: sk-fa***"),
    429: ("requests", "rate_limit_exceeded", "Rate limit reached for requests. Please try again in 1s."),
    500: ("server_error", "server_error", "The server had an error while processing your request."),
    503: ("server_error", "service_unavailable", "The engine is currently overloaded, please try again later."),
}


def error_body(status: int) -> dict[str, Any]:
    kind, code, message = ERRORS.get(status, ("server_error", None, f"fake error {status}"))
    return {"error": {"message": message, "type": kind, "param": None, "code": code}}


# Every response's `usage`, in the Responses API's shape: input counts the cached tokens, output the reasoning ones.
USAGE = {
    "input_tokens": 120,
    "input_tokens_details": {"cached_tokens": 80},
    "output_tokens": 30,
    "output_tokens_details": {"reasoning_tokens": 12},
    "total_tokens": 150,
}


def _event(kind: str, **data: Any) -> bytes:
    return sse(kind, {"type": kind, **data})


def _message(item_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": item_id,
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _patch(path: str, text: str) -> str:
    return f"*** Begin Patch\n*** Add File: {path}\n+{text}\n*** End Patch\n"


async def stream(fake: FakeModel, body: dict[str, Any], fault: Fault | None = None) -> AsyncIterator[bytes]:
    """One scripted response as the SSE events Codex parses."""
    n = next(_ids)
    response_id = f"resp_{n}"
    script = Script.of(last_user_text(body), tool_output(body))
    yield _event("response.created", response={"id": response_id, "status": "in_progress", "output": []})
    if fault is not None and fault.kind == "cut":
        item_id = f"msg_{n}"
        added = {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}
        yield _event("response.output_item.added", output_index=0, item=added)
        for piece in chunks(f"cut: {last_user_text(body)} ".ljust(CUT_SHOWN + 8, "~")[:CUT_SHOWN]):
            yield _event("response.output_text.delta", item_id=item_id, output_index=0, content_index=0, delta=piece)
        if fault.hold:
            await fake.held()
        raise StreamCut(response_id)
    output: list[dict[str, Any]] = []
    if script.action == "run":
        item = {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": "exec_command",
            "arguments": orjson.dumps({"cmd": script.arg}).decode(),
            "status": "completed",
        }
        output.append(item)
    elif script.action == "write":
        item = {
            "type": "custom_tool_call",
            "id": f"ctc_{n}",
            "call_id": f"call_{n}",
            "name": "apply_patch",
            "input": _patch(script.arg, script.text),
            "status": "completed",
        }
        output.append(item)
    elif script.action == "ask":
        question = {
            "id": "q1",
            "header": "Question",
            "question": script.arg,
            "options": [
                {"label": "Yes", "description": "Go ahead"},
                {"label": "No", "description": "Do not"},
            ],
        }
        item = {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": "request_user_input",
            "arguments": orjson.dumps({"questions": [question]}).decode(),
            "status": "completed",
        }
        output.append(item)
    else:
        text = script.text
        if script.action == "plan":
            text = f"<proposed_plan>\n{script.text}\n</proposed_plan>"
        elif script.action == "hold":
            text = f"holding: {script.text}"
        item_id = f"msg_{n}"
        added = {"type": "message", "id": item_id, "role": "assistant", "status": "in_progress", "content": []}
        yield _event("response.output_item.added", output_index=0, item=added)
        pieces = chunks(text)
        hold_at = held_after(pieces) if script.action == "hold" else -1
        for index, piece in enumerate(pieces):
            yield _event("response.output_text.delta", item_id=item_id, output_index=0, content_index=0, delta=piece)
            if index == hold_at:
                await fake.held()
        output.append(_message(item_id, text))
    for index, item in enumerate(output):
        if item["type"] != "message":
            yield _event("response.output_item.added", output_index=index, item=item)
        yield _event("response.output_item.done", output_index=index, item=item)
    usage = USAGE
    yield _event(
        "response.completed", response={"id": response_id, "status": "completed", "output": output, "usage": usage}
    )

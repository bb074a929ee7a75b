"""The OpenAI Responses API side of the fake model (`POST /v1/responses`, SSE), for Codex (and Qwen Code, which
speaks it too with `--auth-type openai-responses`: a `RUN:` becomes its `run_shell_command`, a `WRITE:` its
`write_file` when it offers no `apply_patch`).

Codex resends the whole conversation on every request. The reply is decided by
`Script.of(last user text, tool output)`: the tool output when the last input item is a
tool result, else the text of the last user message (its last `input_text`; Codex also
puts environment context and instructions into user-role items, which come earlier).
Faults (`FAIL:`, `CUT`, see `fake_model`) apply to the request of a turn that their `at=` names (the first by
default): `turn_request`.

Collab agents (`SPAWN:`, Codex with `[features] multi_agent_v2`): Codex 0.171 offers the tools in a `namespace`
tool named `collaboration`, and the model calls one as a `function_call` with `"namespace": "collaboration"`.
Agents talk through `agent_message` input items (`author`, `recipient`, content "Message Type: NEW_TASK |
MESSAGE | FINAL_ANSWER\nTask name: ...\nSender: ...\nPayload:\n<text>", the payload of a task as an
`encrypted_content` part). A spawned agent's conversation ends with its NEW_TASK, whose payload is scripted like a
user's message; the parent's ends with the FINAL_ANSWER once the agent finished (after `wait_agent`'s output).
"""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from tests.support.fake_model import CUT_SHOWN, PROBE_END, Script, StreamCut, chunks, held_after, sse

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


def agent_message(item: dict[str, Any]) -> tuple[str, str] | None:
    """(message type, payload) of an `agent_message` input item (one collab agent to another), else None."""
    if item.get("type") != "agent_message":
        return None
    parts = [str(c.get("text") or c.get("encrypted_content") or "") for c in item.get("content") or []]
    header, _, payload = "".join(parts).partition("Payload:\n")
    kind = header.partition("Message Type:")[2].strip().splitlines()
    return (kind[0].strip() if kind else "", payload.strip())


def _user_index(body: dict[str, Any]) -> int | None:
    """The index in `input` of the real user text: the last user message that is not injected context (for a
    spawned collab agent: the task its parent gave it)."""
    items = body.get("input") or []
    for index in range(len(items) - 1, -1, -1):
        message = agent_message(items[index])
        if message is not None and message[0] == "NEW_TASK":
            return index
        text = _text_of(items[index])
        if text is None or text.lstrip().startswith("<"):
            continue  # <environment_context>, <user_instructions>, AGENTS.md ... are not the user speaking
        return index
    return None


def last_user_text(body: dict[str, Any]) -> str:
    """The real user text (see `_user_index`)."""
    index = _user_index(body)
    if index is None:
        return ""
    item = (body.get("input") or [])[index]
    message = agent_message(item)
    return message[1] if message is not None else _text_of(item) or ""


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


def final_answer(body: dict[str, Any]) -> str | None:
    """The final answer of a collab agent when it is the last input item (it reached its parent), else None."""
    items = body.get("input") or []
    message = agent_message(items[-1]) if items else None
    return message[1] if message is not None and message[0] == "FINAL_ANSWER" else None


def turn_text(body: dict[str, Any]) -> str | None:
    """The user's message when `body` is the first request of a turn (no tool result to answer), else None."""
    return last_user_text(body) if tool_output(body) is None else None


def turn_request(body: dict[str, Any]) -> tuple[str, int] | None:
    """(the user's message that started the turn, this request's number in the turn): 1 for the request carrying
    the message, 1 + the tool results it carries since then for a later one; None without a user message."""
    index = _user_index(body)
    if index is None:
        return None
    later = (body.get("input") or [])[index + 1 :]
    return last_user_text(body), 1 + sum(1 for item in later if item.get("type") in TOOL_OUTPUTS)


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


def shell_call(body: dict[str, Any], command: str) -> tuple[str, dict[str, Any]]:
    """The shell tool call for `command` in the form the client offers: Codex's `exec_command` (`cmd`), or
    Qwen Code's `run_shell_command` (`command`) when the request's tools name that one."""
    names = {tool.get("name") for tool in body.get("tools") or [] if isinstance(tool, dict)}
    if "exec_command" not in names and "run_shell_command" in names:
        return "run_shell_command", {"command": command, "is_background": False}
    return "exec_command", {"cmd": command}


def _collab_call(n: int, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A call of one of Codex's collab tools: a function of the `collaboration` namespace."""
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"call_{n}",
        "namespace": "collaboration",
        "name": name,
        "arguments": orjson.dumps(arguments).decode(),
        "status": "completed",
    }


# How long the parent's wait_agent waits (ms; Codex takes 10 s to an hour): longer than any test's turn.
WAIT_AGENT_MS = 600_000


def _script(body: dict[str, Any]) -> Script:
    """What to do: the collab steps first (a child's answer, a spawn's result), then the keywords."""
    answer = final_answer(body)
    if answer is not None:
        return Script("reply", f"child said: {answer}")
    output = tool_output(body)
    if output is not None and '"task_name"' in output:  # spawn_agent's result: wait for the agent's answer
        return Script("wait_agent", output)
    return Script.of(last_user_text(body), output)


def _offers(body: dict[str, Any], tool: str) -> bool:
    return any(isinstance(t, dict) and t.get("name") == tool for t in body.get("tools") or [])


def _patch(path: str, text: str) -> str:
    return f"*** Begin Patch\n*** Add File: {path}\n+{text}\n*** End Patch\n"


async def stream(fake: FakeModel, body: dict[str, Any], fault: Fault | None = None) -> AsyncIterator[bytes]:
    """One scripted response as the SSE events Codex parses."""
    n = next(_ids)
    response_id = f"resp_{n}"
    script = _script(body)
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
        name, arguments = shell_call(body, script.arg)
        item = {
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": name,
            "arguments": orjson.dumps(arguments).decode(),
            "status": "completed",
        }
        output.append(item)
    elif script.action == "write" and _offers(body, "write_file") and not _offers(body, "apply_patch"):
        item = {  # Qwen Code's own file tool (absolute paths only)
            "type": "function_call",
            "id": f"fc_{n}",
            "call_id": f"call_{n}",
            "name": "write_file",
            "arguments": orjson.dumps({"file_path": script.arg, "content": script.text + "\n"}).decode(),
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
    elif script.action == "spawn":
        task = {"task_name": "helper", "message": script.arg, "fork_turns": "none"}
        output.append(_collab_call(n, "spawn_agent", task))
    elif script.action == "wait_agent":
        output.append(_collab_call(n, "wait_agent", {"timeout_ms": WAIT_AGENT_MS}))
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
        if script.action == "probe":
            text, pieces, hold_at = text + PROBE_END, [text, PROBE_END], 0
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

"""The Anthropic Messages side of the fake model (Claude Code talks to it).

`stream(fake, body)` answers a streaming `POST /v1/messages` as SSE, scripted by the
keywords of `fake_model.Script` in the last user message; `complete(body)` answers the
non-streaming side requests the CLI makes (titles, summaries, ...).

Claude-only keywords, besides those of `Script`:
- `AGENT: <prompt>`  an Agent (subagent) tool call; the subagent's own request echoes the prompt.
- `TODO: <a>; <b>`   a TaskCreate call per step (one per request), then a TaskUpdate marking the
                     first step completed, then a plain reply.

Only main-loop requests (those offering `tools`) follow the script: a side request
that quotes the user's text must never run a tool or block on HOLD, nor get a fault
(`FAIL:`, `CUT`, see `fake_model`; they apply to the request of a turn their `at=` names: `turn_request`).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import orjson

from tests.support.fake_model import CUT_SHOWN, PROBE_END, Script, StreamCut, chunks, sse

if TYPE_CHECKING:
    from tests.support.fake_model import FakeModel, Fault


def _blocks(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content or [] if isinstance(b, dict)]


def _tool_result_text(block: dict[str, Any]) -> str:
    content = block.get("content")
    if isinstance(content, str):
        return content
    return "".join(str(c.get("text", "")) for c in content or [] if isinstance(c, dict))


def user_text(message: dict[str, Any]) -> str:
    """The user's own words in a user message: the last text block that is not injected context."""
    texts = [
        str(b.get("text", ""))
        for b in _blocks(message)
        if b.get("type") == "text" and not str(b.get("text", "")).lstrip().startswith("<")
    ]
    return texts[-1] if texts else ""


def all_user_texts(body: dict[str, Any]) -> list[str]:
    """Every text block of every user message of a request (tests look for steer text here)."""
    return [
        str(b.get("text", ""))
        for m in body.get("messages") or []
        if m.get("role") == "user"
        for b in _blocks(m)
        if b.get("type") == "text"
    ]


def _todo_step(messages: list[dict[str, Any]]) -> Script | None:
    """The TODO script: the next task call, judged by the tool results since the user asked."""
    asked = [i for i, m in enumerate(messages) if user_text(m)]
    if not asked or not user_text(messages[asked[-1]]).startswith("TODO:"):
        return None
    steps = [s.strip() for s in user_text(messages[asked[-1]]).removeprefix("TODO:").split(";") if s.strip()]
    done = sum(1 for m in messages[asked[-1] :] for b in _blocks(m) if b.get("type") == "tool_result")
    if done < len(steps):
        return Script("task_create", steps[done])
    if done == len(steps):
        return Script("task_update", "1")
    return Script("reply", "todo done")


def script_of(body: dict[str, Any]) -> Script:
    messages = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    if not messages:
        return Script("reply", "echo: ")
    if (todo := _todo_step(messages)) is not None:
        return todo
    last = messages[-1]
    text = user_text(last)
    results = [b for b in _blocks(last) if b.get("type") == "tool_result"]
    if text.startswith("AGENT:") and not results:
        return Script("agent", text.removeprefix("AGENT:").strip())
    if results and not text:
        return Script.of("", _tool_result_text(results[-1]))
    if results:  # a steer folded in next to a tool result: answer the steer
        return Script.of(text, None)
    return Script.of(text, None)


def is_main_loop(body: dict[str, Any]) -> bool:
    return bool(body.get("tools"))


def turn_text(body: dict[str, Any]) -> str | None:
    """The user's message when `body` is a main-loop request starting a turn (its last user message is the
    user's words, not tool results), else None."""
    messages = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    if not is_main_loop(body) or not messages:
        return None
    if any(b.get("type") == "tool_result" for b in _blocks(messages[-1])):
        return None
    return user_text(messages[-1]) or None


def turn_request(body: dict[str, Any]) -> tuple[str, int] | None:
    """(the user's message that started the turn, this request's number in the turn) for a main-loop request:
    1 for the request carrying the message, 1 + the tool-result messages since then for a later one. The
    message may share its user message with tool results: after a turn that failed waiting for the model,
    Claude Code sends the next message together with the last tool's result (a steer folded in next to a
    tool result counts as a new message too)."""
    messages = [m for m in body.get("messages") or [] if m.get("role") == "user"]
    if not is_main_loop(body):
        return None
    for index in range(len(messages) - 1, -1, -1):
        if text := user_text(messages[index]):
            return text, len(messages) - index
    return None


# What the Messages API answers for each error status (its `error.type`).
ERRORS = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    529: "overloaded_error",
}


def error_body(status: int) -> dict[str, Any]:
    kind = ERRORS.get(status, "api_error")
    message = {401: "invalid x-api-key", 429: "Number of requests has exceeded your rate limit", 529: "Overloaded"}
    return {"type": "error", "error": {"type": kind, "message": message.get(status, f"fake error {status}")}}


def _tool_use(name: str, tool_input: dict[str, Any]) -> dict[str, Any]:
    return {"type": "tool_use", "id": f"toolu_{uuid.uuid4().hex[:20]}", "name": name, "input": tool_input}


def plan(body: dict[str, Any]) -> tuple[Script, list[dict[str, Any]]]:
    """The script and the content blocks to send (text blocks carry their full text)."""
    script = script_of(body) if is_main_loop(body) else Script("reply", "A fake title")
    if script.action == "run":
        return script, [_tool_use("Bash", {"command": script.arg, "description": "run a command"})]
    if script.action == "write":
        return script, [_tool_use("Write", {"file_path": script.arg, "content": script.text})]
    if script.action == "ask":
        question = {
            "question": script.arg,
            "header": "Question",
            "options": [
                {"label": "Yes", "description": "yes"},
                {"label": "No", "description": "no"},
            ],
            "multiSelect": False,
        }
        return script, [_tool_use("AskUserQuestion", {"questions": [question]})]
    if script.action == "hold":
        return script, [{"type": "text", "text": "holding on... released."}]
    if script.action == "probe":
        return script, [{"type": "text", "text": script.text + PROBE_END}]
    if script.action == "agent":
        agent = {"description": "a helper", "prompt": script.text, "subagent_type": "general-purpose"}
        return script, [{"type": "text", "text": "delegating"}, _tool_use("Agent", agent)]
    if script.action == "task_create":
        return script, [_tool_use("TaskCreate", {"subject": script.text, "description": script.text})]
    if script.action == "task_update":
        return script, [_tool_use("TaskUpdate", {"taskId": script.text, "status": "completed"})]
    return script, [{"type": "text", "text": script.text}]


# Every reply's `usage`, as the Messages API reports it: `input_tokens` leaves out the cache's reads and writes,
# and a stream's `message_start` carries the output so far (1) while `message_delta` carries the final count.
USAGE = {"input_tokens": 12, "cache_creation_input_tokens": 30, "cache_read_input_tokens": 200, "output_tokens": 7}


def _usage(final: bool = True) -> dict[str, int]:
    return {**USAGE, "output_tokens": USAGE["output_tokens"] if final else 1}


async def stream(fake: FakeModel, body: dict[str, Any], fault: Fault | None = None) -> AsyncIterator[bytes]:
    script, blocks = plan(body)
    if fault is not None and fault.kind == "cut":
        text = f"cut: {(turn_request(body) or ('', 0))[0]} ".ljust(CUT_SHOWN + 8, "~")[:CUT_SHOWN]
        script, blocks = Script("cut", text), [{"type": "text", "text": text}]
    message_id = f"msg_{uuid.uuid4().hex[:24]}"
    yield sse(
        "message_start",
        {
            "type": "message_start",
            "message": {
                "id": message_id,
                "type": "message",
                "role": "assistant",
                "model": body.get("model", "fake"),
                "content": [],
                "stop_reason": None,
                "stop_sequence": None,
                "usage": _usage(final=False),
            },
        },
    )
    stop_reason = "end_turn"
    for index, block in enumerate(blocks):
        if block["type"] == "text":
            yield sse(
                "content_block_start",
                {"type": "content_block_start", "index": index, "content_block": {"type": "text", "text": ""}},
            )
            parts = chunks(block["text"])
            if script.action == "hold":
                parts = ["holding on... ", "released."]
            if script.action == "probe":
                parts = [script.text, PROBE_END]
            for n, part in enumerate(parts):
                delta = {"type": "text_delta", "text": part}
                yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
                if script.action in ("hold", "probe") and n == 0:
                    await fake.held()
            if script.action == "cut":
                if fault is not None and fault.hold:
                    await fake.held()
                raise StreamCut(message_id)
        else:
            stop_reason = "tool_use"
            start = {**block, "input": {}}
            yield sse("content_block_start", {"type": "content_block_start", "index": index, "content_block": start})
            for part in chunks(orjson.dumps(block["input"]).decode(), 40):
                delta = {"type": "input_json_delta", "partial_json": part}
                yield sse("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})
        yield sse("content_block_stop", {"type": "content_block_stop", "index": index})
    yield sse(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": USAGE["output_tokens"]},
        },
    )
    yield sse("message_stop", {"type": "message_stop"})


def complete(body: dict[str, Any]) -> dict[str, Any]:
    """A non-streaming reply: plain text for side requests (never a tool call); a main-loop request (Claude Code
    asks again without streaming when a reply's stream broke off) gets its scripted reply, never held."""
    content = plan(body)[1] if is_main_loop(body) else [{"type": "text", "text": "A fake title"}]
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fake"),
        "content": content,
        "stop_reason": "tool_use" if any(b["type"] == "tool_use" for b in content) else "end_turn",
        "stop_sequence": None,
        "usage": _usage(),
    }

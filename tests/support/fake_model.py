"""A local fake model server for the real agent CLIs (the only replaced part in their tests).

It serves the OpenAI Responses API (`POST /v1/responses`, for Codex) and the Anthropic
Messages API (`POST /v1/messages`, for Claude Code) as SSE on 127.0.0.1:<free port>, in
its own thread and event loop so a test may block without stalling it. Replies are
scripted by keywords in the last user message (see `Script`); every request body is
recorded so tests can assert what the CLI sent (history after a resume, a steer, ...).

Keywords (one per message, first match wins):
- `RUN: <shell command>`  a shell tool call; after its result, a reply quoting the output.
- `WRITE: <path> <text>`  a file edit (Codex apply_patch / Claude Write).
- `ASK: <question>`       Codex: a request_user_input tool call (plan mode); Claude: AskUserQuestion.
- `PLAN: <text>`          Codex: a `<proposed_plan>` reply.
- `SPAWN: <task>`         Codex (with `multi_agent_v2`): a collab agent. The parent calls `collaboration.spawn_agent`
                          (task name `helper`, `fork_turns: none`), then `collaboration.wait_agent`; the spawned agent
                          gets <task> as its own message (so it may RUN, WRITE, HOLD ... itself), and once its final
                          answer reaches the parent, the parent replies `child said: <answer>` (fake_openai).
- `HOLD`                  stream one chunk (Codex: the first `HOLD_SHOWN` characters when the reply is that
                          long), then wait until the test calls `release()` (or the client goes away): a turn
                          that is reliably still running.
- `PROBE: <text>`          stream <text> as one chunk, wait until the test calls `release()`, then stream
                          `PROBE_END` and finish: the reply is exactly <text> + PROBE_END, and while it waits the
                          driver has had all of <text> in one delta (tests/test_redaction_probe.py).
- anything else           a streamed reply `echo: <message>`.

Fault directives (a line of the message, like the keywords; they concern the model request itself, so
they are checked before the keywords, and only on a main-loop request of the turn that message started: never
on Claude Code's side requests). A turn's requests are numbered from 1: the first carries the user's message,
each later one the result of the tool call the one before asked for (`RUN:`, `WRITE:`):
- `FAIL: <status> [retry-after=<s>] [times=<n>] [at=<k>]`  answer with HTTP `<status>` and the API's own error
                          body (401 bad key, 429 rate limited, 529 overloaded, 500/503 server error ...),
                          with a `retry-after: <s>` header when given. `times=<n>`: only the first n
                          requests of this message fail, later ones (the CLI's own retries, or the same
                          message sent again) are answered as if the line were not there; without it
                          every request fails. `at=<k>`: the turn's k-th request fails instead of its first
                          (`RUN: ...` then `FAIL: 500 at=2`: the command runs, the request with its output
                          fails).
- `CUT [hold] [fallback] [times=<n>] [at=<k>]` stream the start of a reply (`CUT_SHOWN` characters of
                          `cut: <message>`, in chunks), then close the connection abruptly: no completion
                          event, no end of the chunked body, as when a network drops mid-reply. `hold`: wait
                          for `release()` before closing, so a test can first see the part that streamed
                          (whether a CLI shows bytes that arrive together with the cut is its own race).
                          `fallback`: Claude Code's non-streaming re-ask of a cut request is cut too (half of
                          its JSON body, then the connection dropped), so the cut persists; without it that
                          re-ask gets the scripted reply. `times` and `at` as for FAIL.
Faulted requests are recorded in `requests` like the others, so a test can count a CLI's retries.
"""

from __future__ import annotations

import asyncio
import dataclasses
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route


@dataclasses.dataclass(frozen=True, slots=True)
class Script:
    """What the fake model does for one request, decided from the conversation it was sent."""

    action: str  # reply | run | write | ask | plan | spawn | hold | probe | after_tool
    text: str
    arg: str = ""

    @staticmethod
    def of(last_user_text: str, tool_output: str | None) -> Script:
        if tool_output is not None:
            return Script("after_tool", f"tool said: {tool_output.strip()[:200]}")
        text = last_user_text.strip()
        for line in text.splitlines():
            line = line.strip()
            if m := re.match(r"^RUN:\s*(.+)$", line):
                return Script("run", text, m.group(1))
            if m := re.match(r"^WRITE:\s*(\S+)\s+(.*)$", line):
                return Script("write", m.group(2), m.group(1))
            if m := re.match(r"^ASK:\s*(.+)$", line):
                return Script("ask", text, m.group(1))
            if m := re.match(r"^PLAN:\s*(.+)$", line):
                return Script("plan", m.group(1))
            if m := re.match(r"^SPAWN:\s*(.+)$", line):
                return Script("spawn", text, m.group(1))
            if line == "HOLD":
                return Script("hold", text)
            if m := re.match(r"^PROBE: (.+)$", line):
                return Script("probe", m.group(1))
        return Script("reply", f"echo: {text}")


@dataclasses.dataclass(frozen=True, slots=True)
class Fault:
    """A scripted failure of a model request: an HTTP error status, or a reply cut mid-stream."""

    kind: str  # status | cut
    status: int = 0
    retry_after: str | None = None
    times: int | None = None  # None: every request of the message fails
    hold: bool = False  # CUT: wait for `release()` before cutting
    at: int = 1  # which request of the turn fails (1: the one carrying the user's message)
    fallback: bool = False  # CUT: Claude Code's non-streaming re-ask is cut too

    @staticmethod
    def of(text: str) -> Fault | None:
        for line in text.strip().splitlines():
            line = line.strip()
            if m := re.match(r"^FAIL:\s*(\d{3})((?:\s+[a-z-]+=\S+)*)\s*$", line):
                options = _options(m.group(2))
                status, retry_after = int(m.group(1)), options.get("retry-after")
                return Fault("status", status, retry_after, _times(options), at=_at(options))
            if m := re.match(r"^CUT((?:\s+(?:[a-z-]+=\S+|hold|fallback))*)\s*$", line):
                options = _options(m.group(1))
                hold, fallback = "hold" in options, "fallback" in options
                return Fault("cut", times=_times(options), hold=hold, at=_at(options), fallback=fallback)
        return None


def _options(text: str) -> dict[str, str]:
    """`key=value` pairs (a bare word is a key with an empty value)."""
    return {word.partition("=")[0]: word.partition("=")[2] for word in text.split()}


def _times(options: dict[str, str]) -> int | None:
    return int(options["times"]) if "times" in options else None


def _at(options: dict[str, str]) -> int:
    return int(options.get("at") or 1)


class StreamCut(Exception):
    """Raised inside a streaming reply: the server drops the connection (the CUT directive)."""


# Characters of a CUT reply sent before the connection drops: more than a driver keeps back (64), so a part
# of it is shown while the stream is still open.
CUT_SHOWN = 96


def chunks(text: str, size: int = 8) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# One chunk (8) more than a driver keeps back of a stream (64): the first shown delta of a held reply is released
# only by its last chunk, so seeing it proves that the whole held part reached the driver.
HOLD_SHOWN = 72
PROBE_END = " (end of probe)"  # what a PROBE reply streams after its release


def held_after(pieces: list[str]) -> int:
    """The chunk after which a HOLD reply waits: the first that brings it to `HOLD_SHOWN` characters, else the
    first (a short reply)."""
    total = 0
    for index, piece in enumerate(pieces):
        total += len(piece)
        if total >= HOLD_SHOWN:
            return index
    return 0


def error_response(fault: Fault, body: dict[str, Any]) -> Response:
    headers = {"retry-after": fault.retry_after} if fault.retry_after is not None else {}
    return Response(orjson.dumps(body), status_code=fault.status, headers=headers, media_type="application/json")


async def _cut_body(reply: bytes) -> AsyncIterator[bytes]:
    """The first half of a JSON reply, then the connection dropped (no end of the chunked body)."""
    yield reply[: len(reply) // 2]
    raise StreamCut("non-streaming reply")


def sse(event: str, data: dict[str, Any]) -> bytes:
    return b"event: " + event.encode() + b"\ndata: " + orjson.dumps(data) + b"\n\n"


Handler = Callable[["FakeModel", dict[str, Any]], AsyncIterator[bytes]]


class FakeModel:
    """Start with `FakeModel(handlers).start()`; `url` is `http://127.0.0.1:PORT`."""

    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []  # {"path": ..., "body": ...} in arrival order
        self.abandoned: list[dict[str, Any]] = []  # streamed replies the client closed before their end
        self.streamed: list[dict[str, Any]] = []  # streamed replies sent to their end (usage included)
        self._lock = threading.Condition()
        self._released = threading.Event()
        self._faulted: dict[tuple[str, str], int] = {}  # (path, message) -> requests failed so far
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self.port = 0

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # ---- control from the test -------------------------------------------------------

    def release(self) -> None:
        """Let every HOLD stream (present and future) finish."""
        self._released.set()

    def reset_hold(self) -> None:
        self._released.clear()

    async def held(self) -> None:
        """Inside a handler: wait for `release()` without blocking the server's loop."""
        await asyncio.get_running_loop().run_in_executor(None, self._released.wait)

    def bodies(self, path: str) -> list[dict[str, Any]]:
        with self._lock:
            return [r["body"] for r in self.requests if r["path"] == path]

    def wait_requests(self, path: str, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Block until `count` requests reached `path`; returns their bodies."""
        with self._lock:
            ok = self._lock.wait_for(lambda: len([r for r in self.requests if r["path"] == path]) >= count, timeout)
            if not ok:
                raise TimeoutError(f"{path}: {count} requests expected, {len(self.requests)} seen in all")
            return [r["body"] for r in self.requests if r["path"] == path]

    def wait_body(self, text: str, timeout: float = 60.0, tools_only: bool = False) -> dict[str, Any]:
        """Block until a request (any path) whose body mentions `text` arrived; returns the first such body.
        `tools_only`: only a request offering tools (an agent's main loop, not its side requests: titles...)."""

        def found() -> list[dict[str, Any]]:
            return [
                r["body"]
                for r in self.requests
                if text in orjson.dumps(r["body"]).decode() and (r["body"].get("tools") or not tools_only)
            ]

        with self._lock:
            if not self._lock.wait_for(found, timeout):
                raise TimeoutError(f"no request mentions {text!r} ({len(self.requests)} seen in all)")
            return found()[0]

    def fault_for(self, path: str, turn: tuple[str, int] | None, fallback: bool = False) -> Fault | None:
        """The fault this request gets (counted), or None: `turn` is (the user's message that started the
        turn, this request's number in it) for a main-loop request, else None (never faulted). `fallback`:
        the request is Claude Code's non-streaming re-ask, which only a `CUT fallback` faults."""
        fault = Fault.of(turn[0]) if turn is not None else None
        if turn is None or fault is None or fault.at != turn[1]:
            return None
        if fallback and not (fault.kind == "cut" and fault.fallback):
            return None
        with self._lock:
            done = self._faulted.get((path, turn[0]), 0)
            if fault.times is not None and done >= fault.times:
                return None
            self._faulted[(path, turn[0])] = done + 1
        return fault

    def wait_abandoned(self, path: str, count: int, timeout: float = 60.0) -> list[dict[str, Any]]:
        """Block until the client closed `count` streamed replies of `path` before their end (a cancelled
        request: a CLI interrupted mid-reply); returns their request bodies."""
        with self._lock:
            ok = self._lock.wait_for(lambda: len([r for r in self.abandoned if r["path"] == path]) >= count, timeout)
            if not ok:
                raise TimeoutError(f"{path}: {count} abandoned replies expected, {len(self.abandoned)} seen in all")
            return [r["body"] for r in self.abandoned if r["path"] == path]

    # ---- the server -----------------------------------------------------------------

    async def _watched(self, path: str, body: dict[str, Any], stream: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`stream`, noting in `abandoned` when the client goes away before its end (the response is cancelled),
        in `streamed` when it was sent to its end."""
        try:
            async for chunk in stream:
                yield chunk
            with self._lock:
                self.streamed.append({"path": path, "body": body})
                self._lock.notify_all()
        except (asyncio.CancelledError, GeneratorExit):
            with self._lock:
                self.abandoned.append({"path": path, "body": body})
                self._lock.notify_all()
            raise

    def _record(self, path: str, body: dict[str, Any]) -> None:
        with self._lock:
            self.requests.append({"path": path, "body": body})
            self._lock.notify_all()

    def app(self) -> Starlette:
        async def responses(request: Request) -> Response:
            from tests.support import fake_openai

            body = orjson.loads(await request.body())
            self._record("/v1/responses", body)
            fault = self.fault_for("/v1/responses", fake_openai.turn_request(body))
            if fault is not None and fault.kind == "status":
                return error_response(fault, fake_openai.error_body(fault.status))
            return StreamingResponse(
                self._watched("/v1/responses", body, fake_openai.stream(self, body, fault)),
                media_type="text/event-stream",
            )

        async def messages(request: Request) -> Response:
            from tests.support import fake_anthropic

            body = orjson.loads(await request.body())
            self._record("/v1/messages", body)
            streaming = bool(body.get("stream"))
            fault = self.fault_for("/v1/messages", fake_anthropic.turn_request(body), fallback=not streaming)
            if not streaming:  # a side request, or Claude Code asking again after a cut stream
                reply = orjson.dumps(fake_anthropic.complete(body))
                if fault is not None:
                    return StreamingResponse(_cut_body(reply), media_type="application/json")
                return Response(reply, media_type="application/json")
            if fault is not None and fault.kind == "status":
                return error_response(fault, fake_anthropic.error_body(fault.status))
            return StreamingResponse(
                self._watched("/v1/messages", body, fake_anthropic.stream(self, body, fault)),
                media_type="text/event-stream",
            )

        async def root(request: Request) -> Response:
            return Response(b"", status_code=200)

        async def other(request: Request) -> Response:
            self._record(request.url.path, {})
            return Response(b'{"error":{"message":"not served by the fake model"}}', status_code=404)

        return Starlette(
            routes=[
                Route("/v1/responses", responses, methods=["POST"]),
                Route("/v1/messages", messages, methods=["POST"]),
                Route("/", root, methods=["GET", "HEAD"]),
                Route("/{rest:path}", other, methods=["GET", "POST", "HEAD"]),
            ]
        )

    def start(self) -> FakeModel:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app(), log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self._server = uvicorn.Server(config)
        started = threading.Event()

        def serve() -> None:
            loop = asyncio.new_event_loop()
            self._loop = loop
            assert self._server is not None
            task = loop.create_task(self._server.serve(sockets=[sock]))
            loop.call_soon(started.set)
            loop.run_until_complete(task)
            loop.close()

        self._thread = threading.Thread(target=serve, name="fake-model", daemon=True)
        self._thread.start()
        started.wait(10)
        return self

    def stop(self) -> None:
        self.release()
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)

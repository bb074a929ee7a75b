"""When an app turn of a Claude thread ends: steering, echoes, interrupts and results.

Behaviour of Claude Code 2.1.197 this relies on (observed against the fake model):
- `system/init` is re-sent at the start of every query (each user message that is not
  folded into a running one); it is used only to re-interrupt (below).
- Steering (a user message written while a turn runs) has two outcomes. While the model
  streams text, the message is queued and runs as its own query after the current one:
  a second `system/init` ... `result`. While a tool call is pending or running, it is
  folded into the running query (the next model request carries it as a system note
  "The user sent a new message while you were working: ...") and there is one `result`.
  With `--replay-user-messages` the CLI echoes each of our user messages (`isReplay`)
  when it takes it into the conversation, before the `result` of the query that took
  it. So the app turn ends at the first `result` after which every message sent for it
  has been echoed: exactly once, and after the steer was answered.
- Model API errors: the CLI retries 401, 408, 409, 429, 5xx and 529 itself (10 retries by default, backoff
  from 0.5 s doubling, at least the `retry-after` the API asked for; `CLAUDE_CODE_MAX_RETRIES` sets the
  count), writing a `system/api_retry` line (`error_status`, `error`: rate_limit, overloaded, server_error,
  authentication_failed ..., `retry_delay_ms`) before each retry. When they are used up the query ends with
  a `result` whose `is_error` is true and `api_error_status` is the last HTTP status (null after repeated
  529s: "Repeated 529 Overloaded errors"). A reply stream that breaks off is asked again without streaming,
  with no `api_retry` line; when that reply breaks off too, the query ends with an "API Error: Connection to
  the API was lost (ECONNRESET)" result without a status (after an assistant message carrying that text).
  Whether the partial reply streamed first is a race inside the CLI, so those words count as a cut too.
- Interrupt (`control_request` `interrupt`) ends the running query with the partial
  assistant message, a "[Request interrupted by user]" user line and
  `result/error_during_execution`; the process takes the next message. It does not drop
  queued messages, so after an interrupt every further query of that turn is
  interrupted at its `system/init` too; each such query still echoes its message, so the
  turn ends once (observed for steers queued behind streamed text, behind a pending
  permission prompt, and sent after the interrupt). An interrupt while idle is a no-op.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from threadloom.domain.failures import ModelFailure, RunFailureCode, model_failure
from threadloom.providers.contract import TurnStatus

OVERLOADED = "overloaded"  # the `error` of an `api_retry` line for a 529


@dataclasses.dataclass(slots=True)
class Turn:
    """One app turn on a thread's process."""

    id: str
    unechoed: int = 1  # user messages sent for this turn that the CLI has not taken in yet
    interrupted: bool = False  # the user stopped it: every further query of it is interrupted too
    finishing: bool = False  # completed; waiting for the CLI to write its transcript
    retry_status: int | None = None  # the HTTP status of the last model API error the CLI retried
    retry_error: str | None = None  # and its kind (`api_retry`'s `error`)
    stream_cut: bool = False  # a streamed reply of this turn broke off (set by the runtime from the transcript)

    def steered(self) -> None:
        """One more user message was sent for this turn."""
        self.unechoed += 1

    def echoed(self) -> None:
        """The CLI took one of our messages into the conversation (`isReplay`)."""
        self.unechoed = max(0, self.unechoed - 1)

    def retrying(self, message: dict[str, Any]) -> None:
        """The CLI retries a model request that failed (an `api_retry` line)."""
        status = message.get("error_status")
        self.retry_status = status if isinstance(status, int) else None
        self.retry_error = str(message.get("error") or "") or None

    def outcome(self, result: dict[str, Any]) -> tuple[TurnStatus, str | None, ModelFailure | None] | None:
        """How a `result` message ends this turn, or None if a queued steer runs as its own query next.

        The error text is the CLI's own (the caller redacts it); the model failure is read from the result's
        `api_error_status`, else from the last retried error of the turn.
        """
        if self.unechoed > 0:
            return None
        if self.interrupted:  # even if the last query got to finish first: the user stopped this turn
            return "interrupted", None, None
        if result.get("subtype") == "success" and not result.get("is_error"):
            return "completed", None, None
        errors = result.get("errors")
        text = result.get("result") or ("; ".join(map(str, errors)) if isinstance(errors, list) else None)
        return "failed", str(text or result.get("subtype")), self._failure(result, str(text or ""))

    def _failure(self, result: dict[str, Any], text: str) -> ModelFailure | None:
        status = result.get("api_error_status")
        if isinstance(status, int):
            return model_failure(status)
        if not text.startswith("API Error") and self.retry_status is None:
            return None  # not a model API error: the agent failed otherwise
        if self.retry_error == OVERLOADED or "529" in text:
            return ModelFailure(RunFailureCode.MODEL_OVERLOADED, 529)
        if self.retry_status is None and (self.stream_cut or _connection_lost(text)):
            return ModelFailure(RunFailureCode.MODEL_STREAM_CUT)  # the reply broke off, and so did the re-ask
        return model_failure(self.retry_status)


def _connection_lost(text: str) -> bool:
    """Claude Code's words for a reply whose connection broke off. Its partial stream is not always shown
    first: when the rest of the reply and the end of the connection arrive together, the CLI reports the
    error without the `stream_event` lines it had already read, so `stream_cut` alone misses the cut."""
    lowered = text.lower()
    return "connection to the api was lost" in lowered or "econnreset" in lowered

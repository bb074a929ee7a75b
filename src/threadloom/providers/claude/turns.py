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

from threadloom.providers.contract import TurnStatus


@dataclasses.dataclass(slots=True)
class Turn:
    """One app turn on a thread's process."""

    id: str
    unechoed: int = 1  # user messages sent for this turn that the CLI has not taken in yet
    interrupted: bool = False  # the user stopped it: every further query of it is interrupted too
    finishing: bool = False  # completed; waiting for the CLI to write its transcript

    def steered(self) -> None:
        """One more user message was sent for this turn."""
        self.unechoed += 1

    def echoed(self) -> None:
        """The CLI took one of our messages into the conversation (`isReplay`)."""
        self.unechoed = max(0, self.unechoed - 1)

    def outcome(self, result: dict[str, Any]) -> tuple[TurnStatus, str | None] | None:
        """How a `result` message ends this turn, or None if a queued steer runs as its own query next.

        The error text is the CLI's own (the caller redacts it).
        """
        if self.unechoed > 0:
            return None
        if self.interrupted:  # even if the last query got to finish first: the user stopped this turn
            return "interrupted", None
        if result.get("subtype") == "success" and not result.get("is_error"):
            return "completed", None
        errors = result.get("errors")
        text = result.get("result") or ("; ".join(map(str, errors)) if isinstance(errors, list) else None)
        return "failed", str(text or result.get("subtype"))

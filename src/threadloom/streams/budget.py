"""Bytes queued for subscribers in this process, bounded per subscriber and per token.

A subscriber whose client does not read keeps what it was not sent queued in the server. Frames
are not equal (a tool call's `node.updated` carries up to 64 KiB of output, a `thread.renamed` a few
hundred bytes), so a bound in frames alone lets one token's subscriptions hold hundreds of
megabytes. Every queue therefore counts the encoded size of what it holds in a `QueueAccount`,
and the process's `QueueBudget` keeps the sums per token and overall (the
`threadloom_subscriber_queued_bytes` gauge). A frame that would take a subscriber past
`per_subscriber` bytes, or its token's subscribers together past `per_token`, does not fit: the
queue's owner ends that subscriber with SUBSCRIBER_TOO_SLOW and it resumes from its cursor.

A frame into an empty queue always fits the subscriber's own bound (it is the frame the subscriber
is waiting for; what one frame carries is bounded by `api.subscriptions.STREAM_TEXT_MAX`), never the
token's: a token's subscribers together never hold more than `per_token` bytes.
"""

from __future__ import annotations

import uuid


def utf8_size(text: str) -> int:
    """The size `text` takes on the wire (UTF-8); `str.isascii` keeps the common case free of a copy."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


class QueueBudget:
    """This process's queued subscriber bytes: overall (`total`) and per token."""

    def __init__(self, per_subscriber: int, per_token: int) -> None:
        self.per_subscriber = per_subscriber
        self.per_token = per_token
        self.total = 0
        self.tokens: dict[uuid.UUID | None, int] = {}

    def account(self, token: uuid.UUID | None) -> QueueAccount:
        """A new subscriber's account (`token` None: counted in the total, under no token's bound but its own)."""
        return QueueAccount(self, token)

    def _add(self, token: uuid.UUID | None, size: int) -> None:
        self.total += size
        held = self.tokens.get(token, 0) + size
        if held > 0:
            self.tokens[token] = held
        else:
            self.tokens.pop(token, None)


class QueueAccount:
    """What one subscriber's queue holds, in bytes."""

    __slots__ = ("budget", "queued", "token")

    def __init__(self, budget: QueueBudget, token: uuid.UUID | None) -> None:
        self.budget = budget
        self.token = token
        self.queued = 0

    def take(self, size: int) -> bool:
        """Count `size` more bytes; False, counting nothing, when they would pass the subscriber's or the token's
        bound (the caller then ends the subscriber with SUBSCRIBER_TOO_SLOW)."""
        budget = self.budget
        if self.queued and self.queued + size > budget.per_subscriber:
            return False
        if self.token is not None and budget.tokens.get(self.token, 0) + size > budget.per_token:
            return False
        self.force(size)
        return True

    def force(self, size: int) -> None:
        """Count `size` bytes past any bound: a small control frame (a `synchronized` marker) must not be refused."""
        self.queued += size
        self.budget._add(self.token, size)

    def give(self, size: int) -> None:
        """`size` bytes left the queue (sent, or thrown away)."""
        size = min(size, self.queued)
        self.queued -= size
        self.budget._add(self.token, -size)

    def clear(self) -> None:
        """The queue was emptied or is gone: everything it held is given back."""
        self.give(self.queued)

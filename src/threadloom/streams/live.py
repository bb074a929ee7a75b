"""The live side of one process: the hub, the notifier, and the commit hook that wakes them."""

from __future__ import annotations

import dataclasses

from threadloom.engine.pipeline import Committed
from threadloom.store.db import Database
from threadloom.streams.budget import QueueBudget
from threadloom.streams.hub import Hub
from threadloom.streams.notifier import Notifier


@dataclasses.dataclass(frozen=True, slots=True)
class StreamLimits:
    max_replay: int = 10_000
    subscriber_queue: int = 1_000  # frames per subscriber
    # Queued bytes per subscriber and over all of one token's subscribers, in this process (streams.budget).
    subscriber_queue_bytes: int = 4 * 1024 * 1024
    token_queue_bytes: int = 64 * 1024 * 1024


class Live:
    def __init__(self, db: Database, broadcast_url: str, limits: StreamLimits) -> None:
        self.db = db
        self.limits = limits
        budget = QueueBudget(limits.subscriber_queue_bytes, limits.token_queue_bytes)
        self.hub = Hub(db, mailbox_limit=limits.subscriber_queue, budget=budget)
        self.notifier = Notifier(broadcast_url, self.hub)

    async def start(self) -> None:
        await self.notifier.start()

    async def stop(self) -> None:
        await self.notifier.stop()
        await self.hub.stop()

    async def on_commit(self, committed: Committed) -> None:
        """After every commit: wake local feeds at once, and other processes through broadcaster."""
        if committed.thread_id is None or not committed.sequences:
            return
        last = committed.sequences[-1]
        self.hub.wake(committed.thread_id, committed.project_id, last)
        await self.notifier.publish({"t": str(committed.thread_id), "p": str(committed.project_id or ""), "s": last})

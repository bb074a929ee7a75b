"""broadcaster's Redis backend, fixed so that it delivers (`BROADCAST_URL=redis://…` or `rediss://…`).

A module of its own so that only a server that uses Redis imports redis-py (~0.1 s of CPU at every start).
"""

from __future__ import annotations

from broadcaster._backends.redis import RedisBackend


class SubscribedRedisBackend(RedisBackend):
    """broadcaster's Redis backend, its listener released only once SUBSCRIBE is on the connection.

    The original sets its "ready" event before awaiting redis-py's `subscribe()`, which records the channel
    only after the command is sent. Its listener wakes in between, finds redis-py's `listen()` over at once
    (no channel yet), clears "ready" and waits for a subscribe that never comes again: no message is ever
    delivered. Here the channel is recorded first, then the listener starts.
    """

    async def subscribe(self, channel: str) -> None:
        await self._pubsub.subscribe(channel)
        self._ready.set()

"""Wake-ups between processes over broadcaster (docs/architecture.md, "Live streams").

broadcaster carries only `{thread, project, sequence}` wake-ups — never the source of
truth. One subscription per process feeds the in-process `Hub`. Publishes are
serialized (broadcaster's PostgreSQL backend shares one connection). broadcaster never
notices a dead connection, so a heartbeat travels the channel every second; when it
stops arriving the notifier reconnects with backoff, and meanwhile the hub tells the
feeds to poll the log.

`redis://` goes through `SubscribedRedisBackend` (streams/redis_wakeups.py): broadcaster 0.3.1's own Redis
backend never delivers a message with redis-py 5+ (see its docstring), which left every redis:// server polling
in degraded mode.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from typing import Any

import orjson
from broadcaster import Broadcast

from threadloom.aio import cancel_all
from threadloom.streams.hub import Hub

log = logging.getLogger("threadloom.streams")
CHANNEL = "threadloom_wakeups"
HEARTBEAT = 1.0
HEARTBEAT_TIMEOUT = 3.5
MAX_BACKOFF = 10.0


def broadcast_for(url: str) -> Broadcast:
    """A broadcaster for `BROADCAST_URL` (`redis://` and `rediss://` through `SubscribedRedisBackend`)."""
    if url.split(":", 1)[0] in ("redis", "rediss"):
        from threadloom.streams.redis_wakeups import SubscribedRedisBackend  # redis-py only where it is used

        return Broadcast(backend=SubscribedRedisBackend(url))
    return Broadcast(url)


class Notifier:
    def __init__(self, url: str, hub: Hub) -> None:
        self.url = url
        self.hub = hub
        self.token = uuid.uuid4().hex
        self._broadcast: Broadcast | None = None  # set while subscribed: the publish target
        self._current: Broadcast | None = None
        self._publish_lock = asyncio.Lock()
        self._tasks: list[asyncio.Task[None]] = []
        self._last_beat = time.monotonic()
        self._connected = asyncio.Event()
        self.reconnects = 0

    async def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._listen_forever(), name="notifier-listen"),
            asyncio.create_task(self._heartbeat(), name="notifier-heartbeat"),
        ]
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._connected.wait(), 5)

    async def stop(self) -> None:
        await cancel_all(self._tasks)
        await self._close(self._current)

    async def publish(self, message: dict[str, Any]) -> None:
        """Send a wake-up; on failure the hub degrades to polling until the notifier reconnects."""
        broadcast = self._broadcast
        if broadcast is None:
            return
        try:
            async with self._publish_lock:
                await broadcast.publish(CHANNEL, orjson.dumps(message).decode())
        except Exception as error:
            log.warning("publishing a wake-up failed: %s", error)
            self.hub.set_degraded(True)

    async def _close(self, broadcast: Broadcast | None = None) -> None:
        broadcast = broadcast or self._broadcast
        self._broadcast = None
        if broadcast is not None:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(broadcast.disconnect(), 2)

    async def _listen_forever(self) -> None:
        backoff = 0.1
        while True:
            try:
                await self._listen_once()
                backoff = 0.1
            except asyncio.CancelledError:
                raise
            except Exception as error:
                log.warning("wake-up listener lost (%s); reconnecting in %.1fs", error, backoff)
            self.hub.set_degraded(True)
            self._connected.clear()
            await self._close(self._current)
            await asyncio.sleep(backoff)
            backoff = min(MAX_BACKOFF, backoff * 2)
            self.reconnects += 1

    async def _listen_once(self) -> None:
        broadcast = broadcast_for(self.url)
        self._current = broadcast
        await asyncio.wait_for(broadcast.connect(), 5)
        self._last_beat = time.monotonic()  # a fresh connection gets a full heartbeat window
        reader = asyncio.create_task(self._read(broadcast))
        watchdog = asyncio.create_task(self._watch())
        try:
            done, _ = await asyncio.wait({reader, watchdog}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (reader, watchdog):
                task.cancel()
            await asyncio.wait({reader, watchdog}, timeout=2)
            for task in (reader, watchdog):
                if task.done() and not task.cancelled():
                    task.exception()  # retrieved here; the first one is raised below
        for task in done:
            if not task.cancelled():
                task.result()

    async def _read(self, broadcast: Broadcast) -> None:
        # LISTEN and publishes share broadcaster's one connection: never at the same time.
        async with self._publish_lock:
            subscription = broadcast.subscribe(CHANNEL)
            subscriber = await subscription.__aenter__()
            self._broadcast = broadcast
        try:
            self._last_beat = time.monotonic()
            self._connected.set()
            self.hub.set_degraded(False)
            while True:
                event = await subscriber.get()
                self._on_message(event.message)
        finally:
            self._broadcast = None
            with contextlib.suppress(Exception):
                async with self._publish_lock:
                    await asyncio.wait_for(subscription.__aexit__(None, None, None), 1)

    async def _watch(self) -> None:
        """Ends when heartbeats stop arriving: the subscription is dead even if it looks alive."""
        while time.monotonic() - self._last_beat < HEARTBEAT_TIMEOUT:  # noqa: ASYNC110 - a clock, not a flag
            await asyncio.sleep(HEARTBEAT / 2)
        raise ConnectionError("wake-up heartbeat lost")

    async def _heartbeat(self) -> None:
        n = 0
        while True:
            await asyncio.sleep(HEARTBEAT)
            n += 1
            await self.publish({"hb": self.token, "n": n})

    def _on_message(self, raw: str) -> None:
        try:
            message = orjson.loads(raw)
        except orjson.JSONDecodeError:
            return
        if "hb" in message:
            if message["hb"] == self.token:
                self._last_beat = time.monotonic()
            return
        thread = message.get("t")
        project = message.get("p")
        self.hub.wake(
            uuid.UUID(thread) if thread else None, uuid.UUID(project) if project else None, int(message.get("s", 0))
        )

"""A provider runtime whose calls are spans: used in place of the driver's runtime while tracing is on.

Only the calls into the provider (start a turn, respond to a request …) are spans; the events it
streams back are not (a turn's text deltas would be hundreds of spans).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from threadloom import tracing
from threadloom.providers.contract import ProviderEvent, ProviderRuntime, ThreadSettings


class TracedRuntime:
    def __init__(self, runtime: ProviderRuntime, instance_id: str) -> None:
        self.runtime = runtime
        self.capabilities = runtime.capabilities
        self._attributes = {"threadloom.provider.instance": instance_id}

    def _span(self, call: str) -> Any:
        return tracing.span(f"provider {call}", self._attributes)

    @property
    def alive(self) -> bool:
        return self.runtime.alive

    def events(self) -> AsyncIterator[ProviderEvent]:
        return self.runtime.events()

    async def start_thread(self, settings: ThreadSettings) -> str:
        with self._span("start_thread"):
            return await self.runtime.start_thread(settings)

    async def resume_thread(self, native_thread: str, settings: ThreadSettings) -> None:
        with self._span("resume_thread"):
            await self.runtime.resume_thread(native_thread, settings)

    async def start_turn(
        self, native_thread: str, text: str, settings: ThreadSettings | None = None, handoff: str | None = None
    ) -> str:
        with self._span("start_turn"):
            return await self.runtime.start_turn(native_thread, text, settings, handoff)

    async def steer_turn(self, native_thread: str, native_turn: str, text: str) -> None:
        with self._span("steer_turn"):
            await self.runtime.steer_turn(native_thread, native_turn, text)

    async def interrupt_turn(self, native_thread: str, native_turn: str) -> None:
        with self._span("interrupt_turn"):
            await self.runtime.interrupt_turn(native_thread, native_turn)

    async def respond_to_request(self, request_ref: str, response: dict[str, Any]) -> None:
        with self._span("respond_to_request"):
            await self.runtime.respond_to_request(request_ref, response)

    async def fork_thread(self, native_thread: str, native_turn: str | None) -> str:
        with self._span("fork_thread"):
            return await self.runtime.fork_thread(native_thread, native_turn)

    async def rollback_thread(self, native_thread: str, before_turn: str) -> None:
        with self._span("rollback_thread"):
            await self.runtime.rollback_thread(native_thread, before_turn)

    async def read_thread_snapshot(self, native_thread: str) -> dict[str, Any]:
        with self._span("read_thread_snapshot"):
            return await self.runtime.read_thread_snapshot(native_thread)

    async def close(self) -> None:
        with self._span("close"):
            await self.runtime.close()


def traced(runtime: ProviderRuntime, instance_id: str) -> ProviderRuntime:
    """`runtime` itself while tracing is off."""
    return TracedRuntime(runtime, instance_id) if tracing.ENABLED else runtime

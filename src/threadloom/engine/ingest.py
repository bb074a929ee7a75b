"""Provider events become entities: the ingestor of one live runtime.

Events are partitioned by native thread (one task each, made lazily, its queue bounded) so
one thread's flood never delays another's. Within a thread they are handled in order and
coalesced: written at most every 50 ms, deltas of one item merged, so a streamed reply costs
a transaction or two, not one per token; the turn's last events are written with its run's
end. Events of a native thread with no binding are dropped; of an attempt that is no longer active,
only its usage and its turn's start (the turn is in the provider's conversation all the same) are kept.
What each event changes is decided in `engine.provider_events`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

from threadloom.aio import cancel_all
from threadloom.domain.statuses import RunStatus
from threadloom.domain.usage import Pricing
from threadloom.engine import provider_events
from threadloom.engine.checkpoints import Checkpoints
from threadloom.engine.pipeline import Pipeline, Step
from threadloom.engine.sessions import LiveSession, TurnBinding
from threadloom.faults import hold_point
from threadloom.providers import contract as ev
from threadloom.providers.agent_cli import redact_event, storable

log = logging.getLogger("threadloom.ingest")
COALESCE_SECONDS = 0.05
PARTITION_QUEUE = 4096  # events read ahead per native thread before the runtime's stream waits
PARTITION_IDLE = 5.0  # seconds without events before a native thread's task ends
YIELD_EVERY = 64  # events taken without waiting before giving the event loop to other tasks
_TURN_STATUS = {"completed": RunStatus.COMPLETED, "failed": RunStatus.FAILED, "interrupted": RunStatus.INTERRUPTED}


def _immediate(event: ev.ProviderEvent) -> bool:
    """Events written at once rather than in the coalescing window: a request someone must answer, and
    a subagent's start or end (its workspace is captured right after)."""
    if isinstance(event, ev.RequestOpened):
        return True
    if isinstance(event, ev.ItemStarted | ev.ItemCompleted):
        return event.kind == "subagent"
    return isinstance(event, ev.TurnCompleted)  # a child turn's end (the run's own end goes with the run)


@dataclasses.dataclass(slots=True)
class _Pending:
    """A partition's events not yet written, all of one binding (one turn)."""

    binding: TurnBinding | None = None
    events: list[Any] = dataclasses.field(default_factory=list)
    since: float = 0.0  # when the first of them arrived (monotonic)

    def add(self, event: ev.ProviderEvent) -> None:
        """Keep `event`, merged into the previous one when both are deltas of the same item."""
        if not self.events:
            self.since = time.monotonic()
        last = self.events[-1] if self.events else None
        if (
            isinstance(event, ev.TextDelta | ev.OutputDelta)
            and type(last) is type(event)
            and last.item_id == event.item_id
            and last.native_turn == event.native_turn
        ):
            self.events[-1] = dataclasses.replace(last, delta=last.delta + event.delta)
            return
        self.events.append(event)

    def take(self) -> list[Any]:
        events, self.events = self.events, []
        return events


class _Partition:
    """One native thread's events, in order: a bounded queue and the task applying it."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[ev.ProviderEvent | None] = asyncio.Queue(PARTITION_QUEUE)  # None: drain and stop
        self.task: asyncio.Task[None] | None = None


class Ingestor:
    """Applies one runtime's events, partitioned by native thread.

    The pump reads the runtime's stream and hands each event to its native thread's partition
    (made on first use, gone after `PARTITION_IDLE` s without events): a flood of deltas on one
    thread is applied by that thread's task while another thread's events go through their own,
    concurrently (different app threads never share a row lock). Within a partition events are
    applied in order and coalesced: everything that arrives within `COALESCE_SECONDS` of the first
    pending event is written in one transaction, deltas of one item merged. Events that must take
    effect at once (a request the user must answer, a subagent's start or end, which capture the
    workspace) flush immediately; the turn's end is written in the same transaction as its run's end.
    """

    def __init__(
        self,
        pipeline: Pipeline,
        session: LiveSession,
        finish: Callable[..., Any],
        on_exit: Callable[[LiveSession, str], Any],
        checkpoints: Checkpoints | None = None,
        pricing: Pricing | None = None,
        on_usage: Callable[[uuid.UUID, uuid.UUID], Awaitable[None]] | None = None,
    ) -> None:
        self.pipeline = pipeline
        self.pricing = pricing  # how the instance's model calls are priced (domain.usage)
        self.on_usage = on_usage  # after a model call is recorded: the budgets' check (engine.budgets)
        self.session = session
        self.finish = finish
        self.on_exit = on_exit
        self.checkpoints = checkpoints
        self.partitions: dict[str, _Partition] = {}
        self.structured_questions = session.runtime.capabilities.supports_structured_questions
        self.unanswerable: list[str] = []  # provider requests to release with an empty answer

    async def run(self) -> None:
        """Route the runtime's events to their partitions until it exits (then drain them all first)."""
        try:
            try:
                read = 0
                async for event in self.session.runtime.events():
                    if isinstance(event, ev.RuntimeExited):
                        await self._exited(event)
                        return
                    await self._route(event)
                    read += 1
                    if read % YIELD_EVERY == 0:  # a buffered flood is read without waiting: let others run
                        await asyncio.sleep(0)
            except Exception:
                log.exception("the %s event stream failed", self.session.instance_id)
            with contextlib.suppress(Exception):
                await self.session.runtime.close()
            await self._exited(ev.RuntimeExited("the provider's event stream broke off"))
        finally:
            await cancel_all([p.task for p in self.partitions.values() if p.task is not None])

    async def _route(self, event: ev.ProviderEvent) -> None:
        event = redact_event(event, storable)  # NUL cannot be stored: one such output must not sink a batch
        native_thread = getattr(event, "native_thread", None)
        if native_thread is None:
            await self._unbound(event)
            return
        partition = self.partitions.get(native_thread)
        if partition is None:
            partition = self.partitions[native_thread] = _Partition()
            partition.task = asyncio.create_task(self._drain(native_thread, partition), name=f"ingest-{native_thread}")
        await partition.queue.put(event)

    async def _exited(self, event: ev.RuntimeExited) -> None:
        """Every partition applies what it holds, then the live turns are lost."""
        for partition in list(self.partitions.values()):
            await partition.queue.put(None)
        tasks = [p.task for p in self.partitions.values() if p.task is not None]
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.on_exit(self.session, f"{event.reason} (exit code {event.exit_code})")

    async def _drain(self, native_thread: str, partition: _Partition) -> None:
        """One native thread's task: apply its events in order, coalescing what arrives close together.

        Waiting (with a timer) only when its queue is empty keeps a flood cheap: queued events are taken
        as they are, and the window's end is checked after each."""
        pending = _Pending()
        taken = 0
        overdue = 0  # events taken after the window closed, already queued when it did
        while True:
            if partition.queue.empty():
                timeout = pending.since + COALESCE_SECONDS - time.monotonic() if pending.events else PARTITION_IDLE
                try:
                    event = await asyncio.wait_for(partition.queue.get(), max(0.0, timeout))
                except TimeoutError:
                    if pending.events:
                        await self._guarded(self._write(pending))
                        continue
                    if not partition.queue.empty():
                        continue
                    del self.partitions[native_thread]  # idle and empty (no await since the check): gone
                    return
            else:
                event = partition.queue.get_nowait()
                taken += 1
                if taken % YIELD_EVERY == 0:
                    await asyncio.sleep(0)  # let the other threads' tasks and the pump run meanwhile
            if event is None:
                await self._guarded(self._write(pending))
                return
            await self._guarded(self.handle(event, pending))
            if pending.events and time.monotonic() >= pending.since + COALESCE_SECONDS:
                # What already arrived joins the batch first (a few at most): a turn's end right behind
                # it then takes the batch into its run's end, instead of waiting for its commit.
                if partition.queue.empty() or overdue >= YIELD_EVERY:
                    overdue = 0
                    await self._guarded(self._write(pending))
                else:
                    overdue += 1

    async def _guarded(self, step: Awaitable[None]) -> None:
        try:
            await step
        except Exception:
            log.exception("ingest failed")

    async def handle(self, event: ev.ProviderEvent, pending: _Pending) -> None:
        """Take one event of a partition: add it to `pending`, or write `pending` with it now."""
        native_thread = getattr(event, "native_thread", None)
        binding = self.session.bindings.get(native_thread) if native_thread is not None else None
        if binding is None:
            await self._write(pending)  # what came before, of an earlier turn of this thread
            await self._unbound(event)
            return
        if pending.binding is not binding:
            await self._write(pending)
            pending.binding = binding
        if isinstance(event, ev.TurnStarted) and event.parent_turn is None:
            await hold_point("turn-started")  # tests: the provider started the turn; the app has not read so yet
        if (
            isinstance(event, ev.TurnCompleted)
            and event.parent_turn is None
            and (binding.native_turn is None or event.native_turn == binding.native_turn)
        ):
            self.session.unbind(binding.native_thread)
            status = _TURN_STATUS.get(event.status, RunStatus.FAILED)
            hold = f"run failed: {event.error}" if status == RunStatus.FAILED else None
            events = pending.take()
            await self.finish(
                binding.run_id,
                status,
                event.error if status != RunStatus.COMPLETED else None,
                hold_reason=hold,
                attempt_id=binding.attempt_id,
                before=(self._decision(binding, events),) if events else (),
                thread_id=binding.thread_id,
                model_failure=event.failure if status == RunStatus.FAILED else None,
            )
            if self.on_usage is not None and any(isinstance(e, ev.UsageReported) for e in events):
                await self._guarded(self.on_usage(binding.thread_id, binding.run_id))  # its last calls
            return
        pending.add(event)
        if _immediate(event):
            await self._write(pending)
            await self._scope_step(binding, event)
            await self._release_unanswerable()

    async def _release_unanswerable(self) -> None:
        while self.unanswerable:  # release the provider: it asked something nobody can answer here
            ref = self.unanswerable.pop()
            try:
                await self.session.runtime.respond_to_request(ref, {"answers": {}})
            except Exception:
                log.exception("could not release provider request %s", ref)

    async def _unbound(self, event: ev.ProviderEvent) -> None:
        if isinstance(event, ev.RequestOpened):  # nobody can answer it: refuse, or the agent waits forever
            await self._refuse(event)
        log.debug("dropping %s for an unbound thread", type(event).__name__)

    async def _scope_step(self, binding: TurnBinding, event: ev.ProviderEvent) -> None:
        """A subagent's child scope: captured when its node starts and when it ends (after the event is
        recorded, outside its transaction)."""
        if self.checkpoints is None:
            return
        if isinstance(event, ev.ItemStarted) and event.kind == "subagent":
            node_id = binding.items.get(event.item_id)
            if node_id is not None:
                await self.checkpoints.node_started(node_id)
        elif isinstance(event, ev.ItemCompleted) and event.kind == "subagent":
            node_id = binding.items.get(event.item_id)
            if node_id is not None:
                await self.checkpoints.node_ended(node_id)
        elif isinstance(event, ev.TurnCompleted) and event.native_turn in binding.child_turns:
            await self.checkpoints.node_ended(binding.child_turns[event.native_turn])

    async def _refuse(self, event: ev.RequestOpened) -> None:
        response: dict[str, Any] = {"answers": {}} if event.kind == "user_input" else {"decision": "decline"}
        log.warning("declining %s request %s of unbound thread %s", event.kind, event.request_ref, event.native_thread)
        try:
            await self.session.runtime.respond_to_request(event.request_ref, response)
        except Exception:
            log.exception("could not decline provider request %s", event.request_ref)

    async def _write(self, pending: _Pending) -> None:
        """Apply the pending events of a partition in one transaction (nothing if there are none).

        If that transaction fails, the events are applied one by one: one event that cannot be written
        is logged and skipped, and the others (a turn's start, its end) still reach the log, as they did
        when every event had its own transaction."""
        binding, events = pending.binding, pending.take()
        if binding is None or not events:
            return
        try:
            await self._apply(binding, events)
        except Exception:
            if len(events) == 1:
                raise
            log.exception("ingest batch of %d events failed; applying them one by one", len(events))
            for event in events:
                await self._guarded(self._apply(binding, [event]))
        if self.on_usage is not None and any(isinstance(e, ev.UsageReported) for e in events):
            # Model calls were recorded: budgets are checked now, before the partition's next batch.
            await self._guarded(self.on_usage(binding.thread_id, binding.run_id))

    async def _apply(self, binding: TurnBinding, events: list[Any]) -> None:
        step = Step(command_type="ingest", thread_id=binding.thread_id, decide=self._decision(binding, events))
        unanswerable = await self.pipeline.execute(step)
        self.unanswerable.extend(unanswerable)

    def _decision(self, binding: TurnBinding, events: list[Any]) -> provider_events.Decision:
        """What `events` change (`engine.provider_events`), decided under the thread lock."""
        return provider_events.decision(
            binding, events, self.pipeline.clock.now(), self.structured_questions, self.pricing
        )

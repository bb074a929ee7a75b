"""A filtered subscriber's mailbox (streams.hub.Mailbox with `keep`): only kept rows are queued and counted, the
others leave one `Skipped` range each run of them, and a row over the bound still ends the subscriber. In
process: the queue alone, rows as a thread feed hands them out."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from threadloom.store.events import LogEvent
from threadloom.streams.budget import QueueBudget
from threadloom.streams.hub import Mailbox, Skipped, SlowConsumer

THREAD = uuid.uuid4()


def row(sequence: int, entity_type: str) -> LogEvent:
    return LogEvent(
        sequence, THREAD, None, f"{entity_type}.updated", entity_type, uuid.uuid4(), None, None, datetime.now(UTC), {}
    )


def box(keep: object = None, limit: int = 5) -> Mailbox:
    return Mailbox(limit, QueueBudget(1 << 20, 1 << 30).account(None), keep)  # type: ignore[arg-type]


def runs_only(event: LogEvent) -> bool:
    return event.entity_type == "run"


async def drain(mailbox: Mailbox) -> list[object]:
    out: list[object] = []
    while mailbox.items:
        item = await mailbox.get()
        out.append(item if isinstance(item, Skipped) else item.sequence)
    return out


async def test_rows_a_subscriber_does_not_keep_take_no_place_in_its_queue() -> None:
    mailbox = box(runs_only, limit=5)
    for sequence in range(1, 101):  # 100 rows, every 25th a run's: five times the bound, four of them kept
        mailbox.put(row(sequence, "run" if sequence % 25 == 0 else "thread"))
    assert not mailbox.overflowed and mailbox.rows == 4
    assert await drain(mailbox) == [Skipped(1, 24), 25, Skipped(26, 49), 50, Skipped(51, 74), 75, Skipped(76, 99), 100]
    assert mailbox.rows == 0 and mailbox.account.queued == 0


async def test_kept_rows_past_the_bound_still_end_the_subscriber() -> None:
    mailbox = box(runs_only, limit=5)
    for sequence in range(1, 8):
        mailbox.put(row(sequence, "run"))
    assert mailbox.overflowed
    with pytest.raises(SlowConsumer):
        await mailbox.get()


async def test_a_gap_in_the_skipped_rows_is_not_merged_over() -> None:
    mailbox = box(runs_only)
    for sequence in (1, 2, 5):  # 3 and 4 never reached the box: its reader must read them from the log
        mailbox.put(row(sequence, "thread"))
    assert await drain(mailbox) == [Skipped(1, 2), Skipped(5, 5)]


async def test_a_filter_that_fails_keeps_the_row() -> None:
    def broken(event: LogEvent) -> bool:
        raise KeyError("no such field")

    mailbox = box(broken)
    mailbox.put(row(1, "thread"))
    assert await drain(mailbox) == [1]  # its reader's own filter fails on it there, not the feed's task

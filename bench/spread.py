"""Benchmark: many subscriptions over many threads, each thread changing at a steady rate.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/spread.py [--k 10000] [--threads 1000] [--per-second 1] [--seconds 10] [--smoke]

The question it answers: with 10,000 live `threadEvents` subscriptions spread over 1,000 threads
(10 on each) and every thread changing once a second, does every subscriber get every event, in
order, within a second (p99 commit-to-client), with the server's memory bounded?

Producing 1,000 events a second through GraphQL mutations would measure the mutations on a
2-core machine, not the fan-out (and the producer shares the two cores with the server). So the
events come from another writer: ten times a second one SQL statement renames a tenth of the
threads — each gets a `thread.updated` event in the log with the next sequence of its thread and
its new row as payload, as the pipeline would write it — and a wake-up per thread goes over the
shared PostgreSQL channel (`BROADCAST_URL=postgres://…`, which the server listens on), as from
another replica. The server reads the woken threads' logs and fans the rows out exactly as for
its own commits.

Subscribers, sockets and figures are those of bench/fanout.py (it reuses its client processes and
its report): delivered/s, commit-to-client p50/p99 (receive time minus the event's `occurredAt`,
stamped just before the producer's transaction), RSS per idle subscription, CPU per process. The
floor is bench/ws_floor_app.py with the same sockets, layout and pacing (its producer is an HTTP
publish per event).

`--smoke` (200 subscriptions over 20 threads for 1 s) finishes in seconds, for tests/test_bench_smoke.py.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import fanout
import httpx
import orjson
import sqlalchemy as sa
from broadcaster import Broadcast
from common import bench_tmp, create_database

from threadloom.api import ids
from threadloom.store.db import Database
from threadloom.streams.notifier import CHANNEL


class LogProducer(fanout.Threadloom):
    """Threadloom as fan-out bench target, its events written into the log by this process."""

    def __init__(self, database_url: str, data_dir: Path, token: str, per_socket: int) -> None:
        super().__init__(database_url, data_dir, token, per_socket)
        self.database_url = database_url
        self.db: Database | None = None
        self.channel: Broadcast | None = None

    async def open(self) -> None:
        self.db = Database.from_url(self.database_url, pool_size=4)
        self.channel = Broadcast(self.database_url.replace("postgresql+asyncpg://", "postgres://"))
        await self.channel.connect()

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.disconnect()
        if self.db is not None:
            await self.db.dispose()

    async def latest(self, http: httpx.AsyncClient, topics: list[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        for start in range(0, len(topics), 100):  # a page of `nodes` holds at most 100 ids
            found.update(await super().latest(http, topics[start : start + 100]))
        return found

    async def produce_tick(self, topics: list[str], n: int) -> None:
        """One statement renaming each thread in `topics` once (a `thread.updated` event each), then a
        wake-up per thread on the channel."""
        assert self.db is not None and self.channel is not None
        thread_ids = []
        for topic in topics:
            found = ids.decode(topic)
            assert found is not None
            thread_ids.append(found[1])
        params = {"ids": thread_ids, "title": f"tick {n}", "now": datetime.now(UTC)}
        async with self.db.transaction() as tx:
            written = await tx.tuples(RENAME_MANY, params)
        for thread_id, project_id, sequence in written:
            wake = {"t": str(thread_id), "p": str(project_id), "s": sequence}
            await self.channel.publish(CHANNEL, orjson.dumps(wake).decode())


# A thread.updated event per thread, its payload the thread's new row, as the pipeline would log it
# (sequence from the thread's last_sequence under the row lock the UPDATE takes).
RENAME_MANY = sa.text(
    """
    WITH renamed AS (
        UPDATE threads SET title = :title, updated_at = :now, last_sequence = last_sequence + 1
        WHERE id = ANY(CAST(:ids AS uuid[]))
        RETURNING *
    )
    INSERT INTO events (thread_id, sequence, project_id, event_type, entity_type, entity_id, occurred_at, payload)
    SELECT id, last_sequence, project_id, 'thread.updated', 'thread', id, :now, to_jsonb(renamed) - 'last_sequence'
    FROM renamed
    RETURNING thread_id, project_id, sequence
    """
)


class SpreadBench(fanout.Bench):
    async def start(self, system: str) -> fanout.Target:
        if system != "threadloom":
            return await super().start(system)
        target = await asyncio.to_thread(
            LogProducer, self.database_url, self.tmp / "data", self.token, self.args.per_socket
        )
        await target.open()
        return target


def paced_producer(bench: SpreadBench, per_second: float, ticks_per_second: int) -> None:
    """Replace fanout's per-event producer with ticks: each tick writes a slice of the threads once."""

    async def produce_all(produce, jobs: list[str], producers: int, rate: float) -> None:  # type: ignore[no-untyped-def]
        target = bench.current
        if not isinstance(target, LogProducer):
            await original(produce, jobs, producers, rate)
            return
        per_tick = max(1, round(rate / ticks_per_second))
        started = time.perf_counter()
        for i, start in enumerate(range(0, len(jobs), per_tick)):
            delay = started + i / ticks_per_second - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await target.produce_tick(jobs[start : start + per_tick], i)

    original = fanout.produce_all
    fanout.produce_all = produce_all  # type: ignore[assignment]


async def main_async(args: argparse.Namespace, tmp: Path, pg: fanout.EmbeddedPostgres) -> None:
    database = "tl_spread"
    await create_database(pg.socket_dir, database)
    url = pg.url(database)
    os.environ["BROADCAST_URL"] = url.replace("postgresql+asyncpg://", "postgres://")
    bench = SpreadBench(args, pg, url, tmp)
    paced_producer(bench, args.per_second, ticks_per_second=10)
    original_start = bench.start

    async def start(system: str) -> fanout.Target:
        bench.current = await original_start(system)
        return bench.current

    bench.start = start  # type: ignore[method-assign]
    try:
        await bench.setup()
        topics = bench.threads[1 : 1 + args.threads]
        per_thread = max(1, round(args.per_second * args.seconds))
        args.rate = args.per_second * len(topics)
        print(
            f"{args.k:,} subscriptions over {len(topics):,} threads ({args.k // len(topics)} each), "
            f"{args.per_second:g} event/s per thread for {args.seconds:g} s ({args.rate:,.0f} events/s, "
            f"{args.rate * args.k / len(topics):,.0f} messages/s)",
            flush=True,
        )
        tl = await bench.run("threadloom", args.k, topics, per_thread)
        if isinstance(bench.current, LogProducer):
            await bench.current.close()
        fl = await bench.run("floor", args.k, topics, per_thread)
        fanout.print_pair(tl, fl)
        if tl.received != tl.expected or tl.gaps or tl.problems:
            raise RuntimeError(f"threadloom lost or misordered events: {'; '.join(tl.problems)}")
        lat = tl.latency_ms
        verdict = "met" if tl.received == tl.expected and lat.get("p99", float("inf")) < 1000 else "NOT met"
        print(
            f"  target p99 < 1 s with nothing lost: {verdict} (p99 {lat.get('p99', float('nan')):.0f} ms, "
            f"{tl.received:,} of {tl.expected:,} delivered, RSS/idle sub {tl.rss_per_sub:.1f} KiB)"
        )
    finally:
        await bench.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--k", type=int, default=10_000, help="subscriptions")
    parser.add_argument("--threads", type=int, default=1_000, help="threads they are spread over")
    parser.add_argument("--per-second", type=float, default=1.0, help="events per thread per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="how long the threads keep changing")
    parser.add_argument("--clients", type=int, default=2, help="client subprocesses holding the sockets")
    parser.add_argument("--per-socket", type=int, default=10, help="subscriptions per socket")
    parser.add_argument("--connect-concurrency", type=int, default=100)
    parser.add_argument("--smoke", action="store_true", help="200 subscriptions over 20 threads for 1 s")
    args = parser.parse_args()
    args.settle = 0.0 if args.smoke else 1.0  # as in fanout.py
    if args.smoke:
        args.k, args.threads, args.seconds, args.clients = 200, 20, 1.0, 1
    # What bench/fanout.py's Bench and workers read.
    args.deflate, args.producers, args.timeout, args.idle = False, 1, 120.0, 15.0
    args.max_connect, args.min_events, args.events, args.max_messages = 600.0, 1, 1, 10**9
    args.rate, args.step, args.budget, args.spread_events, args.smoke_fanout = 0.0, [], 0.0, 1, args.smoke
    # One admin token sets up the threads and holds every socket: its caps are raised to fit.
    os.environ.update(
        THREADLOOM_MUTATIONS_PER_MINUTE="100000000",
        THREADLOOM_MUTATION_BURST="10000000",
        THREADLOOM_MAX_CONNECTIONS_PER_TOKEN="1000000",
        THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN="1000000",
    )
    with bench_tmp("threadloom-spread-") as tmp, fanout.embedded_postgres(tmp) as pg:
        try:
            asyncio.run(main_async(args, tmp, pg))
        except (RuntimeError, TimeoutError, httpx.HTTPError) as error:
            print(f"FAILED: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Replay speed of `threadEvents`: how fast a reconnecting client catches up.

A thread with N events (written straight through the event log, as commands would);
one subscriber asks for everything after sequence 0 and the clock runs until its
`synchronized` item. The floor, measured in the same run, is the same rows read with raw
asyncpg in pages of 500 and encoded with orjson — what any replay must at least do.

    .venv/bin/python bench/replay.py [--events 9000] [--smoke]

`--smoke` replays 500 events (seconds, for tests/test_bench_smoke.py).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from pathlib import Path

import orjson

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from common import bench_tmp, create_database, embedded_postgres  # noqa: E402
from tests.support.graphql import CREATE_PROJECT, make_thread  # noqa: E402
from tests.support.server import Client, ServerProcess  # noqa: E402
from tests.support.ws import WsClient  # noqa: E402

from threadloom.api.ids import decode  # noqa: E402
from threadloom.domain.changes import Change  # noqa: E402
from threadloom.engine.clock import SystemClock  # noqa: E402
from threadloom.store import log, migrate  # noqa: E402
from threadloom.store import threads as thread_store  # noqa: E402
from threadloom.store.db import Database  # noqa: E402

QUERY = "subscription($t: ID!) { threadEvents(threadId: $t, afterSequence: 0) { sequence type occurredAt } }"


async def main(events: int) -> None:
    with bench_tmp() as tmp, embedded_postgres(tmp / "pg") as pg:
        await create_database(pg.socket_dir, "tl_replay")
        url = pg.url("tl_replay")
        db = Database.from_url(url)
        await migrate.upgrade(db.engine)
        server = ServerProcess(url, tmp / "data").wait_ready()
        client = Client(server.url, server.admin_token)
        try:
            (tmp / "ws").mkdir()  # a project's workspace must exist
            data = await client.gql(CREATE_PROJECT, {"name": "replay", "root": str(tmp / "ws")})
            thread = (await make_thread(client, data["createProject"]["project"]["id"], "t"))["id"]
            thread_uuid: uuid.UUID = decode(thread)[1]  # type: ignore[index]
            for batch in range(events // 500):
                async with db.transaction() as tx:
                    current = await thread_store.lock(tx, thread_uuid)
                    assert current is not None
                    changes = [Change("thread.renamed", current.evolve(title=f"{batch}-{i}")) for i in range(500)]
                    await log.append(
                        tx, changes, project_id=current.project_id, command_id=None, now=SystemClock().now()
                    )
            total = 1 + (events // 500) * 500
            results = []
            for _ in range(3):
                ws = await WsClient.connect(server.url, server.admin_token)
                started = time.perf_counter()
                await ws.subscribe(QUERY, {"t": thread})
                got = 0
                while True:
                    item = (await ws.receive())["payload"]["data"]["threadEvents"]
                    if item["type"] == "synchronized":
                        break
                    got += 1
                results.append(time.perf_counter() - started)
                await ws.close()
                assert got == total, (got, total)
            conn = await pg.connect("tl_replay")
            floors = []
            for _ in range(3):
                started = time.perf_counter()
                after, rows = 0, 0
                while True:
                    page = await conn.fetch(
                        "SELECT sequence, event_type, occurred_at FROM events WHERE thread_id = $1 AND sequence > $2 "
                        "ORDER BY sequence LIMIT 500",
                        thread_uuid,
                        after,
                    )
                    for row in page:
                        orjson.dumps(
                            {"sequence": row["sequence"], "type": row["event_type"], "occurredAt": row["occurred_at"]}
                        )
                    rows += len(page)
                    if len(page) < 500:
                        break
                    after = page[-1]["sequence"]
                floors.append(time.perf_counter() - started)
            await conn.close()
        finally:
            await client.aclose()
            server.stop()
            await db.dispose()
    best, floor = min(results), min(floors)
    print(f"threadEvents replay of {total:,} events over a real WebSocket (best of 3)")
    print(f"  threadloom  {best * 1000:8.1f} ms   {total / best:10,.0f} events/s")
    print(f"  floor       {floor * 1000:8.1f} ms   {total / floor:10,.0f} events/s   (raw asyncpg pages + orjson)")
    print(f"  ratio       {best / floor:8.1f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--events", type=int, default=9000)
    parser.add_argument("--smoke", action="store_true", help="500 events: finishes in seconds (for the tests)")
    args = parser.parse_args()
    asyncio.run(main(500 if args.smoke else args.events))

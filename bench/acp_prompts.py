"""Benchmark: what the ACP bridge adds to a prompt, against the same run driven over GraphQL as the floor.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/acp_prompts.py [--prompts 30] [--words 40] [--smoke]

`--smoke` runs 3 prompts per side, for tests/test_bench_smoke.py.

One real server (embedded PostgreSQL, the scripted agent) and two threads of one project:

- floor: the bridge's own GraphQL work done in this process on one graphql-transport-ws socket: read the
  thread's `latestSequence`, `sendMessage`, follow `threadEvents` from that sequence until the run ends;
- threadloom acp: `threadloom acp` as a subprocess, driven by the official ACP Python SDK as the editor:
  `session/prompt` until its answer. The difference is the bridge: JSON-RPC over stdio both ways, mapping
  each event to a session update, and the SDK validating every message on the editor's side.

Each prompt makes the agent answer `--words` words in chunks 2 ms apart, streamed as several updates. The sides take
turns, one prompt each (who goes first alternates), so a drift of the machine's load moves both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "src")]

from acp import text_block  # noqa: E402
from acp.stdio import spawn_agent_process  # noqa: E402
from common import bench_tmp, create_database, embedded_postgres  # noqa: E402
from tests.support.graphql import make_project  # noqa: E402
from tests.support.server import Client, ServerProcess  # noqa: E402

from threadloom.acp.documents import SEND, THREAD  # noqa: E402
from threadloom.acp.graphql_socket import GraphQLSocket  # noqa: E402
from threadloom.acp.updates import EVENTS, TERMINAL  # noqa: E402
from threadloom.store import migrate  # noqa: E402
from threadloom.store.db import Database  # noqa: E402


class Editor:
    """Counts what an editor would show."""

    def __init__(self) -> None:
        self.updates = 0

    async def session_update(self, session_id: str, update: Any, **_: Any) -> None:
        self.updates += 1

    def on_connect(self, conn: Any) -> None:
        pass


async def floor_prompt(socket: GraphQLSocket, thread: str, text: str) -> float:
    started = time.perf_counter()
    after = (await socket.execute(THREAD, {"t": thread}))["thread"]["latestSequence"]
    sent = await socket.execute(SEND, {"t": thread, "text": text, "d": {"queueAfterActive": True}})
    run = sent["sendMessage"]["run"]["id"]
    async for data in socket.subscribe(EVENTS, {"t": thread, "after": after}):
        entity = data["threadEvents"]["entity"] or {}
        if entity.get("id") == run and entity.get("runStatus") in TERMINAL:
            assert entity["runStatus"] == "COMPLETED", entity
            break
    return time.perf_counter() - started


def summary(name: str, samples: list[float]) -> float:
    ordered = sorted(samples[1:])  # the first prompt of a side warms its connection
    median = statistics.median(ordered)
    p90 = ordered[int(0.9 * (len(ordered) - 1))]
    print(f"  {name:<15} median {median * 1000:7.1f} ms   p90 {p90 * 1000:7.1f} ms   ({len(ordered)} prompts)")
    return median


async def main(prompts: int, words: int) -> None:
    # A 2 ms pause between the reply's chunks makes it stream as several message updates.
    text = "@delay 2\n@reply " + " ".join(f"word{i}" for i in range(words))
    with bench_tmp() as tmp, embedded_postgres(tmp / "pg") as pg:
        await create_database(pg.socket_dir, "tl_acp")
        url = pg.url("tl_acp")
        db = Database.from_url(url)
        await migrate.upgrade(db.engine)
        await db.dispose()
        server = ServerProcess(url, tmp / "data").wait_ready()
        token = str(server.admin_token)
        client = Client(server.url, token)
        home = tmp / "ws"
        home.mkdir()
        await make_project(client, "acp bench", str(home))
        socket = await GraphQLSocket.connect(server.url, token)
        editor = Editor()
        bare: list[float] = []
        bridged: list[float] = []
        try:
            command = (sys.executable, "-m", "threadloom", "acp", "--url", server.url)
            env = {"PATH": "/usr/bin:/bin", "THREADLOOM_TOKEN": token}
            async with spawn_agent_process(lambda _agent: editor, *command, env=env) as (conn, _process):
                await conn.initialize(protocol_version=1)
                session = (await conn.new_session(cwd=str(home))).session_id
                floor_thread = (await conn.new_session(cwd=str(home))).session_id  # a thread of the same kind

                async def via_acp() -> float:
                    started = time.perf_counter()
                    done = await conn.prompt(session_id=session, prompt=[text_block(text)])
                    assert done.stop_reason == "end_turn", done
                    return time.perf_counter() - started

                for i in range(prompts):
                    if i % 2 == 0:
                        bare.append(await floor_prompt(socket, floor_thread, text))
                        bridged.append(await via_acp())
                    else:
                        bridged.append(await via_acp())
                        bare.append(await floor_prompt(socket, floor_thread, text))
        finally:
            await socket.close()
            await client.aclose()
            server.stop()
    print(f"ACP prompt round trip, {prompts} prompts a side, alternating; each answers {words} words")
    print(f"  (the editor was sent {editor.updates / prompts:.1f} session updates per prompt)")
    base = summary("floor", bare)
    mine = summary("threadloom acp", bridged)
    added = statistics.median(b - f for b, f in zip(bridged[1:], bare[1:], strict=True))
    print("  floor: the same GraphQL operations on one socket in-process (no stdio, no mapping)")
    print(f"  ratio           median {mine / base:.2f}x")
    print(f"  added           median {added * 1000:.1f} ms per prompt (of the pairs' differences)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--prompts", type=int, default=30)
    parser.add_argument("--words", type=int, default=40)
    parser.add_argument("--smoke", action="store_true", help="3 prompts a side: seconds (for the tests)")
    args = parser.parse_args()
    asyncio.run(main(3 if args.smoke else args.prompts, args.words))

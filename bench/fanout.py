"""Benchmark: live subscription fan-out (threadEvents over graphql-transport-ws) against a floor.

Not a test. Run from anywhere with the project's virtualenv:

    .venv/bin/python bench/fanout.py [--k 100,1000] [--step 2000,4000] [--events 200] [--per-socket 10]

It starts an embedded PostgreSQL in a temp dir under /tmp, migrates a fresh database,
starts `python -m threadloom serve` (tests.support.server.ServerProcess) once for its
admin token, and creates one project and 1 + `--threads` threads over GraphQL. It first
measures what the listed cores deliver (busy loops alone and at once): on a shared VM two
listed cores can be worth one.

Then, for each K (subscriptions): `--k` always, then `--step` while the previous K held
(every subscription connected and synchronized, connect time under `--max-connect`, every
event delivered once and in order, delivered/s not under half the best so far) and the
projected time stays within `--budget`, it runs four phases, each on a freshly started server:

- Threadloom, one thread: K subscriptions of
  `threadEvents(threadId, afterSequence: <latestSequence>) { sequence type occurredAt }`
  on one thread; M renameThread mutations (one event each) from `--producers` concurrent
  HTTP tasks; every subscription receives every event. M is `--events`, lowered so that
  K x M stays within `--max-messages` (not under `--min-events`).
- the floor, one thread: the same sockets and messages against bench/ws_floor_app.py
  (plain Starlette, `uvicorn --ws websockets-sansio`, the same `next` message encoded once
  per event and written to every subscription of the topic; `POST /publish` is its producer).
- both again with the K subscriptions spread over `--threads` threads and
  `--spread-events` events per thread (each delivered to K / threads subscriptions).

Subscribers are real websockets in `--clients` client subprocesses (this script with
`--worker`), `--per-socket` subscriptions per socket (10 by default: a client app
multiplexes its subscriptions over one socket, and opening a socket costs Threadloom about
as much as a subscription; `--per-socket 1` for one socket per subscription; the server's
per-connection limit is raised to match). The clients offer permessage-deflate, as browsers
do (`--no-deflate`: they don't); the floor's uvicorn is started with whatever Threadloom's
answered in the warm-up (it declines since it turned compression off). The producer runs in
this process. Every subscription waits for its
`synchronized` item before any event is produced. (Threadloom sends its messages as binary
frames, since its encode_json returns bytes; the floor sends text frames of the same JSON.)

Figures per phase:
- delivered/s: messages received by all subscribers / (last delivery - first commit), where
  the first commit is the earliest `occurredAt` received;
- commit-to-client latency p50/p99: receive time (wall clock, in the client) - `occurredAt`
  (stamped by the server when the command starts, before its transaction: it includes the
  commit). Events are produced as fast as the producers go (`--rate` paces them), so under
  saturation the latency is mostly the backlog, up to the phase's drain time;
- RSS per idle subscription: the server's VmRSS (/proc/<pid>/status) after K idle,
  synchronized subscriptions minus before connecting (after a one-subscription warm-up), / K;
- CPU seconds of the server, the client processes, PostgreSQL and this process (producer)
  over the phase, from /proc via psutil, and the server's CPU per delivered message: the
  machine's cores are shared by all of them.

About 4 minutes on a 2-core machine; `--k 100 --step "" --events 50` for a quick look;
`--smoke` (K=20, a few events, no CPU capacity probe) finishes in seconds, for tests/test_bench_smoke.py.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import subprocess
import sys
import time
import traceback
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import websockets
from common import REPO, EmbeddedPostgres, bench_tmp, create_database, embedded_postgres

sys.path.insert(0, str(REPO))  # for tests.support
from tests.support.graphql import CREATE_PROJECT, CREATE_THREAD
from tests.support.server import Client, ServerProcess, free_port

from threadloom.store import migrate
from threadloom.store.db import Database

PROTOCOL = "graphql-transport-ws"
EVENTS = (
    "subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) "
    "{ sequence type occurredAt } }"
)
RENAME = "mutation($t: ID!, $n: String!) { renameThread(input: {threadId: $t, title: $n}) { userErrors { code } } }"
LATEST = "query($ids: [ID!]!) { nodes(ids: $ids) { ... on Thread { id latestSequence } } }"
WORKER_SCRIPT = str(Path(__file__).resolve())  # this file, run with --worker
BUCKET = 10_000  # latency histogram buckets per second (0.1 ms)


# ================================================================ client worker (subprocess)


@dataclass(slots=True)
class Group:
    """The subscriptions of one socket; `pending` counts those not yet synchronized (or failed)."""

    pending: int
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(slots=True)
class Sub:
    topic: str
    group: Group
    synced: bool = False
    ended: str | None = None
    last: int = 0


@dataclass(slots=True)
class Tally:
    received: int = 0
    gaps: int = 0  # items whose sequence is not the previous + 1
    first_occurred: float = float("inf")
    last_received: float = 0.0
    hist: Counter[int] = field(default_factory=Counter)


class Worker:
    """Holds sockets and subscriptions; driven by JSON lines on stdin, answers on stdout."""

    def __init__(self) -> None:
        self.sockets: list[Any] = []
        self.readers: list[asyncio.Task[None]] = []
        self.subs: list[Sub] = []
        self.replayed = 0  # items before `synchronized`: there should be none
        self.closed_early = 0
        self.closing = False
        self.tally = Tally()
        self.expected = 0
        self.done = asyncio.Event()

    def _settle(self, sub: Sub) -> None:
        sub.group.pending -= 1
        if sub.group.pending == 0:
            sub.group.done.set()

    def _end(self, sub: Sub, why: str) -> None:
        if sub.ended is None:
            sub.ended = why
            if not sub.synced:
                self._settle(sub)

    async def read(self, ws: Any, by_id: dict[str, Sub]) -> None:
        loads, parse, clock = orjson.loads, datetime.fromisoformat, time.time
        try:
            async for raw in ws:
                message = loads(raw)
                kind = message.get("type")
                if kind == "next":
                    sub = by_id[message["id"]]
                    payload = message["payload"]
                    item = (payload.get("data") or {}).get("threadEvents")
                    if item is None:
                        codes = [e.get("extensions", {}).get("code") for e in payload.get("errors", [])]
                        self._end(sub, f"errors {codes}")
                    elif sub.synced:
                        now = clock()
                        tally = self.tally
                        occurred = parse(item["occurredAt"]).timestamp()
                        tally.hist[round((now - occurred) * BUCKET)] += 1
                        if occurred < tally.first_occurred:
                            tally.first_occurred = occurred
                        tally.last_received = now
                        sequence = item["sequence"]
                        if sequence != sub.last + 1:
                            tally.gaps += 1
                        sub.last = sequence
                        tally.received += 1
                        if tally.received >= self.expected:
                            self.done.set()
                    elif item["type"] == "synchronized":
                        sub.synced = True
                        sub.last = item["sequence"]
                        self._settle(sub)
                    else:
                        self.replayed += 1
                elif kind == "ping":
                    await ws.send('{"type":"pong"}')
                elif kind in ("error", "complete"):
                    sub_or_none = by_id.get(str(message.get("id")))
                    if sub_or_none is not None:
                        self._end(sub_or_none, f"{kind} {message.get('payload')}")
        except websockets.ConnectionClosed:
            pass
        finally:
            if not self.closing:
                self.closed_early += 1
                for sub in by_id.values():
                    self._end(sub, "socket closed")

    async def connect(
        self,
        url: str,
        token: str,
        plan: list[list[Any]],
        per_socket: int,
        concurrency: int,
        deflate: bool,
        limit_s: float,
    ) -> dict[str, Any]:
        """Open sockets for `plan` ([topic, afterSequence] per subscription); wait until all are synchronized."""
        started = time.perf_counter()
        self.closing = False
        gate = asyncio.Semaphore(concurrency)
        errors: list[str] = []
        init = orjson.dumps({"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}).decode()

        async def open_socket(chunk: list[list[Any]]) -> None:
            async with gate:  # held until the socket's subscriptions are synchronized
                try:
                    ws = await websockets.connect(
                        url,
                        subprotocols=[PROTOCOL],  # type: ignore[list-item]
                        compression="deflate" if deflate else None,
                        max_size=None,
                        open_timeout=limit_s,
                        ping_interval=None,  # the server pings; the client answers
                        close_timeout=2,
                    )
                    await ws.send(init)
                    ack = orjson.loads(await asyncio.wait_for(ws.recv(), limit_s))
                    if ack.get("type") != "connection_ack":
                        raise ConnectionError(str(ack))
                except Exception as error:
                    errors.append(f"{type(error).__name__}: {error}")
                    return
                group = Group(len(chunk))
                by_id: dict[str, Sub] = {}
                for i, (topic, _) in enumerate(chunk, 1):
                    by_id[str(i)] = Sub(topic, group)
                self.subs.extend(by_id.values())
                self.sockets.append(ws)
                self.readers.append(asyncio.create_task(self.read(ws, by_id)))
                for i, (topic, after) in enumerate(chunk, 1):
                    variables = {"t": topic, "after": after}
                    message = {"id": str(i), "type": "subscribe", "payload": {"query": EVENTS, "variables": variables}}
                    await ws.send(orjson.dumps(message).decode())
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(group.done.wait(), limit_s)

        chunks = [plan[i : i + per_socket] for i in range(0, len(plan), per_socket)]
        await asyncio.gather(*(open_socket(c) for c in chunks))
        ended = Counter(s.ended for s in self.subs if s.ended is not None)
        return {
            "seconds": time.perf_counter() - started,
            "sockets": len(self.sockets),
            "synced": sum(s.synced and s.ended is None for s in self.subs),
            "connect_errors": len(errors),
            "error_sample": errors[:3],
            "ended": dict(ended.most_common(3)),
            "replayed": self.replayed,
        }

    def arm(self, per_topic: dict[str, int]) -> dict[str, Any]:
        """Expect `per_topic[topic]` events on every live subscription of that topic."""
        self.tally = Tally()
        self.expected = sum(per_topic.get(s.topic, 0) for s in self.subs if s.synced and s.ended is None)
        self.done.clear()
        if self.expected == 0:
            self.done.set()
        return {"expected": self.expected}

    async def wait(self, limit_s: float, idle: float) -> dict[str, Any]:
        """Until every expected item arrived, nothing arrived for `idle` s, or `limit_s` s passed."""
        deadline = time.monotonic() + limit_s
        seen, changed = -1, time.monotonic()
        while not self.done.is_set() and time.monotonic() < deadline:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.done.wait(), 0.5)
            if self.tally.received != seen:
                seen, changed = self.tally.received, time.monotonic()
            elif time.monotonic() - changed > idle:
                break
        t = self.tally
        return {
            "expected": self.expected,
            "received": t.received,
            "gaps": t.gaps,
            "first_occurred": t.first_occurred if t.received else None,
            "last_received": t.last_received,
            "hist": list(t.hist.items()),
            "ended": dict(Counter(s.ended for s in self.subs if s.ended is not None).most_common(3)),
            "n_ended": sum(s.ended is not None for s in self.subs),
            "sockets_closed": self.closed_early,
        }

    async def close(self) -> dict[str, Any]:
        self.closing = True
        await asyncio.gather(*(ws.close() for ws in self.sockets), return_exceptions=True)
        for task in self.readers:
            task.cancel()
        await asyncio.gather(*self.readers, return_exceptions=True)
        closed = len(self.sockets)
        self.sockets, self.readers, self.subs = [], [], []
        self.replayed = self.closed_early = 0
        return {"closed": closed}


async def worker_main() -> None:
    worker = Worker()
    out = sys.stdout
    while True:
        line = await asyncio.to_thread(sys.stdin.readline)
        if not line:
            break
        command = orjson.loads(line)
        op = command.pop("op")
        try:
            if op == "connect":
                reply = await worker.connect(**command)
            elif op == "arm":
                reply = worker.arm(**command)
            elif op == "wait":
                reply = await worker.wait(**command)
            elif op == "close":
                reply = await worker.close()
            else:
                reply = {"error": f"unknown op {op}"}
        except Exception:
            reply = {"error": traceback.format_exc()}
        out.write(orjson.dumps(reply).decode() + "\n")
        out.flush()
    await worker.close()


# ================================================================ coordinator


class WorkerProc:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc

    @classmethod
    async def start(cls) -> WorkerProc:
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            WORKER_SCRIPT,
            "--worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            limit=2**26,
        )
        return cls(proc)

    async def call(self, op: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(orjson.dumps({"op": op, **args}) + b"\n")
        await self.proc.stdin.drain()
        line = await self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"client worker {self.proc.pid} exited ({self.proc.returncode})")
        reply: dict[str, Any] = orjson.loads(line)
        if "error" in reply:
            raise RuntimeError(f"client worker {self.proc.pid}: {reply['error']}")
        return reply

    async def stop(self) -> None:
        if self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


# ---------------------------------------------------------------- processes, CPU, memory


def rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


def _cpu(pid: int, reaped_children: bool = False) -> float:
    try:
        t = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return 0.0
    return float(t.user + t.system + (t.children_user + t.children_system if reaped_children else 0.0))


def cpu_snapshot(server: int, clients: list[int], postmaster: int) -> dict[str, float]:
    pm = psutil.Process(postmaster)
    return {
        "server": _cpu(server),
        "clients": sum(_cpu(pid) for pid in clients),
        # exited backends are in the postmaster's children_* once it has reaped them
        "postgres": _cpu(postmaster, True) + sum(_cpu(c.pid) for c in pm.children()),
        "producer": _cpu(os.getpid()),
    }


def start_floor(port: int, log: Path, deflate: bool) -> subprocess.Popen[bytes]:
    with log.open("wb") as err:  # a file, not a pipe nobody reads
        return subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "bench.ws_floor_app:app",
                "--ws",
                "websockets-sansio",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-access-log",
                "--log-level",
                "warning",
                "--ws-per-message-deflate",
                "true" if deflate else "false",
            ],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=err,
        )


def wait_floor(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            err = log.read_text(errors="replace")
            raise RuntimeError(f"floor server exited {proc.returncode}:\n{err[-3000:]}")
        try:
            if httpx.get(url + "/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"{url} did not become ready")


def stop_process(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


# ---------------------------------------------------------------- the system under test and the floor


class Target:
    """A freshly started server: its URL, pid, a producer of one event, the sequences to subscribe after."""

    name: str
    url: str
    pid: int

    async def produce(self, http: httpx.AsyncClient, topic: str, n: int) -> None:
        raise NotImplementedError

    async def latest(self, http: httpx.AsyncClient, topics: list[str]) -> dict[str, int]:
        return dict.fromkeys(topics, 0)

    def stop(self) -> ServerLog:
        """Stop it; the warnings and errors it logged, counted by kind."""
        raise NotImplementedError


@dataclass(frozen=True, slots=True)
class ServerLog:
    errors: list[str]  # "N x <level> <logger>: <message> -> <exception>", the most frequent first
    warnings: list[str]


def read_log(lines: list[str]) -> ServerLog:
    """Threadloom's JSON log lines at warning and above (a floor's ERROR lines), counted by message + exception."""
    kinds: dict[str, Counter[str]] = {"errors": Counter(), "warnings": Counter()}
    for line in lines:
        if line.startswith("{"):
            try:
                record = orjson.loads(line)
            except orjson.JSONDecodeError:
                continue
            level = record.get("level")
            if level in ("warning", "error", "critical"):
                exc = str(record.get("exc", "")).strip().splitlines()
                text = f"{record.get('logger')}: {record.get('msg', '')}" + (f" -> {exc[-1]}" if exc else "")
                kinds["warnings" if level == "warning" else "errors"][text[:240]] += 1
        elif line.startswith(("ERROR", "Traceback")):
            kinds["errors"][line[:200]] += 1
    return ServerLog(*([f"{n} x {kind}" for kind, n in kinds[key].most_common(3)] for key in ("errors", "warnings")))


class Threadloom(Target):
    name = "threadloom"

    def __init__(self, database_url: str, data_dir: Path, token: str, per_socket: int) -> None:
        # One admin token holds every socket and produces every event: its per-token caps and
        # mutation rate (docs/security.md, "Limits") are raised to fit the run.
        env = {
            "THREADLOOM_MAX_SUBSCRIPTIONS": str(max(100, per_socket)),
            "THREADLOOM_MAX_CONNECTIONS_PER_TOKEN": "1000000",
            "THREADLOOM_MAX_SUBSCRIPTIONS_PER_TOKEN": "1000000",
            "THREADLOOM_MUTATIONS_PER_MINUTE": "100000000",
            "THREADLOOM_MUTATION_BURST": "10000000",
        }
        self.server = ServerProcess(database_url, data_dir, env=env)
        self.server.wait_ready(60)
        self.url, self.pid = self.server.url, self.server.proc.pid
        self.headers = {"authorization": f"Bearer {token}"}

    async def produce(self, http: httpx.AsyncClient, topic: str, n: int) -> None:
        body = {"query": RENAME, "variables": {"t": topic, "n": f"renamed {n}"}}
        response = await http.post(self.url + "/graphql", json=body, headers=self.headers)
        data = response.json()
        if response.status_code != 200 or "errors" in data or data["data"]["renameThread"]["userErrors"]:
            raise RuntimeError(f"renameThread failed: {response.status_code} {data}")

    async def latest(self, http: httpx.AsyncClient, topics: list[str]) -> dict[str, int]:
        body = {"query": LATEST, "variables": {"ids": topics}}
        response = await http.post(self.url + "/graphql", json=body, headers=self.headers)
        nodes = response.json()["data"]["nodes"]
        return {n["id"]: n["latestSequence"] for n in nodes}

    def stop(self) -> ServerLog:
        self.server.stop()
        return read_log(self.server.log)


class Floor(Target):
    name = "floor"

    def __init__(self, log: Path, deflate: bool) -> None:
        port = free_port()
        self.log = log
        self.proc = start_floor(port, log, deflate)
        self.url, self.pid = f"http://127.0.0.1:{port}", self.proc.pid
        wait_floor(self.url, self.proc, log)

    async def produce(self, http: httpx.AsyncClient, topic: str, n: int) -> None:
        response = await http.post(self.url + "/publish", content=orjson.dumps({"t": topic}))
        response.raise_for_status()

    def stop(self) -> ServerLog:
        stop_process(self.proc)
        return read_log(self.log.read_text(errors="replace").splitlines())


# ---------------------------------------------------------------- one phase


@dataclass(slots=True)
class Phase:
    system: str
    k: int
    threads: int
    per_thread: int  # events per thread
    connect_s: float = 0.0
    synced: int = 0
    connect_errors: int = 0
    rss_before: int = 0  # KiB
    rss_after: int = 0
    expected: int = 0
    received: int = 0
    gaps: int = 0
    window_s: float = 0.0
    produce_s: float = 0.0
    latency_ms: dict[str, float] = field(default_factory=dict)
    cpu: dict[str, float] = field(default_factory=dict)
    cpu_wall: float = 0.0
    problems: list[str] = field(default_factory=list)  # any: this K did not hold
    notes: list[str] = field(default_factory=list)

    @property
    def events(self) -> int:
        return self.threads * self.per_thread

    @property
    def rate(self) -> float:
        return self.received / self.window_s if self.window_s > 0 else 0.0

    @property
    def rss_per_sub(self) -> float:
        return (self.rss_after - self.rss_before) / self.k

    @property
    def held(self) -> bool:
        return not self.problems


def percentiles(hist: Counter[int], qs: tuple[float, ...]) -> dict[str, float]:
    total = sum(hist.values())
    out: dict[str, float] = {}
    if not total:
        return out
    keys = sorted(hist)
    for q in qs:
        rank, seen = q * total, 0
        for key in keys:
            seen += hist[key]
            if seen >= rank:
                out[f"p{round(q * 100)}"] = key / BUCKET * 1000
                break
    out["max"] = keys[-1] / BUCKET * 1000
    return out


async def warm_up(target: Target, http: httpx.AsyncClient, token: str, topic: str) -> bool:
    """One subscription, one event: imports, caches and code paths are warm before the baseline RSS.

    Returns whether the server accepted permessage-deflate (the client offers it, as browsers do).
    """
    url = target.url.replace("http://", "ws://") + "/graphql"
    async with websockets.connect(url, subprotocols=[PROTOCOL], max_size=None) as ws:  # type: ignore[list-item]
        assert ws.response is not None
        deflate = "permessage-deflate" in ws.response.headers.get("Sec-WebSocket-Extensions", "")
        init = {"type": "connection_init", "payload": {"authorization": f"Bearer {token}"}}
        await ws.send(orjson.dumps(init).decode())
        assert orjson.loads(await ws.recv())["type"] == "connection_ack"
        after = (await target.latest(http, [topic]))[topic]
        variables = {"t": topic, "after": after}
        subscribe = {"id": "1", "type": "subscribe", "payload": {"query": EVENTS, "variables": variables}}
        await ws.send(orjson.dumps(subscribe).decode())
        item = orjson.loads(await asyncio.wait_for(ws.recv(), 30))["payload"]["data"]["threadEvents"]
        assert item["type"] == "synchronized", item
        await target.produce(http, topic, -1)
        item = orjson.loads(await asyncio.wait_for(ws.recv(), 30))["payload"]["data"]["threadEvents"]
        assert item["type"] != "synchronized", item
    return deflate


async def produce_all(
    produce: Callable[[str, int], Awaitable[None]], jobs: list[str], producers: int, rate: float
) -> None:
    """`jobs` (one topic per event) by `producers` concurrent tasks; paced at `rate` events/s when > 0."""
    started = time.perf_counter()
    index = 0

    async def producer() -> None:
        nonlocal index
        while index < len(jobs):
            i = index
            index += 1
            if rate > 0:
                delay = started + i / rate - time.perf_counter()
                if delay > 0:
                    await asyncio.sleep(delay)
            await produce(jobs[i], i)

    await asyncio.gather(*(producer() for _ in range(producers)))


class Bench:
    def __init__(self, args: argparse.Namespace, pg: EmbeddedPostgres, database_url: str, tmp: Path) -> None:
        self.args = args
        self.pg = pg
        self.postmaster = int(pg.server.get_pid())
        self.database_url = database_url
        self.tmp = tmp
        self.token = ""
        self.threads: list[str] = []
        self.workers: list[WorkerProc] = []
        self.server_deflate = True  # whether Threadloom's server accepts permessage-deflate (seen in the warm-up)
        self.http = httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=args.producers + 2))

    async def setup(self) -> None:
        db = Database.from_url(self.database_url, pool_size=1)
        try:
            await migrate.upgrade(db.engine)
        finally:
            await db.dispose()
        server = await asyncio.to_thread(ServerProcess, self.database_url, self.tmp / "data")
        try:
            await asyncio.to_thread(server.wait_ready, 60)
            assert server.admin_token is not None, "no admin token printed on an empty database"
            self.token = server.admin_token
            client = Client(server.url, self.token)
            try:
                (self.tmp / "workspace").mkdir(exist_ok=True)  # a project's workspace must exist
                data = await client.gql(CREATE_PROJECT, {"name": "fanout", "root": str(self.tmp / "workspace")})
                project = data["createProject"]["project"]["id"]
                for i in range(1 + self.args.threads):
                    data = await client.gql(CREATE_THREAD, {"projectId": project, "title": f"thread {i}"})
                    self.threads.append(data["createThread"]["thread"]["id"])
            finally:
                await client.aclose()
        finally:
            await asyncio.to_thread(server.stop)
        self.workers = await asyncio.gather(*(WorkerProc.start() for _ in range(self.args.clients)))

    async def close(self) -> None:
        await asyncio.gather(*(w.stop() for w in self.workers))
        await self.http.aclose()

    async def start(self, system: str) -> Target:
        if system == "threadloom":
            return await asyncio.to_thread(
                Threadloom, self.database_url, self.tmp / "data", self.token, self.args.per_socket
            )
        return await asyncio.to_thread(Floor, self.tmp / "floor.log", self.server_deflate)

    async def run(self, system: str, k: int, topics: list[str], per_thread: int) -> Phase:
        args = self.args
        phase = Phase(system, k, len(topics), per_thread)
        target = await self.start(system)
        try:
            deflate = await warm_up(target, self.http, self.token, topics[0])
            if system == "threadloom":
                self.server_deflate = deflate  # the floor's uvicorn is started with the same setting
            latest = await target.latest(self.http, topics)
            await asyncio.sleep(args.settle / 2)  # the server's RSS settles before it is read
            phase.rss_before = rss_kib(target.pid)

            # K subscriptions, round-robin over the topics, then over the client processes.
            plan = [[topics[i % len(topics)], latest[topics[i % len(topics)]]] for i in range(k)]
            n = len(self.workers)
            started = time.perf_counter()
            replies = await asyncio.gather(
                *(
                    w.call(
                        "connect",
                        url=target.url.replace("http://", "ws://") + "/graphql",
                        token=self.token,
                        plan=plan[i::n],
                        per_socket=args.per_socket,
                        concurrency=max(1, args.connect_concurrency // n),
                        deflate=args.deflate,
                        limit_s=args.max_connect,
                    )
                    for i, w in enumerate(self.workers)
                )
            )
            phase.connect_s = time.perf_counter() - started
            phase.synced = sum(r["synced"] for r in replies)
            phase.connect_errors = sum(r["connect_errors"] for r in replies)
            if phase.synced < k:
                samples = [e for r in replies for e in r["error_sample"]] + [str(r["ended"]) for r in replies]
                phase.problems.append(f"{k - phase.synced} of {k} not synchronized ({'; '.join(samples)[:300]})")
            if any(r["replayed"] for r in replies):
                phase.problems.append(f"{sum(r['replayed'] for r in replies)} items replayed before synchronized")
            if phase.connect_s > args.max_connect:
                phase.problems.append(f"connecting took {phase.connect_s:.0f} s > --max-connect {args.max_connect:.0f}")
            await asyncio.sleep(args.settle)
            phase.rss_after = rss_kib(target.pid)

            armed = await asyncio.gather(
                *(w.call("arm", per_topic=dict.fromkeys(topics, per_thread)) for w in self.workers)
            )
            phase.expected = sum(a["expected"] for a in armed)
            jobs = [t for _ in range(per_thread) for t in topics]  # round-robin over the topics
            pids = [w.proc.pid for w in self.workers]
            cpu0, wall0 = cpu_snapshot(target.pid, pids, self.postmaster), time.perf_counter()

            async def produce(topic: str, i: int) -> None:
                await target.produce(self.http, topic, i)

            await produce_all(produce, jobs, args.producers, args.rate)
            phase.produce_s = time.perf_counter() - wall0
            results = await asyncio.gather(
                *(w.call("wait", limit_s=args.timeout, idle=args.idle) for w in self.workers)
            )
            cpu1 = cpu_snapshot(target.pid, pids, self.postmaster)
            phase.cpu_wall = time.perf_counter() - wall0
            phase.cpu = {key: cpu1[key] - cpu0[key] for key in cpu0}

            phase.received = sum(r["received"] for r in results)
            phase.gaps = sum(r["gaps"] for r in results)
            firsts = [r["first_occurred"] for r in results if r["first_occurred"] is not None]
            last = max(r["last_received"] for r in results)
            phase.window_s = last - min(firsts) if firsts else 0.0
            hist: Counter[int] = Counter()
            for r in results:
                hist.update({int(key): count for key, count in r["hist"]})
            phase.latency_ms = percentiles(hist, (0.5, 0.99))
            if phase.received < phase.expected:
                phase.problems.append(f"delivered {phase.received:,} of {phase.expected:,} messages")
            if phase.gaps:
                phase.problems.append(f"{phase.gaps} items out of sequence")
            ended = sum(r["n_ended"] for r in results)
            if ended:
                reasons = "; ".join(str(r["ended"]) for r in results if r["ended"])[:300]
                closed = sum(r["sockets_closed"] for r in results)
                phase.problems.append(f"{ended} subscriptions ended, {closed} sockets closed by the server ({reasons})")
        finally:
            await asyncio.gather(*(w.call("close") for w in self.workers), return_exceptions=True)
            logged = await asyncio.to_thread(target.stop)
            if logged.errors:
                phase.problems.append("server logged errors: " + "; ".join(logged.errors))
            if logged.warnings:
                phase.notes.append("server logged warnings: " + "; ".join(logged.warnings))
        return phase


# ---------------------------------------------------------------- report


def describe(p: Phase) -> str:
    lat = p.latency_ms
    return (
        f"{p.rate:9,.0f} msg/s  p50 {lat.get('p50', float('nan')):7.1f} ms  p99 {lat.get('p99', float('nan')):7.1f} ms"
    )


def cpu_line(p: Phase) -> str:
    c, wall = p.cpu, p.cpu_wall
    busy = sum(c.values())
    per_msg = 1e6 * c["server"] / p.received if p.received else float("nan")
    return (
        f"CPU over {wall:4.1f} s: server {c['server']:5.1f} s ({100 * c['server'] / wall:3.0f}%), "
        f"clients {c['clients']:5.1f} s ({100 * c['clients'] / wall:3.0f}%), "
        f"postgres {c['postgres']:4.1f} s, producer {c['producer']:4.1f} s; "
        f"{busy / wall:.2f} of {psutil.cpu_count()} cores busy; server {per_msg:.0f} us/msg"
    )


def print_pair(tl: Phase, fl: Phase) -> None:
    layout = "1 thread" if tl.threads == 1 else f"{tl.threads} threads"
    print()
    print(
        f"K={tl.k:,} on {layout}: {tl.per_thread} events/thread, {tl.events:,} events, "
        f"{tl.expected:,} messages expected"
    )
    print(
        f"  threadloom  {describe(tl)}   connect {tl.connect_s:5.1f} s ({tl.k / tl.connect_s:5.0f}/s)  "
        f"RSS/idle sub {tl.rss_per_sub:6.1f} KiB ({tl.rss_before / 1024:.0f} -> {tl.rss_after / 1024:.0f} MiB)  "
        f"commits/s {tl.events / tl.produce_s:6.0f}"
    )
    print(
        f"  floor       {describe(fl)}   connect {fl.connect_s:5.1f} s ({fl.k / fl.connect_s:5.0f}/s)  "
        f"RSS/idle sub {fl.rss_per_sub:6.1f} KiB ({fl.rss_before / 1024:.0f} -> {fl.rss_after / 1024:.0f} MiB)  "
        f"publishes/s {fl.events / fl.produce_s:6.0f}"
    )
    ratio = fl.rate / tl.rate if tl.rate else float("inf")
    print(f"  ratio       {ratio:.1f}x (floor delivered msg/s over threadloom)")
    print(f"  threadloom  {cpu_line(tl)}")
    print(f"  floor       {cpu_line(fl)}")
    for p in (tl, fl):
        for problem in p.problems:
            print(f"  PROBLEM ({p.system}): {problem}")
        for note in p.notes:
            print(f"  note ({p.system}): {note}")


def print_summary(pairs: list[tuple[Phase, Phase]], stop_reason: str) -> None:
    print()
    print("summary (delivered msg/s, p50/p99 commit-to-client ms, RSS KiB per idle subscription)")
    print(
        f"  {'K':>6} {'layout':>10} | {'threadloom':>10} {'p50':>7} {'p99':>7} {'RSS/sub':>7} | {'floor':>9} "
        f"{'p50':>7} {'p99':>7} | ratio"
    )
    for tl, fl in pairs:
        layout = "1 thread" if tl.threads == 1 else f"{tl.threads} threads"
        ok = "" if tl.held else "  (did not hold)"
        print(
            f"  {tl.k:>6,} {layout:>10} | {tl.rate:10,.0f} {tl.latency_ms.get('p50', 0):7.1f} "
            f"{tl.latency_ms.get('p99', 0):7.1f} {tl.rss_per_sub:7.1f} | {fl.rate:9,.0f} "
            f"{fl.latency_ms.get('p50', 0):7.1f} {fl.latency_ms.get('p99', 0):7.1f} | "
            f"{fl.rate / tl.rate if tl.rate else float('inf'):4.1f}x{ok}"
        )
    print(f"  stepping: {stop_reason}")


# ---------------------------------------------------------------- main


BUSY_LOOP = """
import time
start, cpu = time.perf_counter(), time.process_time()
n = 0
while time.perf_counter() - start < {seconds}:
    n += 1
print(n, (time.process_time() - cpu) / (time.perf_counter() - start))
"""


def cpu_capacity(seconds: float = 1.0) -> str:
    """What the listed cores deliver: one busy loop alone, then one per listed core at once."""
    cores = psutil.cpu_count() or 1

    def loops(n: int) -> list[tuple[int, float]]:
        code = BUSY_LOOP.format(seconds=seconds)
        procs = [subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True) for _ in range(n)]
        out = [proc.communicate()[0].split() for proc in procs]
        return [(int(o[0]), float(o[1])) for o in out]

    (alone, alone_cpu), together = loops(1)[0], loops(cores)
    work = sum(n for n, _ in together) / alone
    busy = sum(c for _, c in together)
    return (
        f"CPU: {cores} cores listed; {cores} busy loops at once do {work:.2f}x the work of one alone "
        f"(/proc: {alone_cpu:.2f} cores busy alone, {busy:.2f} together)"
    )


def parse_ks(text: str) -> list[int]:
    return [int(x.replace("_", "")) for x in text.split(",") if x.strip()]


async def main_async(args: argparse.Namespace, tmp: Path, pg: EmbeddedPostgres) -> None:
    t_start = time.perf_counter()
    database = "tl_fanout"
    await create_database(pg.socket_dir, database)
    bench = Bench(args, pg, pg.url(database), tmp)
    pairs: list[tuple[Phase, Phase]] = []
    stop_reason = "ran every K asked for"
    try:
        print("CPU: not measured (--smoke)" if args.smoke else cpu_capacity(), flush=True)
        await bench.setup()
        print(
            f"setup: embedded PostgreSQL, migrated, 1 project + {1 + args.threads} threads, "
            f"{args.clients} client processes: {time.perf_counter() - t_start:.1f} s",
            flush=True,
        )
        ks = [(k, False) for k in args.k] + [(k, True) for k in args.step]
        rounds: list[list[tuple[Phase, Phase]]] = []  # per K: (one thread, spread)
        round_walls: list[float] = []
        best = 0.0
        for index, (k, stepping) in enumerate(ks):
            elapsed = time.perf_counter() - t_start
            if stepping and rounds:
                last = rounds[-1]
                single_tl = last[0][0]
                if not all(tl.held for tl, _ in last):
                    stop_reason = f"stopped before K={k:,}: K={single_tl.k:,} did not hold"
                    break
                if single_tl.rate < best / 2:
                    stop_reason = f"stopped before K={k:,}: K={single_tl.k:,} delivered under half the best msg/s"
                    break
                # connecting grows with K; the rest (messages capped, commits fixed, server starts) hardly
                connect = sum(p.connect_s for pair in last for p in pair)
                projected = (round_walls[-1] - connect) + connect * k / single_tl.k
                if elapsed + projected > args.budget:
                    stop_reason = (
                        f"stopped before K={k:,}: projected {projected:.0f} s would pass --budget {args.budget:.0f} s"
                    )
                    break
            single = [bench.threads[0]]
            spread = bench.threads[1 : 1 + args.threads]
            m = max(args.min_events, min(args.events, args.max_messages // k))
            rounds.append([])
            round_started = time.perf_counter()
            for topics, per_thread in ((single, m), (spread, args.spread_events)):
                tl = await bench.run("threadloom", k, topics, per_thread)
                fl = await bench.run("floor", k, topics, per_thread)
                rounds[-1].append((tl, fl))
                pairs.append((tl, fl))
                if len(topics) == 1:
                    best = max(best, tl.rate)
                print_pair(tl, fl)
                print(f"  [{time.perf_counter() - t_start:.0f} s elapsed]", flush=True)
            round_walls.append(time.perf_counter() - round_started)
            if index == len(ks) - 1:
                stop_reason = f"ran every K asked for (largest {k:,})"
    finally:
        await bench.close()
    print_summary(pairs, stop_reason)
    held = [k for k in dict.fromkeys(tl.k for tl, _ in pairs) if all(tl.held for tl, _ in pairs if tl.k == k)]
    if held:
        print(f"  largest K that held here (both layouts): {max(held):,}")
    if args.deflate:
        answer = "accepted" if bench.server_deflate else "declined"
        compression = f"permessage-deflate offered by the clients, {answer} by Threadloom (and so by the floor)"
    else:
        compression = "permessage-deflate not offered by the clients"
    pacing = f"paced at {args.rate:g} events/s" if args.rate else "unpaced"
    print(f"  clients: {args.clients} processes, {args.per_socket} subscription(s) per socket; {compression}")
    print(f"  producers: {args.producers} HTTP tasks, {pacing}")
    print(f"total run time {time.perf_counter() - t_start:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--k", type=parse_ks, default=[100, 1000], help="subscription counts always run")
    parser.add_argument(
        "--step", type=parse_ks, default=[2000, 4000], help="larger K tried in order while the previous held"
    )
    parser.add_argument("--events", type=int, default=200, help="events on the one thread (M)")
    parser.add_argument(
        "--max-messages",
        type=int,
        default=20_000,
        help="cap on K x M for the one-thread phases: M is lowered for large K (not under --min-events)",
    )
    parser.add_argument("--min-events", type=int, default=10)
    parser.add_argument("--threads", type=int, default=100, help="threads in the spread phases")
    parser.add_argument("--spread-events", type=int, default=3, help="events per thread in the spread phases")
    parser.add_argument("--clients", type=int, default=1, help="client subprocesses holding the sockets")
    parser.add_argument("--per-socket", type=int, default=10, help="subscriptions per socket")
    parser.add_argument("--connect-concurrency", type=int, default=100, help="sockets opening at once, in all")
    parser.add_argument("--no-deflate", dest="deflate", action="store_false", help="clients do not offer compression")
    parser.add_argument("--producers", type=int, default=4, help="concurrent producer tasks")
    parser.add_argument("--rate", type=float, default=0, help="events/s to pace the producers at (0: unpaced)")
    parser.add_argument(
        "--max-connect", type=float, default=60, help="seconds; K does not hold when connecting is slower"
    )
    parser.add_argument("--timeout", type=float, default=120, help="seconds to wait for delivery per phase")
    parser.add_argument("--idle", type=float, default=15, help="give up a phase after this long with no delivery")
    parser.add_argument("--budget", type=float, default=300, help="seconds; no larger K when it would pass this")
    parser.add_argument("--smoke", action="store_true", help="K=20 and a few events: seconds (for the tests)")
    args = parser.parse_args()
    args.settle = 0.0 if args.smoke else 1.0  # seconds for the RSS to settle; its figure means nothing in a smoke
    if args.smoke:
        args.k, args.step, args.events, args.min_events = [20], [], 10, 5
        args.threads, args.spread_events, args.timeout, args.idle = 4, 2, 30, 10
    if args.worker:
        asyncio.run(worker_main())
        return 0
    with bench_tmp("threadloom-fanout-") as tmp, embedded_postgres(tmp) as pg:
        try:
            asyncio.run(main_async(args, tmp, pg))
        except (RuntimeError, TimeoutError) as error:
            print(f"FAILED: {error}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

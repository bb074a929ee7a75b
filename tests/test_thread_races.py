"""Random interleavings of structural operations raced at one thread through the real API of a real server.

Each run draws new rounds from its seed (tests/support/seeds.py; `THREADLOOM_TEST_SEED` replays one): in each
round two to four requests go out at once — sendMessage in every dispatch mode, stopThread, resumeQueue,
rollbackToRun, forkThread, a message on a fork, mergeBack, switchProvider, and a wait for the thread to go
idle — so they race each other and the runs they start. Every answer must be data or a typed userError, never
a server error.

Chance alone leaves whole operations out (a mergeBack needs a fork with a finished run; a steer needs a live
turn), so forced rounds, placed among the random ones by the seed, set each one up and race it: a fork, a
message on it and a mergeBack raced against sends, rollbacks and Stops; a steer into a turn that waits for one
(`@await-steer`); a rollback to a finished run; every dispatch mode. Forced rounds are tried again (a few
times at most) until each has happened, and the test fails when one never did (`FLOORS`).

Once the thread and its forks are quiet the invariants are checked as a user (and an auditor) would:

- no run is left active, and none queued unless the queue is held for a reason; every interrupted run was
  asked to stop (or says why it was ended), every failed one says why;
- the workspace holds exactly the files of the last operation that set them: the checkpoint captured at the
  end of the last run, or the one a later rollback went back to; every completed run's checkpoint holds the
  file that run wrote. Each fork's own folder likewise holds its last checkpoint (or its fork point's files);
- the agent's conversation (`@recall`) holds no message of a rolled-back run and the message of every run that
  completed and was not rolled back (itself, or quoted in a handoff); a fork's holds its fork point and its
  own finished runs, and nothing of the runs after its fork point;
- the server logged no error, and no outbox effect failed, waits to retry or was retried;
- the event log replays to the same projections.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import random
import re
import subprocess
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import seeds, server_log
from tests.support.db import assert_log_replays, troubled_effects, unfinished_effects
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished
from tests.support.server import Client, providers_env, serving
from tests.support.waiting import until
from threadloom.api.ids import decode

# Three scripted instances: one that can do everything, one that rolls back by forking (no native rollback),
# one that steers by restarting the turn (no active steering).
PROVIDERS = """
[instances.a]
driver = "scripted"

[instances.b]
driver = "scripted"
supports_native_rollback = false

[instances.c]
driver = "scripted"
supports_active_steering = false
"""
UNLIMITED = {
    f"THREADLOOM_{name}": "1000000"
    for name in ("MUTATIONS_PER_MINUTE", "MUTATION_BURST", "RUN_STARTS_PER_MINUTE", "RUN_START_BURST")
}
ROUNDS = 12
MODES = ("auto", "startImmediately", "queueAfterActive", "steerActive", "restartActive")
TARGETED = ("steerActive", "restartActive")
# What every run must have done at least once (each counted from a successful answer, the steer from the
# agent's own reply inside the run it steered).
FLOORS = ("fork", "fork.send", "mergeBack.raced", "steer.reached", "rollback", *(f"mode.{m}" for m in MODES))
FORCED_TRIES = 12  # forced rounds of a kind after the random ones (a loaded run once refused 5 rollbacks)
# A mergeBack counts as raced when one of these went out in the same round.
RACING = frozenset({*MODES, "stop", "rollback"})
# The random rounds' mix, and the companions of the forced rounds: what races the operation set up.
MIX = {
    "auto": 4,
    "startImmediately": 2,
    "queueAfterActive": 3,
    "steerActive": 3,
    "restartActive": 2,
    "stop": 2,
    "resume": 2,
    "rollback": 3,
    "fork": 1,
    "fork_work": 1,
    "merge": 1,
    "switch": 2,
    "settle": 2,
}
RACERS = {"auto": 3, "startImmediately": 1, "queueAfterActive": 2, "steerActive": 2, "restartActive": 2, "stop": 2,
          "rollback": 2}  # fmt: skip
# Beside a turn held for its steer: nothing that would end it first (no Stop, restart or switch to `c`).
CALM = {"auto": 2, "queueAfterActive": 2, "startImmediately": 1, "rollback": 1, "fork": 1, "fork_work": 1}

CREATE_THREAD = """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "a"}) {
  thread { id } userErrors { code } } }"""
SEND = """mutation($t: ID!, $text: String!, $d: DispatchInput) {
  sendMessage(input: {threadId: $t, text: $text, dispatch: $d}) {
    run { id ordinal } appliedDispatch message { id } userErrors { code message field } } }"""
STOP = """mutation($t: ID!) { stopThread(input: {threadId: $t}) { thread { id } userErrors { code message field } } }"""
RESUME = (
    """mutation($t: ID!) { resumeQueue(input: {threadId: $t}) { thread { id } userErrors { code message field } } }"""
)
ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) {
  rolledBackRuns { ordinal } userErrors { code message field } } }"""
FORK = """mutation($r: ID!) { forkThread(input: {source: {run: $r}, ownWorkspace: true}) {
  thread { id } userErrors { code message field } } }"""
MERGE = """mutation($f: ID!) { mergeBack(input: {forkThreadId: $f}) {
  transfer { id } userErrors { code message field } } }"""
SWITCH = """mutation($t: ID!, $i: String!) { switchProvider(input: {threadId: $t, providerInstanceId: $i}) {
  thread { id } userErrors { code message field } } }"""
STATE = """query($t: ID!) { thread(id: $t) { activeRun { id } queue { id } queueHeld queueHoldReason
  workspacePath project { id } } }"""
RUNS = """query($t: ID!) { thread(id: $t) { runs(first: 100) { nodes {
  id ordinal status statusReason interruptRequestedAt startedAt checkpoint { ref } userMessage { text } } } } }"""
RUN_STATUS = """query($r: ID!) { node(id: $r) { ... on Run { status } } }"""
RUNS_ONE = """query($r: ID!) { node(id: $r) { ... on Run { id ordinal status statusReason interruptRequestedAt
  providerInstance { id } activeAttempt { status } } } }"""
MESSAGES = """query($t: ID!, $after: String) { thread(id: $t) { messages(first: 100, after: $after) {
  pageInfo { hasNextPage endCursor } nodes { id role text run { id status } } } } }"""
ACTIVITIES = """query($t: ID!, $after: String) { thread(id: $t) { activities(first: 100, after: $after) {
  pageInfo { hasNextPage endCursor } nodes { kind sequence payload } } } }"""
CHECKPOINTS = """query($t: ID!) { thread(id: $t) { checkpoints(first: 100) { nodes {
  id ordinal ref status scope { kind } } } } }"""

ACTIVE = {"PREPARING", "STARTING", "RUNNING", "WAITING"}
ENDED = {"COMPLETED", "FAILED", "INTERRUPTED", "CANCELLED", "ROLLED_BACK"}
TOKEN = re.compile(r"\bt\d{3}\b")  # a message of the thread
FORK_TOKEN = re.compile(r"\bf\d{3}\b")  # a message on a fork
# A message as an agent holds it (its own `@reply` line): not a path in a handoff's list of files changed, which
# names the files a run's checkpoint holds anew, written by whichever run ran before it.
ASKED = re.compile(r"@reply ([tf]\d{3})\b")


def _work(token: str, hold: str = "@delay 30") -> str:
    """A message whose run writes `state.txt` and its own file, then replies with its token."""
    return f"@write state.txt {token}\n@write {token}.txt {token}\n{hold}\n@reply {token} one two three"


@dataclasses.dataclass(frozen=True, slots=True)
class Op:
    kind: str
    go: Callable[[], Awaitable[str | None]]  # the request; its answer's tally key (None: nothing to ask)


@dataclasses.dataclass(frozen=True, slots=True)
class Fork:
    id: str
    source_run: str  # the main thread's run it was forked at


@dataclasses.dataclass(frozen=True, slots=True)
class Steer:
    token: str
    message: str
    run: str  # the run it was steered into (STEER_ACTIVE)


class Race:
    """The requests of one test, the facts their answers gave, and the tally of what each answered."""

    def __init__(self, api: Client, thread: str, rng: random.Random, instances: str, database_url: str) -> None:
        self.api = api
        self.database_url = database_url
        self.thread = thread
        self.rng = rng
        self.instances = instances  # what switchProvider may pick ("a" alone: a switch to where it is)
        self.runs: list[tuple[str, int]] = []  # (id, ordinal) of every run a sendMessage made
        self.forks: list[Fork] = []
        self.steers: list[Steer] = []
        self.tokens = 0
        self.answers: collections.Counter[str] = collections.Counter()
        self.floors: collections.Counter[str] = collections.Counter()
        self.played: collections.Counter[str] = collections.Counter()  # forced rounds played, by kind
        self.odd: list[str] = []  # messages of refusals other than the expected busy ones, for the printout

    async def call(self, name: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        """The mutation's payload; fails on anything but data with typed userErrors."""
        response = await self.api.post(query, variables)
        assert response.status_code == 200, (name, variables, response.text)
        body = response.json()
        assert "errors" not in body and body.get("data"), (name, variables, body)
        payload: dict[str, Any] = next(iter(body["data"].values()))
        codes = [e["code"] for e in payload["userErrors"]]
        assert all(re.fullmatch(r"[A-Z][A-Z_]+", c) and c != "INTERNAL_SERVER_ERROR" for c in codes), (name, payload)
        key = f"{name}:{','.join(codes) or 'ok'}"
        self.answers[key] += 1
        self.odd += [f"{key}: {e['message']}" for e in payload["userErrors"] if e["code"] in ("WORKSPACE_CONFLICT",)]
        return payload

    def token(self, prefix: str = "t") -> str:
        self.tokens += 1
        return f"{prefix}{self.tokens:03d}"

    async def round(self, ops: list[Op]) -> list[str | None]:
        """The requests of `ops` at once; a successful mergeBack among them counts as raced when one of them
        was a send, rollback or Stop of the thread."""

        answers = list(await asyncio.gather(*(op.go() for op in ops)))
        if "mergeBack:ok" in answers and {op.kind for op in ops} & RACING:
            self.floors["mergeBack.raced"] += 1
        return answers

    def draw(self, mix: dict[str, int], count: int) -> list[Op]:
        """`count` operations drawn from `mix` (kind → weight)."""
        return [self.operation(kind) for kind in self.rng.choices(list(mix), weights=list(mix.values()), k=count)]

    # ---- the operations: parameters drawn now (from the seed), the request made when awaited ----

    def operation(self, kind: str) -> Op:
        if kind in MODES:
            return self.send(kind)
        return getattr(self, kind)()  # type: ignore[no-any-return]

    def send(self, mode: str, target: str | None = None, text: str | None = None) -> Op:
        token = self.token()
        text = text or _work(token)
        if mode in TARGETED and target is None and self.runs:
            target = self.rng.choice(self.runs[-3:])[0]
        if mode in TARGETED:
            dispatch: dict[str, Any] = {mode: {"targetRunId": target}} if target else {"auto": True}
        else:
            dispatch = {mode: True}
        name = f"send.{mode}" if mode not in TARGETED or target else f"send.{mode}.untargeted"

        async def go() -> str:
            sent = await self.call(name, SEND, {"t": self.thread, "text": text, "d": dispatch})
            if sent["run"] is not None:
                self.runs.append((sent["run"]["id"], sent["run"]["ordinal"]))
            if sent["userErrors"]:
                return f"{name}:{sent['userErrors'][0]['code']}"
            self.answers[f"applied.{sent['appliedDispatch']}"] += 1
            if name == f"send.{mode}":
                self.floors[f"mode.{mode}"] += 1
            if sent["appliedDispatch"] == "STEER_ACTIVE":
                self.steers.append(Steer(token, sent["message"]["id"], sent["run"]["id"]))
            return f"{name}:ok"

        return Op(mode, go)

    def stop(self) -> Op:
        return Op("stop", lambda: self._thread_call("stopThread", STOP))

    def resume(self) -> Op:
        return Op("resume", lambda: self._thread_call("resumeQueue", RESUME))

    async def _thread_call(self, name: str, query: str) -> str:
        answer = await self.call(name, query, {"t": self.thread})
        return f"{name}:{','.join(e['code'] for e in answer['userErrors']) or 'ok'}"

    def rollback(self, ordinal: int | None = None) -> Op:
        if ordinal is None:
            ordinal = self.rng.randint(0, max((o for _, o in self.runs), default=0))

        async def go() -> str:
            answer = await self.call("rollbackToRun", ROLLBACK, {"t": self.thread, "n": ordinal})
            self.floors["rollback"] += not answer["userErrors"]
            return f"rollbackToRun:{','.join(e['code'] for e in answer['userErrors']) or 'ok'}"

        return Op("rollback", go)

    def fork(self, source: str | None = None) -> Op:
        if source is None and self.runs:
            source = self.rng.choice(self.runs)[0]

        async def go() -> str | None:
            if source is None:
                return None
            forked = await self.call("forkThread", FORK, {"r": source})
            if forked["thread"] is None:
                return f"forkThread:{forked['userErrors'][0]['code']}"
            self.forks.append(Fork(forked["thread"]["id"], source))
            self.floors["fork"] += 1
            return "forkThread:ok"

        return Op("fork", go)

    def fork_work(self, fork: Fork | None = None) -> Op:
        if fork is None and self.forks:
            fork = self.rng.choice(self.forks)
        token = self.token("f")
        text = f"@write {token}.txt {token}\n@reply {token} on the fork"

        async def go() -> str | None:
            if fork is None:
                return None
            sent = await self.call("fork.send", SEND, {"t": fork.id, "text": text, "d": None})
            if sent["userErrors"]:
                return f"fork.send:{sent['userErrors'][0]['code']}"
            self.floors["fork.send"] += 1
            return "fork.send:ok"

        return Op("fork_work", go)

    def merge(self, fork: Fork | None = None) -> Op:
        if fork is None and self.forks:
            fork = self.rng.choice(self.forks)

        async def go() -> str | None:
            if fork is None:
                return None
            merged = await self.call("mergeBack", MERGE, {"f": fork.id})
            return f"mergeBack:{','.join(e['code'] for e in merged['userErrors']) or 'ok'}"

        return Op("merge", go)

    def switch(self, instance: str | None = None) -> Op:
        chosen = instance or self.rng.choice(self.instances)

        async def go() -> str:
            answer = await self.call("switchProvider", SWITCH, {"t": self.thread, "i": chosen})
            return f"switchProvider:{','.join(e['code'] for e in answer['userErrors']) or 'ok'}"

        return Op("switch", go)

    def settle(self) -> Op:
        async def go() -> None:
            await self.idle(self.thread)  # as long as any wait for quiet: a loaded run needed over 15 s

        return Op("settle", go)

    async def idle(self, thread: str, within: float = 90) -> dict[str, Any]:  # a loaded full run needed over 30 s
        """The thread once nothing runs: no active run, and an empty queue unless it is held."""

        seen: list[dict[str, Any]] = []

        async def check() -> dict[str, Any] | None:
            state = (await self.api.gql(STATE, {"t": thread}))["thread"]
            seen[:] = [state]
            quiet = state["activeRun"] is None and (not state["queue"] or state["queueHeld"])
            return state if quiet else None

        try:
            return await until(check, within=within)
        except TimeoutError:  # what kept it busy, and that run as the API shows it: the next failure says why
            active = seen[-1]["activeRun"] if seen else None
            run = (await self.api.gql(RUNS_ONE, {"r": active["id"]}))["node"] if active else None
            raise TimeoutError(f"thread {thread} not quiet in {within}s: {seen[-1] if seen else None}; {run}") from None

    async def drained(self) -> None:
        """The thread idle with nothing queued: a held queue resumed and run down."""
        state = await self.idle(self.thread)
        while state["queue"]:
            await self.call("resumeQueue", RESUME, {"t": self.thread})
            state = await self.idle(self.thread)

    async def runs_now(self, thread: str | None = None) -> list[dict[str, Any]]:
        return list((await self.api.gql(RUNS, {"t": thread or self.thread}))["thread"]["runs"]["nodes"])

    async def ended(self, run_id: str, within: float = 30) -> str:
        async def check() -> str | None:
            status = str((await self.api.gql(RUN_STATUS, {"r": run_id}))["node"]["status"])
            return status if status in ENDED else None

        return await until(check, within=within)

    # ---- forced rounds: each sets up one operation and races it ----

    async def forced(self, kind: str) -> None:
        self.played[kind] += 1
        await {"fork": self.forced_fork, "steer": self.forced_steer, "rollback": self.forced_rollback,
               "modes": self.forced_modes}[kind]()  # fmt: skip

    async def _finished_run(self) -> dict[str, Any]:
        """A completed run of the thread, drawn from the seed; one is made (and waited for) when none is."""
        await self.drained()
        done = [r for r in await self.runs_now() if r["status"] == "COMPLETED"]
        if not done:
            made = await self.call("send.setup", SEND, {"t": self.thread, "text": _work(self.token()), "d": None})
            if made["run"] is None or await self.ended(made["run"]["id"]) != "COMPLETED":
                return {}
            done = [r for r in await self.runs_now() if r["status"] == "COMPLETED"]
        return self.rng.choice(sorted(done, key=lambda r: r["ordinal"])) if done else {}

    async def forced_fork(self) -> None:
        """A fork of a finished run raced against sends, rollbacks and Stops; a message on it (raced too, and
        waited for); then its mergeBack raced against at least one of them."""
        source = await self._finished_run()
        if not source:
            return
        before = len(self.forks)
        await self.round([self.fork(source["id"]), *self.draw(RACERS, self.rng.randint(0, 2))])
        if len(self.forks) == before:
            return
        fork = self.forks[-1]
        await self.round([self.fork_work(fork), *self.draw(RACERS, self.rng.randint(0, 2))])
        await self.idle(fork.id)
        await self.round([self.merge(fork), *self.draw(RACERS, self.rng.randint(1, 2))])

    async def forced_steer(self) -> None:
        """A turn that waits for a steer (`@await-steer`) on a provider that steers in place, steered while it
        runs, with calm companions; the steer reached it when the run's own reply carries the steer's token."""
        await self.drained()
        if self.instances != "a":
            await self.round([self.switch(self.rng.choice("ab"))])
        token = self.token()
        held = await self.call(
            "send.held", SEND, {"t": self.thread, "text": _work(token, "@await-steer"), "d": {"startImmediately": True}}
        )
        if held["run"] is None:
            return
        held_id = held["run"]["id"]
        self.runs.append((held_id, held["run"]["ordinal"]))

        async def running() -> str | None:
            status = str((await self.api.gql(RUN_STATUS, {"r": held_id}))["node"]["status"])
            return status if status in ({"RUNNING"} | ENDED) else None

        if await until(running) != "RUNNING":
            return
        await self.round([self.send("steerActive", target=held_id), *self.draw(CALM, self.rng.randint(0, 2))])
        # Only a steer ends the held turn. Once the round's effects have run, a steer still in the held run
        # was delivered (one the turn refused became a run of its own); without one, the run is stopped, so
        # nothing waits out the agent's 60 s bound.
        await until(self._effects_done, within=30)
        if not await self.delivered(held_id):
            await self.call("stopThread", STOP, {"t": self.thread})
        await self.ended(held_id)
        self.floors["steer.reached"] += await self.steered(held_id) > 0

    async def _effects_done(self) -> bool:
        return await unfinished_effects(self.database_url, [_uuid(self.thread)]) == 0

    async def delivered(self, run_id: str) -> bool:
        """Whether a STEER_ACTIVE answer's message into `run_id` is still that run's (read once the effects
        have run)."""
        messages = {m["id"]: m for m in await _pages(self.api, MESSAGES, self.thread, "messages")}
        return any(
            s.run == run_id and ((messages.get(s.message) or {}).get("run") or {}).get("id") == run_id
            for s in self.steers
        )

    async def steered(self, run_id: str | None = None) -> int:
        """How many STEER_ACTIVE answers (into `run_id`, or any run) reached their live turn: the steer's
        message is still the run's (it did not become a run of its own) and the run's reply has its token."""
        messages = await _pages(self.api, MESSAGES, self.thread, "messages")
        by_id = {m["id"]: m for m in messages}
        reached = 0
        for steer in self.steers:
            if run_id is not None and steer.run != run_id:
                continue
            message = by_id.get(steer.message)
            if message is None or message["run"] is None or message["run"]["id"] != steer.run:
                continue
            said = " ".join(m["text"] for m in messages if m["role"] == "ASSISTANT" and m["run"]
                            and m["run"]["id"] == steer.run)  # fmt: skip
            reached += f"{steer.token} one two three" in said
        return reached

    async def forced_rollback(self) -> None:
        """A rollback to a finished run before the last, raced against sends and Stops."""
        await self.drained()
        runs = await self.runs_now()
        last = max((r["ordinal"] for r in runs if r["status"] != "ROLLED_BACK"), default=0)
        targets = [r["ordinal"] for r in runs if r["status"] == "COMPLETED" and r["ordinal"] < last]
        if not targets:
            await self._finished_run()
            await self._finished_run()  # two: the first to go back to, the second to undo
            return
        target = self.rng.choice(sorted(targets))
        await self.round([self.rollback(target), *self.draw(RACERS, self.rng.randint(0, 2))])

    async def forced_modes(self) -> None:
        """Each dispatch mode not yet answered: startImmediately on the idle thread, then the others at once,
        the targeted ones aimed at the run it started."""
        missing = [m for m in MODES if not self.floors[f"mode.{m}"]]
        await self.drained()
        first = self.send("startImmediately")
        await self.round([first])
        target = self.runs[-1][0] if self.runs else None
        rest = [self.send(m, target=target if m in TARGETED else None) for m in missing if m != "startImmediately"]
        await self.round([*rest, *self.draw(RACERS, self.rng.randint(0, 1))])

    def unmet(self) -> list[str]:
        return [floor for floor in FLOORS if not self.floors[floor]]


async def _pages(api: Client, query: str, thread: str, field: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    after = None
    while True:
        page = (await api.gql(query, {"t": thread, "after": after}))["thread"][field]
        found += page["nodes"]
        if not page["pageInfo"]["hasNextPage"]:
            return found
        after = page["pageInfo"]["endCursor"]


def _git(shadow: Path, *args: str) -> bytes:
    return subprocess.run(["git", f"--git-dir={shadow}", *args], check=True, capture_output=True).stdout


def _checkpoint_files(shadow: Path, ref: str) -> dict[str, bytes]:
    """The files of a checkpoint (a commit in the project's shadow repository) by path, read in two git calls
    (a commit never changes, so each is read once)."""
    key = (str(shadow), ref)
    if key not in _READ:
        listing = [e.split("\t", 1) for e in _git(shadow, "ls-tree", "-r", "-z", ref).decode().split("\0") if e]
        blobs = subprocess.run(
            ["git", f"--git-dir={shadow}", "cat-file", "--batch"],
            input="".join(f"{meta.split()[2]}\n" for meta, _ in listing).encode(),
            check=True,
            capture_output=True,
        ).stdout
        files, at = {}, 0
        for _, path in listing:
            header_end = blobs.index(b"\n", at)
            size = int(blobs[at:header_end].split()[2])
            files[path] = blobs[header_end + 1 : header_end + 1 + size]
            at = header_end + 1 + size + 1
        _READ[key] = files
    return dict(_READ[key])


_READ: dict[tuple[str, str], dict[str, bytes]] = {}


_FILE_LINE = re.compile(r"- \w+ (\S+) \(\+\d+ -\d+\)")  # the agent's reply escapes its newlines


def _without_present_files(said: str, root: Path) -> str:
    """`said` less its handoff's "Files changed" lines naming a file the folder holds now. When runs ran out of
    ordinal order, a kept run's checkpoint can hold a file an undone run wrote before it (the workspace is
    restored as it was right after the target run, which `_check_files` checks); the handoff's list of that
    checkpoint's files then names it, which is the folder as it is, not the undone run's message recalled."""
    present = set(_workspace_files(root))
    return _FILE_LINE.sub(lambda line: "" if line.group(1) in present else line.group(0), said)


def _workspace_files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _uuid(gid: str) -> str:
    found = decode(gid)
    assert found is not None, gid
    return str(found[1])


@pytest.mark.parametrize("instances", ["abc", "a"], ids=["three-providers", "one-provider"])
async def test_raced_structural_operations_leave_one_consistent_thread(
    request: pytest.FixtureRequest, database_url: str, tmp_path: Path, instances: str
) -> None:
    """Files, runs, the log and the conversation (nothing undone recalled, everything kept recalled) are
    checked for every history, the thread's and each fork's; every operation happened at least once; the
    server logged no error and no effect failed. The one-provider case never switches, the three-provider
    case mostly does."""
    seed = seeds.draw(request)
    rng = seed.random()
    home = tmp_path / "ws"
    home.mkdir()
    data_dir = tmp_path / "data"
    with serving(database_url, data_dir, providers_env(tmp_path, PROVIDERS, **UNLIMITED)) as server:
        api = Client(server.url, server.admin_token)
        try:
            with seed.shown_on_failure():
                switched = await _race_and_check(api, rng, home, data_dir, instances, database_url)
                assert instances != "a" or not switched
                # Quiet now: what went wrong inside, though every answer looked fine.
                assert await troubled_effects(database_url) == []
                errors = server_log.errors(server.log)
                assert errors == [], "\n".join(errors)
        except BaseException:
            print("the server's error lines:", *server_log.errors(server.log), sep="\n")
            raise
        finally:
            await api.aclose()
        server.stop()  # quiet: nothing writes while the log is replayed
    with seed.shown_on_failure():
        await assert_log_replays(database_url)
        errors = server_log.errors(server.log)  # its shutdown too
        assert errors == [], "\n".join(errors)


async def _race_and_check(
    api: Client, rng: random.Random, home: Path, data_dir: Path, instances: str, database_url: str
) -> bool:
    """Races, then checks; whether the thread's provider was switched."""
    project = (await api.gql(CREATE_PROJECT, {"name": "races", "root": str(home)}))["createProject"]["project"]
    thread = (await api.gql(CREATE_THREAD, {"p": project["id"]}))["createThread"]["thread"]["id"]
    race = Race(api, thread, rng, instances, database_url)
    # The forced rounds go among the random ones, where the seed puts them (one of each, in a drawn order).
    forced = ["fork", "steer", "rollback"]
    rng.shuffle(forced)
    at = dict(zip(sorted(rng.sample(range(2, ROUNDS), len(forced))), forced, strict=True))
    for number in range(ROUNDS):
        if number in at:
            await race.forced(at[number])
        await race.round(race.draw(MIX, rng.randint(2, 4)))
    # Then again, a few times at most, each kind whose operation has not happened yet.
    for _ in range(FORCED_TRIES):
        unmet = race.unmet()
        if not unmet:
            break
        kinds = {"fork": "fork", "fork.send": "fork", "mergeBack.raced": "fork", "steer.reached": "steer"}
        for kind in dict.fromkeys(kinds.get(floor, "rollback" if floor == "rollback" else "modes") for floor in unmet):
            await race.forced(kind)
    print(dict(sorted(race.answers.items())))
    print("forced rounds:", dict(race.played), "floors:", {f: race.floors[f] for f in FLOORS})
    if race.odd:
        print("refusals:", *race.odd, sep="\n  ")
    assert race.unmet() == [], (race.unmet(), dict(race.played))

    # Quiet: the queue resumed (a Stop holds it), every run of the thread and of its forks over.
    await race.call("resumeQueue", RESUME, {"t": thread})
    state = await race.idle(thread)
    for fork in race.forks:
        await race.idle(fork.id)

    runs = await race.runs_now()
    assert not [r for r in runs if r["status"] in ACTIVE], runs
    queued = [r for r in runs if r["status"] == "QUEUED"]
    assert not queued or (state["queueHeld"] and state["queueHoldReason"]), (queued, state)
    # An interrupted run was asked to stop (or says why it was ended); a failed one says why.
    unexplained = [
        r
        for r in runs
        if (r["status"] == "INTERRUPTED" and not (r["interruptRequestedAt"] or r["statusReason"]))
        or (r["status"] == "FAILED" and not r["statusReason"])
    ]
    assert not unexplained, unexplained

    shadow = data_dir / "checkpoints" / f"{_uuid(project['id'])}.git"
    activities = await _check_files(api, thread, home, shadow, runs, TOKEN, {})
    print("steers that reached their live turn:", await race.steered(), "of", len(race.steers))

    # The conversation: what the agent holds now, against the runs that count.
    said, messages = await _recall(race, thread)
    remembered = set(TOKEN.findall(_without_present_files(said, home)))
    forgotten = {
        token
        for m in messages
        if m["role"] == "USER" and m["run"] and m["run"]["status"] == "ROLLED_BACK"
        for token in TOKEN.findall(m["text"])
    }
    kept = {TOKEN.findall(r["userMessage"]["text"])[0] for r in runs if r["status"] == "COMPLETED"}
    started = [r["ordinal"] for r in sorted((r for r in runs if r["startedAt"]), key=lambda r: r["startedAt"])]
    switched = any(a["kind"] == "lineage.provider_switched" for a in activities)
    print(f"runs started in the order {started}, switched: {switched}")
    if remembered & forgotten or not kept <= remembered:  # for the replay: every run and lineage step
        for r in sorted(runs, key=lambda r: r["ordinal"]):
            print("RUN", r["ordinal"], r["status"], TOKEN.findall(r["userMessage"]["text"]), r.get("startedAt"))
        for a in activities:
            print("ACT", a["kind"], {k: v for k, v in (a["payload"] or {}).items() if k not in ("steps",)})
    assert not remembered & forgotten, (sorted(remembered & forgotten), said)
    # In any order and across switches: every kept run is the agent's own or was handed to it.
    assert kept <= remembered, (sorted(kept - remembered), said)

    await _check_forks(race, project["id"], data_dir, shadow, runs, messages)
    return switched


async def _check_files(
    api: Client,
    thread: str,
    root: Path,
    shadow: Path,
    runs: list[dict[str, Any]],
    token: re.Pattern[str],
    start: dict[str, bytes],
) -> list[dict[str, Any]]:
    """The thread's folder holds the files of the last operation that set them, in the thread's own order of
    events (`start`: the files before any: none, or a fork point's); every completed run's checkpoint holds
    the file the run wrote. The thread's activities."""
    checkpoints = (await api.gql(CHECKPOINTS, {"t": thread}))["thread"]["checkpoints"]["nodes"]
    by_id = {c["id"]: c for c in checkpoints}
    root_scoped = {c["ordinal"]: c for c in checkpoints if c["scope"]["kind"] == "ROOT_RUN"}
    last: str | None = None
    expected = ""
    activities = await _pages(api, ACTIVITIES, thread, "activities")
    for activity in activities:
        payload = activity["payload"] or {}
        if activity["kind"] == "checkpoint.captured" and by_id[payload["checkpointId"]]["scope"]["kind"] == "ROOT_RUN":
            last = f"{activity['kind']} {by_id[payload['checkpointId']]['ordinal']}"
            expected = by_id[payload["checkpointId"]]["ref"]
        elif activity["kind"] == "rollback.completed":
            last = f"{activity['kind']} to {payload['targetOrdinal']}"
            expected = root_scoped[payload["targetOrdinal"]]["ref"]
    wanted = _checkpoint_files(shadow, expected) if last else start
    if _workspace_files(root) != wanted:  # for the replay
        for r in sorted(runs, key=lambda r: r["ordinal"]):
            print("RUN", r["ordinal"], r["status"], token.findall(r["userMessage"]["text"])[:1], r["checkpoint"])
        shown = ("targetOrdinal", "checkpointId", "filePaths", "status", "kind")
        for a in activities:
            if a["kind"].startswith(("rollback", "checkpoint", "run.", "lineage")):
                print("ACT", a["sequence"], a["kind"], {k: v for k, v in (a["payload"] or {}).items() if k in shown})
    assert _workspace_files(root) == wanted, (thread, last)
    for run in runs:
        if run["status"] == "COMPLETED" and token.search(run["userMessage"]["text"]):
            mark = token.search(run["userMessage"]["text"])
            assert mark is not None
            held = _checkpoint_files(shadow, run["checkpoint"]["ref"])
            assert held.get(f"{mark.group()}.txt") == mark.group().encode(), (thread, run["ordinal"], sorted(held))
    return activities


async def _recall(race: Race, thread: str) -> tuple[str, list[dict[str, Any]]]:
    """What the agent of `thread` holds (a `@recall` run's reply), and the thread's messages after it."""
    recall = await race.call("send.recall", SEND, {"t": thread, "text": "@recall", "d": {"startImmediately": True}})
    assert recall["userErrors"] == [], recall
    done = await finished(race.api, recall["run"]["id"])
    assert done["status"] == "COMPLETED", done
    messages = await _pages(race.api, MESSAGES, thread, "messages")
    said = "".join(
        m["text"] for m in messages if m["role"] == "ASSISTANT" and m["run"] and m["run"]["id"] == recall["run"]["id"]
    )
    return said, messages


async def _check_forks(
    race: Race,
    project: str,
    data_dir: Path,
    shadow: Path,
    main_runs: list[dict[str, Any]],
    main_messages: list[dict[str, Any]],
) -> None:
    """Each fork as the thread: its own folder holds its last checkpoint (its fork point's files before it
    ran), each of its finished runs' checkpoints its file; its agent holds its fork point's message (when that
    run is still completed), every finished run of its own, and no message of the thread's runs after the
    fork point (a fork's context stops there, whatever the thread did later)."""
    by_id = {r["id"]: r for r in main_runs}
    ordinal_of = {r["id"]: r["ordinal"] for r in main_runs}
    for fork in race.forks:
        state = (await race.api.gql(STATE, {"t": fork.id}))["thread"]
        assert state["workspacePath"], state  # forked with a folder of its own
        folder = data_dir / "workspaces" / _uuid(project) / state["workspacePath"]
        point = by_id[fork.source_run]
        runs = await race.runs_now(fork.id)
        await _check_files(
            race.api, fork.id, folder, shadow, runs, FORK_TOKEN, _checkpoint_files(shadow, point["checkpoint"]["ref"])
        )
        said, _ = await _recall(race, fork.id)
        remembered = set(ASKED.findall(said))
        own = {
            FORK_TOKEN.findall(r["userMessage"]["text"])[0]
            for r in runs
            if r["status"] == "COMPLETED" and FORK_TOKEN.search(r["userMessage"]["text"])
        }
        assert own <= remembered, (fork.id, sorted(own - remembered), said)
        if point["status"] == "COMPLETED":
            mark = TOKEN.findall(point["userMessage"]["text"])[0]
            assert mark in remembered, (fork.id, mark, said)
        later = {
            t
            for m in main_messages
            if m["role"] == "USER" and m["run"] and ordinal_of.get(m["run"]["id"], 0) > point["ordinal"]
            for t in TOKEN.findall(m["text"])
        }
        if later & remembered:  # for the replay
            print("FORK", fork.id, "at", point["ordinal"], "recalls:", said, sep="\n")
            for r in sorted(main_runs, key=lambda r: r["ordinal"]):
                print("RUN", r["ordinal"], r["status"], TOKEN.findall(r["userMessage"]["text"]), r.get("startedAt"))
        assert not later & remembered, (fork.id, point["ordinal"], sorted(later & remembered), said)


# ---- what the races found, reduced to one deterministic history ----------------------------------------------

SEND_ON = """mutation($t: ID!, $text: String!, $i: String, $d: DispatchInput) {
  sendMessage(input: {threadId: $t, text: $text, providerInstanceId: $i, dispatch: $d}) {
    run { id ordinal } userErrors { code message field } } }"""
REORDER = """mutation($r: ID!, $p: Int!) { reorderQueuedRun(input: {runId: $r, position: $p}) {
  userErrors { code } } }"""
REPLIES = """query($t: ID!) { thread(id: $t) { messages(first: 100) { nodes { role text run { id } } } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id } } }"""
APPROVE = """mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) {
  userErrors { code } } }"""


async def test_a_provider_returned_to_is_told_of_a_run_that_ran_elsewhere_after_its_own_later_run(
    database_url: str, tmp_path: Path
) -> None:
    """Runs may run out of ordinal order (here a queued run moved ahead; in the races a message that jumped
    a held queue). Run 4 runs first, on b; run 3 runs after it, on a. When the thread comes back to b, b was
    never told about run 3: it must get it in a delta handoff, although 3 < 4, the last run b ran."""
    home = tmp_path / "ws"
    home.mkdir()
    with serving(database_url, tmp_path / "data", providers_env(tmp_path, PROVIDERS)) as server:
        api = Client(server.url, server.admin_token)
        try:
            project = (await api.gql(CREATE_PROJECT, {"name": "order", "root": str(home)}))["createProject"]
            thread = (await api.gql(CREATE_THREAD, {"p": project["project"]["id"]}))["createThread"]["thread"]["id"]

            async def sent(text: str, instance: str | None = None) -> str:
                queue = {"queueAfterActive": True}  # never a steer of the run waiting for its approval
                answer = await api.gql(SEND_ON, {"t": thread, "text": text, "i": instance, "d": queue})
                assert answer["sendMessage"]["userErrors"] == [], answer
                return str(answer["sendMessage"]["run"]["id"])

            assert (await finished(api, await sent("@reply one")))["status"] == "COMPLETED"
            waiting = await sent("@approval echo two")  # run 2 stays active until approved

            async def asked() -> str | None:
                found = (await api.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"]
                return str(found[0]["id"]) if found else None

            request = await until(asked)
            three = await sent("@reply three", "a")
            four = await sent("@reply four", "b")
            assert (await api.gql(REORDER, {"r": four, "p": 1}))["reorderQueuedRun"]["userErrors"] == []
            assert (await api.gql(APPROVE, {"r": request}))["respondToApproval"]["userErrors"] == []
            for run_id in (waiting, four, three):
                assert (await finished(api, run_id))["status"] == "COMPLETED"

            recall = await sent("@recall", "b")
            assert (await finished(api, recall))["status"] == "COMPLETED"
            nodes = (await api.gql(REPLIES, {"t": thread}))["thread"]["messages"]["nodes"]
            said = "".join(m["text"] for m in nodes if m["role"] == "ASSISTANT" and m["run"]["id"] == recall)
            assert "@reply one" in said and "@reply four" in said, said
            assert "@reply three" in said, said  # b holds run 3 too: in a handoff
        finally:
            await api.aclose()


RESTART = """mutation($t: ID!, $text: String!, $r: ID!) {
  sendMessage(input: {threadId: $t, text: $text, dispatch: {restartActive: {targetRunId: $r}}}) {
    run { id } appliedDispatch userErrors { code } } }"""
ATTEMPTS = """query($r: ID!) { node(id: $r) { ... on Run { status attempts { attemptOrdinal status reason
  providerTurns { id } } } } }"""


async def test_a_restart_while_the_first_attempt_is_prepared_starts_the_new_attempt_with_its_input_and_no_effect_fails(
    database_url: str, tmp_path: Path
) -> None:
    """Found by the races (`effect … (provider-turn.start) failed … RUN_NOT_STARTABLE: run is preparing,
    attempt superseded`): a restart that supersedes the run's first attempt while that attempt's start effect is
    between preparing and recording the turn. That effect must end as a no-op — the new attempt's own effect
    starts the run, with the restart's combined input — not fail, be retried, and start the new attempt itself
    with the first message alone (the restart's message lost)."""
    async with _held_first_run(database_url, tmp_path) as (api, thread, run_id, gate):
        restarted = (await api.gql(RESTART, {"t": thread, "text": "@reply second", "r": run_id}))["sendMessage"]
        assert restarted["userErrors"] == [] and restarted["appliedDispatch"] == "RESTART_ACTIVE", restarted
        assert restarted["run"]["id"] == run_id
        gate.touch()

        assert (await finished(api, run_id))["status"] == "COMPLETED"
        nodes = (await api.gql(REPLIES, {"t": thread}))["thread"]["messages"]["nodes"]
        said = " ".join(m["text"] for m in nodes if m["role"] == "ASSISTANT" and m["run"]["id"] == run_id)
        assert "first" in said and "second" in said, said  # the new attempt got the combined input
        attempts = (await api.gql(ATTEMPTS, {"r": run_id}))["node"]["attempts"]
        shown = [(a["attemptOrdinal"], a["status"], a["reason"], len(a["providerTurns"])) for a in attempts]
        assert shown == [(1, "SUPERSEDED", "INITIAL", 0), (2, "COMPLETED", "STEERING_RESTART", 1)], shown


async def test_a_steer_whose_attempt_a_restart_superseded_before_delivery_is_not_also_made_a_new_run(
    database_url: str, tmp_path: Path
) -> None:
    """Found by the races (seed 207242662, `[three-providers]`: run 1's current attempt replied `t003` and wrote
    `t003.txt`, yet message t003 was run 3's). A steer of the first attempt, then a restart, both while that
    attempt's start effect is held at `turn-recording`: the restart's input is every message of the run so far,
    the steer's included, so the new attempt carries it. The steer's own effect, which runs after the held one
    (one effect at a time per thread), then finds no live turn of the attempt it steered; it must not make the
    message a run of its own too (`steer.became_run`), or the agent is asked it twice."""
    async with _held_first_run(database_url, tmp_path) as (api, thread, run_id, gate):
        steer = {"steerActive": {"targetRunId": run_id}}
        steered = (await api.gql(SEND, {"t": thread, "text": "@reply steered", "d": steer}))["sendMessage"]
        assert steered["userErrors"] == [] and steered["appliedDispatch"] == "STEER_ACTIVE", steered
        restarted = (await api.gql(RESTART, {"t": thread, "text": "@reply second", "r": run_id}))["sendMessage"]
        assert restarted["userErrors"] == [] and restarted["appliedDispatch"] == "RESTART_ACTIVE", restarted
        gate.touch()

        assert (await finished(api, run_id))["status"] == "COMPLETED"
        nodes = (await api.gql(REPLIES, {"t": thread}))["thread"]["messages"]["nodes"]
        said = " ".join(m["text"] for m in nodes if m["role"] == "ASSISTANT" and m["run"]["id"] == run_id)
        assert all(word in said for word in ("first", "steered", "second")), said  # the restart's whole input

        async def settled() -> bool:  # the steer's effect has run, whatever it did
            return await unfinished_effects(database_url, [_uuid(thread)]) == 0

        await until(settled)
        runs = (await api.gql(RUNS, {"t": thread}))["thread"]["runs"]["nodes"]
        assert [(r["ordinal"], r["userMessage"]["text"]) for r in runs] == [(1, "@reply first")], runs
        users = [m["text"] for m in nodes if m["role"] == "USER"]
        assert users == ["@reply first", "@reply steered", "@reply second"], users
        assert all(m["run"]["id"] == run_id for m in nodes), nodes  # the steer stays run 1's message


@contextlib.asynccontextmanager
async def _held_first_run(database_url: str, tmp_path: Path) -> AsyncIterator[tuple[Client, str, str, Path]]:
    """A server whose first run's start effect is held at `turn-recording` (between preparing and recording its
    turn) until `gate` is touched: yields (client, thread id, run id, gate) once the hold is reached. On exit the
    server stops, and its log and the effects table must show no error."""
    home = tmp_path / "ws"
    home.mkdir()
    gate = tmp_path / "gate"
    env = providers_env(tmp_path, PROVIDERS, THREADLOOM_TEST_HOLD_AT=f"turn-recording:{gate}")
    with serving(database_url, tmp_path / "data", env) as server:
        api = Client(server.url, server.admin_token)
        try:
            project = (await api.gql(CREATE_PROJECT, {"name": "held", "root": str(home)}))["createProject"]
            thread = (await api.gql(CREATE_THREAD, {"p": project["project"]["id"]}))["createThread"]["thread"]["id"]
            first = (await api.gql(SEND, {"t": thread, "text": "@reply first", "d": None}))["sendMessage"]
            run_id = first["run"]["id"]

            async def held() -> bool:
                return await asyncio.to_thread(Path(f"{gate}.held").exists)

            await until(held)
            yield api, thread, run_id, gate
        finally:
            await api.aclose()
        server.stop()
        assert server_log.errors(server.log) == [], server.log[-40:]
    assert await troubled_effects(database_url) == []

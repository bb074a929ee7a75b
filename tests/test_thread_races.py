"""Random interleavings of structural operations raced at one thread through the real API of a real server.

Each run draws new rounds from its seed (tests/support/seeds.py; `THREADLOOM_TEST_SEED` replays one): in each
round two to four requests go out at once — sendMessage in every dispatch mode, stopThread, resumeQueue,
rollbackToRun, forkThread, mergeBack, switchProvider, and a wait for the thread to go idle — so they race each
other and the runs they start. Every answer must be data or a typed userError, never a server error. Once the
thread is idle the invariants are checked as a user (and an auditor) would:

- no run is left active, and none queued unless the queue is held for a reason; every interrupted run was
  asked to stop (or says why it was ended), every failed one says why;
- the workspace holds exactly the files of the last operation that set them: the checkpoint captured at the
  end of the last run, or the one a later rollback went back to; every completed run's checkpoint holds the
  file that run wrote;
- the agent's conversation (`@recall`) holds no message of a rolled-back run and the message of every run that
  completed and was not rolled back (itself, or quoted in a handoff);
- the event log replays to the same projections.
"""

from __future__ import annotations

import asyncio
import collections
import random
import re
import subprocess
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support import seeds, server_log
from tests.support.db import assert_log_replays, troubled_effects
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
ROUNDS = 14

CREATE_THREAD = """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "a"}) {
  thread { id } userErrors { code } } }"""
SEND = """mutation($t: ID!, $text: String!, $d: DispatchInput) {
  sendMessage(input: {threadId: $t, text: $text, dispatch: $d}) {
    run { id ordinal } userErrors { code message field } } }"""
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
  project { id } } }"""
RUNS = """query($t: ID!) { thread(id: $t) { runs(first: 100) { nodes {
  id ordinal status statusReason interruptRequestedAt startedAt checkpoint { ref } userMessage { text } } } } }"""
MESSAGES = """query($t: ID!, $after: String) { thread(id: $t) { messages(first: 100, after: $after) {
  pageInfo { hasNextPage endCursor } nodes { role text run { id status } } } } }"""
ACTIVITIES = """query($t: ID!, $after: String) { thread(id: $t) { activities(first: 100, after: $after) {
  pageInfo { hasNextPage endCursor } nodes { kind sequence payload } } } }"""
CHECKPOINTS = """query($t: ID!) { thread(id: $t) { checkpoints(first: 100) { nodes {
  id ordinal ref status scope { kind } } } } }"""

ACTIVE = {"PREPARING", "STARTING", "RUNNING", "WAITING"}
TOKEN = re.compile(r"\bt\d{3}\b")


class Race:
    """The requests of one test, the facts their answers gave, and the tally of what each answered."""

    def __init__(self, api: Client, thread: str, rng: random.Random, instances: str) -> None:
        self.api = api
        self.thread = thread
        self.rng = rng
        self.instances = instances  # what switchProvider may pick ("a" alone: a switch to where it is)
        self.runs: list[tuple[str, int]] = []  # (id, ordinal) of every run a sendMessage made
        self.forks: list[str] = []
        self.tokens = 0
        self.answers: collections.Counter[str] = collections.Counter()

    async def call(self, name: str, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        """The mutation's payload; fails on anything but data with typed userErrors."""
        response = await self.api.post(query, variables)
        assert response.status_code == 200, (name, variables, response.text)
        body = response.json()
        assert "errors" not in body and body.get("data"), (name, variables, body)
        payload: dict[str, Any] = next(iter(body["data"].values()))
        codes = [e["code"] for e in payload["userErrors"]]
        assert all(re.fullmatch(r"[A-Z][A-Z_]+", c) and c != "INTERNAL_SERVER_ERROR" for c in codes), (name, payload)
        self.answers[f"{name}:{','.join(codes) or 'ok'}"] += 1
        return payload

    def token(self, prefix: str = "t") -> str:
        self.tokens += 1
        return f"{prefix}{self.tokens:03d}"

    # ---- the operations: parameters drawn now (from the seed), the request made when awaited ----

    def operation(self) -> Callable[[], Awaitable[None]]:
        kinds = {
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
        kind = self.rng.choices(list(kinds), weights=list(kinds.values()))[0]
        if kind in ("auto", "startImmediately", "queueAfterActive", "steerActive", "restartActive"):
            return self.send(kind)
        return getattr(self, kind)()  # type: ignore[no-any-return]

    def send(self, mode: str) -> Callable[[], Awaitable[None]]:
        token = self.token()
        text = f"@write state.txt {token}\n@write {token}.txt {token}\n@delay 30\n@reply {token} one two three"
        if mode in ("steerActive", "restartActive") and self.runs:
            dispatch: dict[str, Any] = {mode: {"targetRunId": self.rng.choice(self.runs[-3:])[0]}}
        else:
            dispatch = {mode if mode not in ("steerActive", "restartActive") else "auto": True}

        async def go() -> None:
            sent = await self.call(f"send.{mode}", SEND, {"t": self.thread, "text": text, "d": dispatch})
            if sent["run"] is not None:
                self.runs.append((sent["run"]["id"], sent["run"]["ordinal"]))

        return go

    def stop(self) -> Callable[[], Awaitable[None]]:
        return lambda: self._thread_call("stopThread", STOP)

    def resume(self) -> Callable[[], Awaitable[None]]:
        return lambda: self._thread_call("resumeQueue", RESUME)

    async def _thread_call(self, name: str, query: str) -> None:
        await self.call(name, query, {"t": self.thread})

    def rollback(self) -> Callable[[], Awaitable[None]]:
        ordinal = self.rng.randint(0, max((o for _, o in self.runs), default=0))

        async def go() -> None:
            await self.call("rollbackToRun", ROLLBACK, {"t": self.thread, "n": ordinal})

        return go

    def fork(self) -> Callable[[], Awaitable[None]]:
        source = self.rng.choice(self.runs)[0] if self.runs else None

        async def go() -> None:
            if source is not None:
                forked = await self.call("forkThread", FORK, {"r": source})
                if forked["thread"] is not None:
                    self.forks.append(forked["thread"]["id"])

        return go

    def fork_work(self) -> Callable[[], Awaitable[None]]:
        fork = self.rng.choice(self.forks) if self.forks else None
        token = self.token("f")

        async def go() -> None:
            if fork is not None:
                await self.call("fork.send", SEND, {"t": fork, "text": f"@reply {token} on the fork", "d": None})

        return go

    def merge(self) -> Callable[[], Awaitable[None]]:
        fork = self.rng.choice(self.forks) if self.forks else None

        async def go() -> None:
            if fork is not None:
                await self.call("mergeBack", MERGE, {"f": fork})

        return go

    def switch(self) -> Callable[[], Awaitable[None]]:
        instance = self.rng.choice(self.instances)
        return lambda: self._switch(instance)

    async def _switch(self, instance: str) -> None:
        await self.call("switchProvider", SWITCH, {"t": self.thread, "i": instance})

    def settle(self) -> Callable[[], Awaitable[None]]:
        async def go() -> None:
            await self.idle(self.thread, within=15)

        return go

    async def idle(self, thread: str, within: float = 30) -> dict[str, Any]:
        """The thread once nothing runs: no active run, and an empty queue unless it is held."""

        async def check() -> dict[str, Any] | None:
            state = (await self.api.gql(STATE, {"t": thread}))["thread"]
            quiet = state["activeRun"] is None and (not state["queue"] or state["queueHeld"])
            return state if quiet else None

        return await until(check, within=within)


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
    """The files of a checkpoint (a commit in the project's shadow repository) by path."""
    listing = _git(shadow, "ls-tree", "-r", "-z", ref).decode().split("\0")
    files = {}
    for entry in filter(None, listing):
        meta, path = entry.split("\t", 1)
        files[path] = _git(shadow, "cat-file", "blob", meta.split()[2])
    return files


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
    checked for every history; the one-provider case never switches, the three-provider case mostly does."""
    seed = seeds.draw(request)
    rng = seed.random()
    home = tmp_path / "ws"
    home.mkdir()
    data_dir = tmp_path / "data"
    with serving(database_url, data_dir, providers_env(tmp_path, PROVIDERS, **UNLIMITED)) as server:
        api = Client(server.url, server.admin_token)
        try:
            with seed.shown_on_failure():
                switched = await _race_and_check(api, rng, home, data_dir, instances)
                assert instances != "a" or not switched
        finally:
            await api.aclose()
        server.stop()  # quiet: nothing writes while the log is replayed
    with seed.shown_on_failure():
        await assert_log_replays(database_url)


async def _race_and_check(api: Client, rng: random.Random, home: Path, data_dir: Path, instances: str) -> bool:
    """Races, then checks; whether the thread's provider was switched."""
    project = (await api.gql(CREATE_PROJECT, {"name": "races", "root": str(home)}))["createProject"]["project"]
    thread = (await api.gql(CREATE_THREAD, {"p": project["id"]}))["createThread"]["thread"]["id"]
    race = Race(api, thread, rng, instances)
    for _ in range(ROUNDS):
        group = [race.operation() for _ in range(rng.randint(2, 4))]
        await asyncio.gather(*(op() for op in group))
    print(dict(sorted(race.answers.items())))

    # Quiet: the queue resumed (a Stop holds it), every run of the thread and of its forks over.
    await race.call("resumeQueue", RESUME, {"t": thread})
    state = await race.idle(thread)
    for fork in race.forks:
        await race.idle(fork)

    runs = (await api.gql(RUNS, {"t": thread}))["thread"]["runs"]["nodes"]
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

    # The files: those of the last operation that set them, in the thread's own order of events.
    shadow = data_dir / "checkpoints" / f"{_uuid(project['id'])}.git"
    checkpoints = (await api.gql(CHECKPOINTS, {"t": thread}))["thread"]["checkpoints"]["nodes"]
    by_id = {c["id"]: c for c in checkpoints}
    root = {c["ordinal"]: c for c in checkpoints if c["scope"]["kind"] == "ROOT_RUN"}
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
            expected = root[payload["targetOrdinal"]]["ref"]
    if _workspace_files(home) != (_checkpoint_files(shadow, expected) if last else {}):  # for the replay
        for r in sorted(runs, key=lambda r: r["ordinal"]):
            print("RUN", r["ordinal"], r["status"], TOKEN.findall(r["userMessage"]["text"])[:1], r["checkpoint"])
        shown = ("targetOrdinal", "checkpointId", "filePaths", "status", "kind")
        for a in activities:
            if a["kind"].startswith(("rollback", "checkpoint", "run.", "lineage")):
                print("ACT", a["sequence"], a["kind"], {k: v for k, v in (a["payload"] or {}).items() if k in shown})
    if last is None:
        assert _workspace_files(home) == {}
    else:
        assert _workspace_files(home) == _checkpoint_files(shadow, expected), last
    for run in runs:
        if run["status"] == "COMPLETED":
            token = TOKEN.search(run["userMessage"]["text"])
            assert token is not None, run
            held = _checkpoint_files(shadow, run["checkpoint"]["ref"])
            assert held.get(f"{token.group()}.txt") == token.group().encode(), (run["ordinal"], sorted(held))

    # The conversation: what the agent holds now, against the runs that count.
    recall = await race.call("send.recall", SEND, {"t": thread, "text": "@recall", "d": {"startImmediately": True}})
    assert recall["userErrors"] == [], recall
    done = await finished(api, recall["run"]["id"])
    assert done["status"] == "COMPLETED", done
    messages = await _pages(api, MESSAGES, thread, "messages")
    said = "".join(
        m["text"] for m in messages if m["role"] == "ASSISTANT" and m["run"] and m["run"]["id"] == recall["run"]["id"]
    )
    remembered = set(TOKEN.findall(said))
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
    return switched


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

            await until(held)  # the first attempt's start waits between preparing and recording its turn
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
        finally:
            await api.aclose()
        server.stop()
        assert server_log.errors(server.log) == [], server.log[-40:]
    assert await troubled_effects(database_url) == []

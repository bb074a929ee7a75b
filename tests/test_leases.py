"""The writer lease through a real server (docs/leases.md): one holder — a token and the device it names — drives a
thread; everyone may watch.

Each test makes a project of its own with two operate tokens ("laptop-token" and "phone-token") on one server
shared by the module. What is checked is what the devices see through the API: who wins a race, the refusal's
code and the holder it names, nothing written by a refused command, the takeover told on the old holder's
stream, a lease that runs out, observers (queries, subscriptions, a read token) never limited, and another
project's token told nothing. A replica killed while holding leases is in tests/test_leases_replicas.py.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.graphql import make_project, make_thread, workspace
from tests.support.runs import SEND, finished
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from tests.support.ws import WsClient

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)

ACQUIRE = """mutation($t: ID!, $ttl: Int!, $takeover: Boolean!, $device: String) {
  acquireThreadLease(input: {threadId: $t, ttlSeconds: $ttl, takeover: $takeover, deviceId: $device}) {
    thread { lease { deviceId tokenName expiresAt } } userErrors { code message field } } }"""
RENEW = """mutation($t: ID!, $ttl: Int!) { renewThreadLease(input: {threadId: $t, ttlSeconds: $ttl}) {
    thread { lease { deviceId expiresAt } } userErrors { code message field } } }"""
RELEASE = """mutation($t: ID!) { releaseThreadLease(input: {threadId: $t}) {
    thread { lease { deviceId } } userErrors { code message field } } }"""
RENAME = """mutation($t: ID!, $n: String!) { renameThread(input: {threadId: $t, title: $n}) {
    userErrors { code message field } } }"""
STOP = """mutation($t: ID!) { stopThread(input: {threadId: $t}) { userErrors { code message } } }"""
DELEGATE = """mutation($t: ID!) { delegateTask(input: {threadId: $t, text: "@reply sub"}) {
    userErrors { code message } } }"""
STATE = """query($t: ID!) { thread(id: $t) { title status lease { deviceId tokenName }
    runs(first: 20) { nodes { id status } } } }"""
TOKEN = """mutation($p: ID!, $name: String!, $scope: TokenScope!) {
  createToken(input: {projectId: $p, name: $name, scope: $scope}) { secret userErrors { code } } }"""
EVENTS = """subscription($t: ID!) { threadEvents(threadId: $t) {
  sequence type entity { __typename ... on Activity { kind summary payload }
    ... on Thread { lease { deviceId tokenName } } } } }"""


@pytest.fixture
async def admin(server: ServerProcess) -> AsyncIterator[Client]:
    c = Client(server.url, server.admin_token)
    yield c
    await c.aclose()


@dataclasses.dataclass
class Device:
    """One client: a token and the device it names in `Threadloom-Device` (None: no device)."""

    client: Client
    token: str
    device: str | None

    async def gql(self, query: str, variables: dict[str, Any]) -> dict[str, Any]:
        headers = {} if self.device is None else {"Threadloom-Device": self.device}
        return await self.client.gql(query, variables, token=self.token, headers=headers)

    async def acquire(self, thread: str, ttl: int = 60, takeover: bool = False) -> dict[str, Any]:
        found = await self.gql(ACQUIRE, {"t": thread, "ttl": ttl, "takeover": takeover})
        return found["acquireThreadLease"]  # type: ignore[no-any-return]

    async def send(self, thread: str, text: str, **kw: Any) -> dict[str, Any]:
        return (await self.gql(SEND, {"t": thread, "text": text, **kw}))["sendMessage"]  # type: ignore[no-any-return]

    async def state(self, thread: str) -> dict[str, Any]:
        return (await self.gql(STATE, {"t": thread}))["thread"]  # type: ignore[no-any-return]


@dataclasses.dataclass
class Scene:
    thread: str
    root: Path
    laptop: Device
    phone: Device
    reader: Device  # a read token of the project: an observer
    project: str


async def _token(admin: Client, project: str, name: str, scope: str = "OPERATE") -> str:
    made = (await admin.gql(TOKEN, {"p": project, "name": name, "scope": scope}))["createToken"]
    assert made["userErrors"] == [], made
    return str(made["secret"])


@pytest.fixture
async def scene(admin: Client, tmp_path: Path) -> Scene:
    root = Path(workspace(tmp_path))
    project = await make_project(admin, f"leases-{tmp_path.name}", str(root))
    thread = str((await make_thread(admin, project, "driven"))["id"])
    laptop = Device(admin, await _token(admin, project, "laptop-token"), "laptop")
    phone = Device(admin, await _token(admin, project, "phone-token"), "phone")
    reader = Device(admin, await _token(admin, project, "reader-token", "READ"), "tablet")
    return Scene(thread, root, laptop, phone, reader, project)


def _codes(payload: dict[str, Any]) -> list[str]:
    return [e["code"] for e in payload["userErrors"]]


async def test_two_devices_racing_for_a_thread_one_wins_and_the_other_is_refused_naming_the_holder(
    scene: Scene,
) -> None:
    laptop, phone, thread = scene.laptop, scene.phone, scene.thread
    first, second = await asyncio.gather(laptop.acquire(thread), phone.acquire(thread))
    winner, loser = (laptop, phone) if first["userErrors"] == [] else (phone, laptop)
    won, lost = (first, second) if winner is laptop else (second, first)
    assert won["userErrors"] == [] and _codes(lost) == ["WRITER_LEASE_HELD"], (first, second)
    assert won["thread"]["lease"]["deviceId"] == winner.device
    assert f"device {winner.device!r} (token '{winner.device}-token')" in lost["userErrors"][0]["message"]

    # The same race for the thread itself: the holder's message starts a run, the other's is refused.
    mine, theirs = await asyncio.gather(winner.send(thread, "@reply mine"), loser.send(thread, "@reply theirs"))
    assert mine["userErrors"] == [] and _codes(theirs) == ["WRITER_LEASE_HELD"], (mine, theirs)
    assert theirs["run"] is None
    await finished(winner.client, mine["run"]["id"])
    runs = (await winner.state(thread))["runs"]["nodes"]
    assert [r["id"] for r in runs] == [mine["run"]["id"]]  # the refused message wrote nothing


async def test_every_kind_of_write_from_another_holder_is_refused_and_stop_is_the_one_let_through(
    scene: Scene,
) -> None:
    laptop, phone, thread = scene.laptop, scene.phone, scene.thread
    assert (await laptop.acquire(thread))["userErrors"] == []
    held = await laptop.send(thread, "@await go-held\n@reply held")
    assert held["userErrors"] == [] and held["run"]["status"] in {"PREPARING", "RUNNING"}, held
    run_id = held["run"]["id"]
    same_token_no_device = Device(laptop.client, laptop.token, None)
    same_token_other_device = Device(laptop.client, laptop.token, "laptop-2")
    steer = {"d": {"steerActive": {"targetRunId": run_id}}}
    for other in (phone, same_token_no_device, same_token_other_device):
        assert _codes(await other.send(thread, "@reply queued")) == ["WRITER_LEASE_HELD"], other.device
        assert _codes(await other.send(thread, "steered", **steer)) == ["WRITER_LEASE_HELD"]
        renamed = (await other.gql(RENAME, {"t": thread, "n": "taken"}))["renameThread"]
        assert _codes(renamed) == ["WRITER_LEASE_HELD"]
        assert _codes((await other.gql(DELEGATE, {"t": thread}))["delegateTask"]) == ["WRITER_LEASE_HELD"]
    seen = await laptop.state(thread)
    assert seen["title"] == "driven" and [r["id"] for r in seen["runs"]["nodes"]] == [run_id]  # nothing written

    # The twin: the holder's own writes go through.
    renamed = (await laptop.gql(RENAME, {"t": thread, "n": "still mine"}))["renameThread"]
    assert renamed["userErrors"] == []
    # Stop is the safety valve: any operate token of the project may end a runaway agent.
    assert (await phone.gql(STOP, {"t": thread}))["stopThread"]["userErrors"] == []
    assert (await finished(laptop.client, run_id))["status"] == "INTERRUPTED"
    assert (await laptop.state(thread))["lease"]["deviceId"] == "laptop"  # a Stop does not move the lease


async def test_a_takeover_moves_the_lease_and_tells_the_old_holder_on_its_stream(
    scene: Scene, server: ServerProcess
) -> None:
    laptop, phone, thread = scene.laptop, scene.phone, scene.thread
    assert (await laptop.acquire(thread))["userErrors"] == []
    ws = await WsClient.connect(
        server.url, None, payload={"authorization": f"Bearer {laptop.token}", "deviceId": "laptop"}
    )
    try:
        await ws.subscribe(EVENTS, {"t": thread})

        async def told() -> tuple[list[Any], dict[str, Any]]:
            leases: list[Any] = []  # the thread's lease as each `thread.leased` event carried it
            while True:
                message = await ws.receive()
                assert message["type"] == "next", message
                event = message["payload"]["data"]["threadEvents"]
                entity = event["entity"] or {}
                if event["type"] == "thread.leased":
                    leases.append(entity["lease"])
                if entity.get("kind") == "lease.taken_over":
                    return leases, entity

        listening = asyncio.ensure_future(told())
        assert _codes(await phone.acquire(thread)) == ["WRITER_LEASE_HELD"]  # without takeover
        taken = await phone.acquire(thread, takeover=True)
        assert taken["userErrors"] == [] and taken["thread"]["lease"]["deviceId"] == "phone"
        leases, notice = await asyncio.wait_for(listening, 30)
        assert leases[-1] == {"deviceId": "phone", "tokenName": "phone-token"}  # the stream carries the new holder
        assert notice["payload"] == {
            "holder": {"deviceId": "phone", "tokenName": "phone-token"},
            "previous": {"deviceId": "laptop", "tokenName": "laptop-token"},
        }
    finally:
        await ws.close()
    assert _codes(await laptop.send(thread, "@reply late")) == ["WRITER_LEASE_HELD"]
    renewed = (await laptop.gql(RENEW, {"t": thread, "ttl": 60}))["renewThreadLease"]
    assert _codes(renewed) == ["LEASE_NOT_HELD"] and "'phone'" in renewed["userErrors"][0]["message"]
    assert (await phone.send(thread, "@reply phone drives"))["userErrors"] == []


async def test_a_lease_not_renewed_runs_out_and_the_thread_takes_writes_from_anyone_again(scene: Scene) -> None:
    laptop, phone, thread = scene.laptop, scene.phone, scene.thread
    assert (await laptop.acquire(thread, ttl=600))["userErrors"] == []
    assert _codes(await phone.send(thread, "@reply too early")) == ["WRITER_LEASE_HELD"]
    # The holder shortens it to one second and stops renewing (a closed laptop).
    renewed = (await laptop.gql(RENEW, {"t": thread, "ttl": 1}))["renewThreadLease"]
    assert renewed["userErrors"] == [] and renewed["thread"]["lease"]["deviceId"] == "laptop"

    async def ran_out() -> bool | None:
        return True if (await phone.state(thread))["lease"] is None else None

    await until(ran_out, within=30)
    sent = await phone.send(thread, "@reply after expiry")
    assert sent["userErrors"] == [], sent
    late = (await laptop.gql(RENEW, {"t": thread, "ttl": 60}))["renewThreadLease"]
    assert _codes(late) == ["LEASE_NOT_HELD"]  # an expired lease is not revived: acquire again
    assert (await laptop.acquire(thread))["userErrors"] == []


async def test_release_gives_the_thread_back_and_only_the_holder_may_release(scene: Scene) -> None:
    laptop, phone, thread = scene.laptop, scene.phone, scene.thread
    assert (await laptop.acquire(thread))["userErrors"] == []
    assert _codes((await phone.gql(RELEASE, {"t": thread}))["releaseThreadLease"]) == ["WRITER_LEASE_HELD"]
    released = (await laptop.gql(RELEASE, {"t": thread}))["releaseThreadLease"]
    assert released["userErrors"] == [] and released["thread"]["lease"] is None
    assert (await phone.send(thread, "@reply free again"))["userErrors"] == []
    again = (await laptop.gql(RELEASE, {"t": thread}))["releaseThreadLease"]
    assert again["userErrors"] == []  # releasing a thread no one holds changes nothing


async def test_observers_read_and_subscribe_while_another_device_holds_the_lease(
    scene: Scene, server: ServerProcess
) -> None:
    laptop, thread = scene.laptop, scene.thread
    assert (await laptop.acquire(thread))["userErrors"] == []
    ws = await WsClient.connect(server.url, scene.reader.token)
    try:
        await ws.subscribe(EVENTS, {"t": thread})
        sent = await laptop.send(thread, "@reply watched")
        assert sent["userErrors"] == []
        while True:  # the reader's stream carries the holder's run
            message = await ws.receive()
            assert message["type"] == "next", message
            entity = message["payload"]["data"]["threadEvents"]["entity"] or {}
            if entity.get("kind") == "run.completed":
                break
    finally:
        await ws.close()
    for observer in (scene.reader, scene.phone, laptop):
        seen = await observer.state(thread)
        assert seen["lease"] == {"deviceId": "laptop", "tokenName": "laptop-token"}
        assert [r["status"] for r in seen["runs"]["nodes"]] == ["COMPLETED"]


async def test_another_projects_token_is_told_nothing_of_the_lease_and_leases_its_own_thread(
    scene: Scene, admin: Client, tmp_path: Path
) -> None:
    laptop, thread = scene.laptop, scene.thread
    assert (await laptop.acquire(thread))["userErrors"] == []
    other_project = await make_project(admin, f"other-{tmp_path.name}", workspace(tmp_path, "other"))
    own_thread = str((await make_thread(admin, other_project, "its own"))["id"])
    stranger = Device(admin, await _token(admin, other_project, "stranger-token"), "laptop")

    acquired = await stranger.acquire(thread, takeover=True)
    assert _codes(acquired) == ["NOT_FOUND"] and "laptop-token" not in str(acquired)
    for refused in (
        await stranger.send(thread, "@reply intrusion"),
        (await stranger.gql(RENEW, {"t": thread, "ttl": 60}))["renewThreadLease"],
        (await stranger.gql(RELEASE, {"t": thread}))["releaseThreadLease"],
        (await stranger.gql(RENAME, {"t": thread, "n": "mine"}))["renameThread"],
    ):
        assert _codes(refused) == ["NOT_FOUND"] and "laptop" not in str(refused), refused
    assert await stranger.state(thread) is None
    assert (await laptop.state(thread))["lease"]["deviceId"] == "laptop"  # unmoved

    # The twin: the same token, the same probes, on its own project's thread.
    assert (await stranger.acquire(own_thread))["thread"]["lease"]["tokenName"] == "stranger-token"
    assert (await stranger.send(own_thread, "@reply at home"))["userErrors"] == []


async def test_a_device_named_in_connection_init_or_the_input_is_the_holder_and_a_bad_device_is_refused(
    scene: Scene, server: ServerProcess
) -> None:
    laptop, thread = scene.laptop, scene.thread
    # Named in the input by a request that names none: the lease is that device's.
    bare = Device(laptop.client, laptop.token, None)
    named = await bare.gql(ACQUIRE, {"t": thread, "ttl": 60, "takeover": False, "device": "laptop"})
    assert named["acquireThreadLease"]["thread"]["lease"]["deviceId"] == "laptop"
    contradiction = await scene.phone.gql(ACQUIRE, {"t": thread, "ttl": 60, "takeover": True, "device": "other"})
    assert _codes(contradiction["acquireThreadLease"]) == ["INVALID_INPUT"]
    no_device = await bare.acquire(thread)
    assert _codes(no_device) == ["INVALID_INPUT"] and no_device["userErrors"][0]["field"] == "deviceId"
    assert _codes(await laptop.acquire(thread, ttl=0)) == ["INVALID_INPUT"]

    bad = await laptop.client.post(STATE, {"t": thread}, token=laptop.token, headers={"Threadloom-Device": "d" * 200})
    assert bad.status_code == 400 and bad.json()["errors"][0]["extensions"]["code"] == "INVALID_INPUT"

    # Over a socket, the device of connection_init: a mutation there writes as the holder.
    ws = await WsClient.connect(
        server.url, None, payload={"authorization": f"Bearer {laptop.token}", "deviceId": "laptop"}
    )
    try:
        op = await ws.subscribe(RENAME, {"t": thread, "n": "renamed over the socket"})
        answer = await ws.receive()
        assert answer["id"] == op and answer["payload"]["data"]["renameThread"]["userErrors"] == [], answer
    finally:
        await ws.close()
    assert (await laptop.state(thread))["title"] == "renamed over the socket"

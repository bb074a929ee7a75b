"""Recovery and retryRun with the real Codex and Claude Code CLIs against the fake model (the only replaced part).

- A restart in flight: the model holds the turn's reply (`HOLD`: one chunk, then nothing until the test releases
  it), so the turn is provably running and no tool ran; the server gets `kill -9` (its agent dies with it) and a
  new server starts on the same database and data folder. Recovery gives the run a PROVIDER_RECOVERY attempt on
  the same native thread, resumed by the CLI in a new process; released, the run completes.
- retryRun: the model answers the message's first request with HTTP 500 (`FAIL: 500 times=1`), the run fails
  typed (MODEL_SERVER_ERROR); `retryRun` makes a RETRY attempt on the same native thread and the run completes.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import MODEL_PATH, cli_providers_env
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until

PROVIDERS = ["codex", "claude"]
THREAD = """mutation($p: ID!, $i: String!) { createThread(input: {projectId: $p, providerInstanceId: $i, title: "t"}) {
  thread { id } userErrors { code message } } }"""
RUN = """query($r: ID!) { run(id: $r) {
  id status statusReason failure { code }
  attempts { attemptOrdinal reason status statusReason
             providerTurns { status providerThread { id nativeThreadRef } } } } }"""
RETRY = """mutation($r: ID!) { retryRun(input: {runId: $r}) { run { id } userErrors { code message } } }"""
WAIT_S = 90.0


class Restartable:
    """A server with `codex` and `claude` instances on `fake`, killed (-9) and started again on its database."""

    def __init__(self, database_url: str, folder: Path, fake: FakeModel) -> None:
        self.database_url = database_url
        self.data_dir = folder / "data"
        self.env = cli_providers_env(folder, fake)
        self.server = ServerProcess(database_url, self.data_dir, env=self.env).wait_ready()
        assert self.server.admin_token is not None
        self.token: str = self.server.admin_token
        self.dead: list[ServerProcess] = []

    def client(self) -> Client:
        return Client(self.server.url, self.token)

    def crash_and_restart(self) -> None:
        self.server.kill()
        self.dead.append(self.server)
        self.server = ServerProcess(self.database_url, self.data_dir, env=self.env).wait_ready()


@pytest.fixture
def restartable(database_url: str, tmp_path: Path, fake: FakeModel) -> Iterator[Restartable]:
    r = Restartable(database_url, tmp_path, fake)
    yield r
    r.server.stop()
    for proc in [*r.dead, r.server]:
        print(proc.report(60))  # shown by pytest only when the test fails


async def _thread(client: Client, tmp_path: Path, provider: str) -> str:
    workspace = tmp_path / f"ws-{provider}"
    workspace.mkdir()
    project = (await client.gql(CREATE_PROJECT, {"name": provider, "root": str(workspace)}))["createProject"]
    made = (await client.gql(THREAD, {"p": project["project"]["id"], "i": provider}))["createThread"]
    assert made["userErrors"] == [], made
    return str(made["thread"]["id"])


async def _run(client: Client, run_id: str) -> dict[str, Any]:
    return (await client.gql(RUN, {"r": run_id}))["run"]  # type: ignore[no-any-return]


def _attempts(run: dict[str, Any]) -> list[tuple[int, str, str, str | None]]:
    return [(a["attemptOrdinal"], a["reason"], a["status"], a["statusReason"]) for a in run["attempts"]]


def _native_threads(run: dict[str, Any]) -> set[str]:
    return {t["providerThread"]["nativeThreadRef"] for a in run["attempts"] for t in a["providerTurns"]}


async def _requests_beyond(fake: FakeModel, provider: str, seen: int) -> None:
    async def check() -> bool:
        return len(fake.bodies(MODEL_PATH[provider])) > seen

    await until(check, within=WAIT_S)


@pytest.mark.parametrize("provider", PROVIDERS)
async def test_a_turn_in_flight_at_a_kill_9_completes_on_a_recovery_attempt_on_the_resumed_native_thread(
    restartable: Restartable, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    client = restartable.client()
    try:
        thread = await _thread(client, tmp_path, provider)
        sent = await send(client, thread, "HOLD\nthen finish")
        assert sent["userErrors"] == [], sent
        run_id = str(sent["run"]["id"])
        await _requests_beyond(fake, provider, 0)  # the model has the turn's request and holds its reply

        async def running() -> bool:
            return (await _run(client, run_id))["status"] == "RUNNING"

        await until(running, within=WAIT_S)
        before = len(fake.bodies(MODEL_PATH[provider]))
        restartable.crash_and_restart()
        await client.aclose()
        client = restartable.client()

        async def recovering() -> dict[str, Any] | None:
            found = await _run(client, run_id)
            return found if len(found["attempts"]) == 2 and found["attempts"][1]["status"] == "RUNNING" else None

        found = await until(recovering, within=WAIT_S)
        assert _attempts(found)[0] == (1, "INITIAL", "FAILED", "provider_lost")
        await _requests_beyond(fake, provider, before)  # the resumed CLI asked the model again
        fake.release()
        done = await finished(client, run_id, within=WAIT_S)
        assert done["status"] == "COMPLETED", done
        run = await _run(client, run_id)
        assert _attempts(run) == [
            (1, "INITIAL", "FAILED", "provider_lost"),
            (2, "PROVIDER_RECOVERY", "COMPLETED", None),
        ]
        assert len(_native_threads(run)) == 1, run  # the same native thread, resumed by the new process
    finally:
        await client.aclose()


@pytest.mark.parametrize("provider", ["codex"])
async def test_retry_run_completes_a_run_the_model_api_failed(
    restartable: Restartable, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    """Codex only: its own retries are off (`request_max_retries = 0`), so the 500 reaches the run at once."""
    client = restartable.client()
    try:
        thread = await _thread(client, tmp_path, provider)
        sent = await send(client, thread, "FAIL: 500 times=1\nsay hello")
        run_id = str(sent["run"]["id"])
        failed = await finished(client, run_id, within=WAIT_S)
        assert failed["status"] == "FAILED", failed
        assert (await _run(client, run_id))["failure"]["code"] == "MODEL_SERVER_ERROR"
        seen = len(fake.bodies(MODEL_PATH[provider]))

        retried = (await client.gql(RETRY, {"r": run_id}))["retryRun"]
        assert retried["userErrors"] == [], retried
        done = await finished(client, run_id, within=WAIT_S)
        assert done["status"] == "COMPLETED", done
        run = await _run(client, run_id)
        assert (run["statusReason"], run["failure"]) == (None, None)
        assert [(a, r, s) for a, r, s, _ in _attempts(run)] == [(1, "INITIAL", "FAILED"), (2, "RETRY", "COMPLETED")]
        assert len(_native_threads(run)) == 1, run  # the retry went to the same native thread
        assert len(fake.bodies(MODEL_PATH[provider])) > seen  # and to the model again
    finally:
        await client.aclose()

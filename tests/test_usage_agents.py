"""The usage ledger with the real Codex and Claude CLIs through the whole service, against the fake model
(which answers every request with fixed `usage` in each API's own wire format: tests/support/fake_openai.py,
fake_anthropic.py). Each call the model served must be in the ledger exactly once, on the node that made it.

One fake model and one server for the module: `codex` prices its default model from a price table, `claude`
has none (its cost is the one Claude Code reports per query).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.agents import MODEL_PATH, agent_thread, cli_providers_env, until_held
from tests.support.fake_anthropic import USAGE as ANTHROPIC_USAGE
from tests.support.fake_model import FakeModel
from tests.support.fake_openai import USAGE as OPENAI_USAGE
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until

pytestmark = pytest.mark.timeout(240)

PRICES = """
[instances.codex.prices."gpt-5.5"]
input = 1.25
cached_input = 0.125
output = 10.0
"""
USAGE = "usage { calls inputTokens cachedInputTokens cacheWriteTokens outputTokens reasoningTokens costUsd costSource }"
RUN = (
    "query($id: ID!) { run(id: $id) { status "
    + USAGE
    + " usageRecords { node { id kind } model inputTokens outputTokens costUsd costSource }"
    + " rootNode { id "
    + USAGE
    + " children { id kind "
    + USAGE
    + " } } } }"
)
RUNS = "query($id: ID!) { thread(id: $id) { runs(first: 10) { edges { node { id } } } } }"
# One call of each fake, as the ledger counts it (input holds the cache's reads and writes).
CODEX_IN, CODEX_CACHED = OPENAI_USAGE["input_tokens"], OPENAI_USAGE["input_tokens_details"]["cached_tokens"]
CODEX_OUT, CODEX_REASONING = OPENAI_USAGE["output_tokens"], OPENAI_USAGE["output_tokens_details"]["reasoning_tokens"]
CLAUDE_IN = sum(ANTHROPIC_USAGE[k] for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens"))
CLAUDE_OUT = ANTHROPIC_USAGE["output_tokens"]


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
def server(
    database_url: str, module_fake: FakeModel, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    base = tmp_path_factory.mktemp("usage-agents")
    env = cli_providers_env(base, module_fake)
    Path(env["THREADLOOM_PROVIDERS"]).write_text(Path(env["THREADLOOM_PROVIDERS"]).read_text() + PRICES)
    proc = ServerProcess(database_url, base / "data", env=env).wait_ready()
    yield proc
    proc.stop()
    print(proc.report(60))


@pytest.fixture(scope="module")
async def client(server: ServerProcess) -> AsyncIterator[Client]:
    c = Client(server.url, server.admin_token)
    yield c
    await c.aclose()


async def _ran(
    client: Client, module_fake: FakeModel, provider: str, thread: str, text: str
) -> tuple[dict[str, Any], int]:
    """The run of `text`, ended, and how many requests the model served meanwhile."""
    before = len(module_fake.bodies(MODEL_PATH[provider]))
    sent = await send(client, thread, text)
    assert sent["userErrors"] == [], sent
    assert (await finished(client, sent["run"]["id"], within=120))["status"] == "COMPLETED"
    served = len(module_fake.bodies(MODEL_PATH[provider])) - before
    return (await client.gql(RUN, {"id": sent["run"]["id"]}))["run"], served


async def test_codex_records_each_response_once_priced_from_the_table(
    client: Client, module_fake: FakeModel, tmp_path_factory: pytest.TempPathFactory
) -> None:
    thread = await agent_thread(client, tmp_path_factory.mktemp("codex") / "ws", "codex")
    found, served = await _ran(client, module_fake, "codex", thread, "RUN: echo hi")
    assert served == 2  # the tool call, then the reply
    one = (CODEX_IN - CODEX_CACHED) * 1.25 + CODEX_CACHED * 0.125 + CODEX_OUT * 10.0  # µ$ of one call
    assert [(r["model"], r["inputTokens"], r["outputTokens"], r["costSource"]) for r in found["usageRecords"]] == [
        ("gpt-5.5", CODEX_IN, CODEX_OUT, "PRICED")
    ] * served
    assert found["usage"] == {
        "calls": served,
        "inputTokens": served * CODEX_IN,
        "cachedInputTokens": served * CODEX_CACHED,
        "cacheWriteTokens": 0,
        "outputTokens": served * CODEX_OUT,
        "reasoningTokens": served * CODEX_REASONING,
        "costUsd": pytest.approx(served * one / 1e6),
        "costSource": "PRICED",
    }
    assert {r["node"]["id"] for r in found["usageRecords"]} == {found["rootNode"]["id"]}


async def test_a_steer_into_a_running_codex_turn_adds_its_calls_to_the_same_run(
    client: Client, module_fake: FakeModel, tmp_path_factory: pytest.TempPathFactory
) -> None:
    thread = await agent_thread(client, tmp_path_factory.mktemp("codex-steer") / "ws", "codex")
    module_fake.reset_hold()
    before = len(module_fake.bodies("/v1/responses"))
    ended = _ended(module_fake)
    held = await send(client, thread, "HOLD")
    await until_held(client, module_fake, held["run"]["id"], "/v1/responses", since=before)
    try:
        steer = await send(client, thread, "STEERED-5150")
        assert steer["appliedDispatch"] == "STEER_ACTIVE", steer
        # The hold is not released: the held reply never ends, so the turn can only end by taking the steer in
        # (Codex drops the held reply and asks again with the steer). Releasing here would race the steer's
        # delivery, which follows the answer: a turn that ended first makes the steer a new run (a run of its
        # own, docs/lifecycles/steering-and-queue.md), and this run would hold one call, not the steered one.
        assert (await finished(client, held["run"]["id"], within=120))["status"] == "COMPLETED"
    finally:
        module_fake.release()
    served = len(module_fake.bodies("/v1/responses")) - before

    async def settled() -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:  # each reply ended
        sent, dropped = (now[len(then) :] for now, then in zip(_ended(module_fake), ended, strict=True))
        return (sent, dropped) if len(sent) + len(dropped) == served else None

    completed, dropped = await until(settled)
    # The held reply was dropped unfinished (Codex reports no usage for it), the steered one sent to its end.
    assert (served, len(completed), len(dropped)) == (2, 1, 1)
    assert "STEERED-5150" in str(completed[0]) and "STEERED-5150" not in str(dropped[0])
    found = (await client.gql(RUN, {"id": held["run"]["id"]}))["run"]
    assert found["usage"]["calls"] == 1 and found["usage"]["inputTokens"] == CODEX_IN, found["usage"]
    assert [r["node"]["id"] for r in found["usageRecords"]] == [found["rootNode"]["id"]]
    runs = (await client.gql(RUNS, {"id": thread}))["thread"]["runs"]
    assert [r["node"]["id"] for r in runs["edges"]] == [held["run"]["id"]]  # no run of its own for the steer


def _ended(module_fake: FakeModel) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Bodies of the Codex requests whose reply the fake sent to its end, and of those the client dropped first."""
    return (
        [r["body"] for r in module_fake.streamed if r["path"] == "/v1/responses"],
        [r["body"] for r in module_fake.abandoned if r["path"] == "/v1/responses"],
    )


async def test_claude_records_each_call_once_on_its_node_and_the_querys_reported_cost(
    client: Client, module_fake: FakeModel, tmp_path_factory: pytest.TempPathFactory
) -> None:
    thread = await agent_thread(client, tmp_path_factory.mktemp("claude") / "ws", "claude")
    found, served = await _ran(client, module_fake, "claude", thread, "AGENT: look around")
    root = found["rootNode"]
    subagent = next(c for c in root["children"] if c["kind"] == "SUBAGENT")
    records = found["usageRecords"]
    calls = [r for r in records if r["inputTokens"]]
    # Every request the model served is one call (main loop, the subagent, any side request): none twice.
    assert found["usage"]["inputTokens"] == served * CLAUDE_IN, (served, records)
    assert found["usage"]["outputTokens"] == served * CLAUDE_OUT
    assert found["usage"]["cachedInputTokens"] == served * ANTHROPIC_USAGE["cache_read_input_tokens"]
    assert found["usage"]["cacheWriteTokens"] == served * ANTHROPIC_USAGE["cache_creation_input_tokens"]
    assert len({r["model"] for r in records}) == 1 and "[" not in records[0]["model"]  # the API's name
    # The calls carry no cost of their own; the query's record carries what Claude Code reported.
    assert all(r["costUsd"] is None and r["costSource"] == "REPORTED" for r in calls)
    (query,) = [r for r in records if r["costUsd"] is not None]
    assert query["costSource"] == "REPORTED" and query["costUsd"] > 0
    assert (found["usage"]["costUsd"], found["usage"]["costSource"]) == (query["costUsd"], "REPORTED")
    # The subagent's call is on its node; its cost is in its parent turn's figure, so alone it is unknown.
    assert [r["node"]["id"] for r in calls].count(subagent["id"]) == 1
    assert subagent["usage"]["calls"] == 1 and subagent["usage"]["costUsd"] is None
    assert subagent["usage"]["costSource"] == "UNKNOWN"
    assert root["usage"]["costUsd"] == query["costUsd"]  # the root's subtree holds both

"""The prefix-probing attack on the redactor, run as a tenant would run it, against Codex, Claude Code and ACP.

The attack (issue: "the secret redactor is an oracle"): a read token watches `threadEvents` while the agent
prints guesses; a redactor that kept back a tail because it *could* begin the instance's secret would show a
right prefix differently from a wrong one, and the secret could be recovered one character at a time. Here the
agent prints `<filler><guess>` in one delta and then waits (the fake model's `PROBE:` holds its reply until the
test releases it; the ACP agent's command waits for a gate file), so what the watcher has received while it
waits is exactly what the redactor let through — no timing involved. For a right prefix of the instance's
secret and a wrong guess of the same length, the frames received while waiting are compared (their number and
lengths: the last `STREAM_HOLD` characters kept back, whatever they are), and so are the frames after the
release (every one a prefix of the final text; their number depends on the server's 50 ms write window, so
only the lengths it may show are compared) and the final text (the guess as typed, nothing redacted).

Twin, so a pass cannot come from a probe that never reaches the redactor: the whole secret printed the same
way does become `***`, held back for the same length while waiting.

One server for the module: `codex` (the real Codex CLI) and `claude` (the real Claude Code CLI) against the
fake model server, each with its own API key as the secret; `acp` (the scripted agent's ACP face) with a
secret in its instance `env`.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.acp_scripted import acp_instance
from tests.support.agents import cli_providers_env
from tests.support.cli import create_token
from tests.support.fake_model import PROBE_END, FakeModel
from tests.support.graphql import CREATE_PROJECT, workspace
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess, serving
from tests.support.ws import WsClient
from threadloom.providers.agent_cli import STREAM_HOLD

CODEX_KEY = "sk-codex-5f1e9a07c3d2b864"
CLAUDE_KEY = "sk-claude-0b7d3e61a9f24c58"
ACP_SECRET = "acp-env-91c4f0e2d7b3a865"
SECRETS = {"codex": CODEX_KEY, "claude": CLAUDE_KEY, "acp": ACP_SECRET}
FILLER = "the agent prints a guess after this opening line of eighty characters exactly:::"
THREAD = """mutation($p: ID!, $i: String!) { createThread(input: {projectId: $p, providerInstanceId: $i,
  title: "probe"}) { thread { id } userErrors { code message } } }"""
EVENTS = """subscription($t: ID!, $after: Int) { threadEvents(threadId: $t, afterSequence: $after) {
  sequence type entity { ... on ConversationMessage { id role text streaming }
  ... on ExecutionNode { id kind status detail } } } }"""
LATEST = "query($t: ID!) { thread(id: $t) { latestSequence } }"
_gates = itertools.count(1)


def _wrong(right: str) -> str:
    """A guess of the same length as `right` that begins no secret (its first character changed)."""
    return ("#" if right[0] != "#" else "%") + right[1:]


@pytest.fixture(scope="module")
async def module_db(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
def server(module_db: str, module_fake: FakeModel, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    folder = tmp_path_factory.mktemp("probe")
    env = cli_providers_env(folder, module_fake, openai_key=CODEX_KEY, anthropic_key=CLAUDE_KEY)
    config = Path(env["THREADLOOM_PROVIDERS"])
    acp = acp_instance("acp") + f'env = {{ PROBE_SECRET = "{ACP_SECRET}" }}\n'
    config.write_text(config.read_text() + "\n" + acp)
    with serving(module_db, folder / "data", env) as proc:
        yield proc


@pytest.fixture
async def watch(server: ServerProcess, module_db: str, tmp_path: Path) -> AsyncIterator[Callable[[str], Any]]:
    """`await watch(instance)`: (admin client, a read token of a new project, a thread of `instance` in it,
    the project's workspace)."""
    admin = Client(server.url, server.admin_token)
    root = workspace(tmp_path)
    project = (await admin.gql(CREATE_PROJECT, {"name": "probe", "root": root}))["createProject"]["project"]["id"]
    reader = create_token(module_db, "read", str(project))[1]

    async def make(instance: str) -> tuple[Client, str, str, Path]:
        made = (await admin.gql(THREAD, {"p": project, "i": instance}))["createThread"]
        assert made["userErrors"] == [], made
        return admin, reader, str(made["thread"]["id"]), Path(root)

    try:
        yield make
    finally:
        await admin.aclose()


@dataclasses.dataclass
class Seen:
    """What the read token received of the probed item: the texts shown while the agent waited, the
    streamed texts after the release, and the final text."""

    waiting: list[str]
    after: list[str]
    final: str


def _text_of(entity: dict[str, Any], channel: str) -> tuple[str, bool] | None:
    """(the probed text so far, still streaming) of an entity of the probed channel, else None."""
    if channel == "message" and entity.get("role") == "ASSISTANT":
        return str(entity["text"]), bool(entity["streaming"])
    if channel == "output" and "command" in (entity.get("detail") or {}):
        return str((entity.get("detail") or {}).get("output") or ""), entity["status"] == "RUNNING"
    return None


async def _probe(
    admin: Client, reader: str, thread: str, message: str, channel: str, release: Callable[[], None]
) -> Seen:
    """Send `message` (whose agent prints one delta and waits), read the read token's frames of the printed
    item until something shows, release the agent, and read the rest until the item's final text."""
    after = int((await admin.gql(LATEST, {"t": thread}))["thread"]["latestSequence"])
    ws = await WsClient.connect(admin.base_url, reader)
    try:
        await ws.subscribe(EVENTS, {"t": thread, "after": after})
        sent = await send(admin, thread, message)
        assert sent["userErrors"] == [], sent
        waiting: list[str] = []
        streamed: list[str] = []
        while True:
            received = await ws.receive(within=60)
            assert received["type"] == "next", received
            entity = received["payload"]["data"]["threadEvents"]["entity"] or {}
            found = _text_of(entity, channel)
            if found is None or not found[0]:
                continue  # another item, or the item's start before anything was let through
            text, streaming = found
            if not waiting:
                # The agent has printed everything it will print until released, in one delta: this is all
                # the redactor lets through meanwhile. Release it.
                waiting.append(text)
                assert streaming, text
                release()
                continue
            if not streaming:
                final = text
                break
            streamed.append(text)
        done = await finished(admin, sent["run"]["id"], within=60)
        assert done["status"] == "COMPLETED", done
    finally:
        await ws.close()
    return Seen(waiting, streamed, final)


def _assert_alike(right: Seen, wrong: Seen, right_text: str, wrong_text: str, end: str = PROBE_END) -> None:
    """The frames of a right and a wrong guess have the same shape, and each shows exactly what was typed
    (followed by `end`, what the agent printed once released)."""
    assert [len(t) for t in right.waiting] == [len(t) for t in wrong.waiting] == [len(right_text) - STREAM_HOLD]
    assert right.waiting == [right_text[:-STREAM_HOLD]]
    assert wrong.waiting == [wrong_text[:-STREAM_HOLD]]
    assert right.final == right_text + end
    assert wrong.final == wrong_text + end
    # After the release: `end`'s delta pushes out as much of the tail, then the item's end releases the rest.
    allowed = {len(right.final) - STREAM_HOLD if end else len(right.final), len(right.final)}
    assert {len(t) for t in right.after} <= allowed and {len(t) for t in wrong.after} <= allowed
    for seen in (right, wrong):
        assert all(seen.final.startswith(t) for t in seen.after), seen


def _guesses(secret: str) -> list[tuple[str, str]]:
    """(right, wrong) texts the agent prints: a prefix of the secret one character short, at the end (wholly in
    the kept-back tail) and with the cut through it (partly shown while waiting); half the secret at the end."""
    short, half = secret[:-1], secret[: len(secret) // 2]
    pad = "." * (STREAM_HOLD - len(short) // 2)  # the cut falls in the middle of the guess
    return [
        (FILLER + short, FILLER + _wrong(short)),
        (FILLER + short + pad, FILLER + _wrong(short) + pad),
        (FILLER + half, FILLER + _wrong(half)),
    ]


@pytest.mark.parametrize("instance", ["codex", "claude"])
async def test_a_right_prefix_streams_like_a_wrong_guess_in_agent_text(
    instance: str, module_fake: FakeModel, watch: Callable[[str], Any]
) -> None:
    admin, reader, thread, _ = await watch(instance)
    secret = SECRETS[instance]

    async def probe(text: str) -> Seen:
        module_fake.reset_hold()
        return await _probe(admin, reader, thread, f"PROBE: {text}", "message", module_fake.release)

    for right_text, wrong_text in _guesses(secret):
        right, wrong = await probe(right_text), await probe(wrong_text)
        _assert_alike(right, wrong, right_text, wrong_text)
    # The twin: the whole key printed the same way is redacted, kept back as long while the agent waits.
    whole = await probe(FILLER + secret)
    assert whole.waiting == [FILLER[: len(FILLER) + len(secret) - STREAM_HOLD]]
    assert whole.final == FILLER + "***" + PROBE_END
    assert not any(secret in t for t in (*whole.waiting, *whole.after))


async def test_a_right_prefix_streams_like_a_wrong_guess_in_acp_tool_output(watch: Callable[[str], Any]) -> None:
    admin, reader, thread, root = await watch("acp")

    async def probe(text: str) -> Seen:
        gate = root / f".gate{next(_gates)}"
        command = f"@tool printf %s '{text}'; until [ -e {gate.name} ]; do sleep 0.02; done"
        return await _probe(admin, reader, thread, command, "output", gate.touch)

    for right_text, wrong_text in _guesses(ACP_SECRET):
        right, wrong = await probe(right_text), await probe(wrong_text)
        _assert_alike(right, wrong, right_text, wrong_text, end="")  # the gate only lets the command finish
    whole = await probe(FILLER + ACP_SECRET)
    assert whole.waiting == [FILLER[: len(FILLER) + len(ACP_SECRET) - STREAM_HOLD]]
    assert whole.final == FILLER + "***"
    assert not any(ACP_SECRET in t for t in (*whole.waiting, *whole.after))


async def test_acp_tool_output_reaches_a_watcher_once_though_each_update_carries_all_of_it(
    watch: Callable[[str], Any],
) -> None:
    """ACP's `tool_call_update` carries the tool's whole content so far; each part of the output is shown once
    (it was appended again with every update: `aaa`, `aaabbb` made `aaaaaabbb`). The command prints three parts,
    each after the watcher has seen the previous one, so they reach the driver as three updates."""
    admin, reader, thread, root = await watch("acp")
    parts = [c * 100 for c in "abc"]
    gates = [root / f".part{next(_gates)}" for _ in parts[1:]]
    command = "@tool " + "; ".join(
        f"printf %s {part}" + ("" if k == len(gates) else f"; until [ -e {gates[k].name} ]; do sleep 0.02; done")
        for k, part in enumerate(parts)
    )
    after = int((await admin.gql(LATEST, {"t": thread}))["thread"]["latestSequence"])
    ws = await WsClient.connect(admin.base_url, reader)
    try:
        await ws.subscribe(EVENTS, {"t": thread, "after": after})
        sent = await send(admin, thread, command)
        shown: list[str] = []
        while True:
            entity = (await ws.receive(within=60))["payload"]["data"]["threadEvents"]["entity"] or {}
            found = _text_of(entity, "output")
            if found is None or not found[0]:
                continue
            shown.append(found[0])
            if not found[1]:
                break
            opened = sum(g.exists() for g in gates)
            if opened < len(gates) and len(found[0]) >= 100 * (opened + 1) - STREAM_HOLD:
                gates[opened].touch()  # the part before it has reached the watcher: print the next one
        assert (await finished(admin, sent["run"]["id"], within=60))["status"] == "COMPLETED"
    finally:
        await ws.close()
    whole = "".join(parts)
    assert shown[-1] == whole
    assert all(whole.startswith(text) for text in shown), shown

"""Secrets are redacted from driver events, and the redaction tells nothing about what is not typed whole.

The redactor keeps back a tail of fixed length of every stream; what it emits, and when, depends only on
the lengths of the deltas. A stream typing the beginning of a secret looks exactly like one typing any other
text of the same length, so prefixes cannot be probed one character at a time; only the exact secret turns
into `***` (the agent printing it held it). Only what the agent process holds is redacted: its API key and
its instance's `env`, never the server's own secrets (the agent cannot know them).

The unit tests feed the redactor directly; the API tests watch a real server's threadEvents with a read
token while the real Codex CLI (against the fake model server) or the scripted agent types.
"""

from __future__ import annotations

import dataclasses
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.support.agents import cli_providers_env
from tests.support.cli import create_token
from tests.support.fake_model import FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.ws import WsClient
from threadloom.providers.agent_cli import STREAM_HOLD, StreamRedactor, driver_secrets
from threadloom.providers.contract import (
    ItemCompleted,
    OutputDelta,
    ProviderEvent,
    RuntimeExited,
    TextDelta,
    TurnCompleted,
)

SECRET = "sk-live-0123456789abcdef"
OTHER = "qz-mild-9876543210fedcba"  # the same length as SECRET, sharing no prefix with it
LONG = "-----BEGIN KEY-----" + "".join(f"{k:03d}x" for k in range(60)) + "-----END KEY-----"  # > STREAM_HOLD


def _stream(redactor: StreamRedactor, events: list[ProviderEvent]) -> str:
    out = []
    for event in events:
        for emitted in redactor.events(event):
            if isinstance(emitted, OutputDelta | TextDelta):
                out.append(emitted.delta)
    return "".join(out)


def _shape(redactor: StreamRedactor, events: list[ProviderEvent]) -> list[list[int]]:
    """For each event fed in, the lengths of the deltas it made the redactor emit: what a watcher of the
    stream can measure (how much appears, and at which point of the agent's output)."""
    return [
        [len(e.delta) for e in redactor.events(event) if isinstance(e, OutputDelta | TextDelta)] for event in events
    ]


def _chunks(text: str, size: int) -> list[ProviderEvent]:
    return [OutputDelta("t", "u", "i", text[k : k + size]) for k in range(0, len(text), size)]


def _done(text: str) -> ItemCompleted:
    return ItemCompleted("t", "u", "i", "tool_call", "completed", detail={"output": text})


def test_a_secret_cut_anywhere_is_redacted_and_nothing_else_is_lost() -> None:
    text = f"before {SECRET} middle {SECRET[:5]} after {SECRET}"
    expected = text.replace(SECRET, "***")
    for size in range(1, len(text) + 1):
        redactor = StreamRedactor((SECRET,))
        got = _stream(redactor, [*_chunks(text, size), _done(text)])
        assert got == expected, size


def test_typing_a_prefix_of_a_secret_looks_like_typing_anything_else() -> None:
    """The prefix-probing attack: the agent echoes guesses; the watcher compares what appears when."""
    filler = "the agent says: " * 6  # longer than the held tail, so some text is emitted while typing
    for known in range(1, len(SECRET)):  # every guess of a prefix, right or wrong
        for size in (1, 3, 7, 64):
            right, wrong = filler + SECRET[:known], filler + OTHER[:known]
            seen = _shape(StreamRedactor((SECRET,)), [*_chunks(right, size), _done(right)])
            assert seen == _shape(StreamRedactor((SECRET,)), [*_chunks(wrong, size), _done(wrong)]), (known, size)
    # The same holds of a secret longer than the held tail (redacted as pieces of more than half the tail:
    # each piece is a secret of its own, confirmed only when typed whole).
    for known in (1, 20, STREAM_HOLD // 2):
        right, wrong = filler + LONG[:known], filler + "z" * known
        seen = _shape(StreamRedactor((LONG,)), [*_chunks(right, 5), _done(right)])
        assert seen == _shape(StreamRedactor((LONG,)), [*_chunks(wrong, 5), _done(wrong)]), known


def test_the_held_tail_has_one_length_whatever_the_secrets() -> None:
    for secrets in ((SECRET,), (LONG,), (SECRET, LONG), ("abcdef",)):
        redactor = StreamRedactor(secrets)
        [emitted] = redactor.events(OutputDelta("t", "u", "i", "x" * 500))
        assert isinstance(emitted, OutputDelta) and len(emitted.delta) == 500 - STREAM_HOLD
    # A driver with no secret (the scripted agent) keeps nothing back and changes nothing.
    plain = StreamRedactor(())
    assert _shape(plain, _chunks(f"a{SECRET}bcd", 4)) == [[4]] * 7
    assert plain.text(SECRET) == SECRET


def test_the_whole_secret_still_ends_up_as_stars() -> None:
    text = f"key={SECRET}\nlong={LONG}\n"
    for size in (1, 2, 9, 40, len(text)):
        redactor = StreamRedactor((SECRET, LONG))
        streamed = _stream(redactor, _chunks(text, size))
        streamed += "".join(e.delta for e in redactor.flush() if isinstance(e, OutputDelta))
        assert SECRET not in streamed and "key=***\n" in streamed, size
        # The long one went out as pieces no longer than the tail, each replaced: no character of it shows.
        assert streamed.startswith("key=***\nlong=") and set(streamed[len("key=***\nlong=") : -1]) == {"*"}, size
        [done] = redactor.events(_done(text))
        assert isinstance(done, ItemCompleted) and done.detail == {"output": "key=***\nlong=***\n"}


def test_tails_are_released_by_the_item_the_turn_the_exit_and_flush() -> None:
    redactor = StreamRedactor((SECRET,))
    assert _stream(redactor, [TextDelta("t", "u", "m", "hello")]) == ""  # any short text is kept back
    assert _stream(redactor, [TextDelta("t", "u", "m", " and sk-li")]) == ""
    assert _stream(redactor, [TurnCompleted("t", "u", "completed")]) == "hello and sk-li"
    assert _stream(redactor, [OutputDelta("t", "u", "x", "partial")]) == ""
    assert _stream(redactor, [_done("partial")]) == ""  # another item's end releases only its own tail
    assert _stream(redactor, [OutputDelta("t", "u", "i", "mine")]) == ""
    assert _stream(redactor, [_done("mine")]) == "mine"
    assert _stream(redactor, [RuntimeExited("gone", 1)]) == "partial"
    assert _stream(redactor, [OutputDelta("t", "u", "x", SECRET)]) == ""
    assert [e.delta for e in redactor.flush() if isinstance(e, OutputDelta)] == ["***"]  # released redacted
    assert redactor.flush() == []


def test_completed_items_are_redacted_whole() -> None:
    redactor = StreamRedactor((SECRET,))
    [done] = redactor.events(_done(SECRET))
    assert isinstance(done, ItemCompleted)
    assert done.detail == {"output": "***"}


def test_only_the_agents_own_variables_are_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's secrets are not on the list, even when the server's environment has them."""
    monkeypatch.setenv("THREADLOOM_UNIT_TOKEN", "server-only-token-1234")
    env = {"OPENAI_API_KEY": SECRET, "DEPLOY_PASS": "pw-4711", "SHORT": "abc", "PATH": "/usr/bin"}
    assert driver_secrets(env, ("OPENAI_API_KEY", "DEPLOY_PASS", "SHORT", "MISSING")) == (SECRET, "pw-4711")


# ---- through the API: a read token watching threadEvents of a real server ----------------------------

KEY = "sk-fake-openai-7d1c44e0b9a2"  # the codex instance's API key: the agent holds it
SERVER_SECRET = "srv-token-3b8f20c6d5e1"  # a server variable named like a token: no agent holds it
FILLER = "a long enough opening so that the stream shows text before the item completes:"
THREAD = """mutation($p: ID!, $i: String!) { createThread(input: {projectId: $p, providerInstanceId: $i,
  title: "t"}) { thread { id } userErrors { code message } } }"""
EVENTS = """subscription($t: ID!) { threadEvents(threadId: $t, afterSequence: 0) {
  type entity { ... on ConversationMessage { id role text streaming } } } }"""


@dataclasses.dataclass
class Watched:
    """What a watcher of a thread saw of one assistant message: each text it showed while streaming, and
    the text it ended with."""

    streamed: list[str]
    final: str


@pytest.fixture
def watched_server(database_url: str, tmp_path: Path, fake: FakeModel) -> Iterator[ServerProcess]:
    """A server with a `codex` instance (key KEY, against the fake model) and a `scripted` one, and
    SERVER_SECRET in its environment; a workspace folder `tmp_path/ws`."""
    env = cli_providers_env(tmp_path, fake, openai_key=KEY)
    config = Path(env["THREADLOOM_PROVIDERS"])
    config.write_text(config.read_text() + '\n[instances.open]\ndriver = "scripted"\n')
    env["THREADLOOM_REDACTION_TOKEN"] = SERVER_SECRET
    (tmp_path / "ws").mkdir()
    proc = ServerProcess(database_url, tmp_path / "data", env=env).wait_ready()
    yield proc
    proc.stop()
    print(proc.report(60))


@pytest.fixture
async def watched_api(
    watched_server: ServerProcess, database_url: str, tmp_path: Path
) -> AsyncIterator[tuple[Client, str, str]]:
    """(admin client, a read token of the project, the project's id)."""
    admin = Client(watched_server.url, watched_server.admin_token)
    try:
        project = (await admin.gql(CREATE_PROJECT, {"name": "p", "root": str(tmp_path / "ws")}))["createProject"]
        project_id = str(project["project"]["id"])
        yield admin, create_token(database_url, "read", project_id)[1], project_id
    finally:
        await admin.aclose()


async def _thread(admin: Client, project: str, instance: str) -> str:
    made = (await admin.gql(THREAD, {"p": project, "i": instance}))["createThread"]
    assert made["userErrors"] == [], made
    return str(made["thread"]["id"])


async def _say(admin: Client, reader: str, thread: str, text: str) -> Watched:
    """Send `text`; once the run is over, what the read token's threadEvents show of its assistant
    message (replayed from the log: the very rows a live watcher received)."""
    sent = await send(admin, thread, text)
    assert sent["userErrors"] == [], sent
    done = await finished(admin, sent["run"]["id"], within=60)
    assert done["status"] == "COMPLETED", done
    ws = await WsClient.connect(admin.base_url, reader)
    texts: dict[str, list[tuple[str, bool]]] = {}
    try:
        await ws.subscribe(EVENTS, {"t": thread})
        async for message in ws.items():
            assert message["type"] == "next", message
            item = message["payload"]["data"]["threadEvents"]
            if item["type"] == "synchronized":
                break
            entity = item["entity"] or {}
            if entity.get("role") == "ASSISTANT":
                texts.setdefault(entity["id"], []).append((entity["text"], entity["streaming"]))
    finally:
        await ws.close()
    *_, last = texts.values()  # the message of this run: the latest one
    return Watched([text for text, streaming in last if streaming], last[-1][0])


async def test_a_watcher_sees_server_secrets_as_typed_and_key_prefixes_like_any_text(
    watched_api: tuple[Client, str, str],
) -> None:
    admin, reader, project = watched_api
    thread = await _thread(admin, project, "codex")
    # A server secret is not redacted, nor held: the agent could not have had it.
    said = await _say(admin, reader, thread, f"{FILLER} {SERVER_SECRET}")
    assert said.final == f"echo: {FILLER} {SERVER_SECRET}"
    # A prefix of the key and a string of its length that begins nothing stream the same way: the last
    # STREAM_HOLD characters wait for the item's end, whatever they are, and then show as typed. (How many
    # partial texts a watcher sees depends on how the server batches deltas, so only their bound is asserted.)
    for tail in (KEY[:-1], "x" * (len(KEY) - 1)):
        said = await _say(admin, reader, thread, f"{FILLER} {tail}")
        assert said.final == f"echo: {FILLER} {tail}"
        for text in said.streamed:  # the growing text, then the tail released by the item's end
            assert said.final.startswith(text), text
            assert text == said.final or len(text) <= len(said.final) - STREAM_HOLD, text
    # The whole key is the one thing replaced.
    said = await _say(admin, reader, thread, f"{FILLER} {KEY}")
    assert said.final == f"echo: {FILLER} ***"
    assert not any(KEY in text for text in said.streamed)


async def test_the_scripted_agents_output_is_never_redacted(watched_api: tuple[Client, str, str]) -> None:
    """It holds no secret: the server's secret it is told to print shows as typed."""
    admin, reader, project = watched_api
    thread = await _thread(admin, project, "open")
    said = await _say(admin, reader, thread, f"@reply {FILLER} {SERVER_SECRET[:-3]} and {SERVER_SECRET}")
    assert said.final == f"{FILLER} {SERVER_SECRET[:-3]} and {SERVER_SECRET}"
    assert "***" not in "".join(said.streamed)

"""When the model API fails, through the whole service: the real Codex and Claude Code CLIs against the fake model.

The fake model answers a message's request with an HTTP error (`FAIL: <status>`, optionally `retry-after=` and
`times=`) or cuts its reply mid-stream (`CUT`). What a user of the API must see, for each fault and both CLIs:
- the run FAILED with a stable `failure.code` (and the HTTP status when the CLI reported it), or, where the
  CLI retries by itself, the retry shown as a `runtime.warning` activity and the run COMPLETED;
- the thread stays usable: the next message on it runs normally, and the agent still has the conversation;
- nothing is lost: the messages, and the text streamed before a cut, stay in the thread.

Faults hit a turn's first request, or with `at=2` the one carrying the first tool's result (the turn wrote a
file or ran a command first: the tool node and its file stay, in the failed run's checkpoint). `CUT fallback`
also cuts Claude Code's unstreamed re-ask of a cut reply, so the cut persists and the run fails MODEL_STREAM_CUT.
What each CLI does with `retry-after` is checked at the end (docs/providers.md, "retry-after").

Claude Code retries 401/429/5xx/529 itself (10 times by default, backoff from 0.5 s doubling); the instance
here sets `CLAUDE_CODE_MAX_RETRIES = "1"` in its `env` so a failing request costs about a second. Codex's own
retries are off (the codex driver writes `request_max_retries = 0`), so its failures reach the run at once.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import fake_anthropic, fake_openai
from tests.support.agents import MODEL_PATH, cli_providers_env
from tests.support.fake_model import CUT_SHOWN, FakeModel
from tests.support.graphql import CREATE_PROJECT
from tests.support.pg import PgServer
from tests.support.runs import finished, send
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until
from threadloom.domain.failures import ModelFailure, RunFailureCode, failure_code
from threadloom.providers.claude.turns import Turn
from threadloom.providers.codex_events import turn_failure

THREAD = """mutation($p: ID!, $i: String!) {
  createThread(input: {projectId: $p, providerInstanceId: $i, title: "faults"}) {
    thread { id } userErrors { code message } } }"""
RUN = """query($id: ID!) { run(id: $id) {
  id status statusReason failure { code httpStatus message }
  rootNode { children { kind status } } } }"""
THREAD_STATE = """query($t: ID!) { thread(id: $t) {
  queueHeld
  messages(first: 100) { edges { node { role text streaming run { id } } } }
  activities(last: 100) { nodes { kind summary runId } } } }"""

# (fault line, code, HTTP status the CLI reports) per provider, as each CLI reports them.
CODEX_FAULTS = [
    ("FAIL: 401", "MODEL_AUTH_FAILED", 401),
    ("FAIL: 429 retry-after=1", "MODEL_RATE_LIMITED", 429),
    ("FAIL: 529 retry-after=0", "MODEL_OVERLOADED", 529),
    ("FAIL: 500", "MODEL_SERVER_ERROR", None),  # Codex says `internalServerError`, without the status
    ("FAIL: 503", "MODEL_SERVER_ERROR", 503),
    ("CUT", "MODEL_STREAM_CUT", None),
]
CLAUDE_FAULTS = [
    ("FAIL: 401", "MODEL_AUTH_FAILED", 401),
    ("FAIL: 429 retry-after=1", "MODEL_RATE_LIMITED", 429),
    ("FAIL: 529 retry-after=0", "MODEL_OVERLOADED", 529),
    ("FAIL: 500", "MODEL_SERVER_ERROR", 500),
    ("FAIL: 503", "MODEL_SERVER_ERROR", 503),
]
FAULTS = {"codex": CODEX_FAULTS, "claude": CLAUDE_FAULTS}


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeModel]:
    """One fake model for the module's server (every test sends messages of its own, so counts never mix)."""
    model = FakeModel().start()
    yield model
    model.stop()


@pytest.fixture(autouse=True)
def held_again(fake: FakeModel) -> None:
    """A test's `CUT hold` waits again for its own `release()` (the module's fake is shared)."""
    fake.reset_hold()


@pytest.fixture(scope="module")
async def faults_server(
    pg: PgServer, tmp_path_factory: pytest.TempPathFactory, fake: FakeModel
) -> AsyncIterator[ServerProcess]:
    """One server for the module (each test makes its own project and thread)."""
    folder = tmp_path_factory.mktemp("faults")
    env = cli_providers_env(
        folder,
        fake,
        openai_key="sk-fake-openai-faults",
        anthropic_key="sk-fake-anthropic-faults",
        claude_extra='env = { CLAUDE_CODE_MAX_RETRIES = "1" }',  # its own retries: one, not ten
    )
    proc = ServerProcess(await pg.fresh(), folder / "data", env=env).wait_ready()
    yield proc
    proc.stop()
    print(proc.report(60))


@pytest.fixture
async def api(faults_server: ServerProcess) -> AsyncIterator[Client]:
    client = Client(faults_server.url, faults_server.admin_token)
    yield client
    await client.aclose()


async def _thread(client: Client, tmp_path: Path, provider: str) -> str:
    workspace = tmp_path / f"ws-{provider}"
    workspace.mkdir()
    project = (await client.gql(CREATE_PROJECT, {"name": provider, "root": str(workspace)}))["createProject"]
    made = (await client.gql(THREAD, {"p": project["project"]["id"], "i": provider}))["createThread"]
    assert made["userErrors"] == []
    return str(made["thread"]["id"])


async def _run_to_end(client: Client, thread: str, text: str) -> dict[str, Any]:
    """Send `text` and wait for its run to end; the run as the API shows it."""
    sent = await send(client, thread, text)
    assert sent["userErrors"] == [], sent
    await finished(client, sent["run"]["id"], within=60)
    return (await client.gql(RUN, {"id": sent["run"]["id"]}))["run"]  # type: ignore[no-any-return]


async def _state(client: Client, thread: str) -> dict[str, Any]:
    return (await client.gql(THREAD_STATE, {"t": thread}))["thread"]  # type: ignore[no-any-return]


def _texts(state: dict[str, Any], role: str) -> list[str]:
    return [e["node"]["text"] for e in state["messages"]["edges"] if e["node"]["role"] == role]


def _cut_part(text: str) -> str:
    """What the fake streams of a reply to `text` before it cuts the connection."""
    return f"cut: {text} ".ljust(CUT_SHOWN + 8, "~")[:CUT_SHOWN]


async def _cut_after_seeing_the_start(api: Client, fake: FakeModel, thread: str, text: str) -> str:
    """Send `text` (a `CUT hold` message), wait until the start of the reply shows in the thread, let the fake
    cut the connection, and wait for the run to end; its id."""
    sent = await send(api, thread, text)
    run_id = str(sent["run"]["id"])

    async def shown() -> bool:
        edges = (await _state(api, thread))["messages"]["edges"]
        return any(e["node"]["role"] == "ASSISTANT" and e["node"]["text"].startswith("cut: ") for e in edges)

    await until(shown, within=60)
    fake.release()
    await finished(api, run_id, within=60)
    return run_id


def _last_request_carries(fake: FakeModel, provider: str, *texts: str) -> bool:
    """Did the model's last request of `provider` carry every one of `texts` (the conversation it was sent)?"""
    body = str(fake.bodies(MODEL_PATH[provider])[-1])
    return all(text in body for text in texts)


@pytest.mark.parametrize("provider", ["codex", "claude"])
async def test_each_model_api_fault_fails_its_run_with_a_code_and_the_next_message_continues_the_conversation(
    api: Client, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    thread = await _thread(api, tmp_path, provider)
    token = uuid.uuid4().hex[:8]
    first = await _run_to_end(api, thread, f"remember {token}")
    assert first["status"] == "COMPLETED" and first["failure"] is None
    for line, code, status in FAULTS[provider]:
        failed = await _run_to_end(api, thread, f"fault {token} {line}\n{line}")
        assert failed["status"] == "FAILED", (line, failed)
        assert failed["failure"]["code"] == code, (line, failed)
        assert failed["failure"]["httpStatus"] == status, (line, failed)
        assert failed["failure"]["message"] == failed["statusReason"] and failed["statusReason"], (line, failed)
        after = await _run_to_end(api, thread, f"after {line} {token}")
        assert after["status"] == "COMPLETED", (line, after)  # a held queue with nothing in it does not block it
        assert after["failure"] is None
        assert _last_request_carries(fake, provider, f"remember {token}", f"after {line} {token}"), line
    state = await _state(api, thread)
    users = _texts(state, "USER")
    assert users[0] == f"remember {token}" and len(users) == 1 + 2 * len(FAULTS[provider])
    assert f"echo: after {FAULTS[provider][-1][0]} {token}" in _texts(state, "ASSISTANT")
    assert not state["queueHeld"]
    failures = [a for a in state["activities"]["nodes"] if a["kind"] == "run.failed"]
    assert len(failures) == len(FAULTS[provider])
    if provider == "claude":  # its own retry (one, as the instance sets) is shown before the failure
        retries = [a["summary"] for a in state["activities"]["nodes"] if a["kind"] == "runtime.warning"]
        assert any("answered 429 (rate_limit); Claude Code retries" in r for r in retries), retries
        assert any("answered 529 (overloaded)" in r for r in retries), retries


async def test_a_codex_reply_cut_mid_stream_fails_the_run_and_keeps_the_text_streamed_before_the_cut(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    thread = await _thread(api, tmp_path, "codex")
    run_id = await _cut_after_seeing_the_start(api, fake, thread, "tell me a long story\nCUT hold")
    failed = (await api.gql(RUN, {"id": run_id}))["run"]
    assert failed["status"] == "FAILED" and failed["failure"]["code"] == "MODEL_STREAM_CUT"
    assert "stream disconnected" in failed["statusReason"]
    state = await _state(api, thread)
    partial = [e["node"] for e in state["messages"]["edges"] if e["node"]["role"] == "ASSISTANT"]
    assert len(partial) == 1 and partial[0]["run"]["id"] == failed["id"]
    assert partial[0]["text"] == _cut_part("tell me a long story\nCUT hold") and not partial[0]["streaming"]
    assert [c["status"] for c in failed["rootNode"]["children"] if c["kind"] == "ASSISTANT_MESSAGE"] == ["FAILED"]
    after = await _run_to_end(api, thread, "go on")
    assert after["status"] == "COMPLETED"
    assert _last_request_carries(fake, "codex", "tell me a long story", "go on")


async def test_claude_asks_again_when_a_reply_is_cut_and_the_run_completes_keeping_the_partial_text(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    thread = await _thread(api, tmp_path, "claude")
    text = "tell me a long story\nCUT hold"
    run_id = await _cut_after_seeing_the_start(api, fake, thread, text)
    done = (await api.gql(RUN, {"id": run_id}))["run"]
    assert done["status"] == "COMPLETED" and done["failure"] is None
    state = await _state(api, thread)
    replies = _texts(state, "ASSISTANT")
    assert replies[0] == _cut_part(text)  # what streamed before the cut, kept whole
    assert replies[-1] == f"echo: {text}"  # the answer to Claude Code's second request
    statuses = [c["status"] for c in done["rootNode"]["children"] if c["kind"] == "ASSISTANT_MESSAGE"]
    assert statuses == ["FAILED", "COMPLETED"]
    warnings = [a["summary"] for a in state["activities"]["nodes"] if a["kind"] == "runtime.warning"]
    assert any("broke off mid-stream; Claude Code asked again" in w for w in warnings), warnings
    assert len(fake.bodies(MODEL_PATH["claude"])) >= 2


async def test_claude_retries_a_rate_limited_request_itself_and_the_run_completes_showing_the_retry(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    thread = await _thread(api, tmp_path, "claude")
    text = "busy api\nFAIL: 429 retry-after=1 times=1"
    done = await _run_to_end(api, thread, text)
    assert done["status"] == "COMPLETED" and done["failure"] is None
    asked = [b for b in fake.bodies(MODEL_PATH["claude"]) if fake_anthropic.turn_text(b) == text]
    assert len(asked) == 2  # the refused request, and Claude Code's own retry
    state = await _state(api, thread)
    assert _texts(state, "ASSISTANT") == [f"echo: {text}"]
    warnings = [a for a in state["activities"]["nodes"] if a["kind"] == "runtime.warning"]
    assert [w["runId"] for w in warnings] == [done["id"]]
    assert (
        "the model API answered 429 (rate_limit); Claude Code retries in 1.0 s (retry 1 of 1)" in warnings[0]["summary"]
    )


async def test_codex_does_not_retry_so_a_request_failing_once_fails_the_run_and_sending_again_succeeds(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    thread = await _thread(api, tmp_path, "codex")
    text = "flaky api\nFAIL: 500 times=1"
    failed = await _run_to_end(api, thread, text)
    assert failed["status"] == "FAILED" and failed["failure"]["code"] == "MODEL_SERVER_ERROR"
    again = await _run_to_end(api, thread, text)
    assert again["status"] == "COMPLETED"
    assert _texts(await _state(api, thread), "ASSISTANT") == [f"echo: {text}"]


# ---- the mapping rules alone (forms of the CLIs' reports the fake does not produce) -------------------------


@pytest.mark.parametrize(
    ("error", "code", "status"),
    [
        ({"message": "x", "codexErrorInfo": {"responseStreamDisconnected": {"httpStatusCode": None}}}, "CUT", None),
        ({"message": "x", "codexErrorInfo": {"responseTooManyFailedAttempts": {"httpStatusCode": 502}}}, "5XX", 502),
        ({"message": "x", "codexErrorInfo": "usageLimitExceeded"}, "RATE", None),
        ({"message": "x", "codexErrorInfo": "unauthorized"}, "AUTH", None),
        ({"message": "x", "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": 404}}}, "REQUEST", 404),
        ({"message": "x", "codexErrorInfo": {"httpConnectionFailed": {"httpStatusCode": None}}}, None, None),
        ({"message": "sandbox denied", "codexErrorInfo": "sandboxError"}, None, None),
        ({"message": "no info"}, None, None),
    ],
)
def test_codex_error_reports_map_to_failure_codes(error: dict[str, Any], code: str | None, status: int | None) -> None:
    short = {"CUT": "MODEL_STREAM_CUT", "5XX": "MODEL_SERVER_ERROR", "RATE": "MODEL_RATE_LIMITED"}
    short |= {"AUTH": "MODEL_AUTH_FAILED", "REQUEST": "MODEL_REQUEST_FAILED"}
    found = turn_failure(error)
    assert (found.code if found else None) == (short[code] if code else None)
    assert (found.http_status if found else None) == status


def test_a_claude_failure_that_is_not_the_model_apis_is_an_agent_error() -> None:
    turn = Turn("t1", unechoed=0)
    outcome = turn.outcome({"type": "result", "subtype": "error_max_turns", "is_error": True, "errors": ["too long"]})
    assert outcome == ("failed", "too long", None)
    assert failure_code("too long", None) == RunFailureCode.AGENT_ERROR
    assert failure_code("provider_crashed", None) == RunFailureCode.AGENT_EXITED


def test_claude_repeated_529s_without_a_status_are_read_as_overloaded() -> None:
    turn = Turn("t1", unechoed=0)
    turn.retrying({"type": "system", "subtype": "api_retry", "error_status": 529, "error": "overloaded"})
    result = {"subtype": "success", "is_error": True, "api_error_status": None, "result": "API Error: Repeated 529"}
    assert turn.outcome(result) == (
        "failed",
        "API Error: Repeated 529",
        ModelFailure(RunFailureCode.MODEL_OVERLOADED, 529),
    )


def test_a_claude_api_error_without_a_status_is_a_cut_when_a_reply_broke_off_or_the_connection_dropped() -> None:
    """The lost connection's words make a cut even when no partial reply was shown: the CLI can report the error
    without the stream lines it had read (seen in CI under load). Another statusless API error is no cut."""
    result = {"subtype": "success", "is_error": True, "api_error_status": None}
    result["result"] = "API Error: Connection to the API was lost (ECONNRESET). This is usually temporary — try again."
    stream_cut = ModelFailure(RunFailureCode.MODEL_STREAM_CUT)
    cut = Turn("t1", unechoed=0, stream_cut=True)
    assert cut.outcome(result) == ("failed", result["result"], stream_cut)
    assert Turn("t2", unechoed=0).outcome(result) == ("failed", result["result"], stream_cut)  # nothing streamed
    other = {**result, "result": "API Error: Request was aborted."}
    assert Turn("t3", unechoed=0).outcome(other) == ("failed", other["result"], None)  # twin: not a lost connection
    assert Turn("t4", unechoed=0, stream_cut=True).outcome(other) == ("failed", other["result"], stream_cut)
    cut.retrying({"type": "system", "subtype": "api_retry", "error_status": 503, "error": "server_error"})
    assert cut.outcome(result) == ("failed", result["result"], ModelFailure(RunFailureCode.MODEL_SERVER_ERROR, 503))


# ---- a fault after the turn already worked, a cut that persists ---------------------------------------------

RUN_WORK = """query($id: ID!) { run(id: $id) {
  id status statusReason failure { code httpStatus message }
  rootNode { children { kind status title } }
  checkpoint { status files { path status } } } }"""


async def _work(client: Client, run_id: str) -> dict[str, Any]:
    return (await client.gql(RUN_WORK, {"id": run_id}))["run"]  # type: ignore[no-any-return]


def _turn_requests(fake: FakeModel, provider: str, text: str) -> list[int]:
    """The numbers, within their turn, of the model requests made for the message `text`."""
    read = fake_anthropic.turn_request if provider == "claude" else fake_openai.turn_request
    return [turn[1] for body in fake.bodies(MODEL_PATH[provider]) if (turn := read(body)) and turn[0] == text]


@pytest.mark.parametrize("provider", ["codex", "claude"])
async def test_a_fault_after_a_tool_ran_fails_the_run_keeping_the_tool_and_its_file_and_the_thread_goes_on(
    api: Client, fake: FakeModel, tmp_path: Path, provider: str
) -> None:
    """The turn's first request asks for a file write (then a command); the request carrying its result fails
    (a 503, then a cut that persists). The run fails with its code, yet the tool node completed, the file is
    in the failed run's checkpoint and the workspace, and the next message continues the conversation."""
    thread = await _thread(api, tmp_path, provider)
    workspace = tmp_path / f"ws-{provider}"
    token = uuid.uuid4().hex[:8]
    cut = "CUT at=2 fallback" if provider == "claude" else "CUT at=2"  # Claude Code would ask again unstreamed
    turns = [
        (f"WRITE: written.txt wrote-{token}\nFAIL: 503 at=2", "written.txt", "MODEL_SERVER_ERROR", 503),
        (f"RUN: echo ran-{token} > ran.txt\n{cut}", "ran.txt", "MODEL_STREAM_CUT", None),
    ]
    for text, path, code, status in turns:
        sent = await send(api, thread, text)
        assert sent["userErrors"] == [], sent
        await finished(api, sent["run"]["id"], within=60)
        run = await _work(api, sent["run"]["id"])
        assert run["status"] == "FAILED" and run["failure"]["code"] == code, (text, run)
        assert run["failure"]["httpStatus"] == status, (text, run)
        tools = [c["status"] for c in run["rootNode"]["children"] if c["kind"] == "TOOL_CALL"]
        assert tools == ["COMPLETED"], (text, run)
        assert run["checkpoint"]["status"] == "READY"
        assert {"path": path, "status": "ADDED"} in run["checkpoint"]["files"], run["checkpoint"]
        assert token in (workspace / path).read_text()
        asked = _turn_requests(fake, provider, text)
        assert asked[0] == 1 and 2 in asked and set(asked) == {1, 2}, asked  # the fault came after the tool's result
    after = await _run_to_end(api, thread, f"after the faults {token}")
    assert after["status"] == "COMPLETED" and after["failure"] is None
    assert _last_request_carries(fake, provider, f"wrote-{token}", f"echo ran-{token}", f"after the faults {token}")
    state = await _state(api, thread)
    assert _texts(state, "ASSISTANT")[-1] == f"echo: after the faults {token}"


async def test_a_claude_reply_cut_again_when_asked_unstreamed_fails_the_run_as_a_stream_cut(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    """Claude Code asks again without streaming after a cut; when that reply breaks off too, the run fails
    MODEL_STREAM_CUT, keeps the part that streamed, and the next message continues."""
    thread = await _thread(api, tmp_path, "claude")
    text = "a story cut twice\nCUT hold fallback"
    run_id = await _cut_after_seeing_the_start(api, fake, thread, text)
    failed = (await api.gql(RUN, {"id": run_id}))["run"]
    assert failed["status"] == "FAILED" and failed["failure"]["code"] == "MODEL_STREAM_CUT", failed
    assert failed["failure"]["httpStatus"] is None
    asked = [b for b in fake.bodies(MODEL_PATH["claude"]) if (fake_anthropic.turn_request(b) or ("",))[0] == text]
    assert [bool(b.get("stream")) for b in asked] == [True, False]  # the streamed ask, then the unstreamed one
    state = await _state(api, thread)
    # What streamed before the cut stays (its node FAILED), then Claude Code's own words on the failure.
    assert _texts(state, "ASSISTANT") == [_cut_part(text), failed["statusReason"]]
    assert [c["status"] for c in failed["rootNode"]["children"] if c["kind"] == "ASSISTANT_MESSAGE"] == [
        "FAILED",
        "COMPLETED",
    ]
    warnings = [a["summary"] for a in state["activities"]["nodes"] if a["kind"] == "runtime.warning"]
    assert any("broke off mid-stream; Claude Code asked again" in w for w in warnings), warnings
    after = await _run_to_end(api, thread, "go on after two cuts")
    assert after["status"] == "COMPLETED"
    assert _last_request_carries(fake, "claude", "a story cut twice", "go on after two cuts")


# ---- what each CLI does with the API's retry-after (docs/providers.md) ---------------------------------------


async def test_codex_neither_waits_for_nor_reports_retry_after_and_fails_on_the_first_429(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    """Codex's own retries are off, so a 429 fails the run on its one request whatever `retry-after` says, and
    neither the failure nor any activity carries the header's value: the user sees the API's own words."""
    thread = await _thread(api, tmp_path, "codex")
    text = "slow down\nFAIL: 429 retry-after=37"
    failed = await _run_to_end(api, thread, text)
    assert failed["status"] == "FAILED" and failed["failure"]["code"] == "MODEL_RATE_LIMITED"
    assert failed["failure"]["httpStatus"] == 429
    assert failed["failure"]["message"] == "exceeded retry limit, last status: 429 Too Many Requests"
    assert _turn_requests(fake, "codex", text) == [1]  # no retry, no wait
    state = await _state(api, thread)
    assert not any("37" in a["summary"] for a in state["activities"]["nodes"]), state["activities"]


async def test_claude_waits_at_least_retry_after_before_its_retry_and_shows_the_wait_but_not_in_the_failure(
    api: Client, fake: FakeModel, tmp_path: Path
) -> None:
    """Claude Code waits the longer of its backoff (0.5 s for the first retry) and `retry-after` before it
    retries, and says so in its retry line, shown as a `runtime.warning`; once its retries are used up the
    failure says nothing of it."""
    thread = await _thread(api, tmp_path, "claude")
    text = "slow down\nFAIL: 429 retry-after=2"
    failed = await _run_to_end(api, thread, text)
    assert failed["status"] == "FAILED" and failed["failure"]["code"] == "MODEL_RATE_LIMITED"
    assert len(_turn_requests(fake, "claude", text)) == 2  # the request and its one retry (the instance's)
    state = await _state(api, thread)
    warnings = [a["summary"] for a in state["activities"]["nodes"] if a["kind"] == "runtime.warning"]
    assert warnings == ["the model API answered 429 (rate_limit); Claude Code retries in 2.0 s (retry 1 of 1)"]
    assert "2.0" not in failed["failure"]["message"] and "retry-after" not in failed["failure"]["message"]

"""The `acp` driver over the scripted agent's ACP face, through a real server: what a user of the API sees.

One server, several `acp` instances over the same agent with its ACP knobs: `acp` offers everything;
`acp-bare` offers no steering, fork, rewind or resume (every fallback); `acp-liar` advertises steering,
fork and rewind but answers them -32601 (the probe catches it); `acp-faults` sends an oversized line,
`tool_call_update`s without their `tool_call`, and its usage after the prompt's answer; `acp-amnesic`
can neither resume nor load a session (recovery by handoff). Each test has its own project, so its own agent.
"""

from __future__ import annotations

import asyncio
import glob
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.support.acp_scripted import acp_instance
from tests.support.graphql import CREATE_PROJECT, threads_sharing_a_runtime
from tests.support.runs import finished, run, send
from tests.support.scripted import ScriptedThread
from tests.support.server import Client, ServerProcess
from tests.support.waiting import until

SHARED_SERVER = True  # each test works in a project of its own (conftest's module_server)
PROVIDERS = (
    acp_instance("acp")
    + acp_instance("acp-bare", "--acp-without", "steering,fork,rewind,resume")
    + acp_instance("acp-liar", "--acp-lie", "steering,fork,rewind")
    + acp_instance(
        "acp-faults", "--acp-fault", "orphan-updates,huge-line,trailing-usage", "--acp-huge-line-bytes", "2000000",
        max_line_bytes=1048576,
    )
    + acp_instance("acp-amnesic", "--acp-without", "resume,load")
    + acp_instance("acp-fibber", "--acp-lie", "steering")
)  # fmt: skip

CREATE_THREAD = """mutation($p: ID!, $i: String!) { createThread(input: {projectId: $p, providerInstanceId: $i}) {
  thread { id } userErrors { code } } }"""
INSTANCES = """{ providerInstances { id driver capabilities { supportsActiveSteering canForkThread canForkFromTurn
  canRollbackThread supportsInterrupt }
  acpProfile { agentName agentVersion protocolVersion probedAt methods { method advertised status note } } } }"""
PENDING = """query($t: ID!) { thread(id: $t) { pendingRequests { id kind status payload run { id } } } }"""
APPROVE = """mutation($r: ID!, $d: Decision!) { respondToApproval(input: {requestId: $r, decision: $d}) {
  request { status } userErrors { code } } }"""
ANSWER = """mutation($r: ID!, $a: [QuestionAnswer!]!) { respondToUserInput(input: {requestId: $r, answers: $a}) {
  request { status } userErrors { code message } } }"""
INTERRUPT = """mutation($r: ID!) { interruptRun(input: {runId: $r}) { userErrors { code } } }"""
ACTIVITIES = """query($t: ID!) { thread(id: $t) { activities(last: 100) { nodes { kind summary } } } }"""
MESSAGES = """query($t: ID!) { thread(id: $t) { messages(first: 100) { nodes { role text run { id } } } } }"""
FORK = """mutation($r: ID!) { forkThread(input: {source: {run: $r}, ownWorkspace: false}) {
  thread { id } transfer { id } userErrors { code message } } }"""
TRANSFER = """query($id: ID!) { node(id: $id) { ... on ContextTransfer { status handoff { text } } } }"""
ROLLBACK = """mutation($t: ID!, $n: Int!) { rollbackToRun(input: {threadId: $t, runOrdinal: $n}) {
  userErrors { code message } } }"""
ROLLED = """query($t: ID!) { thread(id: $t) { activities(first: 100) { nodes { kind payload } } } }"""


def _folder(path: Path) -> Path:
    path.mkdir(parents=True)
    path.parent.chmod(0o711)  # within reach of the agent user
    return path


async def _thread(client: Client, tmp_path: Path, instance: str) -> ScriptedThread:
    return await ScriptedThread.create(client, _folder(tmp_path / "ws"), instance)  # type: ignore[no-any-return]


async def _running(client: Client, run_id: str) -> dict[str, Any]:
    async def check() -> dict[str, Any] | None:
        found = await run(client, run_id)
        return found if found["status"] == "RUNNING" else None

    return await until(check)


async def _pending(client: Client, thread: str, count: int = 1) -> list[dict[str, Any]]:
    async def check() -> list[dict[str, Any]] | None:
        found = (await client.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"]
        return found if len(found) >= count else None

    return await until(check)


async def _texts(client: Client, thread: str, run_id: str | None = None) -> list[str]:
    nodes = (await client.gql(MESSAGES, {"t": thread}))["thread"]["messages"]["nodes"]
    return [n["text"] for n in nodes if n["role"] == "ASSISTANT" and (run_id is None or n["run"]["id"] == run_id)]


async def _activities(client: Client, thread: str) -> list[dict[str, Any]]:
    return (await client.gql(ACTIVITIES, {"t": thread}))["thread"]["activities"]["nodes"]  # type: ignore[no-any-return]


async def _instances(client: Client) -> dict[str, Any]:
    return {i["id"]: i for i in (await client.gql(INSTANCES))["providerInstances"]}


# ---- a turn ------------------------------------------------------------------------------------


async def test_a_turn_streams_its_reply_tool_call_and_todo_list_into_the_graph(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "acp")
    done = await thread.run("@reply hello there\n@tool echo out > made.txt\n@todo write; ship")
    kinds = sorted(n["kind"] for n in done["executionGraph"]["nodes"])
    assert "ASSISTANT_MESSAGE" in kinds and "TOOL_CALL" in kinds, kinds
    assert all(n["status"] == "COMPLETED" for n in done["executionGraph"]["nodes"]), done["executionGraph"]
    assert await _texts(client, thread.id, done["id"]) == ["hello there"]
    assert (thread.workspace / "made.txt").read_text() == "out\n"
    todo = next(p for p in done["plans"] if p["kind"] == "TODO_LIST")
    assert [i["step"] for i in todo["items"]] == ["write", "ship"]
    kinds_seen = {a["kind"] for a in await _activities(client, thread.id)}
    assert {"tool.started", "plan.updated"} <= kinds_seen, kinds_seen


async def test_the_native_thread_ref_is_an_alias_never_the_acp_session_id(
    client: Client, server: ServerProcess, tmp_path: Path, data_dir: Path
) -> None:
    thread = await _thread(client, tmp_path, "acp")
    done = await thread.run("@reply secret keeper")
    ref = done["providerThread"]["nativeThreadRef"]
    assert ref.startswith("acp-")
    # The scripted agent keeps each session in threads/<session id>.json: none of those ids is shown.
    sessions = [Path(p).stem for p in glob.glob(f"{data_dir}/**/threads/*.json", recursive=True)]
    assert sessions, "the agent recorded no session"
    shown = str(await client.gql(INSTANCES)) + str(done) + "\n".join(server.log)
    assert not any(sid in shown for sid in sessions)
    assert ref not in sessions


# ---- the profile and the probe ----------------------------------------------------------------


async def test_the_probe_catches_advertised_methods_that_answer_method_not_found(
    client: Client, server: ServerProcess, data_dir: Path, module_server_env: dict[str, str]
) -> None:
    before = (await _instances(client))["acp-liar"]
    assert before["acpProfile"] is None  # no agent of it has started yet: nothing known
    env = {**os.environ, "THREADLOOM_PROVIDERS": module_server_env["THREADLOOM_PROVIDERS"]}
    argv = [sys.executable, "-m", "threadloom", "--data-dir", str(data_dir), "providers", "probe", "acp-liar"]
    out = await asyncio.to_thread(subprocess.run, argv, env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    printed = {
        line.split()[0]: line.split()[1]
        for line in out.stdout.splitlines()[1:]
        if line.startswith("  _") or line.startswith("  session")
    }
    assert printed["_session/steering"] == "unsupported" and printed["_session/rewind"] == "unsupported"
    assert printed["session/fork"] == "unsupported" and printed["session/load"] == "works"
    assert "plan: steer = restart" in out.stdout
    after = (await _instances(client))["acp-liar"]
    profile = after["acpProfile"]
    assert profile["agentName"] == "threadloom-scripted" and profile["protocolVersion"] == 1
    assert profile["probedAt"] is not None
    status = {m["method"]: (m["advertised"], m["status"]) for m in profile["methods"]}
    assert status["_session/steering"] == (True, "UNSUPPORTED") and status["session/resume"] == (True, "WORKS")
    caps = after["capabilities"]
    assert caps == {
        "supportsActiveSteering": False,
        "canForkThread": False,
        "canForkFromTurn": False,
        "canRollbackThread": False,
        "supportsInterrupt": True,
    }


async def test_an_unprobed_instance_plans_with_what_initialize_advertised(client: Client, tmp_path: Path) -> None:
    """The twin of the probe test: `acp` (honest) and `acp-bare` (offers less), never probed."""
    for instance in ("acp", "acp-bare"):
        await (await _thread(client, tmp_path / instance, instance)).run("@reply hi")
    found = await _instances(client)
    assert found["acp"]["capabilities"]["supportsActiveSteering"] is True
    assert found["acp"]["capabilities"]["canRollbackThread"] is True
    assert found["acp"]["acpProfile"]["probedAt"] is None
    assert {m["status"] for m in found["acp"]["acpProfile"]["methods"]} == {"NOT_PROBED"}
    bare = found["acp-bare"]
    assert bare["capabilities"]["supportsActiveSteering"] is False and bare["capabilities"]["canForkThread"] is False
    statuses = {m["method"]: m["status"] for m in bare["acpProfile"]["methods"]}
    assert statuses["_session/steering"] == "NOT_ADVERTISED" and statuses["session/load"] == "NOT_PROBED"


async def test_a_method_found_missing_at_run_time_is_dropped_and_the_steer_becomes_a_run(
    client: Client, tmp_path: Path
) -> None:
    """`acp-fibber` advertises steering but answers it -32601, and was never probed: the first steer is
    planned native, refused, and queued as a run of its own; from then on the instance plans restarts."""
    thread = await _thread(client, tmp_path, "acp-fibber")
    first = await send(client, thread.id, "@await go\n@reply first")
    await _running(client, first["run"]["id"])
    assert (await _instances(client))["acp-fibber"]["capabilities"]["supportsActiveSteering"] is True
    steer = await send(client, thread.id, "@reply the steer")
    assert steer["appliedDispatch"] == "STEER_ACTIVE"

    async def became_a_run() -> list[dict[str, Any]] | None:
        acts = [a for a in await _activities(client, thread.id) if a["kind"] == "steer.became_run"]
        return acts or None

    await until(became_a_run)
    (thread.workspace / "go").write_text("")
    assert (await finished(client, first["run"]["id"]))["status"] == "COMPLETED"
    after = (await _instances(client))["acp-fibber"]
    assert after["capabilities"]["supportsActiveSteering"] is False
    steering = next(m for m in after["acpProfile"]["methods"] if m["method"] == "_session/steering")
    assert steering["status"] == "UNSUPPORTED" and "Method not found" in steering["note"]


# ---- approvals and questions ------------------------------------------------------------------


async def test_approvals_of_two_threads_wait_at_once_and_are_answered_out_of_order(
    client: Client, tmp_path: Path
) -> None:
    a, b = await threads_sharing_a_runtime(client, _folder(tmp_path / "ws"), "acp")
    sent_a = await send(client, a, "@approval echo a > a.txt\n@reply a done")
    sent_b = await send(client, b, "@approval echo b > b.txt\n@reply b done")
    req_a = (await _pending(client, a))[0]
    req_b = (await _pending(client, b))[0]
    assert req_a["kind"] == req_b["kind"] == "COMMAND_APPROVAL"
    assert req_a["payload"]["command"] == "echo a > a.txt"
    answer = (await client.gql(APPROVE, {"r": req_b["id"], "d": "DECLINE"}))["respondToApproval"]
    assert answer["userErrors"] == []
    answer = (await client.gql(APPROVE, {"r": req_a["id"], "d": "ACCEPT"}))["respondToApproval"]
    assert answer["userErrors"] == []
    assert (await finished(client, sent_a["run"]["id"]))["status"] == "COMPLETED"
    assert (await finished(client, sent_b["run"]["id"]))["status"] == "COMPLETED"
    assert (tmp_path / "ws" / "a.txt").read_text() == "a\n"
    assert not (tmp_path / "ws" / "b.txt").exists()


async def test_approvals_of_one_turn_wait_at_once_and_each_gets_its_own_answer(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "acp")
    sent = await send(client, thread.id, "@approvals echo 1 > one.txt | echo 2 > two.txt\n@reply both asked")
    requests = await _pending(client, thread.id, 2)
    by_command = {r["payload"]["command"]: r for r in requests}
    assert set(by_command) == {"echo 1 > one.txt", "echo 2 > two.txt"}
    for command, decision in (("echo 2 > two.txt", "ACCEPT"), ("echo 1 > one.txt", "DECLINE")):
        answer = (await client.gql(APPROVE, {"r": by_command[command]["id"], "d": decision}))["respondToApproval"]
        assert answer["userErrors"] == []
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    assert (thread.workspace / "two.txt").read_text() == "2\n" and not (thread.workspace / "one.txt").exists()


@pytest.mark.parametrize(("directive", "status"), [("@stop max_tokens", "FAILED"), ("@reply fine", "COMPLETED")])
async def test_a_prompt_stopped_short_fails_the_run_with_the_reason(
    client: Client, tmp_path: Path, directive: str, status: str
) -> None:
    thread = await _thread(client, tmp_path, "acp")
    done = await finished(client, (await send(client, thread.id, directive))["run"]["id"])
    assert done["status"] == status
    if status == "FAILED":
        assert done["statusReason"] == "the agent stopped: max_tokens"


@pytest.mark.parametrize(("mode", "asks"), [("APPROVAL_REQUIRED", True), ("WORKSPACE_WRITE", False)])
async def test_the_runtime_mode_reaches_the_agent_through_its_mode_config_option(
    client: Client, tmp_path: Path, mode: str, asks: bool
) -> None:
    project = await client.gql(CREATE_PROJECT, {"name": "mode", "root": str(_folder(tmp_path / "ws"))})
    made = await client.gql(
        """mutation($p: ID!, $m: RuntimeMode!) { createThread(input: {projectId: $p, providerInstanceId: "acp",
             mode: $m}) { thread { id } userErrors { code } } }""",
        {"p": project["createProject"]["project"]["id"], "m": mode},
    )
    thread = made["createThread"]["thread"]["id"]
    sent = await send(client, thread, "@tool echo ran > ran.txt")
    if asks:
        request = (await _pending(client, thread))[0]
        assert request["kind"] == "COMMAND_APPROVAL"
        assert (await client.gql(APPROVE, {"r": request["id"], "d": "ACCEPT"}))["respondToApproval"]["userErrors"] == []
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    assert (tmp_path / "ws" / "ran.txt").read_text() == "ran\n"
    assert (await client.gql(PENDING, {"t": thread}))["thread"]["pendingRequests"] == []


async def test_a_question_by_elicitation_is_a_user_input_request(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "acp")
    sent = await send(client, thread.id, "@ask Which color? | red | blue")
    request = (await _pending(client, thread.id))[0]
    assert request["kind"] == "USER_INPUT"
    question = request["payload"]["questions"][0]
    assert [o["label"] for o in question["options"]] == ["red", "blue"]
    bad = await client.gql(ANSWER, {"r": request["id"], "a": [{"questionId": question["id"], "answers": ["green"]}]})
    assert bad["respondToUserInput"]["userErrors"][0]["code"] == "INVALID_INPUT"
    good = await client.gql(ANSWER, {"r": request["id"], "a": [{"questionId": question["id"], "answers": ["blue"]}]})
    assert good["respondToUserInput"]["request"]["status"] == "RESOLVED"
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    assert (await _texts(client, thread.id, sent["run"]["id"]))[-1] == "Answer: blue"


async def test_a_subagent_is_a_node_of_its_own_with_its_child_turn(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "acp")
    done = await thread.run("@subagent look around\n@reply parent done")
    subagents = [n for n in done["executionGraph"]["nodes"] if n["kind"] == "SUBAGENT"]
    assert len(subagents) == 1 and subagents[0]["status"] == "COMPLETED"
    kinds = {a["kind"] for a in await _activities(client, thread.id)}
    assert {"subagent.started", "subagent.completed"} <= kinds, kinds
    assert (await _texts(client, thread.id, done["id"]))[-1] == "parent done"


# ---- steering and interruption ------------------------------------------------------------------


async def test_steering_goes_into_the_live_turn_through_the_extension(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "acp")
    first = await send(client, thread.id, "@await-steer\n@reply one two")
    await _running(client, first["run"]["id"])
    steer = await send(client, thread.id, "@reply steered here")
    assert steer["appliedDispatch"] == "STEER_ACTIVE" and steer["run"]["id"] == first["run"]["id"]
    done = await finished(client, first["run"]["id"])
    assert done["status"] == "COMPLETED" and len(done["attempts"]) == 1
    assert await _texts(client, thread.id, done["id"]) == ["steered here", "one two"]


async def test_without_the_steering_extension_a_steer_restarts_the_turn(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "acp-bare")
    first = await send(client, thread.id, "@await go\n@reply one two")  # held until the gate opens
    await _running(client, first["run"]["id"])
    restart = await send(client, thread.id, "@reply after the restart")
    assert restart["appliedDispatch"] == "RESTART_ACTIVE" and restart["run"]["id"] == first["run"]["id"]

    async def first_turn_interrupted() -> bool:
        attempts = (await run(client, first["run"]["id"]))["attempts"]
        return [pt["status"] for pt in attempts[0]["providerTurns"]] == ["INTERRUPTED"]

    await until(first_turn_interrupted)  # session/cancel ended the live prompt at its gate
    (thread.workspace / "go").write_text("")  # the new turn runs the whole input again, the gate now open
    done = await finished(client, first["run"]["id"])
    assert done["status"] == "COMPLETED"
    assert [(a["reason"], a["status"]) for a in done["attempts"]] == [
        ("INITIAL", "SUPERSEDED"),
        ("STEERING_RESTART", "COMPLETED"),
    ]
    assert await _texts(client, thread.id, done["id"]) == ["one two", "after the restart"]


async def test_interrupt_cancels_the_prompt_and_the_thread_goes_on(client: Client, tmp_path: Path) -> None:
    thread = await _thread(client, tmp_path, "acp")
    sent = await send(client, thread.id, "@await never-made\n@reply never")
    await _running(client, sent["run"]["id"])
    assert (await client.gql(INTERRUPT, {"r": sent["run"]["id"]}))["interruptRun"]["userErrors"] == []
    assert (await finished(client, sent["run"]["id"]))["status"] == "INTERRUPTED"
    after = await thread.run("@reply still here")
    assert await _texts(client, thread.id, after["id"]) == ["still here"]


# ---- fork and rollback --------------------------------------------------------------------------


async def _fork(client: Client, source: ScriptedThread, run_id: str) -> tuple[ScriptedThread, dict[str, Any]]:
    payload = (await client.gql(FORK, {"r": run_id}))["forkThread"]
    assert payload["userErrors"] == [], payload
    fork = ScriptedThread(client, payload["thread"]["id"], source.workspace)
    memory = await fork.recall()
    transfer = (await client.gql(TRANSFER, {"id": payload["transfer"]["id"]}))["node"]
    return fork, {"memory": memory, **transfer}


@pytest.mark.parametrize(("instance", "status"), [("acp", "RESOLVED_NATIVE"), ("acp-bare", "RESOLVED_PORTABLE")])
async def test_a_fork_at_an_earlier_run_holds_that_conversation(
    client: Client, tmp_path: Path, instance: str, status: str
) -> None:
    source = await _thread(client, tmp_path, instance)
    first = await source.run("@reply alpha")
    await source.run("@reply beta")
    _, got = await _fork(client, source, first["id"])
    assert got["status"] == status
    if status == "RESOLVED_NATIVE":  # session/fork, then _session/rewind of the copy to run 1
        assert got["memory"] == ["user: @reply alpha"] and got["handoff"] is None
    else:  # a new session seeded with a handoff
        assert len(got["memory"]) == 1 and got["memory"][0].startswith("handoff: ")
        assert "@reply alpha" in got["handoff"]["text"] and "@reply beta" not in got["handoff"]["text"]
    assert await source.recall() == ["user: @reply alpha", "user: @reply beta"]


@pytest.mark.parametrize(("instance", "strategy"), [("acp", "native_rollback"), ("acp-bare", None)])
async def test_a_rollback_leaves_the_agent_without_the_undone_runs(
    client: Client, tmp_path: Path, instance: str, strategy: str | None
) -> None:
    thread = await _thread(client, tmp_path, instance)
    for text in ("@reply one", "@write f.txt two", "@reply three"):
        await thread.run(text)
    answer = (await client.gql(ROLLBACK, {"t": thread.id, "n": 1}))["rollbackToRun"]
    assert answer["userErrors"] == [], answer
    records = [n["payload"] for n in (await client.gql(ROLLED, {"t": thread.id}))["thread"]["activities"]["nodes"]
               if n["kind"] == "rollback.completed"]  # fmt: skip
    strategies = [p["strategy"] for p in records[-1]["providerThreads"]]
    if strategy is not None:
        assert strategies == [strategy]
    else:
        assert "native_rollback" not in strategies, strategies
    assert not (thread.workspace / "f.txt").exists()  # the files: Threadloom's own checkpoints
    memory = "\n".join(await thread.recall())
    assert "@reply one" in memory and "two" not in memory and "three" not in memory, memory


# ---- recovery -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("instance", "handoff"), [("acp", False), ("acp-bare", False), ("acp-amnesic", True)])
async def test_after_a_crash_the_next_message_resumes_loads_or_hands_off(
    client: Client, tmp_path: Path, instance: str, handoff: bool
) -> None:
    """`acp` resumes with session/resume, `acp-bare` (no resume) with session/load, `acp-amnesic` (neither)
    gets a replacement session with the conversation as a handoff and a warning."""
    thread = await _thread(client, tmp_path, instance)
    await thread.run("@reply before the crash")
    crashed = await send(client, thread.id, "@crash")
    assert (await finished(client, crashed["run"]["id"]))["statusReason"] == "provider_crashed"
    memory = await thread.recall()
    if handoff:
        assert memory[0].startswith("handoff: ") and "before the crash" in memory[0], memory
        warnings = [a["summary"] for a in await _activities(client, thread.id) if a["kind"] == "runtime.warning"]
        assert any("could not resume" in w for w in warnings), warnings
    else:
        assert memory[0] == "user: @reply before the crash", memory


# ---- protocol traps -----------------------------------------------------------------------------


async def test_an_oversized_line_an_orphan_update_and_trailing_usage_do_not_break_the_turn(
    client: Client, tmp_path: Path
) -> None:
    thread = await _thread(client, tmp_path, "acp-faults")
    done = await thread.run("@tool echo hi\n@reply fine")
    tools = [n for n in done["executionGraph"]["nodes"] if n["kind"] == "TOOL_CALL"]
    assert len(tools) == 1 and tools[0]["status"] == "COMPLETED"  # opened by its update alone
    assert await _texts(client, thread.id, done["id"]) == ["fine"]
    warnings = [a["summary"] for a in await _activities(client, thread.id) if a["kind"] == "runtime.warning"]
    assert any("over the 1048576-byte limit; skipped" in w for w in warnings), warnings
    again = await thread.run("@reply and again")  # the reader went on: the same agent answers
    assert await _texts(client, thread.id, again["id"]) == ["and again"]


# ---- usage -----------------------------------------------------------------------------------------------

USAGE = """query($r: ID!) { run(id: $r) { usage { inputTokens outputTokens costUsd costSource } } }"""
THREAD_USAGE = """query($t: ID!) { thread(id: $t) { usage { inputTokens outputTokens costUsd costSource } } }"""


async def test_an_acp_agents_tokens_and_cumulative_cost_reach_the_ledger_once_per_turn(
    client: Client, tmp_path: Path
) -> None:
    """The prompt answer's tokens are the turn's; `usage_update`'s cost is the session's running sum, so the
    second run is charged only what the session spent since the first."""
    thread = await _thread(client, tmp_path, "acp")
    first = await send(client, thread.id, "@usage 100 50 0.25\n@reply one")
    assert (await finished(client, first["run"]["id"]))["status"] == "COMPLETED"
    second = await send(client, thread.id, "@usage 10 5 0.05\n@reply two")
    assert (await finished(client, second["run"]["id"]))["status"] == "COMPLETED"

    async def usage(run_id: str) -> dict[str, Any]:
        return (await client.gql(USAGE, {"r": run_id}))["run"]["usage"]  # type: ignore[no-any-return]

    assert await usage(first["run"]["id"]) == {
        "inputTokens": 100, "outputTokens": 50, "costUsd": 0.25, "costSource": "REPORTED",
    }  # fmt: skip
    assert await usage(second["run"]["id"]) == {
        "inputTokens": 10, "outputTokens": 5, "costUsd": 0.05, "costSource": "REPORTED",
    }  # fmt: skip
    whole = (await client.gql(THREAD_USAGE, {"t": thread.id}))["thread"]["usage"]
    assert (whole["inputTokens"], whole["outputTokens"], whole["costUsd"]) == (110, 55, 0.3)


async def test_an_acp_turn_without_a_reported_cost_keeps_its_cost_unknown(client: Client, tmp_path: Path) -> None:
    """Its twin: tokens without any `cost` are recorded, and the cost is unknown, never zero."""
    thread = await _thread(client, tmp_path, "acp")
    sent = await send(client, thread.id, "@usage 7 3\n@reply no cost")
    assert (await finished(client, sent["run"]["id"]))["status"] == "COMPLETED"
    found = (await client.gql(USAGE, {"r": sent["run"]["id"]}))["run"]["usage"]
    assert found == {"inputTokens": 7, "outputTokens": 3, "costUsd": None, "costSource": "UNKNOWN"}

"""What `threadloom acp` serves beyond a plain ACP agent, each through the real bridge process on stdio against
a real server with the scripted agent, and checked where a user of the API would see it:

- `_session/steering` (steer into the running prompt's run), config options and the modes API (the thread's
  runtime mode and model), `session/list|resume|close`, `session/fork`, `_threadloom/queue|fork|rollback`;
- questions asked in the editor as form elicitations, several approvals outstanding at once;
- as a server: a session id of another token's project refused exactly like an id that names nothing (with
  the twin where it is allowed), unknown methods, `$/cancel_request` both ways, a line over the limit.
"""

from __future__ import annotations

import asyncio
import base64
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError, text_block

from tests.support.acp import Editor, agent, raw_agent
from tests.support.cli import create_token
from tests.support.graphql import make_project, workspace
from tests.support.pg import PgServer
from tests.support.server import Client, ServerProcess, serving
from tests.support.waiting import until


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    """One database for the module's server; each test works in projects of its own."""
    return await pg.fresh()


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(database_url, tmp_path_factory.mktemp("acp-ext-data")) as proc:
        yield proc


THREAD = """query($t: ID!) { thread(id: $t) { mode model project { id } pendingRequests { id kind }
  runs { nodes { id ordinal status } } messages { nodes { role text run { id } } } } }"""


ENDED = frozenset({"COMPLETED", "FAILED", "INTERRUPTED", "CANCELLED", "ROLLED_BACK"})


async def thread(client: Client, session_id: str) -> dict[str, Any]:
    return (await client.gql(THREAD, {"t": session_id}))["thread"]  # type: ignore[no-any-return]


async def statuses(client: Client, session_id: str) -> list[str]:
    return [r["status"] for r in (await thread(client, session_id))["runs"]["nodes"]]


async def home(client: Client, tmp_path: Path, name: str) -> tuple[str, str]:
    """A new project's (workspace folder, id)."""
    folder = workspace(tmp_path, name.lower().replace(" ", "-"))
    return folder, await make_project(client, name, folder)


async def running(client: Client, session_id: str, count: int = 1) -> None:
    """Waits until the session's run number `count` is RUNNING."""

    async def check() -> bool:
        runs = await statuses(client, session_id)
        return len(runs) >= count and runs[count - 1] == "RUNNING"

    await until(check)


async def settled(client: Client, session_id: str) -> list[str]:
    """Waits until no run of the session is queued or going; its runs' statuses."""

    async def check() -> list[str] | None:
        runs = await statuses(client, session_id)
        return runs if runs and all(s in ENDED for s in runs) else None

    return await until(check)


def prompt(text: str) -> list[Any]:
    return [text_block(text)]


def options(answer: list[Any]) -> dict[str, str]:
    """Config options (the SDK's models, or plain JSON from an extension method) as {id: currentValue}."""
    return {
        (o["id"] if isinstance(o, dict) else o.id): (o["currentValue"] if isinstance(o, dict) else o.current_value)
        for o in answer
    }


async def test_initialize_announces_the_extensions_it_serves(server: ServerProcess, client: Client) -> None:
    editor = Editor()
    async with agent(server.url, str(client.token), editor):
        pass
    started = editor.started
    sessions = started.agent_capabilities.session_capabilities
    assert sessions.list is not None and sessions.resume is not None and sessions.close is not None
    assert sessions.fork is not None
    for meta in (started.field_meta, started.agent_capabilities.field_meta):
        assert meta["steering"] == {"supported": True}
        assert meta["threadloom"]["methods"] == ["_threadloom/queue", "_threadloom/fork", "_threadloom/rollback"]


async def test_a_steer_lands_in_the_running_prompts_run(server: ServerProcess, client: Client, tmp_path: Path) -> None:
    folder, _ = await home(client, tmp_path, "Steer")
    editor = Editor()
    async with agent(server.url, str(client.token), editor) as conn:
        session = (await conn.new_session(cwd=folder)).session_id
        going = asyncio.create_task(conn.prompt(session_id=session, prompt=prompt("@await-steer\n@reply done")))
        await running(client, session)
        steered = await conn.ext_method(
            "session/steering", {"sessionId": session, "prompt": [{"type": "text", "text": "@reply steered in"}]}
        )
        done = await asyncio.wait_for(going, 60)
        # Nothing runs now: with idleBehavior promptRequired nothing is sent; without, a new run starts.
        idle = {"sessionId": session, "prompt": [{"type": "text", "text": "@reply later"}]}
        refused = await conn.ext_method(
            "session/steering", {**idle, "_meta": {"steering": {"idleBehavior": "promptRequired"}}}
        )
        after_refused = await thread(client, session)
        started = await conn.ext_method("session/steering", idle)
        runs = await settled(client, session)

    assert steered["outcome"] == "injected" and steered["_meta"]["threadloom"]["appliedDispatch"] == "STEER_ACTIVE"
    assert done.stop_reason == "end_turn"
    assert editor.text() == "steered indone"  # the steer's reply streamed in the prompt, before the rest
    assert refused == {"outcome": "promptRequired", "reason": "noRunningTurn"}
    assert len(after_refused["runs"]["nodes"]) == 1 and len(after_refused["messages"]["nodes"]) == 4
    assert started["outcome"] == "startedNewTurn" and runs == ["COMPLETED", "COMPLETED"]
    first_run = after_refused["runs"]["nodes"][0]["id"]
    assert [(m["role"], m["text"], m["run"]["id"] == first_run) for m in after_refused["messages"]["nodes"]] == [
        ("USER", "@await-steer\n@reply done", True),
        ("USER", "@reply steered in", True),  # the same run: steered, not queued
        ("ASSISTANT", "steered in", True),
        ("ASSISTANT", "done", True),
    ]


async def test_config_options_change_the_threads_mode_and_model(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    folder, _ = await home(client, tmp_path, "Settings")
    editor = Editor("ACCEPT")
    async with agent(server.url, str(client.token), editor, "--model", "model-a", device="desk") as conn:
        created = await conn.new_session(cwd=folder)
        session = created.session_id
        assert options(created.config_options) == {"mode": "workspace_write", "model": "default"}
        assert created.modes.current_mode_id == "workspace_write"

        changed = await conn.set_config_option(config_id="mode", session_id=session, value="approval_required")
        assert options(changed.config_options)["mode"] == "approval_required"
        assert (await thread(client, session))["mode"] == "APPROVAL_REQUIRED"
        # The mode holds for the next run: a plain command now asks first.
        await conn.prompt(session_id=session, prompt=prompt("@tool echo asked > asked.txt"))
        assert [call["title"] for call, _ in editor.asked] == ["echo asked > asked.txt"]

        picked = await conn.set_config_option(config_id="model", session_id=session, value="model-a")
        assert options(picked.config_options)["model"] == "model-a"
        assert (await thread(client, session))["model"] == "model-a"

        await conn.set_session_mode(mode_id="read_only", session_id=session)  # the older modes API
        assert (await thread(client, session))["mode"] == "READ_ONLY"

        with pytest.raises(RequestError) as bad:
            await conn.set_config_option(config_id="mode", session_id=session, value="anything_goes")
        assert bad.value.code == -32602 and bad.value.data == {"code": "INVALID_CONFIG_VALUE"}
        with pytest.raises(RequestError) as unknown:
            await conn.set_config_option(config_id="colour", session_id=session, value="red")
        assert unknown.value.data == {"code": "UNKNOWN_CONFIG_OPTION"}
        assert (await thread(client, session))["mode"] == "READ_ONLY"  # refused: unchanged

        # Another client on the editor's device (the session holds the thread's writer lease) changes the mode:
        # the next prompt tells the editor first.
        changed = await client.gql(
            "mutation($t: ID!) { setRuntimeMode(input: {threadId: $t, mode: WORKSPACE_WRITE})"
            " { userErrors { code } } }",
            {"t": session},
            headers={"Threadloom-Device": "desk"},
        )
        assert changed["setRuntimeMode"]["userErrors"] == []
        await conn.prompt(session_id=session, prompt=prompt("@reply hi"))
        back = await conn.set_config_option(config_id="model", session_id=session, value="default")

    assert (await thread(client, session))["model"] is None and options(back.config_options)["model"] == "default"
    assert [u["currentModeId"] for u in editor.of_kind("current_mode_update")] == [
        "approval_required",
        "workspace_write",  # another client's change, shown at the next prompt
    ]
    updates = [{o["id"]: o["currentValue"] for o in u["configOptions"]} for u in editor.of_kind("config_option_update")]
    assert updates == [
        {"mode": "read_only", "model": "model-a"},  # after session/set_mode
        {"mode": "workspace_write", "model": "model-a"},  # another client's change
    ]


async def test_sessions_are_listed_resumed_and_closed(server: ServerProcess, client: Client, tmp_path: Path) -> None:
    folder_a, _ = await home(client, tmp_path, "List A")
    folder_b, _ = await home(client, tmp_path, "List B")
    async with agent(server.url, str(client.token), Editor()) as conn:
        a1 = (await conn.new_session(cwd=folder_a)).session_id
        await conn.prompt(session_id=a1, prompt=prompt("@reply one"))
        a2 = (await conn.new_session(cwd=folder_a)).session_id
        b1 = (await conn.new_session(cwd=folder_b)).session_id
        in_a = await conn.list_sessions(cwd=folder_a)
        everywhere: list[Any] = []
        cursor = None
        while True:
            page = await conn.list_sessions(cursor=cursor)
            everywhere += page.sessions
            if (cursor := page.next_cursor) is None:
                break

    assert sorted((s.session_id, s.cwd) for s in in_a.sessions) == sorted([(a1, folder_a), (a2, folder_a)])
    assert in_a.next_cursor is None
    assert {a1, a2, b1} <= {s.session_id for s in everywhere}
    assert [s.title for s in in_a.sessions if s.session_id == a1] == ["@reply one"]  # titled by its first message

    later = Editor()
    async with agent(server.url, str(client.token), later) as conn:
        resumed = await conn.resume_session(cwd=folder_a, session_id=a1)
        assert later.updates == []  # resumed, not replayed: the editor has the history
        assert options(resumed.config_options)["mode"] == "workspace_write"
        again = await conn.prompt(session_id=a1, prompt=prompt("@reply two"))
        assert again.stop_reason == "end_turn" and later.text() == "two"
        await conn.close_session(session_id=a1)
        with pytest.raises(RequestError) as closed:
            await conn.prompt(session_id=a1, prompt=prompt("@reply three"))
        assert closed.value.code == -32002 and closed.value.data == {"code": "NOT_FOUND"}
    assert await statuses(client, a1) == ["COMPLETED", "COMPLETED"]  # closing kept the thread


async def test_queue_sends_behind_the_running_prompt(server: ServerProcess, client: Client, tmp_path: Path) -> None:
    folder, _ = await home(client, tmp_path, "Queue")
    editor = Editor()
    async with agent(server.url, str(client.token), editor) as conn:
        session = (await conn.new_session(cwd=folder)).session_id
        going = asyncio.create_task(conn.prompt(session_id=session, prompt=prompt("@await go\n@reply first")))
        await running(client, session)
        queued = await conn.ext_method(
            "threadloom/queue", {"sessionId": session, "prompt": [{"type": "text", "text": "@reply second"}]}
        )
        waited = asyncio.create_task(
            conn.ext_method(
                "threadloom/queue",
                {"sessionId": session, "prompt": [{"type": "text", "text": "@reply third"}], "wait": True},
            )
        )

        async def both_queued() -> bool:
            return (await statuses(client, session)) == ["RUNNING", "QUEUED", "QUEUED"]

        await until(both_queued)
        (Path(folder) / "go").touch()
        done, ended = await asyncio.wait_for(asyncio.gather(going, waited), 60)

    assert queued["appliedDispatch"] == "QUEUE_AFTER_ACTIVE" and queued["queuePosition"] == 1
    assert done.stop_reason == "end_turn" and ended["stopReason"] == "end_turn"
    seen = await thread(client, session)
    assert [r["status"] for r in seen["runs"]["nodes"]] == ["COMPLETED"] * 3
    assert ended["runId"] == seen["runs"]["nodes"][2]["id"]
    assert [m["text"] for m in seen["messages"]["nodes"] if m["role"] == "ASSISTANT"] == ["first", "second", "third"]
    assert editor.text() == "firstthird"  # the prompt's run and the waited one; the other was not followed


async def test_fork_makes_a_session_that_continues_from_the_source(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    folder, project = await home(client, tmp_path, "Fork")
    editor = Editor()
    async with agent(server.url, str(client.token), editor) as conn:
        source = (await conn.new_session(cwd=folder)).session_id
        await conn.prompt(session_id=source, prompt=prompt("@reply original"))
        forked = await conn.ext_method("threadloom/fork", {"sessionId": source, "title": "Tried otherwise"})
        recalled = await conn.prompt(session_id=forked["sessionId"], prompt=prompt("@recall"))
        drafted = await conn.fork_session(cwd=folder, session_id=source)  # ACP's draft session/fork
        with pytest.raises(RequestError) as bad:
            await conn.ext_method("threadloom/fork", {"sessionId": source, "workspace": "somewhere"})

    assert recalled.stop_reason == "end_turn"
    recall = "".join(u["content"]["text"] for s, u in editor.updates if s == forked["sessionId"])
    assert "@reply original" in recall and recall.endswith("user: @recall")  # the source's conversation, then its own
    for fork in (forked["sessionId"], drafted.session_id):
        seen = (await client.gql("query($t: ID!) { thread(id: $t) { title project { id } } }", {"t": fork}))["thread"]
        assert seen["project"]["id"] == project and fork != source
    assert options(forked["configOptions"])["mode"] == options(drafted.config_options)["mode"] == "workspace_write"
    assert bad.value.data == {"code": "INVALID_INPUT"}


async def test_rollback_previews_and_undoes_the_last_runs(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    folder, _ = await home(client, tmp_path, "Rollback")
    async with agent(server.url, str(client.token), Editor()) as conn:
        session = (await conn.new_session(cwd=folder)).session_id
        for text in ("@write a.txt one", "@write b.txt two", "@write c.txt three"):
            await conn.prompt(session_id=session, prompt=prompt(text))
        verb = "threadloom/rollback"
        preview = await conn.ext_method(verb, {"sessionId": session, "runs": 1, "dryRun": True})
        unchanged = await statuses(client, session)
        undone = await conn.ext_method(
            verb, {"sessionId": session, "runs": 1, "previewToken": preview["preview"]["previewToken"]}
        )
        errors = {}
        for name, params in {
            "too many": {"runs": 5},
            "both": {"runs": 1, "runOrdinal": 0},
            "neither": {},
            "stale": {"runOrdinal": 0, "previewToken": preview["preview"]["previewToken"]},
        }.items():
            with pytest.raises(RequestError) as refused:
                await conn.ext_method(verb, {"sessionId": session, **params})
            errors[name] = (refused.value.code, refused.value.data)
        to_start = await conn.ext_method(verb, {"sessionId": session, "runOrdinal": 0})

    assert preview["runOrdinal"] == 2 and preview["preview"]["rolledBackRunOrdinals"] == [3]
    assert preview["preview"]["deletePaths"] == ["c.txt"]
    assert unchanged == ["COMPLETED"] * 3  # a dry run changes nothing
    assert undone == {"runOrdinal": 2, "rolledBackRunOrdinals": [3]}
    assert errors == {
        "too many": (-32602, {"code": "NOTHING_TO_ROLL_BACK"}),
        "both": (-32602, {"code": "INVALID_INPUT"}),
        "neither": (-32602, {"code": "INVALID_INPUT"}),
        "stale": (-32602, {"code": "STALE_PREVIEW"}),  # the server's own stable code, in data.code
    }
    assert to_start["rolledBackRunOrdinals"] == [1, 2]
    assert await statuses(client, session) == ["ROLLED_BACK"] * 3
    assert [name for name in ("a.txt", "b.txt", "c.txt") if (Path(folder) / name).exists()] == []


async def test_a_question_is_asked_in_the_editor_as_a_form(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    folder, _ = await home(client, tmp_path, "Questions")
    editor = Editor(form={"q1": "blue"})
    async with agent(server.url, str(client.token), editor, elicitation=True) as conn:
        session = (await conn.new_session(cwd=folder)).session_id
        done = await asyncio.wait_for(
            conn.prompt(session_id=session, prompt=prompt("@ask Which colour? | red | blue")), 60
        )

    assert done.stop_reason == "end_turn" and editor.text() == "Answer: blue"
    [(message, form)] = editor.elicited
    assert message == "Which colour?" and form["sessionId"] == session
    field = form["requestedSchema"]["properties"]["q1"]
    assert field["type"] == "string" and [o["const"] for o in field["oneOf"]] == ["red", "blue"]
    assert form["requestedSchema"]["required"] == ["q1"]


@pytest.mark.parametrize("elicitation", [True, False], ids=["declined-in-the-editor", "editor-without-forms"])
async def test_a_question_not_answered_in_the_editor_waits_for_another_client(
    elicitation: bool, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    """The twin of the form: declined in the editor, or with an editor that takes no forms, the question stays
    in the thread, and the prompt goes on once another client on the editor's device (the session holds the
    thread's writer lease, docs/leases.md) answers it."""
    folder, _ = await home(client, tmp_path, "Declined")
    editor = Editor(form=None if elicitation else {"q1": "blue"})
    async with agent(server.url, str(client.token), editor, elicitation=elicitation, device="desk") as conn:
        session = (await conn.new_session(cwd=folder)).session_id
        going = asyncio.create_task(conn.prompt(session_id=session, prompt=prompt("@ask Which colour? | red | blue")))

        async def pending() -> list[dict[str, Any]]:
            return (await thread(client, session))["pendingRequests"]  # type: ignore[no-any-return]

        async def declined() -> bool:
            return bool(editor.elicited)

        [request] = await until(pending)
        if elicitation:
            await until(declined)  # asked and declined in the editor first
        answered = await client.gql(
            """mutation($r: ID!) { respondToUserInput(input: {requestId: $r,
                 answers: [{questionId: "q1", answers: ["red"]}]}) { userErrors { code } } }""",
            {"r": request["id"]},
            headers={"Threadloom-Device": "desk"},
        )
        assert answered["respondToUserInput"]["userErrors"] == []
        done = await asyncio.wait_for(going, 60)
    assert done.stop_reason == "end_turn" and editor.text() == "Answer: red"
    assert len(editor.elicited) == (1 if elicitation else 0)


async def test_several_approvals_are_outstanding_at_once(server: ServerProcess, client: Client, tmp_path: Path) -> None:
    folder, _ = await home(client, tmp_path, "Approvals")
    editor = Editor("ACCEPT")
    editor.hold = asyncio.Event()
    async with agent(server.url, str(client.token), editor) as conn:
        sessions = [(await conn.new_session(cwd=folder)).session_id for _ in range(2)]
        going = [
            asyncio.create_task(conn.prompt(session_id=s, prompt=prompt(f"@approval echo {i} > {i}.txt")))
            for i, s in enumerate(sessions)
        ]

        async def both_asked() -> bool:
            return len(editor.asked) == 2

        await until(both_asked)  # both asked, neither answered yet
        editor.hold.set()
        done = await asyncio.wait_for(asyncio.gather(*going), 60)
    assert [d.stop_reason for d in done] == ["end_turn", "end_turn"]
    assert sorted(call["title"] for call, _ in editor.asked) == ["echo 0 > 0.txt", "echo 1 > 1.txt"]
    assert (Path(folder) / "0.txt").read_text() == "0\n" and (Path(folder) / "1.txt").read_text() == "1\n"


async def test_a_session_of_another_project_is_refused_like_an_unknown_id(
    server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    """A session id is no bearer token: with a token of another project, every method answers the id of a
    real thread exactly as a made-up one. The twin: the thread's own project's token gets it."""
    mine, _ = await home(client, tmp_path, "Secret")
    theirs, other = await home(client, tmp_path, "Outsider")
    async with agent(server.url, str(client.token), Editor()) as conn:
        secret = (await conn.new_session(cwd=mine)).session_id
        await conn.prompt(session_id=secret, prompt=prompt("@reply private"))
    made_up = base64.urlsafe_b64encode(f"Thread:{uuid.uuid4()}".encode()).decode().rstrip("=")
    text = [{"type": "text", "text": "@reply hijack"}]

    async def answers(token: str, session_id: str) -> dict[str, Any]:
        seen = Editor()
        found: dict[str, Any] = {}
        async with agent(server.url, token, seen) as conn:
            calls = {  # in this order: the insider's prompt, steer and queue start runs, the rest needs none going
                "load": conn.load_session(cwd=mine, session_id=session_id),
                "resume": conn.resume_session(cwd=mine, session_id=session_id),
                "rollback": conn.ext_method(
                    "threadloom/rollback", {"sessionId": session_id, "runs": 1, "dryRun": True}
                ),
                "mode": conn.set_config_option(config_id="mode", session_id=session_id, value="read_only"),
                "fork": conn.ext_method("threadloom/fork", {"sessionId": session_id}),
                "prompt": conn.prompt(session_id=session_id, prompt=prompt("@reply hijack")),
                "steer": conn.ext_method("session/steering", {"sessionId": session_id, "prompt": text}),
                "queue": conn.ext_method("threadloom/queue", {"sessionId": session_id, "prompt": text}),
            }
            for name, call in calls.items():
                try:
                    await call
                    found[name] = "ok"
                except RequestError as exc:
                    found[name] = (exc.code, str(exc), exc.data)
            listed = await conn.list_sessions()
        found["listed"] = session_id in {s.session_id for s in listed.sessions}
        found["updates"] = seen.updates
        return found

    _, outsider = create_token(database_url, "operate", other)
    refused = await answers(outsider, secret)
    assert refused == await answers(outsider, made_up)  # the same answers: nothing tells the two apart
    methods = {k: v for k, v in refused.items() if k not in {"listed", "updates"}}
    assert "ok" not in methods.values() and refused["load"][0] == -32002 and refused["listed"] is False
    assert refused["updates"] == []
    assert [m["text"] for m in (await thread(client, secret))["messages"]["nodes"]] == ["@reply private", "private"]
    assert (await thread(client, secret))["mode"] == "WORKSPACE_WRITE"

    _, insider = create_token(database_url, "operate", (await thread(client, secret))["project"]["id"])
    allowed = await answers(insider, secret)
    assert allowed["listed"] is True
    assert [k for k, v in allowed.items() if v != "ok"] == ["listed", "updates"]
    assert [u["content"]["text"] for _, u in allowed["updates"][:2]] == ["@reply private", "private"]
    del theirs


async def test_the_bridge_as_a_server_survives_what_an_editor_may_send(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    """Raw lines: an unknown method, a line over the limit, `$/cancel_request` of a prompt (its run stops, the
    prompt ends as cancelled), and an approval answered elsewhere withdrawn from the editor."""
    folder, _ = await home(client, tmp_path, "Raw")
    async with raw_agent(server.url, str(client.token), device="desk") as raw:
        unknown = await raw.call(1, "session/teleport", {})
        assert unknown["error"]["code"] == -32601
        await raw.write(
            b'{"jsonrpc":"2.0","id":2,"method":"session/new","params":{"cwd":"' + b"x" * (17 * 1024 * 1024) + b'"}}\n'
        )
        unreadable = await raw.wait_for(lambda m: m.get("id") is None and m.get("error", {}).get("code") == -32700)
        assert "unreadable line" in unreadable["error"]["message"]
        session = (await raw.call(3, "session/new", {"cwd": folder, "mcpServers": []}))["result"]["sessionId"]

        await raw.send(
            {
                "id": 4,
                "method": "session/prompt",
                "params": {"sessionId": session, "prompt": [{"type": "text", "text": "@delay 60000"}]},
            }
        )
        await running(client, session)
        await raw.send({"method": "$/cancel_request", "params": {"requestId": 4}})
        assert (await raw.answer(4))["result"]["stopReason"] == "cancelled"
        assert await statuses(client, session) == ["INTERRUPTED"]

        await raw.send(
            {
                "id": 5,
                "method": "session/prompt",
                "params": {"sessionId": session, "prompt": [{"type": "text", "text": "@approval echo ok > ok.txt"}]},
            }
        )
        asked = await raw.wait_for(lambda m: m.get("method") == "session/request_permission")
        [request] = (await thread(client, session))["pendingRequests"]
        await client.gql(
            "mutation($r: ID!) { respondToApproval(input: {requestId: $r, decision: ACCEPT}) { userErrors { code } } }",
            {"r": request["id"]},
            headers={"Threadloom-Device": "desk"},  # the editor's device: the session holds the writer lease
        )
        withdrawn = await raw.wait_for(lambda m: m.get("method") == "$/cancel_request", within=10)
        assert withdrawn["params"] == {"requestId": asked["id"]}
        assert (await raw.answer(5))["result"]["stopReason"] == "end_turn"
        assert (Path(folder) / "ok.txt").read_text() == "ok\n"

"""`threadloom acp` driven by an editor: the official ACP Python SDK's client, over the agent's real stdio.

The SDK validates every message it gets against the protocol's schema, so a session update or a permission
request of the wrong shape is dropped or refused there and the test sees it missing. Behind the bridge is a
real server with the scripted agent.
"""

from __future__ import annotations

import asyncio
import functools
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from acp import RequestError, text_block
from acp.schema import ImageContentBlock

from tests.support.acp import Editor, agent
from tests.support.cli import create_token
from tests.support.graphql import make_project, workspace
from tests.support.pg import PgServer
from tests.support.server import Client, ServerProcess, serving
from tests.support.waiting import until


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    """One database for the module's server; each test works in a project of its own."""
    return await pg.fresh()


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """One server for the module (a start per test would cost more than most of these tests)."""
    with serving(database_url, tmp_path_factory.mktemp("acp-data")) as proc:
        yield proc


THREADS = "query($p: ID!) { project(id: $p) { threads { totalCount } } }"
THREAD = """query($t: ID!) { thread(id: $t) { project { id } runs { nodes { status } }
  messages { nodes { role text } } } }"""


async def project_home(client: Client, tmp_path: Path, name: str) -> str:
    """The workspace folder of a new project named `name`."""
    home = workspace(tmp_path, name.lower().replace(" ", "-"))
    await make_project(client, name, home)
    return home


async def run_running(client: Client, session_id: str) -> None:
    """Waits until the session's (first) run is RUNNING."""

    async def running() -> bool:
        runs = (await thread(client, session_id))["runs"]["nodes"]
        return bool(runs) and runs[0]["status"] == "RUNNING"

    await until(running)


async def run_ended(client: Client, session_id: str) -> bool:
    """Whether the session's (first) run has completed."""
    runs = (await thread(client, session_id))["runs"]["nodes"]
    return bool(runs) and runs[0]["status"] == "COMPLETED"


async def thread(client: Client, session_id: str) -> dict[str, Any]:
    return (await client.gql(THREAD, {"t": session_id}))["thread"]  # type: ignore[no-any-return]


async def test_an_editor_prompts_and_sees_the_run_as_it_happens(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    home = workspace(tmp_path, "editor")
    project = await make_project(client, "Edited", home)
    editor = Editor()
    async with agent(server.url, str(client.token), editor) as conn:
        session = await conn.new_session(cwd=str(Path(home) / "src"))  # a folder inside the workspace
        script = "@todo read; answer\n@reply hello there world\n@tool echo from-the-tool\n@usage 12 6"
        done = await conn.prompt(session_id=session.session_id, prompt=[text_block(script)])

    assert done.stop_reason == "end_turn"
    # The run's tokens, as the ledger recorded the agent's one model call.
    assert done.usage is not None
    assert (done.usage.input_tokens, done.usage.output_tokens, done.usage.total_tokens) == (12, 6, 18)
    # The session is a thread of the project whose workspace holds cwd, with the run the prompt started.
    seen = await thread(client, session.session_id)
    assert seen["project"]["id"] == project and [r["status"] for r in seen["runs"]["nodes"]] == ["COMPLETED"]
    assert [(m["role"], m["text"]) for m in seen["messages"]["nodes"]] == [
        ("USER", script),
        ("ASSISTANT", "hello there world"),
    ]
    assert {s for s, _ in editor.updates} == {session.session_id}
    assert editor.text() == "hello there world"  # streamed in parts, each part once
    calls = editor.of_kind("tool_call")
    assert [(c["title"], c["kind"]) for c in calls] == [("echo from-the-tool", "execute")]
    ended = [u for u in editor.of_kind("tool_call_update") if u["toolCallId"] == calls[0]["toolCallId"]]
    assert ended[-1]["status"] == "completed" and "from-the-tool" in ended[-1]["content"][0]["content"]["text"]
    plans = editor.of_kind("plan")
    assert plans and [e["status"] for e in plans[-1]["entries"]] == ["completed", "completed"]
    assert [e["content"] for e in plans[-1]["entries"]] == ["read", "answer"]


async def test_the_editor_answers_the_agents_approvals(server: ServerProcess, client: Client, tmp_path: Path) -> None:
    home = await project_home(client, tmp_path, "Approvals")
    editor = Editor("ACCEPT")
    async with agent(server.url, str(client.token), editor) as conn:
        session = await conn.new_session(cwd=home)
        allowed = await conn.prompt(session_id=session.session_id, prompt=[text_block("@approval echo a > a.txt")])
        editor.choice = "DECLINE"
        declined = await conn.prompt(session_id=session.session_id, prompt=[text_block("@approval echo d > d.txt")])

    assert allowed.stop_reason == "end_turn" and declined.stop_reason == "end_turn"
    assert [(call["title"], call["kind"], kinds) for call, kinds in editor.asked] == [
        ("echo a > a.txt", "execute", ["allow_once", "allow_always", "reject_once"]),
        ("echo d > d.txt", "execute", ["allow_once", "allow_always", "reject_once"]),
    ]
    assert (Path(home) / "a.txt").read_text() == "a\n"
    assert not (Path(home) / "d.txt").exists()  # declined: the command never ran


async def test_cancel_interrupts_the_run_and_ends_the_prompt_as_cancelled(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    home = await project_home(client, tmp_path, "Cancel")
    async with agent(server.url, str(client.token), Editor()) as conn:
        session = await conn.new_session(cwd=home)
        prompt = asyncio.create_task(
            conn.prompt(session_id=session.session_id, prompt=[text_block("@delay 60000\n@reply never")])
        )
        await run_running(client, session.session_id)
        await conn.cancel(session_id=session.session_id)
        done = await asyncio.wait_for(prompt, 30)

    assert done.stop_reason == "cancelled"
    assert [r["status"] for r in (await thread(client, session.session_id))["runs"]["nodes"]] == ["INTERRUPTED"]


async def test_a_dismissed_permission_request_cancels_the_approval(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    home = await project_home(client, tmp_path, "Dismissed")
    editor = Editor(choice=None)
    async with agent(server.url, str(client.token), editor) as conn:
        session = await conn.new_session(cwd=home)
        await conn.prompt(session_id=session.session_id, prompt=[text_block("@approval echo x > x.txt")])
    decided = await client.gql(
        """query($t: ID!) { thread(id: $t) { runs { nodes { executionGraph { nodes {
             runtimeRequest { status response } } } } } } }""",
        {"t": session.session_id},
    )
    requests = [
        n["runtimeRequest"]
        for run in decided["thread"]["runs"]["nodes"]
        for n in run["executionGraph"]["nodes"]
        if n["runtimeRequest"]
    ]
    assert requests == [{"status": "RESOLVED", "response": {"decision": "cancel"}}]
    assert not (Path(home) / "x.txt").exists()


async def test_load_session_replays_the_conversation_to_another_editor(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    home = await project_home(client, tmp_path, "Load")
    async with agent(server.url, str(client.token), Editor()) as conn:
        session = await conn.new_session(cwd=home)
        await conn.prompt(session_id=session.session_id, prompt=[text_block("@reply first answer")])
        await conn.prompt(session_id=session.session_id, prompt=[text_block("@reply second answer")])

    later = Editor()
    async with agent(server.url, str(client.token), later) as conn:
        await conn.load_session(cwd=home, session_id=session.session_id)
        assert [(u["sessionUpdate"], u["content"]["text"]) for _, u in later.updates] == [
            ("user_message_chunk", "@reply first answer"),
            ("agent_message_chunk", "first answer"),
            ("user_message_chunk", "@reply second answer"),
            ("agent_message_chunk", "second answer"),
        ]
        # The loaded session takes prompts like a new one.
        again = await conn.prompt(session_id=session.session_id, prompt=[text_block("@reply third")])
        assert again.stop_reason == "end_turn" and later.text().endswith("third")


async def test_bad_input_gets_a_typed_error_and_changes_nothing(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    home = await project_home(client, tmp_path, "Bad")
    async with agent(server.url, str(client.token), Editor()) as conn:
        with pytest.raises(RequestError) as nowhere:
            await conn.new_session(cwd=str(tmp_path / "elsewhere"))
        assert nowhere.value.code == -32602 and nowhere.value.data == {"code": "NO_PROJECT"}
        with pytest.raises(RequestError) as unknown:
            await conn.prompt(session_id="VGhyZWFkOm5vbmU", prompt=[text_block("@reply hi")])
        assert unknown.value.code == -32002

        with pytest.raises(RequestError) as relative:
            await conn.new_session(cwd="src")
        assert relative.value.code == -32602 and relative.value.data == {"code": "INVALID_CWD"}

        session = await conn.new_session(cwd=home)
        busy = asyncio.create_task(conn.prompt(session_id=session.session_id, prompt=[text_block("@delay 60000")]))

        async def prompting() -> bool:
            return bool((await thread(client, session.session_id))["runs"]["nodes"])

        await until(prompting)
        with pytest.raises(RequestError) as twice:
            await conn.prompt(session_id=session.session_id, prompt=[text_block("@reply second")])
        assert twice.value.code == -32600 and twice.value.data == {"code": "PROMPT_RUNNING"}
        await conn.cancel(session_id=session.session_id)
        assert (await busy).stop_reason == "cancelled"

        image = ImageContentBlock(type="image", data="iVBORw0KGgo=", mime_type="image/png")
        with pytest.raises(RequestError) as refused:
            await conn.prompt(session_id=session.session_id, prompt=[image])
        assert refused.value.code == -32602 and refused.value.data == {"code": "INVALID_PROMPT"}
    # Only the first prompt reached the thread: the refused ones sent nothing.
    assert [m["text"] for m in (await thread(client, session.session_id))["messages"]["nodes"]] == ["@delay 60000"]


async def test_a_token_of_another_project_reaches_nothing_of_this_one(
    server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    mine, theirs = workspace(tmp_path, "mine"), workspace(tmp_path, "theirs")
    await make_project(client, "Mine", mine)
    other = await make_project(client, "Theirs", theirs)
    async with agent(server.url, str(client.token), Editor()) as conn:
        session = await conn.new_session(cwd=mine)
        await conn.prompt(session_id=session.session_id, prompt=[text_block("@reply private")])

    _, token = create_token(database_url, "operate", other)
    outsider = Editor()
    async with agent(server.url, token, outsider) as conn:
        with pytest.raises(RequestError) as load:
            await conn.load_session(cwd=mine, session_id=session.session_id)
        assert load.value.code == -32002
        with pytest.raises(RequestError) as new:
            await conn.new_session(cwd=mine)  # the other project's workspace: not this token's
        assert new.value.data == {"code": "NO_PROJECT"}
        with pytest.raises(RequestError) as prompt:
            await conn.prompt(session_id=session.session_id, prompt=[text_block("@reply hijack")])
        assert prompt.value.code == -32002
    assert outsider.updates == []
    texts = [m["text"] for m in (await thread(client, session.session_id))["messages"]["nodes"]]
    assert texts == ["@reply private", "private"]


async def test_a_bad_token_is_refused_with_auth_required(server: ServerProcess, tmp_path: Path) -> None:
    async with agent(server.url, "tl_not-a-token", Editor()) as conn:
        with pytest.raises(RequestError) as refused:
            await conn.new_session(cwd=str(tmp_path))
        assert refused.value.code == -32000 and refused.value.data == {"code": "UNAUTHENTICATED"}


async def test_a_read_token_cannot_prompt(
    server: ServerProcess, client: Client, database_url: str, tmp_path: Path
) -> None:
    home = workspace(tmp_path, "read")
    project = await make_project(client, "Read only", home)
    _, token = create_token(database_url, "read", project)
    async with agent(server.url, token, Editor()) as conn:
        with pytest.raises(RequestError) as refused:
            await conn.new_session(cwd=home)
    assert refused.value.code == -32602 and refused.value.data == {"code": "FORBIDDEN"}
    assert (await client.gql(THREADS, {"p": project}))["project"]["threads"]["totalCount"] == 0


async def test_an_unreachable_server_is_a_typed_error(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]  # nobody listens once the probe closes
    async with agent(f"http://127.0.0.1:{closed_port}", "tl_whatever", Editor()) as conn:
        with pytest.raises(RequestError) as unreachable:
            await conn.new_session(cwd=str(tmp_path))
    assert unreachable.value.code == -32603 and unreachable.value.data == {"code": "UNREACHABLE"}


class Cable:
    """A TCP forwarder between the bridge and the server whose connections the test can cut (a network blip)."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = 0
        self.url = ""
        self.connections = 0
        self._writers: list[asyncio.StreamWriter] = []
        self._server: asyncio.Server | None = None

    async def __aenter__(self) -> Cable:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.cut()
        assert self._server is not None
        self._server.close()

    def cut(self) -> None:
        for writer in self._writers:
            writer.transport.abort()
        self._writers.clear()

    async def unplug(self) -> None:
        """Cut every connection and refuse new ones until `plug`."""
        assert self._server is not None
        self._server.close()
        await self._server.wait_closed()
        self.cut()

    async def plug(self) -> None:
        self._server = await asyncio.start_server(self._forward, "127.0.0.1", self.port)

    async def _forward(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        upstream_reader, upstream_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        self._writers += [writer, upstream_writer]

        async def pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
            try:
                while data := await source.read(65536):
                    sink.write(data)
                    await sink.drain()
            except OSError:
                pass
            finally:
                sink.transport.abort()

        await asyncio.gather(pipe(reader, upstream_writer), pipe(upstream_reader, writer))


async def test_a_prompt_follows_on_after_the_connection_drops(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    """The connection drops between the two parts and stays down while the second is made (the turn is held at
    a gate until then); back, the bridge replays what it missed from the last sequence it saw."""
    home = await project_home(client, tmp_path, "Blip")
    editor = Editor()

    async def first_part_shown() -> bool:
        return "before the blip" in editor.text()

    async with Cable(server.port) as cable, agent(cable.url, str(client.token), editor) as conn:
        session = await conn.new_session(cwd=home)
        script = "@reply before the blip\n@await go\n@reply after the blip"
        prompt = asyncio.create_task(conn.prompt(session_id=session.session_id, prompt=[text_block(script)]))
        await until(first_part_shown)
        await cable.unplug()
        (Path(home) / "go").touch()
        await until(functools.partial(run_ended, client, session.session_id))  # all of it while the bridge was away
        assert editor.text() == "before the blip"  # the second part is yet to be shown: the gap is real
        await cable.plug()
        done = await asyncio.wait_for(prompt, 60)

    assert done.stop_reason == "end_turn"
    assert cable.connections == 2  # the bridge connected again and followed on from the last sequence it saw
    assert editor.text() == "before the blipafter the blip"  # each part once, nothing lost in the gap
    assert [r["status"] for r in (await thread(client, session.session_id))["runs"]["nodes"]] == ["COMPLETED"]


async def test_a_server_stopping_mid_prompt_ends_it_with_the_runs_outcome(
    pg: PgServer, data_dir: Path, tmp_path: Path
) -> None:
    database_url = await pg.fresh()  # a server of its own: the module's would take the run's turn too
    server = ServerProcess(database_url, data_dir).wait_ready()
    port, token = server.port, str(server.admin_token)
    api = Client(server.url, token)
    try:
        home = await project_home(api, tmp_path, "Restart")
        async with agent(server.url, token, Editor()) as conn:
            session = await conn.new_session(cwd=home)
            script = "@delay 60000\n@reply never"
            prompt = asyncio.create_task(conn.prompt(session_id=session.session_id, prompt=[text_block(script)]))
            await run_running(api, session.session_id)
            server.stop()
            server = ServerProcess(database_url, data_dir, port=port).wait_ready()
            with pytest.raises(RequestError) as failed:
                await asyncio.wait_for(prompt, 60)
        runs = (await thread(api, session.session_id))["runs"]["nodes"]
    finally:
        await api.aclose()
        server.stop()
    assert failed.value.data == {"code": "RUN_FAILED"} and "server_stopped" in str(failed.value)
    assert [r["status"] for r in runs] == ["FAILED"]


async def test_a_subagents_approval_is_asked_in_the_editor(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    home = await project_home(client, tmp_path, "Delegating")
    editor = Editor("ACCEPT")
    async with agent(server.url, str(client.token), editor) as conn:
        session = await conn.new_session(cwd=home)
        script = "@subagent @approval echo c > child.txt"
        done = await asyncio.wait_for(conn.prompt(session_id=session.session_id, prompt=[text_block(script)]), 60)
    assert done.stop_reason == "end_turn"
    assert [call["title"] for call, _ in editor.asked] == ["echo c > child.txt"]
    assert (Path(home) / "child.txt").read_text() == "c\n"
    assert [c["kind"] for c in editor.of_kind("tool_call")][:1] == ["other"]  # the subagent, as a tool call


async def test_a_prompt_too_far_behind_to_replay_reads_the_run_and_misses_nothing(pg: PgServer, tmp_path: Path) -> None:
    """The bridge is cut off while the run does its work. Back, it is too far behind to replay (the server's
    replay limit is 1 event), so it reads the run as it is, shows the editor what it has not seen, and
    follows on from the thread's newest sequence."""
    database_url = await pg.fresh()
    editor = Editor()

    async def shown(text: str) -> bool:
        return text in editor.text()

    with serving(database_url, tmp_path / "data", {"THREADLOOM_MAX_REPLAY": "1"}) as server:
        api = Client(server.url, str(server.admin_token))
        try:
            home = await project_home(api, tmp_path, "Behind")
            async with Cable(server.port) as cable, agent(cable.url, str(server.admin_token), editor) as conn:
                session = await conn.new_session(cwd=home)
                # Held at a gate until the bridge is away: the rest certainly happens while it cannot see it.
                script = "@reply first part\n@await go\n@reply the rest of it\n@tool echo tool-output"
                prompt = asyncio.create_task(conn.prompt(session_id=session.session_id, prompt=[text_block(script)]))
                await until(functools.partial(shown, "first part"))
                await cable.unplug()
                (Path(home) / "go").touch()
                await until(functools.partial(run_ended, api, session.session_id))  # all of it while away
                assert editor.text() == "first part" and editor.of_kind("tool_call") == []  # nothing of it seen yet
                await cable.plug()
                done = await asyncio.wait_for(prompt, 60)
        finally:
            await api.aclose()
    assert done.stop_reason == "end_turn"
    assert editor.text() == "first partthe rest of it"  # each part once
    calls = editor.of_kind("tool_call")
    assert [(c["title"], c["status"]) for c in calls] == [("echo tool-output", "completed")]  # known once done

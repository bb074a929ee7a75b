"""`threadloom acp` and the writer lease (docs/leases.md): a session takes its thread's lease when it sends its first
message, holds it while it is open, and gives it up when the editor closes the session or the bridge ends. Another
editor (another device: its THREADLOOM_DEVICE) is refused with WRITER_LEASE_HELD naming the holder, and so is a
client naming no device; once the first session lets go, the second drives."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from acp import RequestError, text_block

from tests.support.acp import Editor, agent
from tests.support.graphql import make_project, workspace
from tests.support.pg import PgServer
from tests.support.runs import SEND
from tests.support.server import Client, ServerProcess, serving

LEASE = "query($t: ID!) { thread(id: $t) { lease { deviceId } runs { nodes { status } } } }"


@pytest.fixture(scope="module")
async def database_url(pg: PgServer) -> str:
    return await pg.fresh()


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serving(database_url, tmp_path_factory.mktemp("acp-leases")) as proc:
        yield proc


async def _lease(client: Client, thread: str) -> str | None:
    lease = (await client.gql(LEASE, {"t": thread}))["thread"]["lease"]
    return None if lease is None else str(lease["deviceId"])


async def test_a_session_drives_its_thread_from_its_first_prompt_until_it_is_closed(
    server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    home = workspace(tmp_path, "acp-lease")
    await make_project(client, "ACP lease", home)
    token = str(client.token)
    async with agent(server.url, token, Editor(), device="laptop-editor") as laptop:
        session = (await laptop.new_session(cwd=home)).session_id
        assert await _lease(client, session) is None  # an open session that sent nothing drives nothing
        await laptop.prompt(session_id=session, prompt=[text_block("@reply from the laptop")])
        assert await _lease(client, session) == "laptop-editor"
        bare = (await client.gql(SEND, {"t": session, "text": "@reply no device"}))["sendMessage"]
        assert [e["code"] for e in bare["userErrors"]] == ["WRITER_LEASE_HELD"]

        phone_editor = Editor()
        async with agent(server.url, token, phone_editor, device="phone-editor") as phone:
            await phone.load_session(cwd=home, session_id=session)  # watching is open to all
            with pytest.raises(RequestError) as refused:
                await phone.prompt(session_id=session, prompt=[text_block("@reply from the phone")])
            assert refused.value.data == {"code": "WRITER_LEASE_HELD"}
            assert "'laptop-editor'" in str(refused.value)

            await laptop.close_session(session_id=session)  # the laptop lets go
            assert await _lease(client, session) is None
            done = await phone.prompt(session_id=session, prompt=[text_block("@reply from the phone")])
            assert done.stop_reason == "end_turn" and phone_editor.text().endswith("from the phone")
            assert await _lease(client, session) == "phone-editor"
        # The phone's bridge ended with its editor: it released the lease on its way out.
        assert await _lease(client, session) is None
    statuses = [r["status"] for r in (await client.gql(LEASE, {"t": session}))["thread"]["runs"]["nodes"]]
    assert statuses == ["COMPLETED", "COMPLETED"]  # the refused sends wrote nothing

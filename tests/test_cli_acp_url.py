"""`threadloom acp --url` (and THREADLOOM_URL) is the server's base URL, as for every client; the GraphQL
endpoint's URL (`…/graphql`, what GraphQL tools are given) reaches the same server. Each form: the real bridge
on stdio, an editor (the ACP SDK) opening a session in a project, and the thread it made seen over the API."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import pytest
from acp.stdio import spawn_agent_process

from tests.support.graphql import make_project, workspace
from tests.support.server import Client, ServerProcess
from threadloom.acp.graphql_socket import websocket_url

FORMS = ["{base}", "{base}/", "{base}/graphql", "{base}/graphql/"]


class QuietEditor:
    """An editor that shows nothing and is asked nothing (no prompt is sent)."""

    async def session_update(self, *_: Any, **__: Any) -> None:
        pass

    def on_connect(self, conn: Any) -> None:
        pass


@pytest.mark.parametrize("form", ["{base}/graphql", "{base}/"])  # the plain base URL: tests/test_acp.py
async def test_the_bridge_reaches_the_server_by_either_url(
    form: str, server: ServerProcess, client: Client, tmp_path: Path
) -> None:
    home = workspace(tmp_path, "acp-url")
    await make_project(client, "ACP URL", home)
    url = form.format(base=server.url)
    env = {"PATH": os.environ["PATH"], "THREADLOOM_TOKEN": str(server.admin_token)}
    command = (sys.executable, "-m", "threadloom", "acp", "--url", url)
    async with spawn_agent_process(lambda _agent: QuietEditor(), *command, env=env) as (conn, _process):
        await conn.initialize(protocol_version=1)
        session = await conn.new_session(cwd=home)
    thread = await client.gql("query($t: ID!) { thread(id: $t) { id } }", {"t": session.session_id})
    assert thread["thread"] == {"id": session.session_id}


def test_both_forms_name_the_same_websocket_endpoint() -> None:
    for base, ws in (("http://h:8000", "ws://h:8000/graphql"), ("https://h/tl", "wss://h/tl/graphql")):
        assert {websocket_url(form.format(base=base)) for form in FORMS} == {ws}

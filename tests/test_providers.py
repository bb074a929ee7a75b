"""Provider instances from configuration: lazy by default, eager when configured, flags per instance."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from tests.support.graphql import CREATE_PROJECT, make_thread, workspace
from tests.support.server import Client, ServerProcess, providers_env
from tests.support.waiting import until
from threadloom.providers.registry import ConfigError, load_instances
from threadloom.store import tables as t
from threadloom.store.db import Database

CONFIG = """
[instances.eager]
driver = "scripted"
eager_thread = true
supports_active_steering = false
"""


async def _rows(database_url: str, table: sa.Table) -> list[sa.RowMapping]:
    db = Database.from_url(database_url, pool_size=1)
    try:
        async with db.read() as r:
            return await r.rows(sa.select(table))
    finally:
        await db.dispose()


async def test_new_thread_is_lazy(client: Client, database_url: str, tmp_path: Path) -> None:
    data = await client.gql(CREATE_PROJECT, {"name": "p", "root": workspace(tmp_path)})
    await make_thread(client, data["createProject"]["project"]["id"])
    assert await _rows(database_url, t.provider_threads) == []
    assert await _rows(database_url, t.provider_sessions) == []


async def test_eager_instance_creates_its_provider_thread(database_url: str, tmp_path: Path) -> None:
    server = ServerProcess(database_url, tmp_path / "d", env=providers_env(tmp_path, CONFIG)).wait_ready()
    client = Client(server.url, server.admin_token)
    try:
        data = await client.gql(CREATE_PROJECT, {"name": "p", "root": workspace(tmp_path)})
        project = data["createProject"]["project"]["id"]
        created = await client.gql(
            """mutation($p: ID!) { createThread(input: {projectId: $p, providerInstanceId: "eager"}) {
                 thread { id providerInstanceId } } }""",
            {"p": project},
        )
        thread = created["createThread"]["thread"]
        assert thread["providerInstanceId"] == "eager"

        async def ready() -> list[dict[str, str]] | None:
            found = await client.gql(
                "query($t: ID!) { thread(id: $t) { providerThreads { nativeThreadRef status } } }", {"t": thread["id"]}
            )
            pts = found["thread"]["providerThreads"]
            return pts if pts and pts[0]["nativeThreadRef"] else None

        pts = await until(ready)
        assert pts[0]["status"] == "ACTIVE"
        sessions = await _rows(database_url, t.provider_sessions)
        assert [(s["provider_instance_id"], s["status"]) for s in sessions] == [("eager", "ready")]
        assert sessions[0]["capabilities"]["supports_active_steering"] is False
        lazy = await make_thread(client, project)  # the default instance stays lazy
        assert lazy["providerInstanceId"] == "scripted"
    finally:
        await client.aclose()
        server.stop()
    stopped = await _rows(database_url, t.provider_sessions)
    assert [s["status"] for s in stopped] == ["stopped"]  # closed on shutdown


def test_bad_configuration_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('[instances.x]\ndriver = "nope"\n')
    with pytest.raises(ConfigError, match="unknown driver"):
        load_instances(bad)
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match="cannot read"):
        load_instances(missing)
    assert set(load_instances(None)) == {"scripted", "codex", "claude"}
    typo = tmp_path / "typo.toml"
    typo.write_text('[instances.codex]\ndriver = "codex"\napi_key = "sk-inline"\n')
    with pytest.raises(ConfigError, match=r"unknown option.*api_key"):
        load_instances(typo)
    env = tmp_path / "env.toml"
    env.write_text('[instances.claude]\ndriver = "claude"\nenv = {X = 1}\n')
    with pytest.raises(ConfigError, match="table of strings"):
        load_instances(env)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("", "`command` must be a non-empty list"),
        ("command = []", "`command` must be a non-empty list"),
        ('command = "gemini --acp"', "`command` must be a non-empty list"),
        ('command = ["gemini", 3]', "`command` must be a non-empty list"),
        ('command = ["gemini"]\nmax_line_bytes = 10', "`max_line_bytes` must be"),
        ('command = ["gemini"]\ncancel_drain_s = 0', "`cancel_drain_s` must be"),
        ('command = ["gemini"]\nbinary = "gemini"', r"unknown option.*binary"),
    ],
)
def test_a_bad_acp_instance_is_refused(tmp_path: Path, options: str, message: str) -> None:
    bad = tmp_path / "acp.toml"
    bad.write_text(f'[instances.gem]\ndriver = "acp"\n{options}\n')
    with pytest.raises(ConfigError, match=message):
        load_instances(bad)


def test_the_twin_a_good_acp_instance_is_taken(tmp_path: Path) -> None:
    good = tmp_path / "acp.toml"
    good.write_text(
        '[instances.gem]\ndriver = "acp"\ncommand = ["gemini", "--experimental-acp"]\napi_key_env = "GEMINI_KEY"\n'
        'env = { A = "b" }\nmodel = "m"\nmax_line_bytes = 2048\ncancel_drain_s = 1.5\n'
    )
    found = load_instances(good)["gem"]
    assert found.driver == "acp" and found.options["command"] == ["gemini", "--experimental-acp"]

"""The command line and operational endpoints, as a newcomer and an operator meet them."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.support.cli import threadloom
from tests.support.pg import PgServer
from tests.support.server import Client, ServerProcess
from threadloom.api.schema import export_sdl

ROOT = Path(__file__).resolve().parents[1]


def test_checked_in_schema_is_current() -> None:
    checked_in = (ROOT / "schema" / "schema.graphql").read_text()
    fix = "threadloom export-schema --out schema/schema.graphql"
    assert checked_in == export_sdl(), f"schema/schema.graphql is stale: run `{fix}`"


def test_export_schema_command_writes_the_served_schema(tmp_path: Path) -> None:
    out = tmp_path / "s.graphql"
    done = threadloom(None, "export-schema", "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert out.read_text() == export_sdl()


async def test_serve_refuses_unmigrated_database(pg: PgServer, tmp_path: Path) -> None:
    url = await pg.fresh(migrated=False)
    proc = ServerProcess(url, tmp_path / "d", fork=False)  # the command itself refuses
    proc.proc.wait(60)
    assert proc.proc.returncode == 2
    stderr = proc.proc.stderr.read() if proc.proc.stderr else ""
    assert "threadloom migrate" in "\n".join(proc.log) + stderr
    done = threadloom(url, "migrate")
    assert done.returncode == 0, done.stderr
    started = ServerProcess(url, tmp_path / "d").wait_ready()
    try:
        assert started.admin_token is not None
        async with httpx.AsyncClient(base_url=started.url) as http:
            assert (await http.get("/healthz")).json() == {"status": "ok"}
            assert (await http.get("/readyz")).json() == {"status": "ready"}
    finally:
        started.stop()


async def test_embedded_first_start_prints_token_once(tmp_path: Path) -> None:
    data = tmp_path / "embedded"
    first = ServerProcess(None, data).wait_ready(timeout=90)
    try:
        assert first.admin_token is not None and first.admin_token.startswith("tl_")
        client = Client(first.url, first.admin_token)
        assert (await client.gql("{ viewer { scope } }")) == {"viewer": {"scope": "ADMIN"}}
        await client.aclose()
    finally:
        first.stop()
    assert (data / "pg" / "PG_VERSION").exists()
    again = ServerProcess(None, data).wait_ready(timeout=90)
    try:
        assert again.admin_token is None
        client = Client(again.url, first.admin_token)
        assert (await client.gql("{ viewer { scope } }")) == {"viewer": {"scope": "ADMIN"}}
        await client.aclose()
    finally:
        again.stop()


def test_token_create_validates_project(database_url: str) -> None:
    done = threadloom(
        database_url, "token", "create", "--scope", "read", "--project", "00000000-0000-0000-0000-000000000000"
    )
    assert done.returncode == 2
    assert "no project" in done.stderr
    bad = threadloom(database_url, "token", "create", "--scope", "root")
    assert bad.returncode == 2


async def test_graphiql_and_suggestions_only_in_dev_mode(database_url: str, tmp_path: Path) -> None:
    html = {"accept": "text/html"}
    prod = ServerProcess(database_url, tmp_path / "prod").wait_ready()
    try:
        token = prod.admin_token
        async with httpx.AsyncClient(base_url=prod.url) as http:
            assert (await http.get("/graphql", headers=html)).status_code == 401
            page = await http.get("/graphql", headers={**html, "authorization": f"Bearer {token}"})
            assert page.status_code == 404
    finally:
        prod.stop()
    dev = ServerProcess(database_url, tmp_path / "dev", env={"THREADLOOM_DEV": "1"}).wait_ready()
    try:
        async with httpx.AsyncClient(base_url=dev.url) as http:
            page = await http.get("/graphql", headers=html)
            assert page.status_code == 200 and "graphiql" in page.text.lower()
            typo = await http.post(
                "/graphql", json={"query": "{ viewer { scopes } }"}, headers={"authorization": f"Bearer {token}"}
            )
            assert "Did you mean" in typo.json()["errors"][0]["message"]
    finally:
        dev.stop()

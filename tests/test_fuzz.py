"""schemathesis over every query and mutation against a real server: no server errors.

Expected failures are typed (`userErrors`, nullable results, coded errors); the check
fails on any 5xx, any non-JSON answer, and any error without a code or with
INTERNAL_SERVER_ERROR.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import schemathesis
from hypothesis import HealthCheck, seed, settings

from tests.support.pg import PgServer
from tests.support.server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
schema = schemathesis.graphql.from_path(str(ROOT / "schema" / "schema.graphql"))


@pytest.fixture(scope="module")
async def fuzz_server(pg: PgServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServerProcess]:
    url = await pg.fresh()
    proc = ServerProcess(url, tmp_path_factory.mktemp("fuzz")).wait_ready()
    yield proc
    proc.stop()


@schema.parametrize()
@seed(42)
@settings(max_examples=50, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_server_errors(case: schemathesis.Case, fuzz_server: ServerProcess) -> None:
    response = case.call(
        base_url=fuzz_server.url + "/graphql",
        headers={"authorization": f"Bearer {fuzz_server.admin_token}"},
        timeout=30,
    )
    assert response.status_code < 500, response.text
    body = response.json()
    for error in body.get("errors") or []:
        code = (error.get("extensions") or {}).get("code")
        assert code is not None, error
        assert code != "INTERNAL_SERVER_ERROR", (case.body, error)

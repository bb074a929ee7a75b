"""schemathesis over every query and mutation against a real server: no server errors.

Expected failures are typed (`userErrors`, nullable results, coded errors). Each of the 50 examples an
operation gets is checked twice over: by the checks `st run` makes (schemathesis's own, as the repository's
`schemathesis.toml` configures them) and by ours, which fail on any 5xx, any non-JSON answer, and any error
without a code or with INTERNAL_SERVER_ERROR. The `st` CLI, run as a user would with that file, must report
nothing either: it sends a few examples an operation, enough to show the command line, the file, the
token header and the seed work; generating the same 50 an operation again in another process would only
repeat what the first test checked (it was a minute of one worker).

Both draw their requests from the run's seed (tests/support/seeds.py): a fresh one every run, or
`THREADLOOM_TEST_SEED` to replay one; a failure prints it with the command line that replays it. Neither keeps
hypothesis's example database (`database = "none"` in schemathesis.toml, `database=None` here, and the CLI's
`--generation-database none`): examples saved by an earlier run would be tried first, so the seed alone would
not decide what a run sends.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import AsyncIterator
from datetime import timedelta
from pathlib import Path

import orjson
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.config import SchemathesisConfig
from schemathesis.core.failures import FailureGroup

from tests.support import seeds
from tests.support.pg import PgServer
from tests.support.server import ServerProcess

ROOT = Path(__file__).resolve().parents[1]
SEED = seeds.chosen()  # the parametrized tests are made at import: one seed for the module
EXAMPLES = 50  # an operation, checked in-process by schemathesis's checks and ours
CLI_EXAMPLES = 5  # an operation, by `st run`: the command line works as configured (the 50 above are its checks)
ST_RUN_S = 100  # `st run`'s bound: ~6 s idle; 50 examples an operation took 30-111 s


def _config() -> SchemathesisConfig:
    """The repository's schemathesis.toml (what `st run` reads), seeded: schemathesis derives each
    operation's hypothesis seed from it."""
    config = SchemathesisConfig.from_path(ROOT / "schemathesis.toml")
    config.update(seed=SEED, max_failures=None)
    return config


schema = schemathesis.graphql.from_path(str(ROOT / "schema" / "schema.graphql"), config=_config())


@pytest.fixture(scope="module")
async def fuzz_server(pg: PgServer, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[ServerProcess]:
    url = await pg.fresh()
    # Fuzzing sends hundreds of mutations a second: lift the per-token rate limits for this server.
    unlimited = {
        f"THREADLOOM_{name}": "1000000"
        for name in ("MUTATIONS_PER_MINUTE", "MUTATION_BURST", "RUN_STARTS_PER_MINUTE", "RUN_START_BURST")
    }
    proc = ServerProcess(url, tmp_path_factory.mktemp("fuzz"), env=unlimited).wait_ready()
    yield proc
    proc.stop()


@pytest.fixture
def fuzz_seed(request: pytest.FixtureRequest) -> seeds.Seed:
    return seeds.draw(request, SEED)


@schema.parametrize()
@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck), database=None)
def test_fuzzed_requests_get_no_server_errors(
    case: schemathesis.Case, fuzz_server: ServerProcess, fuzz_seed: seeds.Seed
) -> None:
    with fuzz_seed.shown_on_failure():
        headers = {"authorization": f"Bearer {fuzz_server.admin_token}"}
        response = case.call(base_url=fuzz_server.url + "/graphql", headers=headers, timeout=30)
        assert response.status_code < 500, response.text
        case.validate_response(response, headers=headers)  # what `st run` checks, as schemathesis.toml says
        body = response.json()
        for error in body.get("errors") or []:
            code = (error.get("extensions") or {}).get("code")
            assert code is not None, error
            assert code != "INTERNAL_SERVER_ERROR", (case.body, error)


def test_the_checks_st_run_makes_fail_a_server_error_and_an_answer_that_is_no_object() -> None:
    """The in-process checks are not vacuous: `validate_response` (what the fuzzed test calls on each answer)
    refuses a 500 and a JSON list, and passes a typed GraphQL answer (the twin)."""
    case = next(iter(schema.get_all_operations())).ok().Case(body={"query": "{ viewer { id } }"})

    def answer(status: int, body: object) -> requests.Response:
        response = requests.Response()
        response.status_code, response._content = status, orjson.dumps(body)
        response.headers["content-type"] = "application/json"
        response.url = "http://127.0.0.1:9/graphql"
        response.request = requests.Request("POST", response.url, json=case.body).prepare()
        response.elapsed = timedelta(milliseconds=3)
        return response

    case.validate_response(answer(200, {"data": {"viewer": None}}))
    refused = [(500, {"errors": [{"message": "boom"}]}, "ServerError"), (200, [1], "UnexpectedGraphQLResponse")]
    for status, body, failure in refused:
        with pytest.raises(FailureGroup) as raised:
            case.validate_response(answer(status, body))
        assert [type(e).__name__ for e in raised.value.exceptions] == [failure]


def test_fuzzing_keeps_no_example_database(tmp_path: Path) -> None:
    """The seed alone decides a run: the configuration the tests and `st run` read keeps no examples. The twin:
    the same file with a database named keeps one (hypothesis's own default depends on `CI`, so it is named)."""
    assert _config().projects.default.get_hypothesis_settings().database is None
    keeping = tmp_path / "schemathesis.toml"
    keeping.write_text((ROOT / "schemathesis.toml").read_text().replace('database = "none"', 'database = ":memory:"'))
    assert SchemathesisConfig.from_path(keeping).projects.default.get_hypothesis_settings().database is not None


def test_schemathesis_cli_finds_no_failures(
    fuzz_server: ServerProcess, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """`st run` on the live endpoint with its default checks (as configured in schemathesis.toml), seeded: a
    few examples an operation, every operation tested and passed."""
    run = seeds.draw(request, SEED)
    result = subprocess.run(
        [
            str(Path(sys.executable).parent / "st"),
            "--config-file",
            str(ROOT / "schemathesis.toml"),
            "run",
            fuzz_server.url + "/graphql",
            "--header",
            f"Authorization: Bearer {fuzz_server.admin_token}",
            "--max-examples",
            str(CLI_EXAMPLES),
            "--seed",
            str(run.value),
            "--workers",
            "1",
            "--generation-database",
            "none",
            "--no-color",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=ST_RUN_S,
    )
    with run.shown_on_failure():
        assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-2000:]
        generated = re.search(r"(\d+) generated, \1 passed", result.stdout)
        assert generated, result.stdout[-3000:]
        operations = len(list(schema.get_all_operations()))
        assert re.search(rf"Tested: {operations}\b", result.stdout), result.stdout[-3000:]
        assert int(generated.group(1)) >= operations, result.stdout[-3000:]

"""Every client-examples/*/run, executed as a user would, against a real server.

Each `run` installs what it needs into its own folder (from the registries; the first run of the
Python example makes its `.venv` there; tests/support/install_cache.py keeps a copy outside the clone for the
next clean clone, keyed by the lock or requirements file) and exits 0 only when every step of the walk-through
worked: create a thread, send a message, stream the run live, disconnect, resume from the last
cursor with exactly the missed events, answer an approval.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.support.graphql import make_project
from tests.support.install_cache import Installed
from tests.support.server import Client, ServerProcess

EXAMPLES = Path(__file__).resolve().parent.parent / "client-examples"
RUNS = sorted(p.name for p in EXAMPLES.iterdir() if (p / "run").is_file())
# What each example's `run` installs into its folder, and the stamp it leaves when that is current.
INSTALLS = {
    "typescript": Installed(
        "client-typescript-node_modules",
        EXAMPLES / "typescript" / "node_modules",
        ".threadloom-installed",
        (EXAMPLES / "typescript" / "package-lock.json",),
    ),
    "python": Installed(
        "client-python-venv",
        EXAMPLES / "python" / ".venv",
        "requirements.txt",
        (EXAMPLES / "python" / "requirements.txt",),
    ),
}


def test_every_example_has_a_run() -> None:
    assert {"python", "curl", "typescript"} <= set(RUNS)
    assert all(os.access(EXAMPLES / name / "run", os.X_OK) for name in RUNS)


PROJECTS = "{ projects(first: 100, includeArchived: true) { nodes { id archivedAt workspaceStatus } } }"


async def _projects(client: Client) -> dict[str, dict[str, str | None]]:
    nodes = (await client.gql(PROJECTS))["projects"]["nodes"]
    return {p["id"]: p for p in nodes}


async def _run(script: Path, env: dict[str, str]) -> str:
    proc = await asyncio.create_subprocess_exec(str(script), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 600)
    stdout, stderr = out.decode(), err.decode()
    print(stdout, stderr)
    assert proc.returncode == 0, stdout + stderr
    return stdout


def _cleaned_up(before: dict[str, dict[str, str | None]], after: dict[str, dict[str, str | None]]) -> None:
    """Every project the script made is archived, its folder gone; the ones it was given are untouched."""
    made = [after[p] for p in after.keys() - before.keys()]
    assert made, "the script made no project of its own"
    assert all(p["archivedAt"] and p["workspaceStatus"] == "MISSING" for p in made), made
    assert all(after[p]["archivedAt"] is None for p in before), after


@pytest.mark.parametrize("name", RUNS)
async def test_example_runs_against_a_real_server(name: str, server: ServerProcess, client: Client) -> None:
    if name == "curl":  # not optional: scripts/test installs them, as it installs bubblewrap
        assert shutil.which("curl") and shutil.which("jq"), "the curl example needs curl and jq"
    env = {**os.environ, "THREADLOOM_URL": server.url, "THREADLOOM_TOKEN": str(server.admin_token)}
    env.pop("THREADLOOM_PROJECT_ID", None)
    if name == "curl":  # one example is given a project, the other creates its own
        env["THREADLOOM_PROJECT_ID"] = await make_project(client, "curl example")
    before = await _projects(client)
    installed = INSTALLS.get(name)
    if installed is not None:
        installed.restore()
    stdout = await _run(EXAMPLES / name / "run", env)
    assert "every step worked" in stdout
    if installed is not None:
        installed.keep()
    after = await _projects(client)
    if name == "curl":  # given a project: it made none, and left the given one as it was
        assert after == before
    else:  # made its own (python: tour.py too): archived, folder removed
        _cleaned_up(before, after)


async def test_curl_tour_runs_as_a_script(server: ServerProcess, client: Client) -> None:
    """client-examples/curl/tour: the README's tour, request by request, then its project archived."""
    assert shutil.which("curl") and shutil.which("jq"), "the curl tour needs curl and jq"
    env = {**os.environ, "THREADLOOM_URL": server.url, "THREADLOOM_TOKEN": str(server.admin_token)}
    before = await _projects(client)
    stdout = await _run(EXAMPLES / "curl" / "tour", env)
    assert "the tour worked" in stdout
    _cleaned_up(before, await _projects(client))

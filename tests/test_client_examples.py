"""Every client-examples/*/run, executed as a user would, against a real server.

Each `run` installs what it needs into its own folder (from the registries; the first run of the
Python example makes its `.venv` there) and exits 0 only when every step of the walk-through
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
from tests.support.server import Client, ServerProcess

EXAMPLES = Path(__file__).resolve().parent.parent / "client-examples"
RUNS = sorted(p.name for p in EXAMPLES.iterdir() if (p / "run").is_file())


def test_every_example_has_a_run() -> None:
    assert {"python", "curl", "typescript"} <= set(RUNS)
    assert all(os.access(EXAMPLES / name / "run", os.X_OK) for name in RUNS)


@pytest.mark.parametrize("name", RUNS)
async def test_example_runs_against_a_real_server(name: str, server: ServerProcess, client: Client) -> None:
    if name == "curl":  # not optional: scripts/test installs them, as it installs bubblewrap
        assert shutil.which("curl") and shutil.which("jq"), "the curl example needs curl and jq"
    env = {**os.environ, "THREADLOOM_URL": server.url, "THREADLOOM_TOKEN": str(server.admin_token)}
    env.pop("THREADLOOM_PROJECT_ID", None)
    if name == "curl":  # one example is given a project, the other creates its own
        env["THREADLOOM_PROJECT_ID"] = await make_project(client, "curl example")
    proc = await asyncio.create_subprocess_exec(
        str(EXAMPLES / name / "run"), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    out, err = await asyncio.wait_for(proc.communicate(), 600)
    stdout, stderr = out.decode(), err.decode()
    print(stdout, stderr)
    assert proc.returncode == 0, stdout + stderr
    assert "every step worked" in stdout

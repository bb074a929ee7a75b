"""Run the real `threadloom` command line against a test database."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def threadloom(database_url: str | None, *args: str, data_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if database_url:
        env["DATABASE_URL"] = database_url
    if data_dir is not None:
        env["THREADLOOM_DATA_DIR"] = str(data_dir)
    return subprocess.run(
        [sys.executable, "-m", "threadloom", *args], env=env, capture_output=True, text=True, timeout=120
    )


def create_token(database_url: str, scope: str, project: str | None = None) -> tuple[str, str]:
    """(token id, secret) of a new token, made through the CLI."""
    args = ["token", "create", "--scope", scope]
    if project:
        args += ["--project", project]
    done = threadloom(database_url, *args)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    token_id = lines[0].split()[2]
    return token_id, lines[-1]

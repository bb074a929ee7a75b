"""Run the real `threadloom` command line against a test database: `threadloom.cli.main` in a process of its
own, forked from the test process's preloaded forkserver (tests/support/zygote.py), with its own environment,
stdout, stderr and exit code; `python -m threadloom` itself is started by test_export_schema.py and
test_operations.py."""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import subprocess
import uuid
from pathlib import Path

from tests.support import zygote
from threadloom.cli import _project_id
from threadloom.domain.statuses import TokenScope
from threadloom.engine.clock import SystemClock
from threadloom.store import tokens
from threadloom.store.db import Database


def threadloom(database_url: str | None, *args: str, data_dir: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    if database_url:
        env["DATABASE_URL"] = database_url
    if data_dir is not None:
        env["THREADLOOM_DATA_DIR"] = str(data_dir)
    return zygote.run(list(args), env, timeout=120)


def create_token(database_url: str, scope: str, project: str | None = None) -> tuple[str, str]:
    """(token id, secret) of a new token, made in-process the way `threadloom token create` makes it.

    Starting the command for each of ~60 tokens cost the suite about a minute; the command itself is tested
    where it is the subject (tests/test_auth.py, tests/test_operations.py, tests/test_security_tokens.py).
    Called from async tests, so it runs on a loop of its own in a thread."""
    project_id = uuid.UUID(_project_id(project)) if project else None

    async def make() -> tuple[str, str]:
        db = Database.from_url(database_url, pool_size=1)
        try:
            async with db.transaction() as tx:
                info, secret = await tokens.create_token(
                    tx, name="cli", scope=TokenScope(scope), project_id=project_id, now=SystemClock().now()
                )
        finally:
            await db.dispose()
        return str(info.id), secret

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, make()).result(60)

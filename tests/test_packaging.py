"""A non-editable install works: the wheel carries its migrations and `threadloom serve` starts from it.

Slow-ish (about 20 s: it builds the wheel, makes a fresh virtualenv and installs the wheel
and its dependencies from the package index), but it is the only test that sees the
project as a user who runs `pip install .` does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from tests.support.pg import postgres_pids
from tests.support.server import free_port

ROOT = Path(__file__).resolve().parents[1]


def run(*argv: str | Path, cwd: Path | None = None, env: dict[str, str] | None = None) -> str:
    done = subprocess.run([str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{argv} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def build_wheel(tmp: Path) -> Path:
    """`pip wheel --no-deps` of a copy of the project (no build/ or egg-info left in the checkout)."""
    project = tmp / "project"
    junk = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    for name in ("src", "migrations"):
        shutil.copytree(ROOT / name, project / name, ignore=junk)
    for name in ("pyproject.toml", "setup.py"):
        shutil.copy2(ROOT / name, project / name)
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", tmp / "dist", project)
    (wheel,) = (tmp / "dist").glob("threadloom-*.whl")
    return wheel


@pytest.mark.slow
def test_the_wheel_installs_into_a_fresh_venv_and_serves(tmp_path: Path) -> None:
    wheel = build_wheel(tmp_path)
    shipped = set(zipfile.ZipFile(wheel).namelist())
    for migration in (ROOT / "migrations" / "versions").glob("*.py"):
        assert f"threadloom/_migrations/versions/{migration.name}" in shipped
    assert {"threadloom/_migrations/env.py", "threadloom/_migrations/script.py.mako"} <= shipped
    assert {f"threadloom/dashboard/static/{name}" for name in ("index.html", "app.js", "style.css")} <= shipped

    venv = tmp_path / "venv"
    # No --system-site-packages: only what the wheel pulls in. The venv gets no pip of its own (ensurepip, ~4 s
    # of CPU): this pip installs into it (`--python`), without compiling every module up front (~3 s; the
    # server compiles what it imports at its first start).
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    env = {k: v for k, v in os.environ.items() if k not in ("DATABASE_URL", "PYTHONPATH", "VIRTUAL_ENV")}
    python = venv / "bin" / "python"
    run(sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile", wheel, env=env)
    located = run(
        python, "-c", "from threadloom.store import migrate; print(migrate.MIGRATIONS_DIR)", env=env
    )
    assert Path(located.strip()).is_relative_to(venv), located

    data, port = tmp_path / "data", free_port()
    serve = subprocess.Popen(
        [venv / "bin" / "threadloom", "serve", "--port", str(port)],
        cwd=tmp_path,
        env={**env, "THREADLOOM_DATA_DIR": str(data), "XDG_STATE_HOME": str(tmp_path / "state")},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:

        def ready() -> bool:
            assert serve.poll() is None, serve.communicate()[1][-3000:]
            try:
                return httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200
            except httpx.HTTPError:
                return False

        poll(ready, within=90)
        page = httpx.get(f"http://127.0.0.1:{port}/dashboard/", timeout=5)  # served from the installed wheel
        assert page.status_code == 200 and "app.js" in page.text, page.text[:300]
        serve.send_signal(signal.SIGTERM)
        out, err = serve.communicate(timeout=30)
        assert serve.returncode == 0, err[-3000:]
        assert "Admin token (shown once, keep it): tl_" in out
        poll(lambda: not postgres_pids(data / "pg"), within=10)  # the clean stop stopped PostgreSQL
    finally:
        if serve.poll() is None:
            serve.kill()
            serve.wait()
        for pid in postgres_pids(data / "pg"):  # only if the test failed: leave nothing behind
            os.kill(pid, signal.SIGTERM)


def poll(check: Callable[[], bool], within: float) -> None:
    """Wait until `check()` holds (the server answers, a process is gone); fail after `within` s."""
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, f"condition not met in {within}s"
        time.sleep(0.05)

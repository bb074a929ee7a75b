"""`threadloom export-schema`: the SDL on stdout by default, a file only with `--out`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from threadloom.api.schema import export_sdl


def test_export_schema_prints_to_stdout_and_writes_nothing(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "threadloom", "export-schema"],
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "DATABASE_URL"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == export_sdl()
    assert list(tmp_path.iterdir()) == []  # no schema/ folder made in the current directory
